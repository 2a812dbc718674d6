"""Shrinking a failing case while it keeps failing the same way, and writing it as a pytest file.

Passes, repeated until none shrinks the case any more (or the run budget is spent): drop
schedule calls (halves, then quarters, … then single calls), drop outputs and the computations
only they need, inline elementwise intermediates into their consumers, shrink extents (1, 2, 3,
half) and turn parameters into constants, and simplify expressions (a node replaced by one of
its operands of the same type or by a constant, a ``where=`` or a reduction's condition
dropped). Every candidate runs in its own process like any case; "the same way" means the same
kind of outcome, the same signal for a crash, the same exception type for an internal error.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from .programs import INDEX
from .runner import Result, fixed_job, run_one
from .spec import (
    FLOAT_DTYPES,
    Case,
    CompSpec,
    Node,
    Program,
    case_source,
    paths,
    replace_node,
    substitute,
    tensors_read,
)
from .spec import walk as walk_nodes


def signature(r: Result) -> tuple[str, ...]:
    """What must stay the same while a case shrinks."""
    if r.kind == "crash":
        return (r.kind, r.detail.split(":")[0])
    if r.kind == "internal":
        if "does not compile" in r.detail:  # the compiler's message, without line numbers
            return (r.kind, r.phase, re.sub(r"\d+", "", r.detail.split("error:", 1)[-1].strip().lower()))
        return (r.kind, r.phase, re.split(r"[:(]", r.detail)[0].strip())
    if r.kind == "hang":
        return (r.kind, r.phase)
    return (r.kind,)


def isolated(timeout: float) -> Callable[[Case], Result]:
    """Runs a case's recorded calls in its own process, as a campaign would."""
    def run(case: Case) -> Result:
        r = run_one(fixed_job(case), (case.seed, case.index), timeout)
        r.target = case.target
        return r
    return run


def minimize(case: Case, result: Result, run: Callable[[Case], Result], max_runs: int = 300,
             budget: float = 900.0, log: Callable[[str], None] = lambda msg: None) -> tuple[Case, Result]:
    """The smallest case found that fails like ``result`` (the outcome of ``case``) when ``run``
    runs it (``isolated(timeout)``), and its outcome."""
    want = signature(result)
    start = time.monotonic()
    runs = 0
    best, best_result = case, result

    def fails(candidate: Case) -> Result | None:
        nonlocal runs
        runs += 1
        r = run(candidate)
        return r if signature(r) == want else None

    def spent() -> bool:
        return runs >= max_runs or time.monotonic() - start > budget

    progress = True
    while progress and not spent():
        progress = False
        for name, candidates in (("calls", _call_candidates), ("outputs", _output_candidates),
                                 ("inline", _inline_candidates), ("extents", _extent_candidates),
                                 ("expressions", _expression_candidates)):
            for candidate in candidates(best):
                if spent():
                    break
                r = fails(candidate)
                if r is not None:
                    best, best_result = candidate.with_calls(r.calls), r
                    progress = True
                    log(f"{name}: {_size(best)} ({runs} runs)")
                    break  # candidates are drawn again from the smaller case
    log(f"minimized in {runs} runs, {time.monotonic() - start:.0f} s")
    return best, best_result


def _size(case: Case) -> str:
    nodes = sum(len(list(walk_nodes(r))) for c in case.program.comps for r in _roots(c))
    calls = sum(1 for c in case.calls if c.outcome != "refused")
    return f"{len(case.program.reachable())} computations, {nodes} nodes, {calls} calls"


def _roots(c: CompSpec) -> list[Node]:
    return [c.body] + ([c.where] if c.where is not None else [])


# --- candidates, most shrinking first ---------------------------------------------------------------

