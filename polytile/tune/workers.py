"""Isolated worker processes: a crash, a hang or a stuck call in one costs that call, never the caller.

Each worker is a fresh interpreter serving calls over a pipe. ``WorkerPool.map`` hands calls to idle
workers and waits with a deadline per call; a worker that dies (segfault, abort) or overruns its
deadline is killed with everything it started (compilers), its call reported as
``Crashed``/``TimedOut``, and a new worker takes its place. Calls are module-level functions, pickled
by name.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe, wait
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


@dataclass
class Unloadable:
    """The worker could not unpickle the call (its function or an argument is missing there)."""

    message: str


Outcome = Returned | Raised | Crashed | TimedOut


# --- the worker's side ---------------------------------------------------------------------------------

BOOT = ("import sys\n"
        "from multiprocessing.connection import Connection\n"
        "conn = Connection(int(sys.argv[1]))\n"
        "setup = conn.recv()\n"  # plain data: reading it needs nothing but the standard library
        "sys.path[:] = setup['sys_path']\n"
        "from polytile.tune.workers import serve\n"
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
                result = Raised(type(err).__name__, text, expected)
        try:
            conn.send(result)
        except (BrokenPipeError, OSError):
            return


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
    def __init__(self, env: dict[str, str]):
        self.conn, child = Pipe()
        self.proc = subprocess.Popen([sys.executable, "-c", BOOT, str(child.fileno())],
                                     pass_fds=(child.fileno(),), env={**os.environ, **env},
                                     stdin=subprocess.DEVNULL, process_group=0)
        child.close()
        self.conn.send({"sys_path": list(sys.path), "argv": list(sys.argv), "main": _main_module(),
                        "parent": os.getpid()})
        self.ready = False

    def wait_ready(self) -> bool:
        """Wait for the worker's first message; False if it died or never started."""
        if not self.ready:
            try:
                self.ready = self.conn.poll(STARTUP_TIMEOUT) and self.conn.recv() == "ready"
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
    """``size`` worker processes started lazily with extra environment ``env``."""

    def __init__(self, size: int, env: dict[str, str] | None = None):
        check_not_loading_main()
        self.size = max(1, size)
        self.env = dict(env or {})
        self._workers: list[_Worker] = []

    def _spawn(self) -> _Worker:
        return _Worker(self.env)

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
                        raise TuneError(f"a worker process failed to start (exit code {w.kill()}); "
                                        "run `python -c 'import polytile'` to see why")
                    k = pending.pop(0)
                    try:
                        w.send(fn, calls[k])
                    except (BrokenPipeError, OSError):
                        self._replace(slot)
                        pending.insert(0, k)
                        continue
                    busy[slot] = (k, time.monotonic() + timeout)
            if not busy:
                continue
            now = time.monotonic()
            next_deadline = min(d for _, d in busy.values())
            # a worker's pipe closes when it dies (only the worker holds its end): one handle each
            ready = wait([self._workers[s].conn for s in busy], timeout=max(0.0, next_deadline - now))
            for slot in list(busy):
                w = self._workers[slot]
                k, deadline = busy[slot]
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
