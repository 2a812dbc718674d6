"""benchmarks/ablation.py without a GPU: each variant changes the one technique it names (its
kernel differs from the default's, its role and baseline are consistent), the build-up ends at the
default, techniques without a switch are listed and not built, and the variants lower to CUDA with
the instructions of their technique (TMA or cp.async copies, wgmma or mma.sync). The whole list is
compiled with nvcc by ``python benchmarks/ablation.py --build-only``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import ablation  # noqa: E402

import polytile as pt  # noqa: E402
from polytile.codegen.cuda import cuda_source  # noqa: E402
from polytile.target import CUDATarget  # noqa: E402

SM90A = CUDATarget(arch="sm_90a")


def _source(w: ablation.Workload, how: tuple) -> str:
    return cuda_source(pt.lower(ablation.schedule(w, how, SM90A), SM90A), True)[0]


def by_name(vs: list[ablation.Variant], name: str) -> ablation.Variant:
    return next(v for v in vs if v.name == name)


@pytest.mark.parametrize("name", ["gemm4096-bf16", "bert-ffn2-fp16", "r50-conv4-fp16"])
def test_variants_change_one_thing(name: str) -> None:
    w = ablation.workload(name)
    vs = ablation.variants(w, SM90A, model_pick=False)
    by_name = {v.name: v for v in vs}
    assert len(by_name) == len(vs), "variant names repeat"
    default = ablation.build_key(by_name["default"].how)
    for v in vs:
        if v.role == "no switch":
            assert v.how is None and v.change, v
            continue
        assert v.how is not None, v
        if v.role in ("off", "on"):  # a switch that builds the default again measures nothing
            assert ablation.build_key(v.how) != default, v.name
        if v.baseline:
            assert v.baseline in by_name, (v.name, v.baseline)
    steps = [v for v in vs if v.role == "build-up"]
    assert steps[0].name == "plain" and not steps[0].baseline
    assert ablation.build_key(steps[-1].how) == default, "the build-up must end at the default"
    keys = [ablation.build_key(v.how) for v in steps]
    assert len(set(keys)) == len(keys), "a build-up step that adds nothing"
    assert all(s.baseline == p.name for p, s in zip(steps, steps[1:]))


def test_gemm_variants_lower_to_their_technique() -> None:
    w = ablation.workload("bert-ffn2-fp16")
    by_name = {v.name: v for v in ablation.variants(w, SM90A, model_pick=False)}
    default = _source(w, by_name["default"].how)
    # the default is the operator's own schedule
    assert default == cuda_source(pt.lower(w.op().schedule(SM90A), SM90A), True)[0]
    assert "cp.async.bulk.tensor" in default and "wgmma.mma_async" in default
    threads = _source(w, by_name["cp.async"].how)
    assert "cp.async.bulk.tensor" not in threads and "cp.async.cg.shared.global" in threads
    mma = _source(w, by_name["mma.sync"].how)
    assert "mma.sync" in mma and "wgmma" not in mma


def test_selected_keeps_the_baselines() -> None:
    vs = ablation.variants(ablation.workload("r50-conv4-fp16"), SM90A, model_pick=False)
    kept = {v.name for v in ablation.selected(vs, {"mma.sync-reg1", "+inflight"})}
    assert kept == {"default", "mma.sync-reg1", "mma.sync", "+inflight", "+wgmma"}


def test_unknown_shape_is_refused() -> None:
    with pytest.raises(SystemExit, match="unknown shape"):
        ablation.workload("4096x4096-fp8")
    assert ablation.workload("1000x2000x3000-bf16").dims == (1000, 2000, 3000)


class _Resources:
    registers, spill_stores = 100, 0


class _FakeKernel:
    """Computes the workload with torch on the CPU (``wrong``: 10% off); ``benchmark`` returns ``seconds``."""

    def __init__(self, w: ablation.Workload, seconds: float, wrong: bool = False) -> None:
        self.w, self.seconds, self.wrong = w, seconds, wrong
        self.resources = {"kernel0": _Resources()}
        self.calls = 0

    def __call__(self, *arrays):  # noqa: ANN002, ANN204
        import pipelining
        *inputs, out = arrays
        self.calls += 1
        y = pipelining.vendor(self.w.spec, inputs)[2]()
        out.copy_((y * 1.1 if self.wrong else y).reshape(out.shape))
        return out

    def benchmark(self, *arrays, repeat: int = 10) -> float:  # noqa: ANN002
        return self.seconds


def test_measure_times_only_correct_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """``measure`` on the CPU with torch and fake kernels: a wrong variant and one that did not build are
    reported and not timed, a kernel shared by two variants is checked once, ratios are to the baseline."""
    torch = pytest.importorskip("torch")
    import pipelining

    from polytile.runtime import timing

    def cpu_inputs(spec: dict, dtype: str, seed: int) -> list:
        g = torch.Generator().manual_seed(seed)
        shapes = [tuple(int(d.value) for d in t.shape) for t in pipelining.make_op(spec, dtype).func.inputs]
        return [(torch.rand(s, generator=g) * 2 - 1).to(torch.float16) for s in shapes]
    full, empty = torch.full, torch.empty
    monkeypatch.setattr(pipelining, "torch_inputs", cpu_inputs)
    monkeypatch.setattr(torch, "full", lambda *a, device=None, **k: full(*a, **k))
    monkeypatch.setattr(torch, "empty", lambda *a, device=None, **k: empty(*a, **k))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(timing, "time_gpu", lambda fn, repeat=10: 4e-3)
    named = ablation.workload("bert-ffn2-fp16")
    small = ablation.Workload(named.kind, (33, 72, 80), named.dtype)  # the kernels run at a small size
    vs = ablation.variants(named, SM90A, model_pick=False)
    seconds = {"default": 2e-3, "mma.sync": 4e-3, "mma.sync-reg1": 5e-3}
    built = {}
    for v in vs:
        if v.how is not None:
            built.setdefault(("w", ablation.build_key(v.how)), (
                "BuildError: refused" if v.name == "stages-2" else
                _FakeKernel(small, seconds.get(v.name, 3e-3), wrong=v.name == "inflight-0"), 1.0))
    args = type("Args", (), dict(rounds=2, repeat=3, tolerance=1e-2, triton=False, shuffle=True, clocks=False))()
    row = ablation.measure("w", small, vs, built, args)
    got = row["variants"]
    assert got["inflight-0"]["error"].startswith("wrong") and "us" not in got["inflight-0"]
    assert got["stages-2"]["error"] == "BuildError: refused" and "us" not in got["stages-2"]
    assert got["swizzle"]["role"] == "no switch" and "us" not in got["swizzle"]
    assert got["default"]["rel_error"] < 1e-2 and got["default"]["us"] == pytest.approx(2000)
    assert got["default"]["vs_torch"] == pytest.approx(2.0)
    assert got["mma.sync-reg1"]["vs_baseline"] == pytest.approx(5 / 4)  # against mma.sync, its baseline
    assert got["+registers"]["us"] == got["mma.sync"]["us"]  # the same kernel
    assert built["w", ablation.build_key(by_name(vs, "mma.sync").how)][0].calls == 1  # checked once
    assert built["w", ablation.build_key(by_name(vs, "default").how)][0].calls == 1 + 5 + 50  # and per call
    table = ablation.markdown([row])
    assert "| inflight-0 | off | default | WRONG |" in table and "| stages-2 | off | default | build failed |" in table

