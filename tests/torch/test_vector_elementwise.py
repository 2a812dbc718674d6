"""The backend's ``vector_elementwise`` option: elementwise groups merge the elementwise groups that only
feed them (``partition``'s ``merge_elementwise``), and their CUDA threads compute 16 bytes each with
vector loads and stores (``schedules.Knobs.vector``, lowering's ``vector_lanes`` pass) — checked on the
partition, the generated source, the lowered kernel run by the CPU block emulator against the
unvectorized program, and on a GPU against eager torch."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from torch_helpers import assert_close

import polytile as pt
import polytile.torch as ptt
from polytile.errors import PolytileError
from polytile.torch import importer

torch = pytest.importorskip("torch")
F = torch.nn.functional

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cuda"))
import block_emulator  # noqa: E402


class Downsample(torch.nn.Module):
    """A residual block's end with a downsampling branch: relu(bn(conv(x)) + bn_d(conv_d(x)));
    ``also``: the branch's batch norm is returned too (read outside the sum)."""

    def __init__(self, cin: int, c: int, also: bool = False) -> None:
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(cin, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        self.cd, self.bd = torch.nn.Conv2d(cin, c, 1, bias=False), torch.nn.BatchNorm2d(c)
        self.also = also
        with torch.no_grad():
            for b in (self.b1, self.bd):
                b.running_mean.uniform_(-1, 1)
                b.running_var.uniform_(0.5, 2)
                b.weight.uniform_(0.5, 2)
                b.bias.uniform_(-1, 1)
        self.eval()

    def forward(self, x: torch.Tensor) -> object:
        d = self.bd(self.cd(x))
        y = F.relu(self.b1(self.c1(x)) + d)
        return (y, d) if self.also else y


def _partitions(model: torch.nn.Module, x: torch.Tensor) -> dict[bool, list[list[str]]]:
    """The groups' operations of ``model``'s aten graph with the convolutions left to torch, without and
    with ``merge_elementwise``."""
    from torch._dynamo.backends.common import aot_autograd

    from polytile.torch.partition import partition
    out: dict[bool, list[list[str]]] = {}

    def collect(gm: torch.fx.GraphModule, _: list[object]) -> object:
        convs = {n: "left" for n in gm.graph.nodes if n.op == "call_function" and "convolution" in str(n.target)}
        for merge in (False, True):
            out[merge] = [g.ops for g in partition(gm, "cpu", convs, merge_elementwise=merge).groups]
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=aot_autograd(fw_compiler=collect), dynamic=False)(x)
    return out


BN = "_native_batch_norm_legit_no_training"


def test_a_downsampling_batch_norm_merges_into_the_residual_sum_that_reads_it() -> None:
    parts = _partitions(Downsample(4, 8), torch.randn(2, 4, 5, 3))
    assert sorted(parts[False]) == sorted([[BN, "add", "relu"], [BN]])
    assert parts[True] == [[BN, BN, "add", "relu"]]


def test_a_batch_norm_read_elsewhere_does_not_merge() -> None:
    parts = _partitions(Downsample(4, 8, also=True), torch.randn(2, 4, 5, 3))
    assert sorted(parts[True]) == sorted([[BN, "add", "relu"], [BN]])


def _group(model: torch.nn.Module, x: torch.Tensor) -> object:
    """The one imported group of ``model`` (channels-last fp16, convolutions left to torch, merged)."""
    from torch._dynamo.backends.common import aot_autograd

    from polytile.torch.compiler import _graph_outputs
    from polytile.torch.importer import import_group
    from polytile.torch.partition import group_outputs, partition
    found: list[object] = []

    def collect(gm: torch.fx.GraphModule, _: list[object]) -> object:
        convs = {n: "left" for n in gm.graph.nodes if n.op == "call_function" and "convolution" in str(n.target)}
        for g in partition(gm, "cpu", convs, merge_elementwise=True).groups:
            found.append(import_group(g.nodes, group_outputs(g, _graph_outputs(gm)), g.kind, fuse_epilogue=True))
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=aot_autograd(fw_compiler=collect), dynamic=False)(x)
    (imp,) = found
    return imp


def _nhwc(n: int, cin: int, c: int, h: int, w: int) -> tuple[torch.nn.Module, torch.Tensor]:
    model = Downsample(cin, c).half().to(memory_format=torch.channels_last)
    return model, torch.randn(n, cin, h, w).half().contiguous(memory_format=torch.channels_last)


@pytest.mark.needs_nvcc
def test_vector_schedule_reads_and_writes_16_bytes_per_thread(nvcc: str) -> None:
    from polytile.torch.compiler import build_groups
    imp = _group(*_nhwc(3, 4, 24, 5, 7))
    target = pt.CUDATarget(arch="sm_90a")  # type: ignore[attr-defined]
    ((vec, _),) = build_groups([imp.func], target, vector=True)  # type: ignore[attr-defined]
    ((scalar, _),) = build_groups([imp.func], target)  # type: ignore[attr-defined]
    src = vec.source
    # two activations and eight per-channel vectors loaded, the result stored: 16 bytes each
    loads = [line for line in src.splitlines() if "= *(const uint4*)&in" in line]
    assert len(loads) == 10, src
    assert sum("*(uint4*)&out0[" in line for line in src.splitlines()) == 1, src
    assert "uint4" not in scalar.source


