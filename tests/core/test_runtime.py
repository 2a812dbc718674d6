"""The runtime: argument checking (shapes, dtypes, parameters), output allocation, the build cache,
the kernel's introspection, timing, and POLYTILE_DUMP."""

import numpy as np
import pytest

import polytile as pt


def scale_func():
    N, M = pt.param("N"), pt.param("M")
    A = pt.placeholder((N, M), "float32", "A")
    B = pt.compute((N, M), lambda i, j: A[i, j] * 2.0, "B")
    return pt.Func([A], [B], name="scale")


def test_outputs_allocated_or_given(rng):
    kern = pt.build(scale_func())
    a = rng.standard_normal((5, 7)).astype("float32")
    np.testing.assert_allclose(kern(a), 2 * a)
    out = np.full((5, 7), np.nan, dtype="float32")
    res = kern(a, out)
    assert res is out
    np.testing.assert_allclose(out, 2 * a)


def test_wrong_shape_dtype_count():
    kern = pt.build(scale_func())
    with pytest.raises(pt.InputError, match="must have dtype float32, got float64"):
        kern(np.zeros((3, 3)))
    with pytest.raises(pt.InputError, match="must have 2 dimension"):
        kern(np.zeros(3, dtype="float32"))
    with pytest.raises(pt.InputError, match="takes 1 input array"):
        kern()
    with pytest.raises(pt.InputError, match=r"argument B of scale must have shape \(3, 3\), got \(3, 4\)"):
        kern(np.zeros((3, 3), dtype="float32"), np.zeros((3, 4), dtype="float32"))
    with pytest.raises(pt.InputError, match="must be a NumPy array"):
        kern([[1.0]])


def test_params_missing_conflicting_unknown():
    N = pt.param("N")
    A = pt.placeholder((N,), "float32", "A")
    K = pt.param("K")
    B = pt.compute((K,), lambda i: A[i] * 1.0, "B")
    kern = pt.build(pt.Func([A], [B], constraints=[K <= N]))
    a = np.ones(4, dtype="float32")
    with pytest.raises(pt.InputError, match="no value for parameter.*K"):
        kern(a)
    with pytest.raises(pt.InputError, match="has no parameter 'Q'"):
        kern(a, K=2, Q=3)
    with pytest.raises(pt.InputError, match="constraint"):
        kern(a, K=5)
    np.testing.assert_allclose(kern(a, K=3), np.ones(3))


def test_non_contiguous_input_is_copied_output_refused(rng):
    kern = pt.build(scale_func())
    a = rng.standard_normal((7, 10)).astype("float32")[:, ::2]
    np.testing.assert_allclose(kern(a), 2 * a)
    with pytest.raises(pt.InputError, match="C-contiguous"):
        kern(a, np.zeros((10, 7), dtype="float32").T)


def test_kernel_introspection_and_benchmark(rng):
    kern = pt.build(scale_func())
    assert "scale_impl" in kern.source and "for (int64_t" in kern.source
    assert kern.ir.startswith("func scale(")
    t = kern.benchmark(rng.standard_normal((64, 64)).astype("float32"), repeat=3, warmup=1, min_time=0.0)
    assert 0 < t < 1


@pytest.mark.parametrize("timing", [dict(repeat=0), dict(repeat=-1, min_time=-1), dict(repeat=2.5),
                                    dict(warmup=-1), dict(min_time="1")])
def test_benchmark_counts_are_checked(timing, rng):
    """``benchmark(repeat=-1, min_time=-1)`` ended in statistics' error on no runs and ``repeat=0``
    timed one run anyway (independent fuzzer's probes): an InputError names the arguments."""
    kern = pt.build(scale_func())
    with pytest.raises(pt.InputError, match="repeat must be an integer >= 1"):
        kern.benchmark(rng.standard_normal((8, 8)).astype("float32"), **timing)
    assert kern.benchmark(rng.standard_normal((8, 8)).astype("float32"), repeat=np.int64(2), min_time=0) > 0


