"""Constant weights packed once (``polytile.torch.packing``): the packed layout against the weight
element by element, the compiled model against eager torch on odd sizes, packing on the first call
only, and a weight written in place (or replaced) between calls."""

from __future__ import annotations

import pytest
from torch_helpers import assert_close

import polytile.torch as ptt
from polytile.dtypes import INDEX
from polytile.lang import expr as lx
from polytile.torch import packing
from polytile.torch.packing import PackCache, PackedWeight

torch = pytest.importorskip("torch")


def _eval(e: lx.Expr) -> int:
    if isinstance(e, lx.Const):
        return int(e.value)
    a, b = _eval(e.a), _eval(e.b)  # type: ignore[attr-defined]
    return {"//": a // b, "%": a % b}[e.op]  # type: ignore[attr-defined]


@pytest.mark.parametrize("transposed", [True, False])
def test_panels_hold_each_element_where_the_kernel_reads_it(transposed: bool) -> None:
    K, N, nr = 771, 769, 64
    w = torch.randn(N, K).t() if transposed else torch.randn(K, N)  # a linear layer's B: [K][N], either storage
    pw = PackedWeight((K, N), 1, nr)
    packed = pw(w)
    assert packed.shape == pw.kernel_shape == (13, K, nr) and packed.is_contiguous()
    for k, n in [(0, 0), (770, 768), (5, 63), (5, 64), (400, 700)]:
        idx = tuple(_eval(e) for e in pw.index((lx.Const(k, INDEX), lx.Const(n, INDEX))))
        assert packed[idx] == w[k, n]
    assert torch.equal(packed[:, :, :].permute(0, 2, 1).reshape(13 * nr, K)[:N], w.t())
    assert not packed[-1, :, N % nr:].any()  # zeros past N


def test_filter_blocks_hold_each_filter() -> None:
    w = torch.randn(19, 5, 3, 3)
    packed = PackedWeight(tuple(w.shape), 0, 8)(w)
    assert packed.shape == (3, 5, 3, 3, 8)
    assert torch.equal(packed.movedim(-1, 1).reshape(24, 5, 3, 3)[:19], w)
    assert not packed[2, ..., 3:].any()


def test_the_cache_packs_again_only_when_the_weight_changes() -> None:
    p = torch.nn.Parameter(torch.randn(7, 33))
    cache = PackCache(PackedWeight((33, 7), 1, 16))
    with torch.no_grad():
        first = cache(p.t())
        assert cache(p.t()) is first and cache.packs == 1  # a new view of the same weight: packed already
        p.mul_(2)
        assert cache.packs == 1 and torch.equal(cache(p.t()), PackedWeight((33, 7), 1, 16)(p.t()))
        assert cache.packs == 2
        q = torch.nn.Parameter(p.detach().clone())
        assert torch.equal(cache(q.t()), PackedWeight((33, 7), 1, 16)(q.t())) and cache.packs == 3


class LinearConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(771, 769)
        self.conv = torch.nn.Conv2d(5, 19, 3, padding=1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(self.fc(x)), torch.relu(self.conv(y))


def test_a_model_with_packed_weights_matches_eager_and_sees_weights_written_in_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    packs: list[tuple[int, ...]] = []
    pack = PackedWeight.__call__

    def counted(self: PackedWeight, x: torch.Tensor) -> torch.Tensor:
        packs.append(self.kernel_shape)
        return pack(self, x)
    monkeypatch.setattr(packing.PackedWeight, "__call__", counted)
    m = LinearConv().eval()
    report = ptt.Report()
    compiled = torch.compile(m, backend=ptt.backend(report=report, choose="always"), dynamic=False)
    x, y = torch.randn(37, 771), torch.randn(1, 5, 11, 13)
    with torch.no_grad():
        assert_close(compiled(x, y), m(x, y))
        assert [(g.ops, g.packed) for g in report.taken] == [(["addmm", "relu"], 1), (["convolution", "relu"], 1)]
        packs.clear()
        x2 = torch.randn(37, 771)
        assert_close(compiled(x2, y), m(x2, y))
        assert packs == []  # the weights are packed already
        m.fc.weight.mul_(-1.5)  # in place, without recompiling: packed again
        m.conv.weight.add_(torch.randn_like(m.conv.weight))
        assert_close(compiled(x2, y), m(x2, y))
        assert len(packs) == 2
        m.fc.weight = torch.nn.Parameter(torch.randn(769, 771))  # another tensor
        assert_close(compiled(x2, y), m(x2, y))


def test_few_rows_and_function_inputs_are_not_packed() -> None:
    from torch._dynamo.backends.common import aot_autograd

    import polytile as pt
    from polytile.ops.matmul import cpu_gemm_tiles
    from polytile.torch.compiler import extract
    fc = torch.nn.Linear(771, 769).eval()
    adapters: list[object] = []

    def collect(gm: torch.fx.GraphModule, _: list[object]) -> object:
        adapters.extend(a for _, imp in extract(gm, pt.CPUTarget())[0] for a in imp.adapters)  # type: ignore[attr-defined]
        return gm.forward

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return fc(x) + x[:, :769] @ w
    # one row: dot products, B read in place; w: a function's input, not a constant
    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=collect), dynamic=False)(torch.randn(1, 771),
                                                                                   torch.randn(769, 769))
    assert adapters and not any(isinstance(a, PackedWeight) for a in adapters)
    with torch.no_grad():  # the same at 37 rows: the layer's weight is packed, w is not
        adapters.clear()
        torch._dynamo.reset()
        torch.compile(fn, backend=aot_autograd(fw_compiler=collect), dynamic=False)(torch.randn(37, 771),
                                                                                   torch.randn(769, 769))
    nr = cpu_gemm_tiles(37, 769, 771, pt.CPUTarget())["nr"]  # type: ignore[attr-defined]
    assert [a.kernel_shape for a in adapters if isinstance(a, PackedWeight)] == [(-(-769 // nr), 771, nr)]
