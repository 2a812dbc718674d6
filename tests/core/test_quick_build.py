"""Quick builds (``polytile.toolchain.quick_builds``): the shortcuts that make a build cheaper and
leave its kernel the same — the generated C++'s includes precompiled once per compiler and flags
(``runtime.cpu.precompiled_prelude``), and no second legality check of a schedule state that passed
(``Schedule.check``, with the polyhedral program's maps remembered by loop schedule). Every test
compares against the builds of before (``POLYTILE_QUICK_BUILD=0``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import polytile as pt
from polytile import toolchain
from polytile.build import lower
from polytile.codegen.cpu import cpu_source
from polytile.errors import ScheduleError
from polytile.poly.program import PolyProgram
from polytile.runtime import cpu
from polytile.tune import MeasureOptions, make_task
from polytile.tune.measure import Measurer, build_candidate


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(toolchain.QUICK_BUILD_VARIABLE, raising=False)
    return tmp_path / "cache"


def _quick(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    monkeypatch.setenv(toolchain.QUICK_BUILD_VARIABLE, "1" if on else "0")


def _matmul(n: int = 48) -> pt.Func:
    A = pt.placeholder((n, n), "float32", "A")
    B = pt.placeholder((n, n), "float32", "B")
    k = pt.reduce_axis((0, n), "k")
    C = pt.compute((n, n), lambda i, j: pt.sum(A[i, k] * B[k, j], axis=k), "C")
    return pt.Func([A, B], [C])


def _tiled(func: pt.Func) -> pt.Schedule:
    s = pt.Schedule(func)
    st = s["C"]
    st.split("i", 8, "io", "ii").split("j", 16, "jo", "ji").split("ji", 8, "jv", "jl")
    st.reorder("io", "jo", "k", "ii", "jv", "jl")
    st.cache("A", "io")
    st.cache_write("ii")
    st.unroll("jv").vectorize("jl").parallel("io")
    return s


def _gcc_only() -> str:
    cxx = cpu.compiler()
    if not cpu.is_gcc(cxx):
        pytest.skip("precompiled headers are used with GCC only")
    return cxx


def test_the_prelude_precompiled_gives_the_same_assembly(tmp_path: Path) -> None:
    cxx = _gcc_only()
    source = cpu_source(lower(_tiled(_matmul())))
    flags = cpu.compile_flags(cxx)
    prelude = cpu.precompiled_prelude(cxx, flags)
    assert prelude is not None and prelude.with_name(prelude.name + ".gch").exists()
    src = tmp_path / "kernel.cpp"
    src.write_text(source)
    asm = [flag for flag in flags if flag != "-shared"] + ["-S", str(src), "-o"]
    subprocess.run([cxx, *asm, str(tmp_path / "plain.s")], check=True)
    subprocess.run([cxx, *asm, str(tmp_path / "quick.s"), "-include", str(prelude), "-Winvalid-pch"],
                   check=True, capture_output=True, text=True)
    assert (tmp_path / "quick.s").read_text() == (tmp_path / "plain.s").read_text()


def test_a_kernel_built_quickly_is_correct_and_cached_under_the_same_key(
        fresh_cache: Path, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    _gcc_only()
    a, b = rng.standard_normal((2, 48, 48), dtype=np.float32)
    _quick(monkeypatch, False)
    plain = pt.build(_tiled(_matmul()))
    assert not list(fresh_cache.glob("pt_prelude_*"))  # the builds of before make no header
    plain.path.unlink()
    _quick(monkeypatch, True)
    quick = pt.build(_tiled(_matmul()))
    assert quick.path == plain.path
    assert list(fresh_cache.glob("pt_prelude_*.h.gch"))
    np.testing.assert_allclose(quick(a, b), a @ b, rtol=1e-4, atol=1e-4)


def test_a_compiler_that_cannot_precompile_builds_as_before(monkeypatch: pytest.MonkeyPatch,
                                                             rng: np.random.Generator) -> None:
    monkeypatch.setattr(cpu, "is_gcc", lambda cxx: False)
    assert cpu.precompiled_prelude(cpu.compiler(), cpu.compile_flags(cpu.compiler())) is None
    a, b = rng.standard_normal((2, 48, 48), dtype=np.float32)
    np.testing.assert_allclose(pt.build(_tiled(_matmul()))(a, b), a @ b, rtol=1e-4, atol=1e-4)


def _count_violation_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    original = PolyProgram.violation

    def counted(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PolyProgram, "violation", counted)
    return calls


@pytest.mark.parametrize("quick", [True, False])
def test_a_tag_does_not_check_the_loop_order_again(monkeypatch: pytest.MonkeyPatch, quick: bool) -> None:
    _quick(monkeypatch, quick)
    s = pt.Schedule(_matmul())
    calls = _count_violation_checks(monkeypatch)
    s["C"].split("j", 16, "jo", "ji")
    assert calls[0] == 1  # a new loop schedule: checked
    s["C"].unroll("ji")
    assert calls[0] == (1 if quick else 2)  # the same loops, statics and buffers: known legal
    s["C"].reorder("i", "jo", "k", "ji")
    assert calls[0] == (2 if quick else 3)


def test_quick_checks_still_refuse_what_breaks_a_dependence(monkeypatch: pytest.MonkeyPatch) -> None:
    _quick(monkeypatch, True)
    s = pt.Schedule(_matmul())
    s["C"].split("i", 8, "io", "ii").unroll("ii")
    with pytest.raises(ScheduleError, match="cannot be parallel"):
        s["C"].parallel("k")  # carries the reduction
    with pytest.raises(ScheduleError, match="cannot be parallel"):
        s["C"].parallel("k")  # a refused state is not remembered as checked
    s["C"].parallel("io")
    s["C"].parallel("io")  # the same tag again: checked once, known since
    A = pt.placeholder((16,), "float32", "A")
    B = pt.compute((16,), lambda i: A[i] + 1, "B")
    C = pt.compute((16,), lambda i: B[i] * 2, "C")
    s2 = pt.Schedule(pt.Func([A], [C]))
    s2["C"].unroll("i")
    with pytest.raises(ScheduleError, match="breaks a dependence"):
        s2["C"].before("B")


@pytest.mark.parametrize("seed", [0, 1])
def test_a_template_gives_the_same_code_either_way(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    task = make_task("matmul", "cpu", M=64, N=80, K=48)
    configs = [task.space.config(d).values for d in task.space.sample_valid(np.random.default_rng(seed), 3)]
    sources = {}
    for quick in (False, True):
        _quick(monkeypatch, quick)
        sources[quick] = [cpu_source(lower(task.schedule(v), task.target)) for v in configs]
    assert sources[True] == sources[False]


@pytest.mark.parametrize("quick", [True, False])
def test_the_measure_option_reaches_the_build(fresh_cache: Path, quick: bool) -> None:
    _gcc_only()
    task = make_task("matmul", "cpu", M=32, N=32, K=32)
    values = task.space.config_at(0).values
    build_candidate(task, values, False, quick)
    assert bool(list(fresh_cache.glob("pt_prelude_*.h.gch"))) == quick
    assert toolchain.QUICK_BUILD_VARIABLE not in os.environ  # put back after the build


def test_the_batch_path_of_before_and_the_quick_stream_measure_alike(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task = make_task("matmul", "cpu", M=32, N=32, K=32)
    batch = [task.space.config_at(k).values for k in range(2)]
    opts = dict(builders=1, result_cache=False, retime=0, repeat=1, min_time=0.0)
    for quick in (False, True):
        cache = tmp_path / f"cache-{quick}"
        monkeypatch.setenv("POLYTILE_CACHE_DIR", str(cache))  # the workers' build cache
        with Measurer(MeasureOptions(overlap=quick, quick_build=quick, **opts)) as m:
            results = m.measure(task, batch)
        assert [r.status for r in results] == ["ok", "ok"]
        assert bool(list(cache.glob("pt_prelude_*.h.gch"))) == (quick and cpu.is_gcc(cpu.compiler()))


TEMPLATE_SAMPLES = [  # operator, sizes (odd ones: partial tiles), configurations drawn, seed
    ("matmul", dict(M=512, N=512, K=512), 3, 0),
    ("matmul", dict(M=61, N=67, K=45), 4, 1),
    ("matmul", dict(M=97, N=61, K=33), 3, 2),
    ("batch_matmul", dict(batch=3, M=37, N=50, K=29), 3, 3),
    ("dense", dict(M=5, N=67, K=45), 3, 4),
    ("conv2d", dict(N=1, C=8, H=13, W=11, K=16, R=3, S=3, padding=1), 3, 5),
]


@pytest.mark.parametrize("op, shape, n, seed", TEMPLATE_SAMPLES,
                         ids=[f"{op}-{'x'.join(str(v) for v in s.values())}" for op, s, _, _ in TEMPLATE_SAMPLES])
def test_templates_with_full_tiles_separated_give_the_same_code_either_way(
        monkeypatch: pytest.MonkeyPatch, op: str, shape: dict, n: int, seed: int) -> None:
    task = make_task(op, "cpu", **shape)
    configs = [task.space.config(d).values for d in task.space.sample_valid(np.random.default_rng(seed), n)]
    if any(d.name == "separate" for d in task.space.decisions):
        configs = [{**v, "separate": True} for v in configs]
    sources = {}
    for quick in (False, True):
        _quick(monkeypatch, quick)
        sources[quick] = [cpu_source(lower(task.schedule(v), task.target)) for v in configs]
    assert sources[True] == sources[False]


def _count_instance_orders(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import islpy as isl
    calls = [0]
    original = isl.UnionMap.lex_ge_union_map

    def counted(self, other):  # noqa: ANN001, ANN202
        calls[0] += 1
        return original(self, other)

    monkeypatch.setattr(isl.UnionMap, "lex_ge_union_map", counted)
    return calls


def test_a_legal_schedule_is_checked_without_the_order_of_every_two_instances(
        monkeypatch: pytest.MonkeyPatch) -> None:
    orders = _count_instance_orders(monkeypatch)
    for quick in (False, True):
        _quick(monkeypatch, quick)
        orders[0] = 0
        _tiled(_matmul(43))
        assert (orders[0] == 0) == quick


def _refusals() -> list[str]:
    """The messages of primitives refused for breaking a dependence, each naming its first pair."""
    out = []
    X = pt.placeholder((10,), "float32", "X")
    T = pt.compute((10,), lambda i: X[i] + 1.0, "T")
    Y = pt.compute((8,), lambda i: T[i] + T[i + 2], "Y")
    for refused in (lambda s: s["Y"].before("T"), lambda s: s["Y"].after("T", "i"),
                    lambda s: s["T"].shift("i", 3).before("Y", "i")):
        with pytest.raises(ScheduleError) as err:
            refused(pt.Schedule(pt.Func([X], [Y])))
        out.append(str(err.value))
    s = pt.Schedule(_matmul(16))
    for refused in (lambda: s["C"].reverse("k"), lambda: s["C"].split("k", 4, "ko", "ki").reverse("ko")):
        with pytest.raises(ScheduleError) as err:
            refused()
        out.append(str(err.value))
    return out


def test_quick_checks_refuse_the_same_schedules_with_the_same_example(monkeypatch: pytest.MonkeyPatch) -> None:
    messages = {}
    for quick in (False, True):
        _quick(monkeypatch, quick)
        messages[quick] = _refusals()
    assert messages[True] == messages[False]
    assert all(messages[True])


def _carried_refusals() -> list[str]:
    """The messages of loop tags refused for a dependence the loop carries, each naming its first pair:
    a fused producer read two iterations on, a reduction loop, an outer part of one."""
    out = []
    X = pt.placeholder((10,), "float32", "X")
    T = pt.compute((10,), lambda i: X[i] + 1.0, "T")
    Y = pt.compute((8,), lambda i: T[i] + T[i + 2], "Y")
    s = pt.Schedule(pt.Func([X], [Y]))
    s["T"].shift("i", -2).before("Y", "i")  # legal: T[i + 2] is made in Y[i]'s iteration, T[i] two before
    refused = [lambda: s["Y"].parallel("i"), lambda: s["Y"].vectorize("i")]
    m = pt.Schedule(_matmul(16))
    refused += [lambda: m["C"].parallel("k"), lambda: m["C"].split("k", 4, "ko", "ki").parallel("ko")]
    n = pt.param("n")  # the same fusion at a size known at run time only
    Xn = pt.placeholder((n,), "float32", "X")
    Tn = pt.compute((n,), lambda i: Xn[i] + 1.0, "T")
    p = pt.Schedule(pt.Func([Xn], [pt.compute((n - 2,), lambda i: Tn[i] + Tn[i + 2], "Y")]))
    p["T"].shift("i", -2).before("Y", "i")
    refused.append(lambda: p["Y"].parallel("i"))
    for refuse in refused:
        with pytest.raises(ScheduleError) as err:
            refuse()
        out.append(str(err.value))
    return out


def test_quick_checks_refuse_the_same_carried_dependences_with_the_same_example(
        monkeypatch: pytest.MonkeyPatch) -> None:
    messages = {}
    for quick in (False, True):
        _quick(monkeypatch, quick)
        messages[quick] = _carried_refusals()
    assert messages[True] == messages[False]
    assert all("carries a dependence" in m for m in messages[True]) and len(messages[True]) == 5


def test_legal_loop_tags_are_checked_without_the_union_of_every_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quick checks take each dependence through its own two statements' schedules
    (``poly.deps._times``); the union of every statement's schedule is built only to name a broken pair."""
    from polytile.poly import deps
    calls = [0]
    original = deps.schedule_union

    def counted(sched):  # noqa: ANN001, ANN202
        calls[0] += 1
        return original(sched)

    monkeypatch.setattr(deps, "schedule_union", counted)
    for quick in (False, True):
        _quick(monkeypatch, quick)
        calls[0] = 0
        s = _tiled(_matmul(43))  # parallel, vectorized and unrolled loops, a cache: every check
        s["C"].parallel("jo")
        assert (calls[0] == 0) == quick
