"""A product's elementwise epilogue (bias, activation, residual, scale, cast) fused into the product: the
group's Func is the product alone, its sums written back through the epilogue (``product_epilogue``),
one kernel on a GPU instead of the product's and the epilogue's. Compared with eager torch on random
inputs at sizes that divide no tile (7×129 @ 129×77), on the CPU and (marker gpu) on the GPU, and with
the fallbacks — the raw product read outside the group, a transposed or sliced epilogue — that keep
the epilogue as a computation of its own. On the CPU a convolution's epilogue (batch norm, residual,
ReLU) is applied in its write-back the same way."""

from __future__ import annotations

from typing import Any

import pytest
from torch_helpers import compile_and_compare

import polytile as pt

torch = pytest.importorskip("torch")
F = torch.nn.functional


def linear_gelu_residual(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w, b)) + r                   # addmm (weight read transposed) + gelu + add


def mm_relu_bias(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w.t() + b) * 0.5 - r.tanh()


def linear_3d(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    # [1, 7, 129] @ [129, 77]: view to [7, 129], addmm, view back to [1, 7, 77], then the epilogue
    return F.gelu(F.linear(x.unsqueeze(0), w, b), approximate="tanh") + r.unsqueeze(0)


def bmm_scale(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    q = x.view(1, 7, 129).expand(3, 7, 129)
    return torch.bmm(q * 1.0, w.t().unsqueeze(0).expand(3, 129, 77).contiguous()) * 0.125 + b


def plain_product(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return x @ w.t()                                        # 16-bit: the cast to the output type alone


def heads_scale(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    # attention's heads: [n, 77] viewed as [1, n, 7, 11], permuted to [1, 7 heads, n, 11] and scaled;
    # torch stores the result in the permuted order, which is the product's own
    return F.linear(x, w, b).view(1, x.shape[0], 7, 11).permute(0, 2, 1, 3) * 0.125


def boolean_epilogue(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w, b) > r                            # stored as booleans


FUSED = [linear_gelu_residual, mm_relu_bias, linear_3d, bmm_scale, plain_product, heads_scale, boolean_epilogue]


def raw_product_read_twice(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor
                           ) -> tuple[torch.Tensor, ...]:
    y = x @ w.t()
    return y, F.gelu(y + b)                                 # the raw product is an output too


def transposed_epilogue(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return (x @ w.t()).t().contiguous() * 2 + r.t()         # the epilogue reads the product transposed


def sliced_epilogue(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    y = x @ w.t()
    return y[:, :40] * y[:, 37:]                            # two other elements of the product per element


FALLBACKS = [raw_product_read_twice, transposed_epilogue, sliced_epilogue]


def _inputs(dtype: torch.dtype, device: str = "cpu") -> list[torch.Tensor]:
    shapes = [(7, 129), (77, 129), (77,), (7, 77)]
    return [(torch.randn(s) * (1 if n == 0 else 0.2)).to(device=device, dtype=dtype) for n, s in enumerate(shapes)]


def _products(fn: Any, *inputs: torch.Tensor, gpu: bool = False) -> list[Any]:
    """The imported product groups of ``fn``'s aten graph (traced on the CPU), as the backend writes them
    for the CPU or, with ``gpu``, for a GPU."""
    from torch._dynamo.backends.common import aot_autograd

    from polytile.torch.compiler import _graph_outputs, extract
    from polytile.torch.importer import import_group
    from polytile.torch.partition import group_outputs, partition
    found: list[Any] = []

    def collect(gm: torch.fx.GraphModule, _: list[Any]) -> Any:
        if gpu:
            outs = _graph_outputs(gm)
            found.extend(import_group(g.nodes, group_outputs(g, outs), g.kind, fuse_epilogue=True)
                         for g in partition(gm, "cpu").groups if g.kind == "gemm")
        else:
            found.extend(imp for _, imp in extract(gm, pt.CPUTarget())[0] if imp.kind == "gemm")  # type: ignore[attr-defined]
        return gm.forward

    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=collect), dynamic=False)(*inputs)
    return found


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("fn", FUSED, ids=[f.__name__ for f in FUSED])
def test_epilogues_fused_into_the_product_match_eager(fn: Any, dtype: torch.dtype) -> None:
    if fn is plain_product and dtype == torch.float32:
        pytest.skip("a float32 product without an epilogue is its own output (nothing to fuse)")
    if fn is boolean_epilogue and dtype == torch.float16:
        pytest.skip("torch compares the product rounded to float16, polytile in float32: near ties differ")
    (imp,) = _products(fn, *_inputs(dtype))
    (C,) = imp.func.outputs
    assert C.epilogue is not None and {c.name for c in imp.func.computations} <= {"C", "C_lanes"}  # (dot products)
    report = compile_and_compare(fn, *_inputs(dtype))
    assert [g.kind for g in report.taken].count("gemm") == 1 and report.kernels == len(report.taken)


@pytest.mark.parametrize("fn", FALLBACKS, ids=[f.__name__ for f in FALLBACKS])
def test_epilogues_that_do_not_read_the_product_in_place_stay_computations(fn: Any) -> None:
    (imp,) = _products(fn, *_inputs(torch.float32))
    assert all(c.epilogue is None for c in imp.func.computations) and len(imp.func.computations) >= 2
    compile_and_compare(fn, *_inputs(torch.float32))


def test_a_float32_product_without_epilogue_is_its_own_output() -> None:
    (imp,) = _products(plain_product, *_inputs(torch.float32))
    (C,) = imp.func.outputs
    assert C.epilogue is None and C in imp.func.computations


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("arch,mma", [("sm_90a", "pt_wgmma_m64n"), ("sm_80", "pt_mma_m16n8k16_")])
def test_a_bert_layers_products_with_their_epilogues_are_one_kernel_each(nvcc: str, arch: str, mma: str) -> None:
    # BERT's linear layers ran their bias + scale, bias + GELU and bias + residual as a second kernel
    # over a float32 copy of the product
    from test_cuda_schedules import _bert_inputs, _bert_layer

    from polytile.torch.compiler import build_groups
    groups = _products(_bert_layer, *_bert_inputs(), gpu=True)
    assert len(groups) == 3
    for kern, _ in build_groups([g.func for g in groups], pt.CUDATarget(arch=arch)):  # type: ignore[attr-defined]
        assert len(kern.kernels) == 1 and mma in kern.source, kern.source
        assert "float* __restrict__ C" not in kern.source  # no float32 copy of the product
        assert all(r.spill_stores == 0 and r.stack_bytes == 0 for r in kern.resources.values())


@pytest.mark.needs_nvcc
def test_odd_shapes_with_epilogues_compile_for_the_tensor_cores(nvcc: str) -> None:
    from polytile.torch.compiler import build_groups
    x, w, b, r = _inputs(torch.float16)
    x = torch.randn(130, 129).half()                        # enough rows for the tensor cores, none a tile's
    groups = [*_products(linear_gelu_residual, x, w, b, torch.randn(130, 77).half(), gpu=True),
              *_products(linear_gelu_residual, x[:7], w, b, r, gpu=True)]
    for arch in ("sm_90a", "sm_80"):
        for kern, _ in build_groups([g.func for g in groups], pt.CUDATarget(arch=arch)):  # type: ignore[attr-defined]
            # one kernel writes C, the product with its epilogue; the others copy operands of odd rows aligned
            writers = [k for k in kern.kernels if any(b.name == "C" for b in k.args)]
            assert len(writers) == 1 and all(any(b.name.endswith("_aligned") for b in k.args)
                                             for k in kern.kernels if k not in writers)
            assert all(r.spill_stores == 0 and r.stack_bytes == 0 for r in kern.resources.values())


def all_cases(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Every case above in one graph (its groups are compiled together)."""
    out: list[torch.Tensor] = []
    for fn in (linear_gelu_residual, mm_relu_bias, plain_product, heads_scale, *FALLBACKS):
        y = fn(x, w, b, r)
        out.extend(y if isinstance(y, tuple) else (y,))
    return tuple(out)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [7, 130])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_epilogues_on_the_gpu_match_eager(dtype: torch.dtype, rows: int) -> None:
    x, w, b, r = _inputs(dtype, "cuda")
    if rows != 7:
        x = torch.randn(rows, 129, device="cuda").to(dtype)
        r = (torch.randn(rows, 77, device="cuda") * 0.2).to(dtype)
    report = compile_and_compare(all_cases, x, w, b, r, cuda_graphs=False)
    assert report.taken_ops["mm"] + report.taken_ops["addmm"] == 7, report
    if rows == 7:
        compile_and_compare(linear_3d, x, w, b, r, cuda_graphs=False)
        compile_and_compare(bmm_scale, x, w, b, r, cuda_graphs=False)


@pytest.mark.gpu
def test_a_bert_layer_on_the_gpu_matches_eager() -> None:
    from test_cuda_schedules import _bert_inputs, _bert_layer
    report = compile_and_compare(_bert_layer, *[t.cuda() for t in _bert_inputs()], cuda_graphs=False)
    assert report.taken_ops["addmm"] == 3 and report.kernels == len(report.taken), report


class ConvBnResidual(torch.nn.Module):
    """A ResNet block's convolution: batch norm (inference), the residual, ReLU."""

    def __init__(self, stride: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(5, 19, 3, stride=stride, padding=1, bias=True)
        self.bn = torch.nn.BatchNorm2d(19)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)) + r)


def _convs(fn: Any, *inputs: torch.Tensor) -> list[Any]:
    from torch._dynamo.backends.common import aot_autograd

    from polytile.torch.compiler import extract
    found: list[Any] = []

    def collect(gm: torch.fx.GraphModule, _: list[Any]) -> Any:
        found.extend(imp for _, imp in extract(gm, pt.CPUTarget())[0] if imp.kind == "conv")  # type: ignore[attr-defined]
        return gm.forward

    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=collect), dynamic=False)(*inputs)
    return found


@pytest.mark.parametrize("stride", [1, 2])
def test_a_convolutions_epilogue_is_applied_in_its_write_back_on_the_cpu(stride: int) -> None:
    # column vectors (stride 1) and channel vectors written back transposed to NCHW (stride 2)
    m = ConvBnResidual(stride).eval()
    x = torch.randn(1, 5, 11, 13)
    r = torch.randn(1, 19, *((11, 13) if stride == 1 else (6, 7)))
    (imp,) = _convs(m, x, r)
    (O,) = imp.func.outputs
    assert O.epilogue is not None and {c.name for c in imp.func.computations} == {"O", "Ipad"}
    report = compile_and_compare(m, x, r)
    assert [g.ops for g in report.taken] == [["convolution", "_native_batch_norm_legit_no_training", "add", "relu"]]


def test_a_convolution_read_raw_outside_its_group_keeps_its_epilogue_a_computation() -> None:
    def conv_twice(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = F.conv2d(x, w, padding=1)
        return y, torch.relu(y) * 2
    x, w = torch.randn(1, 5, 11, 13), torch.randn(19, 5, 3, 3)
    (imp,) = _convs(conv_twice, x, w)
    assert all(c.epilogue is None for c in imp.func.computations) and len(imp.func.outputs) == 2
    compile_and_compare(conv_twice, x, w)
