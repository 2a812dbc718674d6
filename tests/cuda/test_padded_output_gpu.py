"""On a GPU: GEMMs of 16-bit results of odd N computed in padded rows and copied out
(``gpu_schedules.padded_output``; the bound ``PADDED_OUTPUT_ELEMENTS`` set for the test) against a
float64 torch reference on fresh random inputs at sizes off the tiles."""

import pytest

from polytile import ops
from polytile.ops import gpu_schedules

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

CASES = [(1001, 10781, 71, "float16"), (300, 517, 71, "bfloat16"), (129, 65, 24, "float16"), (17, 31, 200, "float16")]


@pytest.mark.parametrize("dims", CASES, ids=["x".join(map(str, c[:3])) + "-" + c[3] for c in CASES])
def test_padded_output_is_the_product(monkeypatch, dims):
    monkeypatch.setattr(gpu_schedules, "PADDED_OUTPUT_ELEMENTS", 1)
    M, N, K, dt = dims
    op = ops.matmul(M, N, K, dt, out_dtype=dt)
    kern = op.build("cuda")
    assert "Cp" in kern.source
    g = torch.Generator(device="cuda").manual_seed(M + N + K)
    tdt = getattr(torch, dt)
    a = (torch.rand((M, K), device="cuda", generator=g) * 2 - 1).to(tdt)
    b = (torch.rand((K, N), device="cuda", generator=g) * 2 - 1).to(tdt)
    out = kern(a, b)
    ref = a.double() @ b.double()
    assert out.dtype == tdt and torch.isfinite(out).all()
    assert float((out.double() - ref).norm() / ref.norm()) <= op.tolerance
