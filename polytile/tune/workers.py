"""Isolated worker processes: a crash, a hang or a stuck call in one costs that call, never the caller.

Each worker is a fresh interpreter serving calls over a pipe. ``WorkerPool.submit`` queues calls for
idle workers and ``poll`` collects their outcomes with a deadline per call (``map`` does both); a
worker that dies (segfault, abort) or overruns its deadline is killed with everything it started
(compilers), its call reported as ``Crashed``/``TimedOut``, and a new worker takes its place.
``pause``/``resume`` stop and continue a pool's workers (builders, while a CPU kernel is timed).
Calls are module-level functions, pickled by name.

Workers are started as ``python -c BOOT``, not by ``multiprocessing``'s spawn, which runs the
caller's ``__main__`` script again in every worker (so a plain script calling ``pt.tune`` without an
``if __name__ == "__main__":`` guard would tune again in each). Here the script is loaded only when
a call names something defined in it (a template or a hook in the user's script), under the name
``__mp_main__`` as spawn does; if it then starts tuning at its top level, that is refused with a
message saying to add the guard. Workers run in their own process group, so a Ctrl-C at the
terminal reaches only the caller (which then closes its pools), and on Linux they die with it.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
import traceback
import types
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe, wait
from typing import Any

from .space import TuneError


@dataclass
class Returned:
    value: Any


@dataclass
class Raised:
    """The call raised: ``kind`` is the exception's class name, ``message`` its text, ``lineage`` the
    names of its classes (the exception's and its bases', so that a subclass is known by its family)."""

    kind: str
    message: str
    polytile: bool  # a PolytileError (an expected failure), not a bug
    lineage: tuple[str, ...] = ()

    def is_a(self, name: str) -> bool:
        return name == self.kind or name in self.lineage


@dataclass
class Crashed:
    """The worker process died during the call (``signal`` names the signal when one killed it)."""

    exitcode: int | None
    signal: str


@dataclass
class TimedOut:
    seconds: float


@dataclass
class Unloadable:
    """The worker could not unpickle the call (its function or an argument is missing there)."""

    message: str


Outcome = Returned | Raised | Crashed | TimedOut


# --- the worker's side ---------------------------------------------------------------------------------

BOOT = ("import sys\n"
        "from multiprocessing.connection import Connection\n"
        "conn = Connection(int(sys.argv[1]))\n"
        "try:\n"
        "    setup = conn.recv()\n"  # plain data: reading it needs nothing but the standard library
        "    sys.path[:] = setup['sys_path']\n"
        "    from polytile.tune.workers import serve\n"
        # the caller gone (its end closed) or Ctrl-C in the process group before the worker serves:
        # a quiet exit, not a traceback beside the caller's one-line message
        "except (EOFError, OSError, KeyboardInterrupt):\n"
        "    raise SystemExit(1)\n"
        "serve(conn, setup)\n")

_loading_main: str | None = None  # the caller's script while a worker runs it to find a name


class _CallerMain(types.ModuleType):
    """The caller's ``__main__`` as a worker sees it: the script (or ``-m`` module) runs, as
    ``__mp_main__``, only when a call names something in it."""

    def __init__(self, kind: str, where: str):
        super().__init__("__main__")
        self._kind, self._where = kind, where
        self._loaded: dict[str, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if self._loaded is None:
            self._loaded = _run_main(self._kind, self._where)
        try:
            return self._loaded[name]
        except KeyError:
            raise AttributeError(f"{self._where} defines no {name!r}") from None


def _run_main(kind: str, where: str) -> dict[str, Any]:
    import runpy
    global _loading_main
    _loading_main = where
    try:
        if kind == "path":
            found = runpy.run_path(where, run_name="__mp_main__")
        else:
            found = runpy.run_module(where, run_name="__mp_main__", alter_sys=False)
    finally:
        _loading_main = None
    module = types.ModuleType("__mp_main__")
    module.__dict__.update(found)
    sys.modules["__mp_main__"] = module
    return found


def check_not_loading_main() -> None:
    """Raise ``TuneError`` when called while a worker runs the caller's script to find a name in it:
    the script starts tuning at its top level, which would tune again in every worker."""
    if _loading_main is not None:
        raise TuneError(f"{_loading_main} starts tuning when it is imported, and a worker process imports it "
                        "to find a template or function defined there: put the code that tunes under "
                        "`if __name__ == \"__main__\":` (or move the template to a module of its own)")


def _die_with_parent(parent: int) -> None:
    """On Linux, be killed when the caller dies (a killed tuner leaves no worker behind, even a hung one)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the caller died before the request took effect
        os._exit(0)


