"""The measurement worker: a separate process that owns the GPU, times and checks kernel variants.

Run as `python -m polytile.sass.worker`. It speaks length-prefixed pickles on stdin/stdout
(`read_message` / `write_message`); anything a library prints goes to stderr. Requests:

- ("setup", CubinLaunch, settings) -> device facts. Allocates buffers and an L2-flush buffer,
  loads the original kernel and records its outputs on the timing inputs.
- ("time", cubin) -> median milliseconds. First runs the variant once on the timing inputs and
  compares with the original's outputs (a cheap screen); a mismatch is an error reply.
- ("verify", cubin, seeds) -> None or a mismatch description, on fresh inputs per seed.
- ("outputs", cubin, seed) -> the output arrays on `host_inputs(launch, seed)` (for references).
A CUDA error is replied as ("error", text, fatal=True) and the worker exits: after a fault the
context is unusable, so the parent starts a new worker.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from collections.abc import Callable

from polytile.runtime.cuda_driver import CudaError, Device, KernelParams
from polytile.sass.launch import Buffer, CubinLaunch, Scalar, Scratch
from polytile.sass.verify import compare, host_inputs

_HEADER = struct.Struct("<Q")


def write_message(fd: int, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def read_exactly(fd: int, count: int) -> bytes | None:
    chunks, remaining = [], count
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_message(fd: int):
    header = read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    body = read_exactly(fd, _HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


def serve(handle: Callable) -> None:
    """Answer requests from stdin on a private copy of stdout until stdin closes or `handle` says stop."""
    reply_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints must not corrupt the protocol
    while True:
        message = read_message(0)
        if message is None or message[0] == "quit":
            return
        try:
            write_message(reply_fd, ("ok", handle(message)))
        except Exception as exc:  # every failure goes back to the parent as an error reply
            fatal = isinstance(exc, CudaError)
            write_message(reply_fd, ("error", f"{type(exc).__name__}: {exc}", fatal))
            if fatal:
                os._exit(3)


class GpuSession:
    """State of a worker measuring one CubinLaunch."""

    def __init__(self, launch: CubinLaunch, settings: dict) -> None:
        self.launch = launch
        self.settings = settings
        self.device = Device(settings.get("device", 0))
        self.pointers = {}
        for arg in launch.args:
            if isinstance(arg, Buffer) or isinstance(arg, Scratch) and arg.nbytes:
                self.pointers[arg.name] = self.device.alloc(arg.nbytes)
        flush_bytes = 2 * self.device.info.l2_bytes if settings.get("flush_l2", True) else 0
        self.flush = (self.device.alloc(flush_bytes), flush_bytes) if flush_bytes else None
        self.params = self._params()
        self.timing_inputs = host_inputs(launch, settings.get("timing_seed", 0))
        self.reference: dict[int, dict] = {}
        self.timing_reference = self._run(launch.cubin, self.timing_inputs)
        again = self._run(launch.cubin, self.timing_inputs)
        mismatch = compare(launch, self.timing_reference, again)
        if mismatch is not None:
            raise RuntimeError(
                f"the original kernel {launch.label} is not deterministic ({mismatch}); "
                "give the launch an rtol"
            )

    def _params(self):
        values = []
        for arg in self.launch.args:
            if isinstance(arg, Scalar):
                values.append((arg.dtype, arg.value))
            else:
                values.append(("pointer", self.pointers.get(arg.name, 0)))
        return KernelParams(values)

    def _upload(self, inputs: dict) -> None:
        for arg in self.launch.args:
            if arg.name in inputs:
                self.device.upload(self.pointers[arg.name], inputs[arg.name])
            elif arg.name in self.pointers:
                self.device.memset(self.pointers[arg.name], 0, arg.nbytes)

    def _run(self, cubin: bytes, inputs: dict) -> dict:
        launch = self.launch
        module, function = self.device.load(cubin, launch.kernel, launch.shared_bytes)
        try:
            self._upload(inputs)
            self.device.launch(function, launch.grid, launch.block, launch.shared_bytes, self.params)
            self.device.synchronize()
            return {
                b.name: self.device.download(self.pointers[b.name], inputs[b.name]) for b in launch.outputs()
            }
        finally:
            self.device.unload(module)

    def check(self, cubin: bytes, inputs: dict, reference: dict):
        mismatch = compare(self.launch, reference, self._run(cubin, inputs))
        return None if mismatch is None else str(mismatch)

    def time(self, cubin: bytes) -> float:
        mismatch = self.check(cubin, self.timing_inputs, self.timing_reference)
        if mismatch is not None:
            raise ValueError(f"wrong results on the timing inputs: {mismatch}")
        launch = self.launch
        module, function = self.device.load(cubin, launch.kernel, launch.shared_bytes)
        try:
            return self.device.time(
                function,
                launch.grid,
                launch.block,
                launch.shared_bytes,
                self.params,
                reps=self.settings.get("reps", 30),
                warmup=self.settings.get("warmup", 3),
                flush=self.flush,
            )
        finally:
            self.device.unload(module)

    def outputs(self, cubin: bytes, seed: int) -> dict:
        """The outputs of `cubin` on the inputs `host_inputs(launch, seed)`."""
        return self._run(cubin, host_inputs(self.launch, seed))

    def verify(self, cubin: bytes, seeds) -> str | None:
        for seed in seeds:
            inputs = host_inputs(self.launch, seed)
            if seed not in self.reference:
                self.reference[seed] = self._run(self.launch.cubin, inputs)
            mismatch = self.check(cubin, inputs, self.reference[seed])
            if mismatch is not None:
                return f"seed {seed}: {mismatch}"
        return None


def main() -> None:
    session: list[GpuSession] = []

    def handle(message):
        kind = message[0]
        if kind == "setup":
            session[:] = [GpuSession(message[1], message[2])]
            info = session[0].device.info
            return {
                "device": info.name,
                "compute_capability": info.compute_capability,
                "driver_version": info.driver_version,
                "l2_bytes": info.l2_bytes,
            }
        if not session:
            raise RuntimeError("the worker got a request before setup")
        if kind == "time":
            return session[0].time(message[1])
        if kind == "verify":
            return session[0].verify(message[1], message[2])
        if kind == "outputs":
            return session[0].outputs(message[1], message[2])
        raise ValueError(f"unknown request {kind!r}")

    serve(handle)


if __name__ == "__main__":
    sys.exit(main())
