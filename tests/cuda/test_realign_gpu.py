"""On a GPU: GEMVs whose rows of B are not 16-byte aligned (an odd number of 16-bit columns), read as
aligned chunks realigned in registers (lowering/passes/realign_loads.py), against an exact reference.
Inputs are small integers, so every product and sum is exact in float32: a lane shifted by one
element, or a lane past a row's end not zeroed, changes the result (a relative-norm tolerance could
hide an edge column)."""

import pytest

from polytile import ops
from polytile.errors import InputError

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _ints(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-3, 4, shape, device="cuda", generator=g).to(getattr(torch, dtype))


def _exact(kern, a, b):
    out = kern(a, b)
    ref = (a.double() @ b.double()).float()
    assert out.shape == ref.shape
    bad = (out != ref).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} wrong elements, first at {bad[:4].tolist()}"


MATMULS = [
    ((1, 4097, 4093), "bfloat16"),   # the shape suite's awkward.m1_odd (prime K: uneven split)
    ((1, 50257, 768), "float16"),    # GPT-2's vocabulary row
    ((8, 50257, 768), "float16"),    # 8 rows: 8-byte realigned loads
    ((2, 33, 17), "bfloat16"),       # fewer columns than a thread's vector
    ((3, 1009, 1013), "bfloat16"),   # primes
    ((5, 7, 5), "float16"),
    ((13, 1001, 999), "float16"),
    ((16, 257, 131), "float16"),     # the last GEMV size
    ((4, 4099, 4095), "float16"),    # every row's misalignment (4099 = 3 mod 8)
]


@pytest.mark.parametrize("dims,dtype", MATMULS, ids=[f"{d[0]}x{d[1]}x{d[2]}-{t}" for d, t in MATMULS])
def test_default_gemv_of_unaligned_rows_is_exact(dims, dtype):
    M, N, K = dims
    kern = ops.matmul(M, N, K, dtype).build("cuda")
    _exact(kern, _ints((M, K), dtype, N), _ints((K, N), dtype, K))


@pytest.mark.parametrize("dims,dtype", [((3, 5, 1001, 257), "float16"), ((4, 1, 4097, 63), "bfloat16"),
                                        ((2, 16, 333, 999), "bfloat16")])
def test_batched_gemv_of_unaligned_rows_is_exact(dims, dtype):
    batch, M, N, K = dims
    kern = ops.batch_matmul(batch, M, N, K, dtype).build("cuda")
    a, b = _ints((batch, M, K), dtype, N), _ints((batch, K, N), dtype, K)
    out = kern(a, b)
    assert torch.equal(out, (a.double() @ b.double()).float())


@pytest.mark.parametrize("dims,dtype,cfg", [
    ((3, 1001, 333), "bfloat16", dict(threads=64, vector=16, bk=8, stages=3, direct=True, split=1)),
    ((5, 1001, 777), "float16", dict(threads=128, vector=16, bk=16, stages=3, direct=True, split=7)),
    ((7, 1003, 500), "float32", dict(threads=32, vector=16, bk=8, stages=3, direct=True, split=4)),  # 4-byte rows
])
def test_gemv_template_variants_of_unaligned_rows_are_exact(dims, dtype, cfg):
    from polytile.build import build
    from polytile.target import as_target
    from polytile.tune import make_task
    M, N, K = dims
    target = as_target("cuda")
    task = make_task("matmul", target, M=M, N=N, K=K, dtype=dtype, template="matmul_gemv")
    assert task._check(cfg) is None
    _exact(build(task.schedule(cfg), target), _ints((M, K), dtype, 1), _ints((K, N), dtype, 2))


def test_views_are_refused_or_read_right():
    # a realigned load reads the aligned chunks around B's rows: B must be its own dense array, or
    # a view the call path copies or refuses (a view that starts off 16 bytes: refused)
    M, N, K = 1, 4097, 1023
    kern = ops.matmul(M, N, K, "float16").build("cuda")
    a = _ints((M, K), "float16", 3)
    wide = _ints((K, N + 5), "float16", 4)
    flat = _ints((K * N + 1,), "float16", 5)
    for b in (wide[:, :N], flat[1:].view(K, N), wide[:, 3:N + 3]):
        try:
            out = kern(a, b)
        except InputError:
            continue
        assert torch.equal(out, (a.double() @ b.double()).float())


@pytest.mark.parametrize("dims,dtype", [((128, 50257, 768), "float16"), ((33, 1001, 999), "bfloat16"),
                                        ((4095, 4097, 1023), "float16"), ((127, 255, 4096), "bfloat16")])
def test_aligned_operand_copies_are_exact(dims, dtype):
    # tensor-core GEMMs read aligned copies of rows that are not 4-byte aligned; each thread of the copy
    # kernel moves 16 bytes (a realigned load), zeros past a row's end
    M, N, K = dims
    kern = ops.matmul(M, N, K, dtype).build("cuda")
    _exact(kern, _ints((M, K), dtype, 6), _ints((K, N), dtype, 7))
