"""On a GPU: 16-bit GEMMs and batched products whose reduction is shorter than a tensor-core K step
(on the CUDA cores) against a float64 torch reference on fresh random inputs."""

import pytest

from polytile import ops

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dims", [(129, 65, 8, "float16", 0), (64, 64, 1, "bfloat16", 0), (200, 33, 15, "float16", 0),
                                  (40, 33, 5, "bfloat16", 3)],
                         ids=["129x65x8", "64x64x1", "200x33x15", "bmm-3x40x33x5"])
def test_short_reduction_is_the_product(dims):
    M, N, K, dt, batch = dims
    op = ops.batch_matmul(batch, M, N, K, dt, out_dtype=dt) if batch else ops.matmul(M, N, K, dt, out_dtype=dt)
    kern = op.build("cuda")
    g = torch.Generator(device="cuda").manual_seed(M + N + K)
    tdt = getattr(torch, dt)
    lead = (batch,) if batch else ()
    a = (torch.rand((*lead, M, K), device="cuda", generator=g) * 2 - 1).to(tdt)
    b = (torch.rand((*lead, K, N), device="cuda", generator=g) * 2 - 1).to(tdt)
    out = kern(a, b)
    ref = a.double() @ b.double()
    assert torch.isfinite(out).all()
    assert float((out.double() - ref).norm() / ref.norm()) <= op.tolerance