def serve(conn: Connection, setup: dict[str, Any]) -> None:
    """The worker's loop: read a call, run it, send its outcome; return when the caller closes the pipe."""
    os.set_inheritable(conn.fileno(), False)  # the pipe must close when this process dies
    _die_with_parent(setup["parent"])
    if setup.get("cores"):
        pin_process(setup["cores"])
    sys.argv[:] = setup["argv"]
    if setup["main"] is not None:
        sys.modules["__main__"] = _CallerMain(*setup["main"])
    from ..errors import PolytileError
    conn.send("ready")  # deadlines count from here: a slow interpreter start is no timeout
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            fn, args = pickle.loads(data)
        except Exception as err:  # noqa: BLE001 - told to the caller, which stops
            result: Outcome | Unloadable = Unloadable(str(err) if isinstance(err, PolytileError)
                                                      else f"{type(err).__name__}: {err}")
        else:
            try:
                result = Returned(fn(*args))
            except BaseException as err:  # noqa: BLE001 - reported to the caller, whatever it is
                expected = isinstance(err, PolytileError)
                text = str(err) if expected else "".join(traceback.format_exception(err))[-3000:]
                result = Raised(type(err).__name__, text, expected, tuple(c.__name__ for c in type(err).__mro__))
        try:
            conn.send(result)
        except (BrokenPipeError, OSError):
            return


def pin_process(cores: Iterable[int]) -> None:
    """Keep every thread of this process (those started at import too) on ``cores``; threads started
    later inherit it (OpenMP's, a compiler the process runs)."""
    cores = set(cores)
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:  # a thread that has ended since
            pass


