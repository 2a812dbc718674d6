"""On a GPU: small GEMVs on the direct GEMV of one K step (``gpu_schedules.one_step_gemv``, the bound
``ONE_STEP_GEMV_BYTES`` set for the test) against a float64 torch reference on fresh random inputs at
sizes off the tiles (one row, one column, primes, K below a 16-byte row of A)."""

import pytest

from polytile import ops
from polytile.ops import gpu_schedules

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

CASES = [(2, 30, 63, "float32"), (1, 1, 1, "float32"), (3, 17, 5, "float32"), (4, 100, 50, "float32"),
         (1, 5044, 3, "float32"), (1, 45, 64, "bfloat16"), (3, 257, 17, "float16"), (2, 7, 33, "bfloat16")]


@pytest.mark.parametrize("dims", CASES, ids=["x".join(map(str, c[:3])) + "-" + c[3] for c in CASES])
def test_one_step_gemv_is_the_product(monkeypatch, dims):
    monkeypatch.setattr(gpu_schedules, "ONE_STEP_GEMV_BYTES", 1 << 16)
    M, N, K, dt = dims
    op = ops.matmul(M, N, K, dt)
    kern = op.build("cuda")
    assert "B_local" in kern.source and "B_shared" not in kern.source
    g = torch.Generator(device="cuda").manual_seed(M * N + K)
    tdt = getattr(torch, dt)
    a = (torch.rand((M, K), device="cuda", generator=g) * 2 - 1).to(tdt)
    b = (torch.rand((K, N), device="cuda", generator=g) * 2 - 1).to(tdt)
    out = kern(a, b)
    ref = a.double() @ b.double()
    assert torch.isfinite(out).all()
    assert float((out.double() - ref).norm() / ref.norm()) <= op.tolerance
