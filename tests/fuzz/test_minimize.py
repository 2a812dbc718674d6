"""The minimizer keeps what makes a case fail and drops the rest; its pytest file runs the case."""

import numpy as np

from polytile.fuzz import minimize
from polytile.fuzz.runner import Result
from polytile.fuzz.spec import Call, Case, program_source, walk


def _case():
    from polytile.fuzz.execute import generate_case
    for k in range(200):  # a program with at least two computations, one of them reading exp()
        case = generate_case(21, k)
        comps = case.program.reachable()
        if len(comps) >= 2 and "pt.exp(" in program_source(case.program):
            return case
    raise AssertionError("no program with exp() among 200")


def test_minimizer_keeps_the_failing_part():
    """A fake failure: the case "fails" while its program calls exp() and its schedule splits."""
    case = _case()
    case = case.with_calls([Call('s["T"].parallel("i")'), Call('s["T"].split("i", 4)'),
                            Call('s["T"].fuse("i", "j")', "refused"), Call('s["T"].unroll("i")')])
    runs = []

    def fake_run(c):
        runs.append(c)
        bad = "pt.exp(" in program_source(c.program) and any(".split(" in x.text for x in c.calls)
        return Result(c.seed, c.index, "miscompile" if bad else "ok", "check", "", list(c.calls))

    first = fake_run(case)
    small, result = minimize.minimize(case, first, fake_run, max_runs=2000)
    assert result.kind == "miscompile"
    assert [c.text for c in small.calls] == ['s["T"].split("i", 4)']
    assert "pt.exp(" in program_source(small.program)
    nodes = lambda c: sum(len(list(walk(x.body))) for x in c.program.reachable())  # noqa: E731
    assert nodes(small) < nodes(case)
    assert len(small.program.reachable()) <= len(case.program.reachable())
    assert all(e.value <= f.value for e, f in zip(small.program.extents, case.program.extents))


def test_signature_separates_ways_of_failing():
    r = lambda kind, phase, detail: Result(0, 0, kind, phase, detail)  # noqa: E731
    assert minimize.signature(r("crash", "run", "killed by SIGSEGV")) != minimize.signature(
        r("crash", "run", "killed by SIGFPE"))
    assert minimize.signature(r("internal", "build", "KeyError: 'U_local' (at x)")) == minimize.signature(
        r("internal", "build", "KeyError: 'T_local' (at y)"))
    assert minimize.signature(r("miscompile", "check", "a")) == minimize.signature(r("miscompile", "check", "b"))


def test_pytest_file_runs_the_case(tmp_path):
    case = Case(0, 0, _case().program, 5, [])
    text = minimize.pytest_source(case, Result(0, 0, "miscompile", "check", "output T: 1 of 4 wrong"))
    compile(text, "test_x.py", "exec")
    ns: dict = {}
    exec(compile(text, "test_x.py", "exec"), ns)
    assert "test_fuzz_seed0_case0" in ns and 'kern = pt.build(s)' in ns["CASE"]
    np.testing.assert_equal(ns["CASE"].count("reference.check("), 1)


def test_compile_errors_keep_their_message():
    r = lambda detail: Result(0, 0, "internal", "build", detail)  # noqa: E731
    a = r("generated code does not compile: kernel.cpp:43:22: error: ‘INFINITYf’ was not declared in this scope")
    b = r("generated code does not compile: kernel.cpp:50:9: error: ‘INFINITYf’ was not declared in this scope")
    c = r("generated code does not compile: cc.s:85: Error: unsupported masking for `vmovsh'")
    assert minimize.signature(a) == minimize.signature(b) != minimize.signature(c)
