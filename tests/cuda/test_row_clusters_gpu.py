"""On an sm_90 GPU: softmax and layernorm rows split over the blocks of a thread-block cluster
(``row_plan``'s ``cluster``; the CPU side in test_row_clusters.py) against torch in float64, row by row,
on random inputs that are never zero: widths that are no multiple of the slices (128257, 50257, 12345),
one row, float16 and bfloat16, layernorm rows of mean ~300 (the shifted moments keep their digits),
every cluster size; the default with ``POLYTILE_ROW_CLUSTERS=1`` takes the device's rule; a call
captured in a CUDA graph replays right.

Run on a GPU machine: ``python -m pytest -q -m gpu tests/cuda/test_row_clusters_gpu.py``.
"""

from __future__ import annotations

import pytest
from call_paths import capture, warm_up
from gpu_inputs import signed_inputs, skip_unless_hopper

import polytile as pt
from polytile import ops
from polytile.ops.gpu_schedules import SCHEDULES, row_cluster
from polytile.target import as_target

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

SHAPES = [("softmax", 1, 128257, "float32", 8), ("softmax", 32, 128256, "float32", 4),
          ("softmax", 8, 50257, "float32", 2), ("softmax", 3, 12345, "float32", 8),
          ("softmax", 16, 128256, "bfloat16", 8), ("softmax", 5, 50257, "float16", 4),
          ("layernorm", 16, 128256, "float32", 8), ("layernorm", 1, 128257, "float32", 2),
          ("layernorm", 7, 12345, "float32", 4), ("layernorm", 4, 50257, "bfloat16", 8),
          ("layernorm", 2, 32769, "float16", 2)]
"""(operator, rows, width, type, blocks of the cluster): every cluster size on both operators."""


@pytest.fixture(autouse=True)
def _hopper() -> None:
    skip_unless_hopper(torch, "clusters")


def _inputs(name: str, M: int, N: int, dtype: str, seed: int, mean: float = 0.0) -> list:
    x, g, b = signed_inputs(torch, [(M, N), (N,), (N,)], dtype, seed)
    if mean:
        x = (x.float() + mean).to(x.dtype)
    if name == "softmax":
        return [x * 4]  # logits up to ±6: the maximum matters
    return [x, g, b]


def _torch(name: str, inputs: list) -> torch.Tensor:
    x = inputs[0].double()
    if name == "softmax":
        return torch.softmax(x, dim=1)
    g, b = (a.double() for a in inputs[1:])
    return torch.nn.functional.layer_norm(x, (x.shape[1],), g, b, 1e-5)


def _worst_row(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert bool(out.isfinite().all())
    return float(((out.double() - ref).norm(dim=1) / ref.norm(dim=1)).max())


def _tolerance(dtype: str) -> float:
    return {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1e-2}[dtype]


def _split(name: str, M: int, N: int, dtype: str, cluster: int) -> pt.Schedule:
    op = ops.get(name, M=M, N=N, dtype=dtype)
    sched = pt.Schedule(op.func)
    SCHEDULES[name](sched, as_target("cuda"), M, N, cluster=cluster)
    return sched


@pytest.mark.parametrize("name,M,N,dtype,cluster", SHAPES, ids=[f"{n}-{M}x{N}-{d}-c{c}" for n, M, N, d, c in SHAPES])
def test_rows_split_over_a_cluster_match_torch(name, M, N, dtype, cluster):
    kern = pt.build(_split(name, M, N, dtype, cluster), "cuda")
    assert kern.kernels[0].cluster == cluster
    inputs = _inputs(name, M, N, dtype, seed=M * N + cluster)
    out = kern(*inputs)
    torch.cuda.synchronize()
    assert _worst_row(out, _torch(name, inputs)) < _tolerance(dtype), (name, M, N, dtype, cluster)


@pytest.mark.parametrize("N", [128257, 50257, 12345])
def test_layernorm_of_rows_of_mean_300_split_over_a_cluster(N):
    # the shifted moments: the moments of X itself lose var/mean² of their digits (1e-1 off at mean 300)
    for cluster in (2, 8):
        kern = pt.build(_split("layernorm", 3, N, "float32", cluster), "cuda")
        inputs = _inputs("layernorm", 3, N, "float32", seed=N + cluster, mean=300.0)
        out = kern(*inputs)
        torch.cuda.synchronize()
        assert _worst_row(out, _torch("layernorm", inputs)) < 1e-4, (N, cluster)


@pytest.mark.parametrize("name,M,N", [("softmax", 32, 128256), ("softmax", 1, 128256), ("layernorm", 16, 128256),
                                      ("softmax", 8, 50257)])
def test_the_default_takes_the_devices_rule_when_switched_on(name, M, N, monkeypatch):
    monkeypatch.setenv("POLYTILE_ROW_CLUSTERS", "1")
    target = as_target("cuda")
    kern = ops.get(name, M=M, N=N).build(target)
    assert kern.kernels[0].cluster == row_cluster(target, M, N) > 1
    inputs = _inputs(name, M, N, "float32", seed=7)
    assert _worst_row(kern(*inputs), _torch(name, inputs)) < 2e-5


def test_a_cluster_kernel_replays_in_a_cuda_graph():
    kern = pt.build(_split("softmax", 4, 50257, "float32", 8), "cuda")
    static = _inputs("softmax", 4, 50257, "float32", seed=1)
    warm_up(kern, *static)
    graph, out = capture(kern, *static)
    for seed in (2, 3):
        new = _inputs("softmax", 4, 50257, "float32", seed=seed)
        static[0].copy_(new[0])
        graph.replay()
        torch.cuda.synchronize()
        assert _worst_row(out, _torch("softmax", new)) < 2e-5