def _call_candidates(case: Case) -> Iterator[Case]:
    calls = case.calls
    if any(c.outcome == "refused" for c in calls):
        yield case.with_calls([c for c in calls if c.outcome != "refused"])
    n = len(calls)
    chunk = max(1, n // 2)
    while chunk >= 1 and n:
        for at in range(0, n, chunk):
            yield case.with_calls(calls[:at] + calls[at + chunk:])
        if chunk == 1:
            break
        chunk //= 2


def _output_candidates(case: Case) -> Iterator[Case]:
    p = case.program
    by_name = {c.name: c for c in p.comps}
    for out in p.outputs:
        producers = [t for t in tensors_read(by_name[out]) if t in by_name and t not in p.outputs]
        for outputs in ([o for o in p.outputs if o != out] + producers, [o for o in p.outputs if o != out]):
            if outputs and outputs != list(p.outputs):
                yield case.with_program(replace(p, outputs=tuple(dict.fromkeys(outputs))))


def _inline_candidates(case: Case) -> Iterator[Case]:
    p = case.program
    for c in p.reachable():
        if c.name in p.outputs or c.where is not None or any(n.op == "reduce" for n in walk_nodes(c.body)):
            continue
        body = c.body if c.dtype is None else Node("cast", (c.body,), c.dtype, c.dtype)

        def inline(n: Node, c: CompSpec = c, body: Node = body) -> Node:
            if n.op == "load" and n.attr == c.name:
                return substitute(body, dict(zip(c.axes, (inline(a) for a in n.args))))
            return replace(n, args=tuple(inline(a) for a in n.args),
                           axes=tuple((a, inline(lo), inline(hi)) for a, lo, hi in n.axes))

        comps = tuple(replace(x, body=inline(x.body), where=inline(x.where) if x.where is not None else None)
                      for x in p.comps if x is not c)
        yield case.with_program(replace(p, comps=comps))


def _extent_candidates(case: Case) -> Iterator[Case]:
    p = case.program
    for k, e in enumerate(p.extents):
        if e.param is not None:
            yield case.with_program(_with_extent(p, k, replace(e, param=None, minimum=0)))
        for v in sorted({1, 2, 3, e.value // 2, e.value - 1}):
            if 0 <= v < e.value:
                yield case.with_program(_with_extent(p, k, replace(e, value=v, minimum=min(e.minimum, v))))


def _with_extent(p: Program, k: int, e: object) -> Program:
    extents = list(p.extents)
    extents[k] = e  # type: ignore[assignment]
    return replace(p, extents=tuple(extents))


def _expression_candidates(case: Case) -> Iterator[Case]:
    p = case.program
    for ci, c in enumerate(p.comps):
        if c.where is not None:
            yield case.with_program(_with_comp(p, ci, replace(c, where=None)))
        if c.dtype is not None:
            yield case.with_program(_with_comp(p, ci, replace(c, dtype=None)))
        for path, n in paths(c.body):
            for simpler in _simpler(n):
                yield case.with_program(_with_comp(p, ci, replace(c, body=replace_node(c.body, path, simpler))))
        if c.where is not None:
            for path, n in paths(c.where):
                for simpler in _simpler(n):
                    yield case.with_program(_with_comp(p, ci, replace(c, where=replace_node(c.where, path, simpler))))


def _simpler(n: Node) -> Iterator[Node]:
    """Smaller expressions to put in place of ``n``."""
    if n.op == "reduce":
        if len(n.args) > 1:
            yield replace(n, args=n.args[:1])
        return
    if n.op in ("const", "axis", "dim") or n.dtype in ("", INDEX):
        return
    for child in n.args:
        if child.dtype == n.dtype and child.op != "reduce":
            yield child
    if n.dtype != "bool":
        yield Node("const", (), 1.0 if n.dtype in FLOAT_DTYPES else 1, n.dtype)


def _with_comp(p: Program, k: int, c: CompSpec) -> Program:
    comps = list(p.comps)
    comps[k] = c
    return replace(p, comps=tuple(comps))


# --- the test file ----------------------------------------------------------------------------------

def pytest_source(case: Case, result: Result) -> str:
    """A pytest file that runs the minimized case as a script in its own process (a crash fails the
    test, not pytest) and passes once polytile computes the right result or refuses cleanly."""
    target = "" if case.target == "cpu" else f" --target {case.target}"
    title = f"polytile fuzz --seed {case.seed} --case {case.index}{target} (minimized): {result.kind}"
    snippet = case_source(case, title)
    name = f"test_fuzz_seed{case.seed}_case{case.index}"
    detail = result.detail.replace('"""', "'''")
    return f'''"""Fuzz finding, {result.kind} at {result.phase}: {detail[:300]}

Found by `polytile fuzz --seed {case.seed} --case {case.index}` and minimized with --minimize.
"""

import subprocess
import sys

CASE = r"""
{snippet}"""


def {name}():
    proc = subprocess.run([sys.executable, "-c", CASE], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
'''

