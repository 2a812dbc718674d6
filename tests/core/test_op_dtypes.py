"""The operator library's data types: 16-bit softmax and layernorm compute in float32 and store the
16-bit type (as torch does); integer products and convolutions sum in int32 as NumPy does when given
int32 (never wrapping in int8); every result is judged with its type's tolerance from one place
(``dtypes.tolerance``), exactly for integers."""

from __future__ import annotations

import numpy as np
import pytest

from polytile import dtypes, ops


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name,shape", [("softmax", dict(M=37, N=101)), ("layernorm", dict(M=29, N=77))])
def test_16_bit_normalizations_compute_in_float32_and_store_16_bits(rng, name, shape, dtype):
    op = ops.get(name, **shape, dtype=dtype)
    kern = op.build("cpu")
    inputs = op.make_inputs(rng)
    out = kern(*inputs)
    assert out.dtype == dtypes.as_dtype(dtype).numpy
    ref = op.reference(*inputs)  # NumPy in float64
    err = ops.rel_error(out, ref)
    # rounding the float64 result to the 16-bit type is all the error there should be
    rounded = ops.rel_error(ref.astype(out.dtype), ref)
    assert err <= 2 * rounded + 1e-6 and err <= op.tolerance
    assert op.tolerance == dtypes.tolerance(dtype, shape["N"])


def test_normalizations_refuse_integer_data():
    with pytest.raises(ops.PolytileError, match="softmax normalizes floating-point data; int8 is not"):
        ops.get("softmax", M=4, N=4, dtype="int8")


def _full_range(rng: np.random.Generator, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The same arrays with values over the whole range of their integer type."""
    out = []
    for a in arrays:
        info = np.iinfo(a.dtype)
        out.append(rng.integers(info.min, info.max, a.shape, endpoint=True).astype(a.dtype))
    return out


INTEGER_OPS = [
    ("matmul", dict(M=67, N=45, K=89), lambda a, b: np.matmul(a, b)),
    ("batch_matmul", dict(batch=3, M=33, N=45, K=27), lambda a, b: np.matmul(a, b)),
    ("dense", dict(M=37, N=53, K=61), lambda x, w, b: np.maximum(x @ w.T + b, 0)),
    ("conv2d", dict(N=1, C=5, H=13, W=15, K=11, R=3, S=3, padding=1), None),
    ("conv2d", dict(N=2, C=3, H=11, W=9, K=7, R=3, S=3, stride=2, padding=1, pad_stage=False), None),
    ("conv2d_nhwc", dict(N=1, H=9, W=9, C=6, K=10, R=3, S=3, padding=1), None),
    ("conv2d_igemm", dict(N=1, H=9, W=9, C=6, K=10, R=3, S=3, padding=1), None),
]


def _numpy_conv_nchw(i: np.ndarray, w: np.ndarray, stride: int, padding: int) -> np.ndarray:
    """An independent direct convolution with NumPy's int32 arithmetic (NCHW × KCRS)."""
    n, c, h, wd = i.shape
    k, _, r, s = w.shape
    x = np.pad(i, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    p, q = (h + 2 * padding - r) // stride + 1, (wd + 2 * padding - s) // stride + 1
    out = np.zeros((n, k, p, q), np.int32)
    for rr in range(r):
        for ss in range(s):
            patch = x[:, :, rr:rr + stride * (p - 1) + 1:stride, ss:ss + stride * (q - 1) + 1:stride]
            out += np.einsum("nchw,kc->nkhw", patch, w[:, :, rr, ss])
    return out


def _numpy(name: str, shape: dict, fn, inputs: list[np.ndarray]) -> np.ndarray:  # noqa: ANN001
    wide = [a.astype(np.int32) for a in inputs]
    if fn is not None:
        return fn(*wide)
    st, pad = shape.get("stride", 1), shape.get("padding", 0)
    if name == "conv2d":
        return _numpy_conv_nchw(*wide, st, pad)
    i, w = wide  # NHWC × RSCK
    out = _numpy_conv_nchw(i.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), st, pad).transpose(0, 2, 3, 1)
    return out if name == "conv2d_nhwc" else out.reshape(-1, out.shape[-1])


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16"])
@pytest.mark.parametrize("name,shape,fn", INTEGER_OPS, ids=[f"{n}-{k}" for k, (n, _, _) in enumerate(INTEGER_OPS)])
def test_integer_products_sum_in_int32_like_numpy(rng, name, shape, fn, dtype):
    op = ops.get(name, **shape, dtype=dtype)
    inputs = _full_range(rng, op.make_inputs(rng))  # int8 sums of these overflow at the second term
    out = op.build("cpu")(*inputs)
    want = _numpy(name, shape, fn, inputs)
    assert out.dtype == np.int32 and np.abs(want).max() > 2 ** 15
    np.testing.assert_array_equal(out, want)
    assert op.tolerance == 0.0 and ops.rel_error(out, op.reference(*inputs)) == 0.0


def test_tolerances_come_from_the_result_type():
    assert dtypes.tolerance("int8") == dtypes.tolerance("int32", 4096) == dtypes.tolerance("bool") == 0.0
    f32, f16, bf16 = (dtypes.tolerance(d) for d in ("float32", "float16", "bfloat16"))
    assert f32 < f16 < bf16
    # no stricter than rounding to the type, no looser than a few of its epsilons
    for d, tol in (("float16", f16), ("bfloat16", bf16)):
        assert dtypes.epsilon(d) / 2 < tol < 4 * dtypes.epsilon(d)
    assert dtypes.tolerance("float32", 4096) > dtypes.tolerance("float32", 64) > f32  # longer sums
    assert dtypes.tolerance("float32", 64, operands="float16") == dtypes.TENSOR_CORE_TOLERANCE
    assert dtypes.accumulator("int8") == dtypes.accumulator("uint8") == dtypes.accumulator("int16") == dtypes.int32
    assert dtypes.accumulator("bfloat16") == dtypes.float32 and dtypes.accumulator("float64") == dtypes.float64
    for name, shape, dtype, result, reduction in [
            ("matmul", dict(M=8, N=8, K=300), "float16", "float32", 300),
            ("conv2d", dict(N=1, C=4, H=8, W=8, K=4, R=3, S=3), "float64", "float64", 36),
            ("softmax", dict(M=8, N=50), "bfloat16", "bfloat16", 50),
            ("spmm", dict(rows=10, cols=10, n=4, nnz=40), "float32", "float32", 4)]:
        op = ops.get(name, **shape, dtype=dtype)
        assert op.func.outputs[0].dtype.name == result
        assert op.tolerance == dtypes.tolerance(result, reduction, dtype)
