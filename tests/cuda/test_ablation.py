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