def _emulated(imp: object, vector: bool) -> tuple[np.ndarray, str]:
    """The group's CUDA kernel (default schedule, with or without ``Knobs.vector``) run by the block
    emulator on random inputs, the CPU build of the same Func on the same inputs, and the CUDA source."""
    from polytile.codegen.cuda import cuda_source
    from polytile.lowering.pipeline import lower
    from polytile.torch.schedules import Knobs, schedule_group
    func = imp.func  # type: ignore[attr-defined]
    gpu = pt.CUDATarget(arch="sm_90a")  # type: ignore[attr-defined]
    low = lower(schedule_group(func, gpu, Knobs(vector=vector)), gpu)
    rng = np.random.default_rng(7)
    ins = [rng.uniform(0.5, 2, a.kernel_shape) if len(a.kernel_shape) == 1 else rng.standard_normal(a.kernel_shape)
           for a in imp.adapters]  # type: ignore[attr-defined]
    ins = [np.asarray(i, np.float16) for i in ins]
    out_shape = tuple(int(d.value) for d in func.outputs[0].shape)
    (got,) = block_emulator.run(low, [i.astype(np.float64) for i in ins] + [np.zeros(out_shape)])
    cpu = pt.CPUTarget()  # type: ignore[attr-defined]
    want = pt.build(schedule_group(func, cpu), cpu)(*ins)  # type: ignore[attr-defined]
    want = np.asarray(want[0] if isinstance(want, (list, tuple)) else want, np.float64)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < 2e-3, err
    return got, cuda_source(low, True)[0]


@pytest.mark.parametrize("shape, vectors", [((3, 4, 24, 5, 7), True),   # 2520 elements, a partial block
                                            ((2, 4, 12, 2, 2), False),  # channels not a multiple of 8
                                            ((3, 4, 20, 5, 7), False)],  # 2100: not whole vectors
                         ids=["c24", "c12", "c20-odd-total"])
def test_vector_kernel_computes_the_unvectorized_programs_values(shape: tuple[int, ...], vectors: bool) -> None:
    imp = _group(*_nhwc(*shape))
    _, src = _emulated(imp, vector=True)
    assert ("*(uint4*)&out0[" in src) == vectors, src
    _emulated(imp, vector=False)


def test_a_reductions_sums_stay_one_per_thread() -> None:
    # the last block's batch norm + sum + ReLU + mean: the sums' kernel as without vectors, the mean's
    # write-back vectorized
    from polytile.codegen.cuda import cuda_source
    from polytile.lowering.pipeline import lower
    from polytile.torch.schedules import Knobs, schedule_group
    c = 16
    mean, var, g, b = torch.randn(c).half(), torch.rand(c).half() + 0.5, torch.randn(c).half(), torch.randn(c).half()
    x, r = (torch.randn(3, c, 5, 7).half().contiguous(memory_format=torch.channels_last) for _ in range(2))

    def fn(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return F.relu(F.batch_norm(x, mean, var, g, b, False, 0.1, 1e-5) + r).mean((2, 3))
    from test_cuda_schedules import _groups
    (imp,) = _groups(fn, x, r)
    assert imp.kind == "reduce"
    gpu = pt.CUDATarget(arch="sm_90a")  # type: ignore[attr-defined]
    vec, scalar = (cuda_source(lower(schedule_group(imp.func, gpu, Knobs(vector=v)), gpu), True)[0].split("extern")
                   for v in (True, False))
    assert vec[1] == scalar[1] and "uint4" in vec[2] and "uint4" not in scalar[2]
    _emulated(imp, vector=True)


def test_vector_option_is_checked() -> None:
    with pytest.raises(PolytileError, match="vector_elementwise"):
        ptt.backend(vector_elementwise="yes")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(3, 4, 24, 5, 7), (1, 8, 64, 9, 11), (2, 4, 20, 5, 7)], ids=str)
def test_vector_groups_on_the_gpu_match_eager(monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...]) -> None:
    monkeypatch.setattr(importer, "CONVS", set())  # convolutions to torch: the batch norms form the groups
    model, x = _nhwc(*shape)
    model, x = model.cuda(), x.cuda()
    report = ptt.Report()
    compiled = torch.compile(model, backend=ptt.backend(report=report, choose="always", vector_elementwise=True),
                             dynamic=False)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn_like(x)
            assert_close(compiled(x), model(x))
    assert [g.ops for g in report.taken] == [[BN, BN, "add", "relu"]], report.taken


@pytest.mark.gpu
def test_vector_elementwise_resnet_on_the_gpu_matches_eager() -> None:
    from polytile.torch import zoo
    model, inputs = zoo.model("resnet50", size="tiny", batch=3, device="cuda", dtype=torch.float16)
    report = ptt.Report()
    compiled = torch.compile(model, backend=ptt.backend(report=report, choose="always", vector_elementwise=True),
                             dynamic=False)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn_like(inputs[0])
            assert_close(compiled(x).float(), model(x).float(), 3e-2)
    assert report.taken


def test_the_default_follows_the_module_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from polytile.target import as_target
    from polytile.torch import compiler
    cuda, cpu = as_target("cuda:sm_90a"), as_target("cpu")
    assert compiler.vector_wanted(compiler.Options(), cuda)  # on by default since measured (2026-11-29)
    assert not compiler.vector_wanted(compiler.Options(), cpu)
    assert compiler.vector_wanted(compiler.Options(vector_elementwise=True), cuda)
    assert not compiler.vector_wanted(compiler.Options(vector_elementwise=True), cpu)
    monkeypatch.setattr(compiler, "VECTOR_ELEMENTWISE", False)
    assert not compiler.vector_wanted(compiler.Options(), cuda)
    assert compiler.vector_wanted(compiler.Options(vector_elementwise=True), cuda)
    monkeypatch.setattr(compiler, "VECTOR_ELEMENTWISE", True)
    assert not compiler.vector_wanted(compiler.Options(vector_elementwise=False), cuda)
