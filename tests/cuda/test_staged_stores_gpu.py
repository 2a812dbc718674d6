"""On a GPU: tensor-core GEMMs and implicit-GEMM convolutions whose 16-bit results are staged in shared
memory and copied out by the threads (``gpu_schedules.STAGED_ODD_STORES``, its bound off for the test), and the
direct GEMV of one K step for B past ``ONE_STEP_GEMV_BYTES`` (``wide_one_step``'s), against a float64
torch reference on fresh random inputs at sizes off the tiles (odd, prime, M = 1)."""

import pytest
from gpu_inputs import rel_error, signed_inputs

from polytile import ops
from polytile.ops import gpu_schedules

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

GEMMS = [(1001, 10781, 71, "float16"), (128, 50257, 768, "float16"), (77, 30523, 512, "bfloat16"),
         (2048, 4097, 1023, "bfloat16"), (16, 4097, 512, "float16"), (17, 31, 200, "float16"), (131, 9, 67, "bfloat16"),
         (300, 517, 64, "float16")]


@pytest.mark.parametrize("dims", GEMMS, ids=["x".join(map(str, c[:3])) + "-" + c[3] for c in GEMMS])
def test_staged_gemm_is_the_product(monkeypatch, dims):
    monkeypatch.setattr(gpu_schedules, "STAGED_ODD_STORES", True)
    monkeypatch.setattr(gpu_schedules, "STAGED_LEAST_RESULTS", 0)  # small products too
    M, N, K, dt = dims
    op = ops.matmul(M, N, K, dt, out_dtype=dt)
    kern = op.build("cuda")
    assert "C_stage" in kern.source
    a, b = signed_inputs(torch, [(M, K), (K, N)], dt, M * 7 + N + K)
    out = kern(a, b)
    assert out.dtype == getattr(torch, dt)
    assert rel_error(out, a.double() @ b.double()) <= op.tolerance


CONVS = [(16, 70, 70, 14, 161, 1, 1, 1, 0), (1, 101, 103, 304, 33, 3, 3, 1, 1), (2, 9, 11, 3, 33, 3, 3, 2, 1),
         (7, 29, 27, 128, 75, 3, 3, 1, 1)]


@pytest.mark.parametrize("dims", CONVS, ids=["x".join(map(str, c)) for c in CONVS])
def test_staged_conv_is_the_convolution(monkeypatch, dims):
    monkeypatch.setattr(gpu_schedules, "STAGED_ODD_STORES", True)
    monkeypatch.setattr(gpu_schedules, "STAGED_LEAST_RESULTS", 0)  # small products too
    N, H, W, C, K, R, S, st, pad = dims
    op = ops.conv2d_igemm(N, H, W, C, K, R, S, stride=st, padding=pad, dtype="float16", out_dtype="float16")
    kern = op.build("cuda")
    assert "O_stage" in kern.source
    x, w = signed_inputs(torch, [(N, H, W, C), (R, S, C, K)], "float16", N * H + C * K)
    out = kern(x, w)
    y = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(3, 2, 0, 1), stride=st,
                                   padding=pad)
    assert rel_error(out.reshape(-1, K), y.permute(0, 2, 3, 1).reshape(-1, K)) <= op.tolerance


WIDE = [(1, 8424, 48, "float32"), (1, 20011, 64, "float32"), (3, 9001, 33, "float32"), (1, 8424, 48, "bfloat16"),
        (1, 30011, 17, "float16")]


@pytest.mark.parametrize("dims", WIDE, ids=["x".join(map(str, c[:3])) + "-" + c[3] for c in WIDE])
def test_wide_one_step_gemv_is_the_product(dims):
    import polytile as pt
    from polytile.target import as_target
    M, N, K, dt = dims
    op = ops.matmul(M, N, K, dt)
    it = 4 if dt == "float32" else 2
    one = gpu_schedules.one_step_gemv(M, N, K, it, gpu_schedules.WIDE_ONE_STEP_BYTES, as_target("cuda").sms)
    sched = pt.Schedule(op.func)
    kern = pt.build(gpu_schedules.gemm_as(sched, gpu_schedules.GemmChoice("gemv", one, 1, 0.0), M, N, K) or sched,
                    "cuda")
    assert "B_local" in kern.source and "B_shared" not in kern.source and len(kern.kernels) == 1
    a, b = signed_inputs(torch, [(M, K), (K, N)], dt, M * N + K)
    assert rel_error(kern(a, b), a.double() @ b.double()) <= op.tolerance


OVERLAID = [(1001, 10781, 71, "float16"), (77, 30523, 512, "float16"), (2048, 4097, 1023, "bfloat16"),
            (16, 4097, 512, "float16"), (300, 517, 333, "bfloat16")]


@pytest.mark.parametrize("dims", OVERLAID, ids=["x".join(map(str, c[:3])) + "-" + c[3] for c in OVERLAID])
def test_overlaid_stage_is_the_product(dims):
    # the staging tile in the operand tiles' storage, behind a barrier: a warp still reading its operands
    # (wgmma, ldmatrix) or a load still landing in them would show here
    from dataclasses import replace

    import polytile as pt
    from polytile.dtypes import as_dtype
    from polytile.ops.gpu_schedules import gemm_as, gemm_choice
    from polytile.target import as_target
    M, N, K, dt = dims
    op = ops.matmul(M, N, K, dt, out_dtype=dt)
    choice = gemm_choice(as_target("cuda"), M, N, K, as_dtype(dt), out_bytes=2)
    choice = replace(choice, params={**choice.params, "store": "staged overlaid"})
    sched = pt.Schedule(op.func)
    kern = pt.build(gemm_as(sched, choice, M, N, K) or sched, "cuda")
    assert "C_stage = (" in kern.source  # overlaid
    a, b = signed_inputs(torch, [(M, K), (K, N)], dt, M * 3 + N + K)
    out = kern(a, b)
    assert rel_error(out, a.double() @ b.double()) <= op.tolerance
