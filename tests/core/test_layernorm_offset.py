"""Layer normalization of rows far from zero (issue 15's GPU run found it): the moments of X itself,
E[x²] - mean², lost var / mean² of their digits — float32 rows of two close values came out 5e-4
off, rows of mean 300 and deviation 1 off by 5-8% (768 wide) or entirely (2 wide, inf). The op takes
the moments of the row shifted by its first element; checked row by row against float64 at widths
off the vector lanes, on the default CPU schedule and on the tuning template's forms."""

import numpy as np
import pytest

import polytile as pt
from polytile import ops
from polytile.tune import make_task


def _worst_row(out, ref):
    out, ref = np.asarray(out, np.float64).reshape(ref.shape), np.asarray(ref, np.float64)
    return max(ops.rel_error(o, r) for o, r in zip(out, ref))


@pytest.mark.parametrize("M,N", [(1001, 2), (33, 97), (16, 768)])
@pytest.mark.parametrize("offset", [0.0, 10.0, 300.0])
def test_rows_far_from_zero_keep_their_digits(M, N, offset, rng):
    op = ops.layernorm(M, N)
    kern = op.build("cpu")
    x, g, b = op.make_inputs(rng)
    x = (x + np.float32(offset)).astype(np.float32)
    assert _worst_row(kern(x, g, b), op.reference(x, g, b)) < op.tolerance, (M, N, offset)


def test_the_template_forms_shift_the_rows_too(rng):
    op = ops.layernorm(7, 300)
    task = make_task(op, "cpu")
    x, g, b = op.make_inputs(rng)
    x = (x + np.float32(300.0)).astype(np.float32)
    ref = op.reference(x, g, b)
    configs = task.space.sample_valid(np.random.default_rng(3), 6)
    assert configs
    for digits in configs:
        values = task.space.config(digits).values
        kern = pt.build(task.schedule(values), task.target)
        assert _worst_row(kern(x, g, b), ref) < op.tolerance, values
