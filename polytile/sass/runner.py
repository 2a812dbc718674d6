"""The parent side of measurement: a worker process per kernel, restarted when a variant kills it.

A variant may fault (the worker replies with a CUDA error and exits), crash the process outright,
or hang (no reply within the time limit: the worker is killed). Each of these raises
`MeasurementFailed` for that variant only; the next request starts a fresh worker, so a bad
schedule costs one measurement, never the search.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from polytile.sass.game import MeasurementFailed
from polytile.sass.launch import CubinLaunch
from polytile.sass.worker import read_message, write_message


class WorkerError(RuntimeError):
    """The worker cannot measure even the original kernel (setup failed); nothing to optimize."""


@dataclass
class RunnerSettings:
    reps: int = 30  # timed launches per measurement (median)
    warmup: int = 3
    flush_l2: bool = True
    timing_seed: int = 0
    device: int = 0
    timeout_s: float = 30.0  # per request; a variant that runs longer is treated as hung
    setup_timeout_s: float = 180.0
    command: list[str] = field(default_factory=lambda: [sys.executable, "-m", "polytile.sass.worker"])

    def for_worker(self) -> dict:
        return {
            "reps": self.reps,
            "warmup": self.warmup,
            "flush_l2": self.flush_l2,
            "timing_seed": self.timing_seed,
            "device": self.device,
        }


class Runner:
    """Times and verifies variants of one CubinLaunch in an isolated worker process."""

    def __init__(self, launch: CubinLaunch, settings: RunnerSettings | None = None) -> None:
        self.launch = launch
        self.settings = settings or RunnerSettings()
        self.process: subprocess.Popen | None = None
        self.device: dict | None = None
        self.restarts = 0
        self._stderr = None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- process management ----------------------------------------------------------------------

    def _start(self) -> None:
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            self.settings.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            bufsize=0,
        )
        try:
            self.device = self._request(
                ("setup", self.launch, self.settings.for_worker()), self.settings.setup_timeout_s
            )
        except MeasurementFailed as exc:
            raise WorkerError(f"the measurement worker could not set up {self.launch.label}: {exc}") from exc

    def _kill(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.process = None

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()[-2000:].decode(errors="replace").strip()

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                write_message(self.process.stdin.fileno(), ("quit",))
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()

    def _request(self, message, timeout_s: float):
        proc = self.process
        try:
            write_message(proc.stdin.fileno(), message)
        except OSError:
            self._kill()
            raise MeasurementFailed(f"the worker died before the request: {self._stderr_tail()}") from None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            self._kill()
            self.restarts += 1
            raise MeasurementFailed(f"no answer within {timeout_s:.0f} s (hung kernel?); worker restarted")
        reply = read_message(fd)
        if reply is None:
            code = proc.wait()
            self.process = None
            self.restarts += 1
            raise MeasurementFailed(f"the worker died (exit {code}): {self._stderr_tail()}")
        status, *payload = reply
        if status == "error":
            text, fatal = payload
            if fatal:
                self._kill()
                self.restarts += 1
            raise MeasurementFailed(text)
        return payload[0]

    def request(self, message, timeout_s: float | None = None):
        if self.process is None or self.process.poll() is not None:
            self._start()
        return self._request(message, timeout_s or self.settings.timeout_s)

    # ---- measurements ----------------------------------------------------------------------------

    def time(self, cubin: bytes) -> float:
        """Median milliseconds of `cubin` (after a screen of its outputs on the timing inputs)."""
        return float(self.request(("time", cubin)))

    def outputs(self, cubin: bytes, seed: int) -> dict:
        """Output arrays of `cubin` on the inputs `verify.host_inputs(launch, seed)` builds."""
        return self.request(("outputs", cubin, seed))

    def verify(self, cubin: bytes, seeds: tuple[int, ...] = (1, 2, 3)) -> str | None:
        """None if `cubin` matches the original on fresh inputs for every seed, else what differed."""
        return self.request(("verify", cubin, tuple(seeds)))
