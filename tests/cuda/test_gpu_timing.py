"""The GPU timing harness against a fake device: warm-up, event pairs, repeats up to ``min_time``,
the L2 flush, the median; and the kernels' timing arguments shared with the CPU kernels."""

from __future__ import annotations

import inspect
import types

import pytest

from polytile.runtime import cuda_device
from polytile.runtime.cpu import CPUKernel
from polytile.runtime.cuda import CUDAKernel
from polytile.runtime.timing import time_gpu


class FakeDevice:
    """Every launch takes ``ms`` milliseconds by its events; counts launches, flushes and live events."""

    def __init__(self, ms: float):
        self.ms = ms
        self.calls = 0
        self.memsets = 0
        self.live_events = 0
        self.allocated: list[int] = []
        self.info = types.SimpleNamespace(l2_bytes=1 << 20)
        self.cu = types.SimpleNamespace(
            cuEventCreate=self._create, cuEventDestroy=self._destroy, cuMemsetD8Async=self._memset,
            cuEventRecord=lambda ev, stream: (0,), cuEventSynchronize=lambda ev: (0,),
            cuEventElapsedTime=lambda start, end: (0, self.ms))

    def _create(self, flags: int) -> tuple[int, str]:
        self.live_events += 1
        return 0, "event"

    def _destroy(self, ev: str) -> tuple[int]:
        self.live_events -= 1
        return (0,)

    def _memset(self, ptr: int, value: int, nbytes: int, stream: int) -> tuple[int]:
        self.memsets += 1
        return (0,)

    def _check(self, result: tuple, what: str) -> tuple:
        return tuple(result[1:])

    def alloc(self, nbytes: int) -> int:
        self.allocated.append(nbytes)
        return 0x1000

    def free(self, ptr: int) -> None:
        self.allocated.pop()

    def synchronize(self) -> None:
        pass

    def launch(self) -> None:
        self.calls += 1


def fake_device(monkeypatch: pytest.MonkeyPatch, ms: float) -> FakeDevice:
    dev = FakeDevice(ms)
    monkeypatch.setattr(cuda_device, "device", lambda: dev)
    return dev


def test_repeats_until_min_time(monkeypatch: pytest.MonkeyPatch):
    dev = fake_device(monkeypatch, 2.0)
    t = time_gpu(dev.launch, repeat=3, warmup=4, flush_l2=False, min_time=0.1)
    assert t == pytest.approx(2e-3)
    assert dev.calls == 4 + 50  # 3 runs, then 47 more to reach 0.1 s of 2 ms runs
    assert dev.live_events == 0 and dev.memsets == 0


def test_repeat_alone_without_min_time_and_flush_before_each_run(monkeypatch: pytest.MonkeyPatch):
    dev = fake_device(monkeypatch, 0.5)
    t = time_gpu(dev.launch, repeat=7, warmup=1, l2_bytes=1 << 20)
    assert t == pytest.approx(5e-4)
    assert dev.calls == 8 and dev.memsets == 7
    assert not dev.allocated  # the flush buffer is freed


def test_run_count_is_capped(monkeypatch: pytest.MonkeyPatch):
    dev = fake_device(monkeypatch, 1e-4)
    time_gpu(dev.launch, repeat=2, warmup=0, flush_l2=False, min_time=10.0, max_runs=500)
    assert dev.calls == 500


def test_min_time_also_bounds_the_wall_time(monkeypatch: pytest.MonkeyPatch):
    """A tiny kernel whose runs cost more wall time than kernel time (launch, flush) stops when
    ``min_time`` seconds have passed: 1 µs kernels launched 1 ms apart, min_time 0.05 s — about 50
    runs, not the 10,000 (the cap) that 0.05 s of kernel time would take; at least ``repeat``."""
    import time
    dev = fake_device(monkeypatch, 1e-3)
    slow = lambda: (dev.launch(), time.sleep(1e-3))  # noqa: E731
    time_gpu(slow, repeat=5, warmup=0, flush_l2=False, min_time=0.05)
    assert 5 <= dev.calls <= 150
    dev.calls = 0
    time_gpu(slow, repeat=20, warmup=0, flush_l2=False, min_time=0.001)
    assert dev.calls == 20


def test_kernels_share_the_timing_arguments():
    """The tuner calls ``benchmark(*inputs, repeat=, warmup=, min_time=, flush_cache=)`` on CPU and
    CUDA kernels alike."""
    for kernel in (CPUKernel, CUDAKernel):
        params = inspect.signature(kernel.benchmark).parameters
        assert {"repeat", "warmup", "min_time", "flush_cache"} <= set(params), kernel.__name__