def _main_module() -> tuple[str, str] | None:
    """Where the caller's ``__main__`` comes from: ("path", script), ("module", name) for ``-m``, or
    None (an interactive session, ``-c``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", None):
        return ("module", spec.name.removesuffix(".__main__"))
    path = getattr(main, "__file__", None)
    if path and os.path.exists(path):
        return ("path", os.path.abspath(path))
    return None


# --- the caller's side ---------------------------------------------------------------------------------

STARTUP_TIMEOUT = 300.0


class _Worker:
    def __init__(self, env: dict[str, str], cores: frozenset[int] | None = None):
        self.conn, child = Pipe()
        self.proc = subprocess.Popen([sys.executable, "-c", BOOT, str(child.fileno())],
                                     pass_fds=(child.fileno(),), env={**os.environ, **env},
                                     stdin=subprocess.DEVNULL, process_group=0)
        child.close()
        self.conn.send({"sys_path": list(sys.path), "argv": list(sys.argv), "main": _main_module(),
                        "parent": os.getpid(), "cores": sorted(cores or ())})
        self.ready = False
        self.started = time.monotonic()

    def check_ready(self) -> bool | None:
        """Whether the worker has said it is ready, without waiting: True; None while it starts; False
        if it died, or did not start within ``STARTUP_TIMEOUT`` seconds."""
        if self.ready:
            return True
        try:
            if not self.conn.poll(0):
                return None if time.monotonic() - self.started < STARTUP_TIMEOUT else False
            self.ready = self.conn.recv() == "ready"
        except (EOFError, OSError):
            self.ready = False
        return self.ready

    def send(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            data = pickle.dumps((fn, args))
        except Exception as err:  # noqa: BLE001 - any pickling failure: the call cannot go to a worker
            raise TuneError(f"cannot send {getattr(fn, '__name__', fn)} to a worker process ({err}); templates, "
                            "operators and hooks must be defined at module level") from None
        self.conn.send_bytes(data)

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the worker and everything it started."""
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> int:
        """Kill the worker and whatever it started (compilers), reap it, and return its exit status
        (negative: the signal that ended it — its own, when it had died already)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its group; the worker is unreaped, so still its id
        except (ProcessLookupError, PermissionError):
            pass
        code = self.proc.wait()
        self.conn.close()
        return code


def _signal_name(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return ""


class WorkerPool:
    """``size`` worker processes started lazily with extra environment ``env`` (kept on the CPU cores
    ``cores`` when given, ``os.sched_setaffinity``), at the caller's priority.

    Calls are submitted (``submit``) and their outcomes collected as they complete (``poll``), so a
    caller can keep the workers busy while it does other work; ``map`` does both for a list of calls.
    ``pause`` stops every worker and what it started (SIGSTOP to their process groups) and
    ``resume`` continues them, moving their deadlines by the time they were stopped.
    """

    def __init__(self, size: int, env: dict[str, str] | None = None, cores: frozenset[int] | None = None):
        check_not_loading_main()
        self.size = max(1, size)
        self.env = dict(env or {})
        self.cores = cores
        self._workers: list[_Worker] = []
        self._queue: deque[tuple[int, Callable[..., Any], tuple[Any, ...], float]] = deque()
        # worker slot -> (ticket, function, timeout, deadline) of the call it runs
        self._busy: dict[int, tuple[int, Callable[..., Any], float, float]] = {}
        self._tickets = 0
        self._paused_at: float | None = None
        self._unclaimed: list[tuple[int, Outcome]] = []  # outcomes ``map`` collected for other callers

    def _spawn(self) -> _Worker:
        return _Worker(self.env, self.cores)

    @property
    def pending(self) -> int:
        """Calls submitted and not yet collected by ``poll``."""
        return len(self._queue) + len(self._busy) + len(self._unclaimed)

    @property
    def idle(self) -> bool:
        return not self._queue and len(self._busy) < self.size

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> int:
        """Queue ``fn(*args)`` to run within ``timeout`` seconds; returns its ticket for ``poll``."""
        self._tickets += 1
        self._queue.append((self._tickets, fn, args, timeout))
        self._dispatch()
        return self._tickets

    def _dispatch(self) -> None:
        """Send queued calls to the idle workers that are ready. Workers start when calls need them,
        all at once, and are not waited for: a call goes to the first one that is ready."""
        if self._paused_at is not None:
            return
        while len(self._workers) < min(self.size, len(self._busy) + len(self._queue)):
            self._workers.append(self._spawn())
        for slot, w in enumerate(self._workers):
            if not self._queue:
                return
            if slot in self._busy:
                continue
            ready = w.check_ready()
            if ready is None:
                continue  # still starting: its pipe is among ``connections`` and wakes the caller
            if not ready:
                raise TuneError(f"a worker process failed to start (exit code {w.kill()}); "
                                "run `python -c 'import polytile'` to see why")
            ticket, fn, args, timeout = self._queue.popleft()
            try:
                w.send(fn, args)
            except (BrokenPipeError, OSError):
                self._replace(slot)
                self._queue.appendleft((ticket, fn, args, timeout))
                continue
            self._busy[slot] = (ticket, fn, timeout, time.monotonic() + timeout)

    def poll(self, timeout: float | None = None) -> list[tuple[int, Outcome]]:
        """Wait up to ``timeout`` seconds (None: until one completes) and return the (ticket, outcome)
        of every call that completed, died or overran its deadline."""
        self._dispatch()
        if self._unclaimed:
            done, self._unclaimed = self._unclaimed, []
            return done
        if self._paused_at is not None or not (self._busy or self._starting()):
            if timeout:
                time.sleep(timeout)
            return []
        if not self._busy:  # calls wait for workers that are starting: wait for the first to be ready
            wait_s = max(0.0, self.next_deadline() - time.monotonic())
            wait(self.connections(), timeout=wait_s if timeout is None else min(wait_s, timeout))
            self._dispatch()
            return []
        wait_s = max(0.0, self.next_deadline() - time.monotonic())
        if timeout is not None:
            wait_s = min(wait_s, timeout)
        ready = wait(self.connections(), timeout=wait_s)
        done: list[tuple[int, Outcome]] = []
        for slot in list(self._busy):
            w = self._workers[slot]
            ticket, fn, timeout_s, deadline = self._busy[slot]
            outcome: Outcome | Unloadable | None = None
            if w.conn in ready:
                try:
                    outcome = w.conn.recv()
                except (EOFError, OSError):
                    code = w.kill()
                    outcome = Crashed(code, _signal_name(code))
                    self._workers[slot] = self._spawn()
                if isinstance(outcome, Unloadable):
                    raise TuneError(f"a worker process could not load the call {fn.__name__}: "
                                    f"{outcome.message} (templates, operators and hooks must be importable "
                                    "by name: defined at module level in a module or a script file)")
            elif time.monotonic() >= deadline:
                outcome = TimedOut(timeout_s)
                self._replace(slot)
            if outcome is not None:
                del self._busy[slot]
                done.append((ticket, outcome))
        self._dispatch()
        return done

    def _starting(self) -> list[_Worker]:
        """The workers still starting while calls wait for a worker."""
        if not self._queue:
            return []
        return [w for s, w in enumerate(self._workers) if s not in self._busy and not w.ready]

    def connections(self) -> list[Connection]:
        """The pipes of the busy workers, and of the starting ones while calls wait: one becomes
        readable when its call completes, its worker is ready or dies (only the worker holds the
        other end), for callers waiting on several pools at once."""
        if self._paused_at is not None:
            return []
        return [self._workers[s].conn for s in self._busy] + [w.conn for w in self._starting()]

    def next_deadline(self) -> float:
        """When the first running call overruns, or a starting worker's time to start runs out
        (``time.monotonic()``; inf when none runs or starts)."""
        if self._paused_at is not None:
            return float("inf")
        deadlines = [d for *_, d in self._busy.values()] + [w.started + STARTUP_TIMEOUT for w in self._starting()]
        return min(deadlines, default=float("inf"))

    def pause(self) -> None:
        """Stop every worker and its children where they are (their deadlines stop too)."""
        if self._paused_at is None:
            self._paused_at = time.monotonic()
            for w in self._workers:
                w.signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._paused_at is None:
            return
        stopped = time.monotonic() - self._paused_at
        self._paused_at = None
        for w in self._workers:
            w.signal(signal.SIGCONT)
        self._busy = {s: (t, fn, to, d + stopped) for s, (t, fn, to, d) in self._busy.items()}
        self._dispatch()

    def map(self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], timeout: float,
            on_done: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
        """Run ``fn(*args)`` for every args tuple, at most ``size`` at a time, each within ``timeout``
        seconds; outcomes in the order of ``calls`` (``on_done`` hears each as it completes)."""
        index = {self.submit(fn, args, timeout): k for k, args in enumerate(calls)}
        results: list[Outcome | None] = [None] * len(calls)
        left = len(calls)
        others, self._unclaimed = self._unclaimed, []
        while left:
            for ticket, outcome in self.poll():
                k = index.pop(ticket, None)
                if k is None:
                    others.append((ticket, outcome))  # submitted by someone else: theirs to poll
                    continue
                results[k] = outcome
                left -= 1
                if on_done is not None:
                    on_done(k, outcome)
        self._unclaimed = others + self._unclaimed
        return results  # type: ignore[return-value]

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Outcome:
        return self.map(fn, [args], timeout)[0]

    def _replace(self, slot: int) -> None:
        self._workers[slot].kill()
        self._workers[slot] = self._spawn()

    def restart(self) -> None:
        """Replace every idle worker (after a device error that may have poisoned their state)."""
        for slot in range(len(self._workers)):
            if slot not in self._busy:
                self._replace(slot)

    def close(self) -> None:
        for w in self._workers:
            w.kill()
        self._workers = []
        self._queue.clear()
        self._busy.clear()
        self._paused_at = None

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
