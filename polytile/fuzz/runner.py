"""Running fuzz cases in isolated processes, and whole fuzzing campaigns.

The fuzzing process is a fork server: it imports polytile once and forks one child per case, up to
``jobs`` at a time; a case that kills its process (a signal), hangs past the time limit or leaves
without a result costs only that child. Children report their progress (phases and schedule
calls) over a pipe, so a crash or hang is attributed to a phase and comes with the calls that led
to it. Children run in their own process group (a hung compiler is killed with them), without
core dumps, with a memory limit, two OpenMP threads that do not spin, and a private kernel cache.
"""

from __future__ import annotations

import faulthandler
import json
import os
import resource
import selectors
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import IO

from ..runtime.cpu import compile_flags, compiler
from .execute import FINDINGS, Outcome, Report, generate_case, run_case
from .spec import Call, Case

MEMORY_LIMIT = 6 << 30
"""Address space of one case's process: a runaway allocation ends the case, not the machine."""


@dataclass
class Result:
    """What one case did: its outcome, the calls it ran, and how long it took."""

    seed: int
    index: int
    kind: str
    phase: str = ""
    detail: str = ""
    calls: list[Call] = field(default_factory=list)
    seconds: float = 0.0
    target: str = "cpu"

    @property
    def is_finding(self) -> bool:
        return self.kind in FINDINGS

    def replay_command(self) -> str:
        target = "" if self.target == "cpu" else f" --target {self.target}"
        return f"polytile fuzz --seed {self.seed} --case {self.index}{target}"


Job = Callable[[Report], Outcome]


@dataclass
class _Child:
    key: tuple[int, int]
    pid: int
    fd: int
    started: float
    log: IO[bytes]  # the child's stdout and stderr
    data: bytearray = field(default_factory=bytearray)


class Pool:
    """Up to ``jobs`` cases at once, each in a forked child limited to ``timeout`` seconds."""

    def __init__(self, jobs: int, timeout: float):
        compile_flags(compiler())  # the compiler's defects probed once here, not in every child
        self.jobs = max(1, jobs)
        self.timeout = timeout
        self.children: dict[int, _Child] = {}
        self.selector = selectors.DefaultSelector()

    @property
    def free(self) -> int:
        return self.jobs - len(self.children)

    def start(self, key: tuple[int, int], job: Job) -> None:
        log = tempfile.TemporaryFile()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(job, w, log.fileno())
        os.close(w)
        os.set_blocking(r, False)
        child = _Child(key, pid, r, time.monotonic(), log)
        self.children[r] = child
        self.selector.register(r, selectors.EVENT_READ, child)

    def finished(self, wait: float = 0.5) -> list[Result]:
        """Results of the children that finished (or were stopped) within about ``wait`` seconds."""
        done: list[Result] = []
        for key, _ in self.selector.select(wait):
            child: _Child = key.data
            chunk = _read(child.fd)
            if chunk:
                child.data += chunk
            elif chunk == b"":
                done.append(self._finish(child, hung=False))
        now = time.monotonic()
        for child in list(self.children.values()):
            if now - child.started > self.timeout:
                _kill(child.pid)
                done.append(self._finish(child, hung=True))
        return done

    def _finish(self, child: _Child, hung: bool) -> Result:
        self.selector.unregister(child.fd)
        del self.children[child.fd]
        _, status = os.waitpid(child.pid, 0)
        os.set_blocking(child.fd, True)  # the writer is gone: reads end at the pipe's end
        while rest := os.read(child.fd, 1 << 16):
            child.data += rest
        os.close(child.fd)
        seconds = time.monotonic() - child.started
        events = _events(child.data)
        calls = [Call(e["call"], e["outcome"], e.get("detail", "")) for e in events if "call" in e]
        phase = next((e["phase"] for e in reversed(events) if "phase" in e), "start")
        ended = next((e["result"] for e in events if "result" in e), None)
        child.log.seek(0, os.SEEK_END)
        child.log.seek(max(0, child.log.tell() - 600))
        tail = child.log.read().decode(errors="replace").strip()
        child.log.close()
        seed, index = child.key
        if hung:
            out = Outcome("hang", phase, f"no result after {self.timeout:g} s")
        elif ended is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            out = Outcome(**ended)
        elif os.WIFSIGNALED(status):
            sig = signal.Signals(os.WTERMSIG(status)).name
            out = Outcome("crash", phase, f"killed by {sig}" + (f": {tail[-300:]}" if tail else ""))
        else:
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
            said = f": {tail[-300:]}" if tail else ""
            out = Outcome("crash", phase, f"exited with code {code} and no result{said}")
        return Result(seed, index, out.kind, out.phase, out.detail, calls, seconds)

    def close(self) -> None:
        for child in list(self.children.values()):
            _kill(child.pid)
            self._finish(child, hung=True)
        self.selector.close()


