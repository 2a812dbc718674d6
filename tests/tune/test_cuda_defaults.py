"""The CUDA tuning templates contain the operators' default schedules (issue 15): for the shape
suite's workloads (benchmarks/shapes.py) on an sm_90a target, the template ``pt.tune`` picks has the
default schedule as its default configuration — the first choice of every decision, the one every
tuner measures first — valid, and generating the same CUDA source and launches as ``op.build``.
So a tuned kernel is never slower than the default as measured while tuning. Only lowering and
code generation run: no GPU, no nvcc. The sample covers every template family and the default's
less common choices (uneven split-K, direct GEMVs of unaligned rows, batched GEMV splits, TMA,
implicit-GEMM splits and tiles, few-channel convolutions); the whole suite is ``slow``. The row
operators' templates (softmax_cuda, layernorm_cuda) are checked by tests/cuda/test_row_templates.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from polytile.codegen.cuda import cuda_source
from polytile.lowering.pipeline import lower
from polytile.runtime.cuda import index32_ok
from polytile.target import CUDATarget
from polytile.tune import make_task

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import shapes  # noqa: E402

H100 = CUDATarget(arch="sm_90a", name="H100")  # the datasheet's facts (an H200 has the same SMs and L2)
SUITE = {w.name: w for w in shapes.gpu_suite() if w.kind not in ("softmax", "layernorm")}
SAMPLE = [
    "llama3-8b.mlp_up.t8",                    # GEMV, split in 4 (even chunks)
    "gpt2.vocab.t1",                          # GEMV reading unaligned rows directly, 16-byte vectors
    "bert-base.decode_context.s512",          # batched GEMV, split
    "awkward.small_mn_long_k.127x255x4096",   # warpgroup MMA, split
    "awkward.odd_kn.4095x4097x1023",          # warpgroup MMA on aligned copies of the operands
    "gpt2.attn_out.t2048",                    # warpgroup MMA, TMA loads
    "awkward.primes.1009x2003x509",           # CUDA cores (float32)
    "resnet50.l4.3x3.n1",                     # implicit GEMM on warpgroup MMA, split over rows and channels
    "mobilenetv2.b3.project.n32",             # implicit GEMM on mma.sync
]
SLOW_SAMPLE = [
    "resnet50.conv1.n1",                      # few channels (igemm_rows)
    "resnet50.l3.reduce.n1.nchw",             # NCHW implicit GEMM on the CUDA cores, split
]


def _code(sched: object) -> tuple[str, list[tuple[object, ...]]]:
    low = lower(sched, H100)  # type: ignore[arg-type]
    source, kernels = cuda_source(low, index32_ok(low))
    return source, [(k.name, [str(g) for g in k.grid], list(k.block), k.dynamic_shared) for k in kernels]


def check_default(name: str) -> str:
    """Assert the default configuration of ``name``'s template is its default schedule; the template."""
    op = SUITE[name].op()
    task = make_task(op, H100)
    default = task.space.default
    assert task.space.reason_invalid(default.digits) is None, (name, task.template.name)
    assert _code(task.schedule(default.values)) == _code(op.schedule(H100)), (name, task.template.name,
                                                                              default.values)
    return task.template.name


@pytest.mark.parametrize("name", SAMPLE)
def test_the_default_configuration_is_the_default_schedule(name):
    check_default(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_SAMPLE + sorted(set(SUITE) - set(SAMPLE) - set(SLOW_SAMPLE)))
def test_every_suite_workload_starts_at_its_default(name):
    check_default(name)


def test_the_sample_covers_every_template_of_the_suite():
    """Each template family the suite's workloads get is in the sample (from their kinds, without
    defining the spaces of all 122)."""
    assert {shapes.family(SUITE[n]) for n in SAMPLE + SLOW_SAMPLE} == {shapes.family(w) for w in SUITE.values()}


def test_the_default_chooser_s_alternatives_are_in_the_space():
    """What the default chooser ranks is reachable: ResNet-50's 3×3 64→64 at batch 1, whose default
    keeps 128×64 tiles while 64×64 measured 1.11× torch against 0.69× (H200), has both; an uneven
    split-K of the default's kind (61×61×8191, a prime K) is the default configuration."""
    task = make_task(SUITE["resnet50.l1.3x3.n1"].op(), H100)
    tiles = next(d for d in task.space.decisions if d.name == "tile").choices
    assert {"wgmma:128x64x64", "wgmma:64x64x64"} <= set(tiles)
    uneven = make_task("matmul", H100, M=61, N=61, K=8191, dtype="bfloat16")
    values = uneven.space.default.values
    assert values["split"] > 1 and 8191 % values["split"]


def test_the_conv_space_holds_wide_tiles_and_mma_groups_in_flight():
    """ResNet-50's 3×3 512→512 at batch 32 (0.64× cuDNN tuned and default): the convolution template
    offers each tile once (igemm_options ranks each tile once per split), warpgroup MMA's wide 64-row
    tiles and 0 to 2 MMA groups in flight, the default first; a 64×256 tile in two channel chunks with
    two groups in flight is valid and builds (lowering and code generation) with its launch; more
    groups in flight than its stages leave is not."""
    task = make_task(SUITE["resnet50.l4.3x3.n32"].op(), H100)
    decisions = {d.name: d.choices for d in task.space.decisions}
    assert len(set(decisions["tile"])) == len(decisions["tile"])
    assert {"wgmma:64x256x64", "wgmma:64x192x64", "wgmma:128x128x64"} <= set(decisions["tile"])
    assert decisions["inflight"] == (1, 0, 2)
    wide = task.space.from_values(dict(tile="wgmma:64x256x64", split="c2", stages=5, inflight=2))
    assert task.space.reason_invalid(wide.digits) is None
    source, kernels = _code(task.schedule(wide.values))
    assert "wgmma.mma_async.sync.aligned.m64n256k16" in source and "pt_wgmma_wait<2>" in source
    assert kernels[0][1:3] == (["2", "25", "2"], [32, 1, 4])  # 2 filter tiles × 25 row tiles × 2 chunks; 4 warps
    shallow = task.space.from_values(dict(tile="wgmma:128x128x64", split="c2", stages=3, inflight=2))
    assert "in flight" in str(task.space.reason_invalid(shallow.digits))
