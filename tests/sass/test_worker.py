"""The worker's GPU session (upload, run, compare, time) against a numpy stand-in for the device."""

from __future__ import annotations

import numpy as np
import pytest

from polytile.runtime.cuda_driver import DeviceInfo
from polytile.sass import worker
from polytile.sass.launch import Buffer, CubinLaunch, Scalar


class NumpyDevice:
    """Device memory as numpy buffers; 'kernels' are y = a * x (cubin b"good") or a wrong variant."""

    def __init__(self, ordinal=0):
        self.info = DeviceInfo("numpy", (9, 0), 1 << 20, 13000)
        self.memory: dict[int, bytearray] = {}
        self.runs = 0

    def alloc(self, nbytes):
        ptr = 0x1000 * (len(self.memory) + 1)
        self.memory[ptr] = bytearray(nbytes)
        return ptr

    def upload(self, ptr, array):
        self.memory[ptr][:] = np.ascontiguousarray(array).tobytes()

    def download(self, ptr, like):
        return np.frombuffer(bytes(self.memory[ptr]), dtype=like.dtype).reshape(like.shape).copy()

    def memset(self, ptr, byte, nbytes):
        self.memory[ptr][:nbytes] = bytes([byte]) * nbytes

    def load(self, cubin, kernel, shared_bytes):
        return cubin, cubin

    def unload(self, module):
        pass

    def synchronize(self):
        pass

    def launch(self, function, grid, block, shared_bytes, params):
        n, a, x_ptr, y_ptr = (h.value for h in params._holders)
        x = np.frombuffer(bytes(self.memory[x_ptr]), np.float32)
        y = a * x if function != b"wrong" else a * x + (np.arange(n) == 3)
        if function == b"flaky":
            self.runs += 1
            y = y + self.runs
        self.memory[y_ptr][:] = y.astype(np.float32).tobytes()

    def time(self, function, grid, block, shared_bytes, params, reps, warmup, flush):
        self.launch(function, grid, block, shared_bytes, params)
        return 0.5


def launch(cubin=b"good"):
    return CubinLaunch(
        cubin,
        "saxpy",
        (1, 1, 1),
        (32, 1, 1),
        (
            Scalar("n", "int32", 16),
            Scalar("a", "float32", 2.0),
            Buffer("x", "float32", (16,)),
            Buffer("y", "float32", (16,), role="out"),
        ),
    )


@pytest.fixture(autouse=True)
def numpy_device(monkeypatch):
    monkeypatch.setattr(worker, "Device", NumpyDevice)


def test_session_times_checks_and_verifies():
    session = worker.GpuSession(launch(), {"reps": 3})
    assert session.time(b"good") == 0.5
    assert session.verify(b"good", (1, 2)) is None
    outputs = session.outputs(b"good", 7)
    from polytile.sass.verify import host_inputs

    np.testing.assert_array_equal(outputs["y"], 2 * host_inputs(launch(), 7)["x"])
    assert "index 3" in session.verify(b"wrong", (1,))
    with pytest.raises(ValueError, match="wrong results"):
        session.time(b"wrong")


def test_a_nondeterministic_original_needs_an_rtol():
    with pytest.raises(RuntimeError, match="not deterministic"):
        worker.GpuSession(launch(b"flaky"), {})
