"""On a GPU: products and convolutions of 16-bit inputs stored as float16 / bfloat16 (``out_dtype``) by
each template — mma.sync, warpgroup MMA, the implicit-GEMM convolutions, the CUDA cores, the GEMV
kernels and split reductions — on fresh random inputs at sizes off the tiles: float32 sums rounded
once (within one unit in the last place of the output type plus float32 summation error of the
reference), and as close to torch's own 16-bit product as the tolerance allows."""

import pytest
from half_output_cases import CASES

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

FRACTION_BITS = {torch.float16: 10, torch.bfloat16: 7}


def _inputs(op, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    tdt = getattr(torch, op.func.inputs[0].dtype.name)
    shapes = [tuple(int(d.value) for d in t.shape) for t in op.func.inputs]
    return [(torch.rand(s, device="cuda", generator=g) * 2 - 1).to(tdt) for s in shapes]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_half_output(case, dtype):
    name, make, build = case
    seed = 2 * CASES.index(case) + (dtype == "bfloat16")
    if name.startswith("wgmma") and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs an sm_90 GPU")
    op = make(dtype)
    kern = build(op, "cuda")
    inputs = _inputs(op, seed)
    out = kern(*inputs)
    tdt = getattr(torch, dtype)
    assert out.dtype == tdt and torch.isfinite(out).all()
    wide = [x.double() for x in inputs]
    ref = torch.as_tensor(op.reference(*[x.cpu().numpy() for x in wide]), device="cuda").reshape(out.shape)
    magnitude = torch.as_tensor(op.reference(*[x.abs().cpu().numpy() for x in wide]), device="cuda"
                                ).reshape(out.shape)
    terms = op.flops / 2 / out.numel()
    # one rounding to the output type, plus float32 summation error (any order) of the reference
    ulp = ref.abs().clamp_min(2.0 ** -14) * 2.0 ** -FRACTION_BITS[tdt]
    bound = ulp + 2 * terms * 2.0 ** -24 * magnitude
    assert ((out.double() - ref).abs() <= bound).all(), float(((out.double() - ref).abs() / bound).max())
    assert float((out.double() - ref).norm() / ref.norm()) <= op.tolerance
    if op.name in ("matmul", "batch_matmul"):  # torch's own 16-bit product (its own summation, rounded once)
        theirs = (inputs[0] @ inputs[1]).double()
        assert float((out.double() - theirs).norm() / theirs.norm()) <= 2 * op.tolerance
