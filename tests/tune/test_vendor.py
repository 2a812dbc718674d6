"""The vendor baselines `polytile tune` times beside a GPU kernel compute the operator: each torch call
(run here on the CPU) matches the operator's float64 reference on random inputs, in its layout."""

import numpy as np
import pytest

from polytile import ops
from polytile.tune.vendor import gpu_vendor_baseline

pytest.importorskip("torch")


@pytest.mark.parametrize("op", [
    ops.matmul(33, 47, 29, "float32"),
    ops.batch_matmul(3, 17, 19, 23, "float32"),
    ops.conv2d(2, 5, 9, 9, 7, 3, 3, stride=2, padding=1),
    ops.conv2d_igemm(2, 7, 6, 8, 5, 3, 3, 1, 1, dtype="float32"),
    ops.conv3d_igemm(1, 4, 5, 5, 4, 6, 3, 3, 3, 1, 1, dtype="float32"),
    ops.softmax(13, 37),
    ops.layernorm(11, 29),
], ids=lambda op: op.name)
def test_gpu_vendor_baselines_compute_the_operator(op):
    inputs = op.make_inputs(np.random.default_rng(7))
    name, call = gpu_vendor_baseline(op, inputs, device="cpu")
    got = call().numpy()
    want = op.reference(*inputs)
    assert got.shape == want.shape, name
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4), name
