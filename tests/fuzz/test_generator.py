"""The program and schedule generators: determinism, validity of every program, coverage of the
language, and the transactional check of primitives."""

from collections import Counter

import numpy as np
import pytest

import polytile as pt
from polytile.fuzz import inputs, programs, reference, schedules
from polytile.fuzz.execute import SCHEDULE, case_rng, generate_case, run_case
from polytile.fuzz.spec import inputs_source, program_source, walk


def _build(case):
    ns = {"pt": pt, "np": np, "inputs": inputs}
    exec(program_source(case.program), ns)
    exec(inputs_source(case.program, case.input_seed), ns)
    return ns


def test_same_seed_and_case_give_the_same_program():
    for k in range(5):
        a, b = generate_case(7, k), generate_case(7, k)
        assert program_source(a.program) == program_source(b.program)
        assert a.input_seed == b.input_seed
    assert program_source(generate_case(7, 0).program) != program_source(generate_case(7, 1).program)
    assert program_source(generate_case(7, 0).program) != program_source(generate_case(8, 0).program)


def test_every_generated_program_is_accepted_and_defined():
    """Polytile accepts every program (pt.Func and create_schedule) and the reference finds it
    defined on its inputs; together the programs cover the language."""
    seen: Counter = Counter()
    for k in range(120):
        case = generate_case(5, k)
        if case.program.malformed:
            continue
        ns = _build(case)
        s = pt.create_schedule(ns["func"])
        assert s.stage_names()
        reference.evaluate(ns["func"], ns["args"], ns["params"])
        src = program_source(case.program)
        for c in case.program.comps:
            for n in walk(c.body):
                seen[n.op] += 1
                if n.op in ("reduce", "call", "cast", "bin"):
                    seen[f"{n.op}:{n.attr}"] += 1
            seen["where"] += c.where is not None
        seen["param"] += "pt.param" in src
        seen["csr"] += "monotonic=True" in src
        seen["gather"] += "idx0" in src
        for t in case.program.inputs:
            seen[t.dtype] += 1
    for feature in ["reduce:sum", "reduce:max", "reduce:min", "reduce:prod", "select", "bin://", "bin:%",
                    "bin:/", "where", "param", "csr", "gather", "float16", "bfloat16", "int8", "uint8",
                    "int64", "float64"]:
        assert seen[feature] > 0, f"no {feature} in 120 programs: {seen}"
    assert sum(seen[f"call:{f}"] for f in ("exp", "log", "sqrt", "tanh", "sigmoid")) > 0


def test_long_integer_sums_stay_inside_their_type():
    """A sum of a body squashed to [0, 2] over 17 x 17 terms does not fit uint8: the generator takes
    a max instead (seed 101 case 163 made a uint8 sum reach 264, an invalid program)."""
    case = generate_case(101, 163)
    ns = _build(case)
    reference.evaluate(ns["func"], ns["args"], ns["params"])
    assert "pt.max(" in program_source(case.program)


def test_negated_condition_on_constants_is_a_python_not():
    """A where= read at a constant index negates a condition on constants: rendered with ``~`` it
    was the int -1, and pt.select refused the program (seed 7 case 623: an invalid program)."""
    case = generate_case(7, 623)
    assert "(not (0 >= 10))" in program_source(case.program)
    ns = _build(case)
    reference.evaluate(ns["func"], ns["args"], ns["params"])


def test_schedule_calls_are_deterministic():
    def calls(k):
        case = generate_case(9, k)
        ns = _build(case)
        s = pt.create_schedule(ns["func"])
        ns["s"] = s
        out = []
        schedules.generate_calls(case_rng(9, k, SCHEDULE), s, ns,
                                 lambda text, applied: out.append((text, applied.outcome)) or True)
        return out

    for k in range(4):
        assert calls(k) == calls(k)


def test_refused_primitive_leaves_the_schedule_as_it_was():
    A = pt.placeholder((8, 8), "float32", "A")
    T = pt.compute((8, 8), lambda i, j: A[i, j] * 2.0, "T")
    U = pt.compute((8, 8), lambda i, j: T[j, i] + 1.0, "U")
    s = pt.create_schedule(pt.Func([A], [U]))
    ns = {"s": s, "pt": pt}
    before = schedules.snapshot(s)
    assert schedules.apply(s, 's["U"].after(s["T"], "j")', ns).outcome == "refused"
    assert schedules.snapshot(s) == before
    assert schedules.apply(s, 's["U"].split("i", 3)', ns).outcome == "accepted"
    assert schedules.snapshot(s) != before
    assert schedules.apply(s, 's["U"].nonsense()', ns).outcome == "internal"


def test_a_schedule_change_a_refusal_leaves_behind_is_caught(monkeypatch):
    """The snapshot sees a refused primitive that changed the state (a non-transactional one)."""
    A = pt.placeholder((8,), "float32", "A")
    T = pt.compute((8,), lambda i: A[i] * 2.0, "T")
    s = pt.create_schedule(pt.Func([A], [T]))

    def leaky_split(self, loop, factor):
        self.state.tags["i"] = "unroll"
        raise pt.ScheduleError("refused")

    monkeypatch.setattr(pt.Stage, "split", leaky_split)
    applied = schedules.apply(s, 's["T"].split("i", 2)', {"s": s})
    assert applied.outcome == "non-transactional"


@pytest.mark.parametrize("dtype", ["float32", "int8", "uint8", "float16"])
def test_intervals_keep_values_inside_their_type(dtype):
    rng = np.random.default_rng(0)
    gen = programs.ProgramGenerator(rng)
    gen.theme = dtype
    pool = [gen.new_extent(7, allow_param=False), gen.new_extent(5, allow_param=False)]
    gen.add_input("A", (programs.Dim(pool[0]), programs.Dim(pool[1])), dtype)
    for _ in range(30):
        scope = programs.Scope([programs.Axis("i", programs.Dim(pool[0]), True)], list(gen.sources), 3)
        _, iv = gen.value_expr(dtype, scope)
        assert programs.fits(iv, dtype), iv


def test_malformed_programs_are_refused():
    """Some programs are malformed on purpose; the ones polytile refuses today end as "ok"."""
    kinds: dict[str, int] = {}
    for k in range(600):
        case = generate_case(3, k)
        what = case.program.malformed
        if what in ("missing-input", "out-of-bounds") and what not in kinds:
            outcome = run_case(case, lambda event: None, draw_schedule=True)
            assert (outcome.kind, outcome.detail.split(":")[0]) == ("ok", f"{what} refused"), outcome
            kinds[what] = k
    assert set(kinds) == {"missing-input", "out-of-bounds"}
