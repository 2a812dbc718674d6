"""The importer on the aten operations it supports: each function compiled with choose="always" (every
group polytile can take is taken) matches eager torch, and the report lists every operation as taken."""

from __future__ import annotations

import pytest
from torch_helpers import compile_and_compare

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _taken(report: object) -> set[str]:
    return set(report.taken_ops)  # type: ignore[attr-defined]


def elementwise(x: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, ...]:
    a = (x + y * 2 - 0.5) / (y.abs() + 1)
    b = torch.exp(-a) + torch.log(x.abs() + 1) + torch.sqrt(y.abs()) + torch.rsqrt(x * x + 1)
    c = torch.tanh(a) * torch.sigmoid(b) + torch.erf(x) + torch.sin(y) * torch.cos(x) + torch.reciprocal(b + 3)
    d = F.relu(c) + F.gelu(x) + F.gelu(y, approximate="tanh") + F.silu(c) + torch.pow(a, 2) + torch.pow(b, 0.5)
    e = torch.maximum(d, x).clamp(-0.5, 0.7) + torch.minimum(a, y).clamp_min(0.1) + F.hardtanh(b)
    f = torch.where(x > y, e, -e).masked_fill(m, 1.5)
    g = (f < 0.2) & (x >= y) | (y != 0.5)
    return f, g, f.to(torch.float64) * 3, torch.rsub(f, 1.0)


def test_elementwise_operations_match_eager() -> None:
    x, y = torch.randn(7, 13), torch.randn(13)
    m = torch.rand(7, 13) < 0.3
    report = compile_and_compare(elementwise, x, y, m)
    for op in ("add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "sin",
               "cos", "reciprocal", "relu", "gelu", "silu", "pow", "maximum", "minimum", "clamp", "clamp_min",
               "hardtanh", "where", "masked_fill", "gt", "lt", "ge", "ne",
               "_to_copy", "rsub", "abs", "bitwise_and", "bitwise_or"):
        assert op in _taken(report), op
    assert not report.left, report


def views(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    t = x.transpose(0, 2).reshape(6, 5, 7)          # (7, 5, 6) -> (6, 5, 7): split and merge
    p = x.permute(1, 0, 2)[1:4:2, :, 2]             # slice with a step, select
    s = b.unsqueeze(0).expand(6, 5, 7)
    return (t * 2 + s).sum(-1, keepdim=True) + p.reshape(3, 4).mean()


def test_views_are_index_maps() -> None:
    x = torch.randn(6, 5, 7)
    b = torch.randn(5, 7)
    report = compile_and_compare(views, x, b)
    assert {"mul", "add", "sum"} <= _taken(report)


def reductions(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, ...]:
    ln = F.layer_norm(x + 1, (x.shape[-1],), w, bias, eps=1e-5)
    rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    sm = torch.softmax(x * 0.5, dim=-1)
    return ln, rms, sm, x.sum(-1), x.amax(-1), x.amin(-1, keepdim=True), x.mean((-2, -1))


def test_reductions_softmax_layernorm_rmsnorm() -> None:
    x = torch.randn(3, 5, 37)
    w, b = torch.randn(37), torch.randn(37)
    report = compile_and_compare(reductions, x, w, b)
    assert {"native_layer_norm", "_softmax", "mean", "sum", "amax", "amin", "rsqrt", "pow"} <= _taken(report)


def gemms(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor, q: torch.Tensor,
          k: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = F.relu(F.linear(x, w, b)) + r                # addmm with a transposed weight + relu + residual
    z = torch.addmm(b, x, w.t(), beta=0.5, alpha=2.0)
    s = torch.bmm(q, k.transpose(1, 2)) * 0.125      # batched, K transposed
    t = torch.baddbmm(s, q, k.transpose(1, 2))
    u = torch.matmul(q, k[:1].transpose(1, 2).expand(4, 9, 11))  # a broadcast operand
    return y, z, s, t, u, x @ w.t()


def test_matrix_products_with_epilogues() -> None:
    x, w, b = torch.randn(17, 29), torch.randn(23, 29), torch.randn(23)
    r = torch.randn(17, 23)
    q, k = torch.randn(4, 11, 9), torch.randn(4, 11, 9)
    report = compile_and_compare(gemms, x, w, b, r, q, k)
    assert {"addmm", "bmm", "baddbmm", "relu"} <= _taken(report)
    assert not [x for x in report.left if x.op in ("addmm", "bmm", "baddbmm", "mm")], report


class ConvBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(5, 6, 3, stride=2, padding=1, bias=True)
        self.bn = torch.nn.BatchNorm2d(6)
        self.bn.running_mean.uniform_(-0.2, 0.2)
        self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)) + r)


def test_convolution_batch_norm_relu_residual() -> None:
    block = ConvBlock().eval()
    report = compile_and_compare(block, torch.randn(2, 5, 11, 9), torch.randn(2, 6, 6, 5))
    assert {"convolution", "_native_batch_norm_legit_no_training", "relu", "add"} <= _taken(report)
    assert [g.kind for g in report.taken] == ["conv"]


