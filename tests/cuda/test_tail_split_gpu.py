"""On a GPU: GEMMs whose last wave's rows are split (``gpu_schedules.tail_split_choice``, opt-in)
against a float64 torch reference on fresh random inputs: the model's split and forced splits of the
tail (1 to 3 chunks, unequal ones among them), at sizes off the tiles (primes, odd K and N whose rows
are copied aligned, 4-byte aligned rows read in pieces), and the default with the switch on."""

import pytest

import polytile as pt
from polytile import ops
from polytile.dtypes import as_dtype
from polytile.ops import gpu_schedules
from polytile.ops.gpu_schedules import gemm_as, gemm_choice, tail_split_choice
from polytile.runtime.cuda_device import cuda_target

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

# M, N, K, dtype, head rows (None: the model's), tail chunks (None: the model's)
CASES = [(5096, 840, 4216, "float16", None, None), (5096, 840, 4216, "bfloat16", None, 3),
         (997, 523, 1031, "bfloat16", 512, 3), (1009, 1000, 1013, "float16", 768, 2),
         (1946, 1260, 2052, "bfloat16", None, 2), (4256, 1001, 3001, "float16", None, 1),
         (331, 136, 4099, "float16", 256, 4)]


def _check(kern, M, N, K, dt, op, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    tdt = getattr(torch, dt)
    a = (torch.rand((M, K), device="cuda", generator=g) * 2 - 1).to(tdt)
    b = (torch.rand((K, N), device="cuda", generator=g) * 2 - 1).to(tdt)
    out = kern(a, b)
    ref = a.double() @ b.double()
    assert out.dtype == tdt and out.shape == (M, N) and torch.isfinite(out).all()
    assert float((out.double() - ref).norm() / ref.norm()) <= op.tolerance
    # every row, the head's last and the tail's first among them
    rows = (out.double() - ref).norm(dim=1) / ref.norm(dim=1)
    assert float(rows.max()) <= 10 * op.tolerance


@pytest.mark.parametrize("case", CASES, ids=["x".join(map(str, c[:3])) + f"-{c[3]}-h{c[4]}-s{c[5]}" for c in CASES])
def test_split_rows_are_the_product(case):
    M, N, K, dt, head, split = case
    target = cuda_target()
    dtype = as_dtype(dt)
    whole = gemm_choice(target, M, N, K, dtype, out_bytes=2, split_k=1)
    c = tail_split_choice(target, whole, M, N, K, dtype, 2, head_rows=head, tail_split_k=split)
    assert c is not None and c.tail is not None
    op = ops.matmul(M, N, K, dt, out_dtype=dt)
    kern = pt.build(gemm_as(pt.Schedule(op.func), c, M, N, K), target)
    assert "P[" in kern.source and "H[" in kern.source
    _check(kern, M, N, K, dt, op, M * 7 + N + K)


def test_the_default_with_the_switch_on(monkeypatch):
    monkeypatch.setenv(gpu_schedules.TAIL_SPLIT_VARIABLE, "1")
    monkeypatch.setattr(gpu_schedules, "_TAILS", {})  # tails chosen before are cached
    monkeypatch.setattr(gpu_schedules, "tail_combine_seconds", lambda *a: -1e-3)  # the model takes the split
    M, N, K, dt = 5096, 840, 4216, "float16"
    op = ops.matmul(M, N, K, dt, out_dtype=dt)
    kern = op.build("cuda")
    assert len(kern.kernels) == 3 and "P[" in kern.source
    _check(kern, M, N, K, dt, op, 424242)
