"""CUDA templates: spaces respect the target's limits (on any machine); tuning on a GPU (gpu marker)."""

from __future__ import annotations

import numpy as np
import pytest

from polytile.target import CUDATarget
from polytile.tune import MeasureOptions, make_task, tune_task


@pytest.mark.parametrize("op, shape", [("matmul", dict(M=1024, N=1024, K=1024)),
                                       ("conv2d", dict(N=1, C=64, H=56, W=56, K=64, R=3, S=3, stride=1,
                                                       padding=1))])
def test_cuda_spaces_discard_configurations_over_the_limits(op, shape):
    # the direct convolution's space (float32 convolutions start at the implicit GEMM, conv2d_gemm_cuda,
    # where one of its tiles fits the block)
    named = {"template": "conv2d_cuda"} if op == "conv2d" else {}
    roomy = make_task(op, CUDATarget(), **named, **shape)
    small = make_task(op, CUDATarget(max_threads_per_block=128, shared_per_block=8 * 1024), **named, **shape)
    assert roomy.space.size == small.space.size
    rng = np.random.default_rng(0)
    roomy_ok = roomy.space.sample_valid(rng, 300)
    small_ok = set(small.space.sample_valid(rng, 300))
    rejected = [d for d in roomy_ok if d not in small_ok and not small.space.is_valid(d)]
    assert rejected, "a smaller GPU must rule out some configurations"
    assert any("threads_per_block" in small.space.reason_invalid(d) or "shared_bytes" in
               small.space.reason_invalid(d) for d in rejected)
    for d in small_ok:
        v = small.space.config(d).values
        threads = v["bm"] // v["tm"] * (v["bn"] // v["tn"]) if op == "matmul" else v["pixels"]
        assert threads <= 128


@pytest.mark.parametrize("op, shape", [("matmul", dict(M=256, N=192, K=64)),
                                       ("conv2d", dict(N=1, C=16, H=14, W=14, K=32, R=3, S=3, stride=1,
                                                       padding=1))])
def test_cuda_templates_lower_to_kernels_with_shared_staging(op, shape):
    import polytile as pt
    target = CUDATarget(name="test", arch="sm_90a")
    task = make_task(op, target, **shape)
    first_valid = next(c for c in task.space if task.space.is_valid(c.digits))
    text = str(pt.lower(task.schedule(first_valid.values), target))
    assert "kernel " in text and "in shared" in text and "__syncthreads" in text


@pytest.mark.gpu
def test_tune_matmul_on_the_gpu(tmp_path):
    task = make_task("matmul", "cuda", M=512, N=512, K=512)
    result = tune_task(task, trials=8, records=tmp_path / "gpu.jsonl", batch_size=4, progress=False,
                       measure=MeasureOptions(repeat=10, min_time=0.05))
    assert result.best is not None and result.kernel is not None
    assert all(r.target == task.target.key for r in result.records)
