"""The default CPU schedules chosen from the shape and the machine (issue 15): each form against
NumPy on fresh random data at sizes that divide none of its tiles, on this machine's target and on
a wider one (AVX-512, four cores) whose tiles differ."""

import dataclasses
import re

import pytest

from polytile import ops
from polytile.ops.matmul import cpu_stream_tiles
from polytile.ops.norm import row_lanes
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


def test_few_rows_in_column_blocks(rng):
    """Accumulators over more than half the L2 cache: the columns in blocks, run in parallel."""
    small_l2 = dataclasses.replace(cpu_target(), l2_bytes=16 * 1024)
    assert cpu_stream_tiles(3, 1001, small_l2)["blocks"] == 2
    kern = check(ops.matmul(3, 1001, 17), rng, small_l2)
    assert "omp parallel" in kern.source or "serial: about" in kern.source  # a parallel loop (too small to run so)


@pytest.mark.parametrize("batch,M", [(3, 1), (1, 2), (5, 7)])
def test_few_rows_batched(batch, M, rng):
    kern = check(ops.batch_matmul(batch, M, 45, 27), rng)
    assert "B_C_local" not in kern.source


def test_many_rows_keep_the_packed_schedule():
    assert cpu_stream_tiles(64, 100, cpu_target()) is None
    assert "B_C_local" in ops.matmul(64, 100, 30).build("cpu").source


@pytest.mark.parametrize("M,N,K", [(1, 37, 53), (3, 101, 67), (8, 45, 29), (1, 19, 8), (13, 23, 17), (5, 7, 1031)])
@pytest.mark.parametrize("activation", ["relu", "none"])
def test_dense_few_rows_as_dot_products(M, N, K, activation, rng):
    """A dense layer's W is N × K (B transposed): few rows sum dot products over K in vector lanes,
    W read in place (not packed), K's tail and the bias after the lanes — where K holds a whole vector
    of this machine's lanes (K = 8 on a 16-lane AVX-512 machine keeps the packed form)."""
    kern = check(ops.dense(M, N, K, activation=activation), rng)
    if K >= cpu_target().vector_lanes(4):
        assert "XW_lanes" in kern.source and "W_XW_local" not in kern.source
    else:
        assert "XW_lanes" not in kern.source and "W_XW_local" in kern.source


@pytest.mark.parametrize("M,N,K", [(1, 131, 29), (6, 53, 41)])
def test_dense_dot_products_on_a_wider_machine(M, N, K, rng):
    check(ops.dense(M, N, K), rng, WIDE)


def test_dense_keeps_the_packed_schedule_for_many_rows_or_a_short_k(rng):
    assert "W_XW_local" in check(ops.dense(64, 30, 20), rng).source
    assert "W_XW_local" in check(ops.dense(3, 30, 5), rng).source  # K shorter than a vector


CONVS = [dict(N=1, C=57, H=19, W=23, K=57, R=1, S=1),  # 1×1, odd channels and sizes
         dict(N=1, C=13, H=7, W=7, K=37, R=3, S=3, padding=1),  # a 7×7 map: no column vector fills
         dict(N=2, C=3, H=29, W=31, K=5, R=7, S=7, stride=2, padding=3),  # K < one vector
         dict(N=1, C=6, H=17, W=13, K=19, R=3, S=3, dilation=2, padding=2, pad_stage=False),
         dict(N=1, C=7, H=11, W=16, K=13, R=3, S=3, padding=1)]  # whole column vectors: vectors along q


@pytest.mark.parametrize("shape", CONVS, ids=range(len(CONVS)))
def test_conv2d_default(shape, rng):
    check(ops.conv2d(**shape), rng)


def test_conv2d_channel_vectors_on_a_wider_machine(rng):
    check(ops.conv2d(N=1, C=11, H=9, W=15, K=45, R=3, S=3, padding=1), rng, WIDE)


@pytest.mark.parametrize("Q,taps,tile", [(7, 1, 6), (14, 1, 6), (7, 9, 5), (28, 9, 5), (3, 1, 3), (1, 9, 1)])
def test_conv2d_column_tile(Q, taps, tile):
    """As many columns as the registers hold, one fewer with filter taps, at most a row."""
    from polytile.ops.conv import conv2d_cpu_tiles
    assert conv2d_cpu_tiles(64, Q, taps, dataclasses.replace(cpu_target(), vector_bits=256))["q_tile"] == tile


@pytest.mark.parametrize("M,N", [(5, 31), (3, 32), (7, 33), (37, 101), (2, 5003)])
@pytest.mark.parametrize("name", ["softmax", "layernorm"])
def test_rows_reduced_in_vector_lanes(name, M, N, rng):
    """Row sums and maxima as partials per vector lane: every size around the partials' width, a
    tail past the whole vectors, rows longer than a vector of partials."""
    kern = check(ops.get(name, M=M, N=N), rng)
    assert ("_lanes_local" in kern.source) == (N >= row_lanes(cpu_target()))
    assert re.search(r"pt_vstore<\w+>\(&Y\[", kern.source)  # whole vectors of the result, odd N too


@pytest.mark.parametrize("where", [0, -1, -3, 40])
def test_softmax_row_maximum_anywhere(where, rng):
    """The maximum in the first element, in the tail past the whole vectors, in a whole vector; the
    others 100 below it: exp of the difference to a missed maximum overflows float32."""
    M, N = 3, 77
    op = ops.softmax(M, N)
    x = rng.uniform(-1, 1, (M, N)).astype("float32")
    x[:, where] += 100
    out = op.build("cpu")(x)
    assert ops.rel_error(out, op.reference(x)) < op.tolerance


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_rows_reduced_in_vector_lanes_other_types(dtype, rng):
    check(ops.softmax(3, 77, dtype), rng)
    check(ops.layernorm(3, 77, dtype), rng)


@pytest.mark.parametrize("K,order", [(1031, "source"), (131, "cache")])
def test_dense_packs_w_row_by_row_when_its_rows_span_a_page(K, order, rng):
    """W (N × K, B transposed) is packed row by row (each row one stream) when a row is a page or
    longer, else in the packed order; both correct at sizes off the tiles."""
    op = ops.dense(67, 53, K)
    (cache,) = [c for c in op.schedule("cpu").caches if c.tensor == "W"]
    assert cache.copy_order == order
    check(op, rng)


@pytest.mark.parametrize("R,order", [(1, "source"), (3, "cache")])
def test_conv2d_weights_packed_filter_by_filter_for_1x1(R, order, rng):
    op = ops.conv2d(N=1, C=67, H=9, W=11, K=45, R=R, S=R, padding=R // 2)
    (cache,) = [c for c in op.schedule("cpu").caches if c.tensor == "Wt"]
    assert cache.copy_order == order
    check(op, rng)
    check(ops.conv2d(N=1, C=67, H=9, W=11, K=45, R=R, S=R, padding=R // 2), rng, WIDE)


def test_cache_copy_order_is_checked():
    from polytile.errors import ScheduleError
    op = ops.matmul(8, 8, 8)
    sched = pt_schedule(op)
    with pytest.raises(ScheduleError, match="copy_order"):
        sched["C"].cache("A", None, copy_order="rows")


def pt_schedule(op):
    from polytile.schedule.state import Schedule
    return Schedule(op.func)