def _events(data: bytearray) -> list[dict]:
    """The child's events; a line cut short by its death is dropped."""
    out = []
    for line in data.decode(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _read(fd: int) -> bytes | None:
    """What the pipe holds: bytes, b"" at its end, None when nothing is there yet."""
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _child(job: Job, fd: int, log_fd: int) -> None:
    """The body of a case's process: never returns."""
    code = 0
    try:
        faulthandler.disable()  # a crash is the parent's to report, not a traceback on its terminal
        os.setpgid(0, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
        os.environ.update({"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "passive", "LIBC_FATAL_STDERR_": "1"})
        pipe = os.fdopen(fd, "w", buffering=1)

        def report(event: dict) -> None:
            pipe.write(json.dumps(event) + "\n")
            pipe.flush()

        try:
            outcome = job(report)
        except Exception as err:  # noqa: BLE001 - the fuzzer's own failure, reported as such
            from .schedules import describe
            outcome = Outcome("invalid", "fuzzer", f"the fuzzer failed: {describe(err)}")
        report({"result": asdict(outcome)})
    except BaseException:  # noqa: BLE001 - the process must end here whatever happened
        code = 3
    finally:
        os._exit(code)


def case_job(seed: int, index: int, target: str = "cpu") -> Job:
    """Case ``index`` of ``seed`` for ``target``, schedule drawn as it runs."""
    return lambda report: run_case(generate_case(seed, index, target), report, draw_schedule=True)


def fixed_job(case: Case) -> Job:
    """``case`` with its recorded calls (replayed, not drawn)."""
    return lambda report: run_case(case, report, draw_schedule=False)


class kernel_cache:  # noqa: N801 - a context manager used like a function
    """A private, temporary ``POLYTILE_CACHE_DIR`` for the cases' kernels."""

    def __enter__(self) -> str:
        self.old = os.environ.get("POLYTILE_CACHE_DIR")
        self.path = tempfile.mkdtemp(prefix="polytile-fuzz-")
        os.environ["POLYTILE_CACHE_DIR"] = self.path
        return self.path

    def __exit__(self, *exc: object) -> None:
        if self.old is None:
            os.environ.pop("POLYTILE_CACHE_DIR", None)
        else:
            os.environ["POLYTILE_CACHE_DIR"] = self.old
        shutil.rmtree(self.path, ignore_errors=True)


def run_one(job: Job, key: tuple[int, int], timeout: float) -> Result:
    """One job in an isolated child; its result."""
    pool = Pool(1, timeout)
    with kernel_cache():
        pool.start(key, job)
        try:
            while True:
                done = pool.finished()
                if done:
                    return done[0]
        finally:
            pool.close()


@dataclass
class Summary:
    """Counts of a campaign: cases by outcome, primitives applied and refused, time."""

    counts: Counter = field(default_factory=Counter)
    primitives: int = 0
    refused: int = 0
    seconds: float = 0.0
    findings: list[Result] = field(default_factory=list)
    others: list[Result] = field(default_factory=list)  # refused late, or invalid (the fuzzer's fault)
    by_primitive: Counter = field(default_factory=Counter)  # (primitive, outcome) -> calls
    not_emulated: Counter = field(default_factory=Counter)  # what the block emulator lacked -> cases

    @property
    def cases(self) -> int:
        return sum(self.counts.values())

    def add(self, r: Result) -> None:
        self.counts[r.kind] += 1
        self.primitives += len(r.calls)
        self.refused += sum(1 for c in r.calls if c.outcome == "refused")
        for c in r.calls:
            self.by_primitive[(c.text.split("].")[-1].split("(")[0], c.outcome)] += 1
        if r.is_finding:
            self.findings.append(r)
        elif r.kind == "not-emulated":
            self.not_emulated[r.detail.split(":")[0]] += 1
        elif r.kind != "ok":
            self.others.append(r)

    def line(self) -> str:
        c = self.counts
        accepted = c["ok"] + sum(1 for f in self.findings if f.phase in ("run", "check"))
        rate = self.cases / self.seconds if self.seconds else 0.0
        return (f"cases {self.cases}, accepted {accepted}, refused {self.refused} of {self.primitives} primitives, "
                f"refused-late {c['refused-late']}, miscompiles {c['miscompile']}, crashes {c['crash']}, "
                f"hangs {c['hang']}, internal {c['internal']}, invalid {c['invalid']}"
                + (f", not emulated {c['not-emulated']}" if c["not-emulated"] else "")
                + f" ({self.seconds:.0f} s, {rate:.2f} cases/s)")

    def rate_per_core(self, jobs: int) -> float:
        """Cases per minute and per core busy (``jobs`` cases at once, at most one per CPU)."""
        cores = max(1, min(jobs, os.cpu_count() or 1))
        return self.cases / (self.seconds / 60) / cores if self.seconds else 0.0

    def to_json(self) -> dict:
        return {"cases": self.cases, "counts": dict(self.counts), "primitives": self.primitives,
                "refused_primitives": self.refused, "seconds": round(self.seconds, 1),
                "by_primitive": {f"{p} {o}": n for (p, o), n in sorted(self.by_primitive.items())},
                "not_emulated": dict(self.not_emulated.most_common()),
                "findings": [asdict(f) for f in self.findings], "others": [asdict(f) for f in self.others]}


def campaign(seed: int, cases: int | None = None, budget: float | None = None, first: int = 0, jobs: int = 2,
             timeout: float = 60.0, on_result: Callable[[Result], None] | None = None,
             target: str = "cpu") -> Summary:
    """Run cases ``first``, ``first + 1``, … of ``seed`` for ``target``: ``cases`` of them, or as many
    as start within ``budget`` seconds (the ones running then are finished)."""
    summary = Summary()
    start = time.monotonic()
    pool = Pool(jobs, timeout)
    index = first
    with kernel_cache():
        try:
            while True:
                more = (cases is None or index < first + cases) and (
                    budget is None or time.monotonic() - start < budget)
                while more and pool.free:
                    pool.start((seed, index), case_job(seed, index, target))
                    index += 1
                    more = (cases is None or index < first + cases) and (
                        budget is None or time.monotonic() - start < budget)
                if not pool.children and not more:
                    break
                for r in pool.finished():
                    r.target = target
                    summary.add(r)
                    if on_result is not None:
                        on_result(r)
        finally:
            pool.close()
    summary.seconds = time.monotonic() - start
    return summary

