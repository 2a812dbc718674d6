"""Isolated worker processes: a crash, a hang or a stuck call in one costs that call, never the caller.

Each worker is a fresh interpreter (spawn) serving calls over a pipe. ``WorkerPool.map`` hands calls
to idle workers and waits with a deadline per call; a worker that dies (segfault, abort) or overruns
its deadline is killed, its call reported as ``Crashed``/``TimedOut``, and a new worker takes its
place. Calls are module-level functions, pickled by name.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from .space import TuneError


@dataclass
class Returned:
    value: Any


@dataclass
class Raised:
    """The call raised: ``kind`` is the exception's class name, ``message`` its text."""

    kind: str
    message: str
    polytile: bool  # a PolytileError (an expected failure), not a bug


@dataclass
class Crashed:
    """The worker process died during the call (``signal`` names the signal when one killed it)."""

    exitcode: int | None
    signal: str


@dataclass
class TimedOut:
    seconds: float


Outcome = Returned | Raised | Crashed | TimedOut


def _serve(conn: Connection, env: dict[str, str]) -> None:
    os.environ.update(env)
    from ..errors import PolytileError
    conn.send("ready")  # deadlines count from here: a slow interpreter start is no timeout
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            result: Outcome = Returned(fn(*args))
        except BaseException as err:  # noqa: BLE001 - reported to the caller, whatever it is
            expected = isinstance(err, PolytileError)
            text = str(err) if expected else "".join(traceback.format_exception(err))[-3000:]
            result = Raised(type(err).__name__, text, expected)
        try:
            conn.send(result)
        except (BrokenPipeError, OSError):
            return


STARTUP_TIMEOUT = 300.0


class _Worker:
    def __init__(self, ctx: Any, env: dict[str, str]):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, env), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False

    def wait_ready(self) -> bool:
        """Wait for the worker's first message; False if it died or never started."""
        if not self.ready:
            try:
                self.ready = self.conn.poll(STARTUP_TIMEOUT) and self.conn.recv() == "ready"
            except (EOFError, OSError):
                self.ready = False
        return self.ready

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


def _signal_name(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return ""


class WorkerPool:
    """``size`` worker processes started lazily with extra environment ``env``."""

    def __init__(self, size: int, env: dict[str, str] | None = None):
        self.size = max(1, size)
        self.env = dict(env or {})
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker] = []

    def _spawn(self) -> _Worker:
        return _Worker(self._ctx, self.env)

    def map(self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], timeout: float,
            on_done: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
        """Run ``fn(*args)`` for every args tuple, at most ``size`` at a time, each within ``timeout``
        seconds; outcomes in the order of ``calls`` (``on_done`` hears each as it completes)."""
        while len(self._workers) < min(self.size, len(calls)):
            self._workers.append(self._spawn())
        results: list[Outcome | None] = [None] * len(calls)
        pending = list(range(len(calls)))
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (call index, deadline)
        while pending or busy:
            for slot, w in enumerate(self._workers):
                if slot not in busy and pending:
                    if not w.wait_ready():
                        raise TuneError(f"a worker process failed to start (exit code {w.proc.exitcode}); "
                                        "run `python -c 'import polytile'` to see why")
                    k = pending.pop(0)
                    try:
                        w.conn.send((fn, calls[k]))
                    except (BrokenPipeError, OSError):
                        self._replace(slot)
                        pending.insert(0, k)
                        continue
                    busy[slot] = (k, time.monotonic() + timeout)
            if not busy:
                continue
            now = time.monotonic()
            next_deadline = min(d for _, d in busy.values())
            handles = [h for s in busy for h in (self._workers[s].conn, self._workers[s].proc.sentinel)]
            ready = wait(handles, timeout=max(0.0, next_deadline - now))
            for slot in list(busy):
                w = self._workers[slot]
                k, deadline = busy[slot]
                outcome: Outcome | None = None
                if w.conn in ready:
                    try:
                        outcome = w.conn.recv()
                    except (EOFError, OSError):
                        outcome = None
                if outcome is None and (w.proc.sentinel in ready or w.conn in ready):
                    w.proc.join(timeout=5)
                    outcome = Crashed(w.proc.exitcode, _signal_name(w.proc.exitcode))
                    self._replace(slot)
                elif outcome is None and time.monotonic() >= deadline:
                    outcome = TimedOut(timeout)
                    self._replace(slot)
                if outcome is not None:
                    del busy[slot]
                    results[k] = outcome
                    if on_done is not None:
                        on_done(k, outcome)
        return results  # type: ignore[return-value]

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Outcome:
        return self.map(fn, [args], timeout)[0]

    def _replace(self, slot: int) -> None:
        self._workers[slot].kill()
        self._workers[slot] = self._spawn()

    def restart(self) -> None:
        """Replace every worker (after a device error that may have poisoned their state)."""
        for slot in range(len(self._workers)):
            self._replace(slot)

    def close(self) -> None:
        for w in self._workers:
            w.kill()
        self._workers = []

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
