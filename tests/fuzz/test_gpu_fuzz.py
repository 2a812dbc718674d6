"""``polytile fuzz --target cuda``: GPU schedules drawn, lowered, run on the block emulator and checked;
a planted miscompile is found."""

import re

import numpy as np
import pytest

import polytile as pt
from polytile.fuzz import emulator, execute, gpu_schedules, reference, runner
from polytile.fuzz.execute import SCHEDULE, case_rng, generate_case, run_case
from polytile.fuzz.spec import Call, case_source, program_source
from polytile.lowering.passes import allreduce


def _drawn_calls(seed: int, index: int) -> list[str]:
    case = generate_case(seed, index, "cuda")
    ns = {"pt": pt, "np": np}
    exec(program_source(case.program), ns)
    s = pt.create_schedule(ns["func"])
    texts: list[str] = []

    def on_call(text: str, applied: object) -> bool:
        texts.append(text)
        return True
    gpu_schedules.generate_calls(case_rng(seed, index, SCHEDULE), s, ns, on_call)
    return texts


def test_generator_maps_loops_onto_blocks_and_threads():
    cases = [_drawn_calls(1, index) for index in range(40)]
    joined = "\n".join(t for texts in cases for t in texts)
    for want in ('"blockIdx.x"', '"blockIdx.y"', '"threadIdx.x"', '"threadIdx.y"', "reassociate()", 'loc="shared"',
                 'loc="local"', "unroll("):
        assert want in joined, want
    assert ".parallel(" not in joined  # a CPU tag
    # each stage's block: the split factors whose inner loop is bound to threadIdx, at most 1024 threads
    most = 0
    for texts in cases:
        calls = "\n".join(texts)
        threads: dict[str, int] = {}
        for m in re.finditer(r's\["(\w+)"\]\.split\("\w+", (\d+), "\w+", "(\w+)"\)', calls):
            if f's["{m[1]}"].bind("{m[3]}", "threadIdx.' in calls:
                threads[m[1]] = threads.get(m[1], 1) * int(m[2])
        most = max(most, *threads.values(), 0)
    assert 256 <= most <= gpu_schedules.BLOCK_THREADS


def test_a_small_cuda_campaign_runs_clean(monkeypatch):
    monkeypatch.setattr(execute, "NVCC", False)  # nvcc's ~2 s a case: the campaign's, not CI's
    summary = runner.campaign(1, cases=4, first=5, jobs=2, timeout=120, target="cuda")
    assert summary.cases == 4 and not summary.findings, [f.detail for f in summary.findings]
    assert summary.counts["ok"] >= 1
    assert all(f.replay_command().endswith("--target cuda") for f in summary.others)


# case 98 of seed 1: T[i, j] = sum over k, under the lead's schedule of 31a2c35 (a K loop bound to the
# lanes with the output's columns inside it)
INSIDE_THE_TREE = ['s["T"].reassociate()', 's["T"].split("j", 2, "jo", "jv")', 's["T"].bind("jo", "blockIdx.x")',
                   's["T"].split("k", 4, "ko", "kt")', 's["T"].bind("kt", "threadIdx.x")',
                   's["T"].reorder("jo", "kt", "ko", "i", "jv")']


def test_planted_cross_thread_miscompile_is_found(monkeypatch):
    case = generate_case(1, 98, "cuda").with_calls([Call(t) for t in INSIDE_THE_TREE])
    out = run_case(case, lambda event: None, draw_schedule=False)
    assert (out.kind, out.phase) == ("refused-late", "lower") and "chosen by loop(s) i, jv" in out.detail
    monkeypatch.setattr(allreduce, "_bound_inside", lambda s: set())  # the check of 31a2c35 away
    out = run_case(case, lambda event: None, draw_schedule=False)
    assert out.kind == "miscompile", out


def test_cuda_replay_script_lowers_and_emulates(capsys):
    calls = [*INSIDE_THE_TREE[:-1], 's["T"].reorder("jo", "i", "jv", "kt", "ko")']  # one element per tree
    case = generate_case(1, 98, "cuda").with_calls([Call(t) for t in calls])
    text = case_source(case)
    assert 'low = pt.lower(s, "cuda:sm_90a")' in text and "emulator.run(low, [*args, *outs], params)" in text
    exec(text, {})
    assert capsys.readouterr().out.strip().endswith("ok")


def test_emulator_negation_and_parameters():
    # seed 1 case 8, minimized: the emulator took `!c` for `c` (a select stored through pt_store_pair)
    N = pt.param("N")
    U = pt.compute((N, 1), lambda i, j: pt.select(~((j + i) < 1), 1.0, 2.0), "U")
    func = pt.Func([], [U], constraints=[N >= 1])
    s = pt.create_schedule(func)
    s["U"].split("i", 4, "i_b", "i_t").bind("i_b", "blockIdx.x").bind("i_t", "threadIdx.x")
    low = pt.lower(s, "cuda:sm_90a")
    for n in (1, 7):
        (u,) = emulator.run(low, [np.full((n, 1), np.nan, np.float32)], {"N": n})
        reference.check(func, [], [u], {"N": n})


def test_emulator_refuses_what_it_does_not_cover():
    from polytile import dtypes
    from polytile.lowering import loopir as ir
    fence = ir.Evaluate(ir.Call("pt_fence_proxy_async", (), dtypes.int32))
    kernel = ir.Kernel("k", (ir.const(2), ir.const(1), ir.const(1)), (32, 1, 1), fence)
    with pytest.raises(NotImplementedError, match="pt_fence_proxy_async"):
        emulator.run(ir.LoweredFunc("f", [], [], kernel), [])


def test_emulator_keeps_a_threads_arrays_apart_and_typed():
    # seed 2 cases 281, 317 (an array in "auto" memory is a thread's own, as the CUDA printer makes it)
    # and 314 (a declared int32 register used as an index was a float64 zero)
    A = pt.placeholder((16, 4), "float32", "A")
    idx = pt.placeholder((9,), "int32", "idx", value_range=(0, 15))
    k = pt.reduce_axis(4, "k")
    T = pt.compute((9,), lambda i: pt.sum(A[idx[i], k], axis=k), "T")
    s = pt.create_schedule(pt.Func([A, idx], [T]))
    s["T"].split("i", 4, "i_b", "i_t").bind("i_b", "blockIdx.x").bind("i_t", "threadIdx.x")
    s["T"].cache("idx", "i_t", loc="auto")
    low = pt.lower(s, "cuda:sm_90a")
    assert "var idx_T_local" in str(low)
    rng = np.random.default_rng(2)
    a, ix = rng.standard_normal((16, 4)).astype(np.float32), rng.integers(0, 16, 9).astype(np.int32)
    (t,) = emulator.run(low, [a, ix, np.full(9, np.nan, np.float32)])
    np.testing.assert_allclose(t, a[ix].astype(np.float64).sum(1), rtol=1e-6)
    s = pt.create_schedule(pt.Func([A, idx], [T]))
    s["T"].split("i", 4, "i_b", "i_t").bind("i_b", "blockIdx.x").bind("i_t", "threadIdx.x")
    s["T"].cache_identity("A", "i_t", loc="auto")
    low = pt.lower(s, "cuda:sm_90a")
    assert "in auto" in str(low)
    (t,) = emulator.run(low, [a, ix, np.full(9, np.nan, np.float32)])
    np.testing.assert_allclose(t, a[ix].astype(np.float64).sum(1), rtol=1e-6)