def test_float16_on_the_cpu() -> None:
    x, w = torch.randn(9, 40).half(), torch.randn(40).half()
    report = compile_and_compare(lambda x, w: torch.softmax(x * w, -1) + F.silu(x), x, w)
    assert {"_softmax", "silu"} <= _taken(report)


def test_input_layouts_permuted_and_expanded() -> None:
    from polytile.torch.importer import InputAdapter
    base = torch.randn(4, 6, 5)
    t = base.permute(2, 0, 1)
    ad = InputAdapter.of(t)
    assert ad.perm == (1, 2, 0) and ad(t).data_ptr() == base.data_ptr()  # no copy: the base itself
    e = torch.randn(5, 1).expand(5, 7)
    ad = InputAdapter.of(e)
    assert ad.narrowed == (1,) and ad(e).shape == (5, 1)
    report = compile_and_compare(lambda a, b: a * 2 + b.sum(-1)[:, None, None], t, e.t().contiguous().t())
    assert "mul" in _taken(report)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_attention_as_its_pieces() -> None:
    q, k, v = torch.randn(2, 3, 10, 8), torch.randn(2, 3, 12, 8), torch.randn(2, 3, 12, 8)
    mask = torch.randn(2, 1, 10, 12)
    report = compile_and_compare(attention, q, k, v, mask, attention="pieces")
    assert {"bmm", "_safe_softmax"} <= _taken(report)
    whole = compile_and_compare(attention, q, k, v, mask)  # the default keeps torch's fused kernels
    assert "bmm" not in _taken(whole) and any("scaled_dot_product" in x.op for x in whole.left)


def heads_attention(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, mask: torch.Tensor,
                    heads: int) -> torch.Tensor:
    """BERT's self-attention written out: the heads split from the width by views and permutes, so the
    batched products read [tokens][heads · head size] matrices, K transposed."""
    (_, s, width), d = x.shape, x.shape[-1] // heads
    q, k, v = (F.linear(x, w).view(1, s, heads, d).permute(0, 2, 1, 3) for w in (wq, wk, wv))
    p = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / d ** 0.5 + mask, -1)
    return torch.matmul(p, v).permute(0, 2, 1, 3).contiguous().view(1, s, width)


def heads_inputs(tokens: int, heads: int, d: int, dtype: torch.dtype = torch.float32,
                 device: str = "cpu") -> list[torch.Tensor]:
    w = heads * d
    shapes = [(1, tokens, w), (w, w), (w, w), (w, w), (1, 1, 1, tokens)]
    return [torch.randn(s, device=device).to(dtype) for s in shapes]


def test_attention_products_read_the_heads_in_place() -> None:
    # the heads inside a row (batch stride: the head size; row stride: the width) were refused as
    # "operand layouts other than row-major and transposed": BERT-base left its 24 bmm to torch
    from polytile.torch.importer import InputAdapter, product_operand
    x = torch.randn(1, 10, 4, 8).permute(0, 2, 1, 3).reshape(4, 10, 8)  # a view: [10][4 · 8] in memory
    for role, t in (("A", x), ("B", x), ("B", x.transpose(1, 2))):
        ad = product_operand(t, role)
        assert ad.merged == 1 and ad.kernel_shape == (10, 32) and ad(t).data_ptr() == t.data_ptr()
    assert product_operand(x.transpose(1, 2), "A") == InputAdapter.of(x.transpose(1, 2), permute=False)  # copied
    report = compile_and_compare(lambda *a: heads_attention(*a, heads=4), *heads_inputs(10, 4, 8))
    assert report.taken_ops["bmm"] == 2 and not report.left_ops["bmm"]


def test_cpu_row_reductions_use_vector_partial_results() -> None:
    """A row's sum is accumulated in one vector of partial sums (then summed), not one dependent
    addition per column; 45 columns: a partial last vector."""
    from polytile.torch import compiler
    compiler._KERNELS.clear()
    x = torch.randn(6, 45)
    report = compile_and_compare(lambda x: torch.softmax(x, -1) + x.sum(-1, keepdim=True), x)
    assert {"_softmax", "sum"} <= _taken(report)
    sources = [k.source for k in compiler._KERNELS.values()]
    assert any("_part" in s and ("pt_vload" in s or "omp simd" in s) for s in sources)


@pytest.mark.parametrize("rows,n,k", [(1, 37, 53), (3, 45, 29), (8, 101, 67), (5, 19, 8)])
def test_cpu_linear_layers_of_few_rows_sum_dot_products(rows: int, n: int, k: int) -> None:
    """B transposed (a linear layer's weight) with few rows: dot products over K in vector lanes (K's
    tail after the lanes), the weight read in place; more rows keep the packed BLIS form."""
    from polytile.target import cpu_target
    from polytile.torch import compiler
    # K shorter than one vector of this machine's lanes (K = 8 on AVX-512) keeps the packed form too
    for m, dot in ((rows, k >= cpu_target().vector_lanes(4)), (30, False)):
        compiler._KERNELS.clear()
        x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
        report = compile_and_compare(lambda x, w, b: F.relu(F.linear(x, w, b)), x, w, b)
        assert "addmm" in _taken(report)
        (source,) = [kern.source for kern in compiler._KERNELS.values()]
        assert ("C_lanes" in source) == dot and ("B_C_local" in source) == (not dot)
