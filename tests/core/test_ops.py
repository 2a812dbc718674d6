"""The operator library: each operator with its default CPU schedule against its reference, at sizes
that do not divide the tiles."""

import pytest

from polytile import ops

CASES = [
    ("matmul", dict(M=67, N=45, K=89)),
    ("batch_matmul", dict(batch=3, M=33, N=45, K=27)),
    ("dense", dict(M=37, N=53, K=61)),
    ("conv2d", dict(N=1, C=5, H=13, W=15, K=11, R=3, S=3, padding=1)),
    ("conv2d", dict(N=2, C=3, H=11, W=9, K=7, R=3, S=3, stride=2, padding=1, pad_stage=False)),
    ("conv2d", dict(N=1, C=4, H=12, W=12, K=6, R=3, S=3, dilation=2, padding=2)),
    ("conv2d_nhwc", dict(N=1, H=9, W=9, C=6, K=10, R=3, S=3, padding=1)),
    ("softmax", dict(M=37, N=101)),
    ("layernorm", dict(M=29, N=77)),
    ("segment_sum", dict(rows=50, nnz=400)),
    ("spmm", dict(rows=30, cols=40, n=33, nnz=200)),
]


@pytest.mark.parametrize("name,shape", CASES, ids=[f"{n}-{k}" for k, (n, _) in enumerate(CASES)])
def test_op_default_schedule(name, shape, rng):
    op = ops.get(name, **shape)
    kern = op.build("cpu")
    inputs = op.make_inputs(rng)
    assert ops.rel_error(kern(*inputs), op.reference(*inputs)) < op.tolerance
    if op.baseline is not None:
        assert ops.rel_error(op.baseline(*inputs), op.reference(*inputs)) < op.tolerance


def test_unknown_op_and_bad_shape():
    with pytest.raises(ops.PolytileError if hasattr(ops, "PolytileError") else Exception, match="unknown operator"):
        ops.get("matmull")
    with pytest.raises(Exception, match="operator matmul"):
        ops.get("matmul", M=3)
