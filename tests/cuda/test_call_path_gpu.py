"""On a GPU: the asynchronous call path with torch (and CuPy) arrays. Results consumed by torch on the
same stream without a synchronize are right, also on a non-default stream and with ``stream=``; a
captured CUDA graph replays correctly with new inputs; a broken index-array promise surfaces as a
polytile error; the signature cache misses on new shapes; bad arguments are clear errors; NumPy
arguments stay synchronous.

Run on a GPU machine: ``python -m pytest -q -m gpu tests/cuda/test_call_path_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from call_paths import build_lower_triangle, capture, keep_busy, on_gpu, replay, warm_up

import polytile as pt
from polytile import ops

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def matmul_ref(a, b):  # noqa: ANN001, ANN201
    return (a.double() @ b.double()).float()


def close(out, ref, tol: float = 1e-5) -> bool:  # noqa: ANN001
    return float((out.double() - ref.double()).norm() / ref.double().norm()) < tol


@pytest.fixture(scope="module")
def matmul():  # noqa: ANN201 - a CUDAKernel
    return ops.matmul(200, 300, 100).build("cuda")


@pytest.fixture(scope="module")
def segsum():  # noqa: ANN201
    return ops.segment_sum(rows=500, nnz=4000).build("cuda")


def test_results_consumed_on_the_same_stream_without_synchronizing(matmul, rng):
    a = on_gpu(rng.standard_normal((200, 100)).astype("float32"))
    b = on_gpu(rng.standard_normal((100, 300)).astype("float32"))
    keep_busy()
    out = matmul(a, b)
    twice = out * 2  # torch reads the output on the same stream, no synchronize in between
    assert isinstance(out, torch.Tensor) and out.is_cuda and out.device == a.device
    assert close(twice / 2, matmul_ref(a, b))
    given = torch.full((200, 300), float("nan"), device="cuda")
    assert matmul(a, b, given) is given
    assert close(given, matmul_ref(a, b))


def test_a_non_default_current_stream_and_the_stream_keyword(matmul, rng):
    a = on_gpu(rng.standard_normal((200, 100)).astype("float32"))
    b = on_gpu(rng.standard_normal((100, 300)).astype("float32"))
    ref = matmul_ref(a, b)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = matmul(a, b)  # on `side`, torch's current stream here
        plus = out + 1  # torch, same stream
    torch.cuda.current_stream().wait_stream(side)
    assert close(plus - 1, ref)
    other = torch.cuda.Stream()
    other.wait_stream(torch.cuda.current_stream())
    out = matmul(a, b, stream=other)
    other.synchronize()
    assert close(out, ref)


def test_cuda_graph_capture_and_replay_with_new_inputs(matmul, rng):
    static_a = on_gpu(rng.standard_normal((200, 100)).astype("float32"))
    static_b = on_gpu(rng.standard_normal((100, 300)).astype("float32"))
    warm_up(matmul, static_a, static_b)
    graph, static_out = capture(matmul, static_a, static_b)
    for _ in range(2):
        a = on_gpu(rng.standard_normal((200, 100)).astype("float32"))
        b = on_gpu(rng.standard_normal((100, 300)).astype("float32"))
        replay(graph, (static_a, static_b), (a, b))
        assert close(static_out, matmul_ref(a, b))


def bad_offsets(offsets: np.ndarray, row: int) -> np.ndarray:
    """Offsets that decrease at ``row`` (that row is empty, its neighbour longer: no read out of bounds)."""
    bad = offsets.copy()
    bad[row] = bad[row + 1] + 1
    assert bad[row] <= bad[-1]
    return bad


def test_a_broken_index_promise_is_a_polytile_error_at_the_next_synchronization(segsum, rng):
    op = ops.segment_sum(rows=500, nnz=4000)
    offsets, x = op.make_inputs(rng)
    out = segsum(on_gpu(offsets), on_gpu(x))
    pt.synchronize()
    assert close(out, on_gpu(op.reference(offsets, x)))
    segsum(on_gpu(bad_offsets(offsets, 123)), on_gpu(x))  # no copy to the host, no error yet
    with pytest.raises(pt.InputError, match=r"index array offsets of kernel segment_sum broke its promise "
                                            r"monotonic=True at \(flat\) position 123"):
        pt.synchronize()
    pt.synchronize()  # reported once
    segsum(on_gpu(bad_offsets(offsets, 7)), on_gpu(x))
    torch.cuda.synchronize()
    with pytest.raises(pt.InputError, match="position 7"):  # the next call of the kernel reports it too
        segsum(on_gpu(offsets), on_gpu(x))


def test_index_checks_run_inside_a_captured_graph(segsum, rng):
    op = ops.segment_sum(rows=500, nnz=4000)
    offsets, x = op.make_inputs(rng)
    static_off, static_x = on_gpu(offsets), on_gpu(x)
    segsum(static_off, static_x)
    torch.cuda.synchronize()
    graph, static_out = capture(segsum, static_off, static_x)
    graph.replay()
    pt.synchronize()
    assert close(static_out, on_gpu(op.reference(offsets, x)))
    static_off.copy_(on_gpu(bad_offsets(offsets, 321)))
    graph.replay()
    with pytest.raises(pt.InputError, match="position 321"):
        pt.synchronize()


def test_signature_cache_misses_on_shape_dtype_and_strides(rng):
    kern = ops.softmax(33, 257).build("cuda")
    x = on_gpu(rng.standard_normal((33, 257)).astype("float32"))
    kern(x)
    kern(x.clone())
    assert kern.cache_info() == (1, 1)
    N, M = pt.param("N"), pt.param("M")
    X = pt.placeholder((N, M), "float32", "X")
    Y = pt.compute((N, M), lambda i, j: X[i, j] * 2.0, "Y")
    s = pt.create_schedule(pt.Func([X], [Y], name="twice"))
    s[Y].split("j", 128, "bx", "tx").bind("i", "blockIdx.y").bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")
    dbl = pt.build(s, "cuda")
    for shape in ((5, 300), (7, 129), (5, 300)):
        v = on_gpu(rng.standard_normal(shape).astype("float32"))
        assert close(dbl(v), v * 2)
    assert dbl.cache_info() == (2, 2)
    with pytest.raises(pt.InputError, match="dtype float32, got float64"):
        dbl(on_gpu(rng.standard_normal((5, 300))))
    with pytest.raises(pt.InputError, match=r"not contiguous.*\.contiguous\(\)"):
        dbl(on_gpu(rng.standard_normal((300, 5)).astype("float32")).t())
    assert dbl.cache_info() == (2, 2)


def test_bad_arguments_are_clear(matmul, rng):
    a = rng.standard_normal((200, 100)).astype("float32")
    b = rng.standard_normal((100, 300)).astype("float32")
    with pytest.raises(pt.InputError, match="CPU torch tensor"):
        matmul(torch.from_numpy(a), on_gpu(b))
    with pytest.raises(pt.InputError, match="come from different frameworks"):
        matmul(on_gpu(a), b)
    buf = torch.empty(200 * 300, device="cuda")
    a_view = buf[: 200 * 100].view(200, 100)
    a_view.copy_(on_gpu(a))
    with pytest.raises(pt.InputError, match="output C of matmul shares memory with input A"):
        matmul(a_view, on_gpu(b), buf.view(200, 300))
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU: the two-device error needs two")
    with pytest.raises(pt.InputError, match=r"on different GPUs"):
        matmul(on_gpu(a), torch.from_numpy(b).to("cuda:1"))


def test_tensors_on_a_second_gpu(matmul, rng):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    a = torch.from_numpy(rng.standard_normal((200, 100)).astype("float32")).to("cuda:1")
    b = torch.from_numpy(rng.standard_normal((100, 300)).astype("float32")).to("cuda:1")
    out = matmul(a, b)
    assert out.device == a.device and close(out, matmul_ref(a, b))


def test_numpy_arguments_are_synchronous(matmul, rng):
    a = rng.standard_normal((200, 100)).astype("float32")
    b = rng.standard_normal((100, 300)).astype("float32")
    out = matmul(a, b)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_zero_initialized_outputs_from_the_caching_allocator(rng):
    kern = build_lower_triangle("cuda")
    a = on_gpu(rng.standard_normal((100, 100)).astype("float32"))
    for _ in range(3):
        garbage = torch.full((100, 100), float("nan"), device="cuda")
        del garbage  # the caching allocator hands this block out next
        out = kern(a)
        assert torch.equal(out, torch.tril(a * 2))


def test_cupy_arrays_on_cupys_stream(rng):
    cupy = pytest.importorskip("cupy")
    kern = ops.softmax(33, 257).build("cuda")
    op = ops.softmax(33, 257)
    (x,) = op.make_inputs(rng)
    with cupy.cuda.Stream(non_blocking=True):
        out = kern(cupy.asarray(x))
        host = cupy.asnumpy(out)  # copies on the current (same) stream
    assert ops.rel_error(host, op.reference(x)) < 1e-5
