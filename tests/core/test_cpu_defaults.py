"""The default CPU schedules chosen from the shape and the machine (issue 15): each form against
NumPy on fresh random data at sizes that divide none of its tiles, on this machine's target and on
a wider one (AVX-512, four cores) whose tiles differ."""

import dataclasses

import pytest

from polytile import ops
from polytile.ops.matmul import cpu_stream_tiles
from polytile.target import cpu_target

WIDE = dataclasses.replace(cpu_target(), vector_bits=512, cores=4)


def check(op, rng, target=None):
    kern = op.build(target or cpu_target())
    inputs = op.make_inputs(rng)
    assert ops.rel_error(kern(*inputs), op.reference(*inputs)) < op.tolerance
    return kern


@pytest.mark.parametrize("M,N,K", [(1, 37, 53), (1, 1, 1), (3, 101, 67), (7, 45, 29), (13, 19, 23), (23, 71, 17)])
def test_few_rows_stream_b_unpacked(M, N, K, rng):
    """Few rows of A (a decoder's tokens): B is read in place, nothing packed."""
    assert cpu_stream_tiles(M, N, cpu_target()) is not None
    kern = check(ops.matmul(M, N, K), rng)
    assert "A_C_local" not in kern.source and "B_C_local" not in kern.source  # nothing packed


@pytest.mark.parametrize("M,N,K", [(1, 131, 29), (6, 53, 41), (9, 67, 13)])
def test_few_rows_on_a_wider_machine(M, N, K, rng):
    check(ops.matmul(M, N, K), rng, WIDE)


@pytest.mark.parametrize("batch,M", [(3, 1), (1, 2), (5, 7)])
def test_few_rows_batched(batch, M, rng):
    kern = check(ops.batch_matmul(batch, M, 45, 27), rng)
    assert "B_C_local" not in kern.source


def test_many_rows_keep_the_packed_schedule():
    assert cpu_stream_tiles(64, 100, cpu_target()) is None
    assert "B_C_local" in ops.matmul(64, 100, 30).build("cpu").source