def test_build_cache_reuses_library(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path))
    k1 = pt.build(scale_func())
    k2 = pt.build(scale_func())
    assert k1.path == k2.path and k1.path.parent == tmp_path
    assert len(list(tmp_path.glob("pt_*.so"))) == 1


def _dumps(path):
    """(pass, text) of every file POLYTILE_DUMP wrote, in order."""
    return [(p.name.split("-", 1)[1].removesuffix(".txt"), p.read_text()) for p in sorted(path.iterdir())]


def test_dump_writes_every_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYTILE_DUMP", str(tmp_path))
    pt.lower(scale_func())
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0] == "scale.01-ast-to-ir.txt"
    assert any("vectorize" in n for n in names) and any("registers" in n for n in names)
    changed = [text for _, text in _dumps(tmp_path) if text != "(unchanged)\n"]
    assert "for i in [0, N)" in changed[-1]


def test_one_pass_list_guarded_by_target_features(tmp_path, monkeypatch):
    """The CPU and the GPU run one list of passes: each target the passes its features allow, in the
    list's order; a pass that changes nothing is logged as "(unchanged)"."""
    from polytile.target import CUDATarget
    monkeypatch.setenv("POLYTILE_DUMP", str(tmp_path / "cpu"))
    pt.lower(scale_func())
    cpu = _dumps(tmp_path / "cpu")
    assert [p for p, _ in cpu] == ["ast-to-ir", "allocate", "simplify", "unroll", "flatten", "simplify", "vectorize",
                                   "simplify", "registers", "simplify"]
    assert dict(cpu)["unroll"] == "(unchanged)\n" and dict(cpu)["flatten"] != "(unchanged)\n"

    func = scale_func()
    s = pt.create_schedule(func)
    s["B"].split("j", 32, "jo", "ji").bind("i", "blockIdx.x").bind("ji", "threadIdx.x")
    monkeypatch.setenv("POLYTILE_DUMP", str(tmp_path / "sm_80"))
    pt.lower(s, CUDATarget(arch="sm_80"))
    gpu = _dumps(tmp_path / "sm_80")
    assert [p for p, _ in gpu] == ["ast-to-ir", "allocate", "simplify", "tensorize", "whole-tiles", "fragments",
                                   "allreduce", "kernels", "pipeline", "staged-stores", "simplify", "vector-lanes",
                                   "unroll", "flatten", "simplify", "combine-loads", "gpu-vectorize", "realign-loads",
                                   "registers", "barriers", "simplify", "exchange-stores", "pair-stores", "swizzle"]
    assert dict(gpu)["tensorize"] == "(unchanged)\n" and "kernel" in dict(gpu)["kernels"]
    monkeypatch.setenv("POLYTILE_DUMP", str(tmp_path / "sm_90a"))
    pt.lower(s, CUDATarget(arch="sm_90a"))
    assert "async-proxy" in [p for p, _ in _dumps(tmp_path / "sm_90a")]  # guarded by wgmma


def test_compiler_error_is_a_build_error():
    from polytile.runtime.cpu import compile_shared
    with pytest.raises(pt.BuildError, match="rejected the generated code"):
        compile_shared("this is not C++")


def test_compiler_error_names_the_first_error_of_a_long_line():
    """The compiler quotes a long generated line after its message (fuzz seed 7 case 3982: the
    message was cut off the 4,000 characters of output kept); the first error still leads."""
    from polytile.runtime.cpu import compile_shared
    line = "int f() { return " + " + ".join(["undeclared_x"] * 2000) + "; }"
    with pytest.raises(pt.BuildError, match="rejected the generated code: .*error: .undeclared_x. was not declared"):
        compile_shared(line)


def test_zero_sized_problem():
    kern = pt.build(scale_func())
    out = kern(np.zeros((0, 3), dtype="float32"))
    assert out.shape == (0, 3)
