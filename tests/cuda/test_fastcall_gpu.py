"""On a GPU: the C call path (``polytile.runtime.fastcall``) gives the Python path's results, bit for bit,
over random inputs, odd sizes and several dtypes; it works on a non-default current stream, inside a
captured CUDA graph and with torch consuming its outputs unsynchronized; non-contiguous and aliasing
arguments still get the Python path's errors.

Run on a GPU machine: ``python -m pytest -q -m gpu tests/cuda/test_fastcall_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from call_paths import build_lower_triangle, capture, keep_busy, on_gpu, replay, warm_up

import polytile as pt
from polytile import ops
from polytile.dtypes import as_dtype
from polytile.runtime import fastcall

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def built() -> None:
    if fastcall.module() is None:
        pytest.fail("the C call path did not build on this GPU machine (run with a debug log of 'polytile')")


def c_calls(kern) -> int:  # noqa: ANN001
    return sum(call.calls for call in kern._c_calls)


def python_path(kern, *arrays):  # noqa: ANN001, ANN201
    """The call through the Python path alone (the reference)."""
    plan = kern._plans[kern._key(arrays, {})]
    return plan.call(arrays, None)


def add_kernel(dtype: str = "float32"):  # noqa: ANN201
    N = pt.param("N")
    A = pt.placeholder((N,), dtype, "A")
    B = pt.placeholder((N,), dtype, "B")
    C = pt.compute((N,), lambda i: A[i] + B[i], "C")
    s = pt.create_schedule(pt.Func([A, B], [C], name="add"))
    s[C].split("i", 128, "bx", "tx").bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")
    return pt.build(s, "cuda")


@pytest.fixture(scope="module")
def matmul():  # noqa: ANN201
    return ops.matmul(70, 50, 30).build("cuda")


def tensor(x: np.ndarray):  # noqa: ANN201 - a torch tensor on the GPU (bfloat16 through its bits)
    if x.dtype.name == "bfloat16":
        return on_gpu(x.view(np.uint16)).view(torch.bfloat16)
    return on_gpu(x)


def cases(rng):  # noqa: ANN001, ANN201 - (name, kernel, input makers, whether its calls run in C)
    f32 = lambda *shape: on_gpu(rng.standard_normal(shape).astype("float32"))  # noqa: E731
    out = []
    for dtype in ("float32", "float16", "bfloat16"):
        add = add_kernel(dtype)
        out += [(f"add {dtype} {n}", add,
                 lambda n=n, dtype=dtype: [tensor(rng.standard_normal(n).astype(as_dtype(dtype).numpy)) for _ in "AB"],
                 True) for n in (1, 127, 1000, 4099)]
    lower = build_lower_triangle("cuda")  # an output that starts as zeros (a memset per call)
    out += [(f"lower {n}", lower, lambda n=n: [f32(n, n)], True) for n in (1, 37)]
    out.append(("softmax 33x257", ops.softmax(33, 257).build("cuda"), lambda: [f32(33, 257)], True))
    out.append(("matmul 70x50x30", ops.matmul(70, 50, 30).build("cuda"), lambda: [f32(70, 30), f32(30, 50)], True))
    for dtype in ("float16", "bfloat16"):  # odd sizes: three kernels, aligned copies in global temporaries
        op = ops.matmul(67, 45, 29, dtype)
        out.append((f"matmul {dtype} 67x45x29", op.build("cuda"),
                    lambda op=op: [tensor(x) for x in op.make_inputs(rng)], True))
    op = ops.matmul(1000, 1000, 1000, "float16")  # TMA operands: tensor maps stay in Python
    out.append(("matmul float16 1000^3", op.build("cuda"), lambda op=op: [tensor(x) for x in op.make_inputs(rng)],
                False))
    return out


def test_c_calls_give_the_python_paths_results_bit_for_bit(rng):
    for name, kern, make, in_c in cases(rng):
        kern(*make())  # the Python path runs the first call of a signature and leaves a C call
        before = c_calls(kern)
        for _ in range(3):
            arrays = make()
            got = kern(*arrays)
            want = python_path(kern, *arrays)
            torch.cuda.synchronize()
            assert torch.equal(got, want), name
        assert c_calls(kern) == before + (3 if in_c else 0), name


def test_results_consumed_on_a_non_default_stream_without_synchronizing(matmul, rng):
    a = on_gpu(rng.standard_normal((70, 30)).astype("float32"))
    b = on_gpu(rng.standard_normal((30, 50)).astype("float32"))
    want = (a.double() @ b.double()).float()
    matmul(a, b)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    before = c_calls(matmul)
    with torch.cuda.stream(side):
        keep_busy()  # `side`: a launch on another stream would race
        out = matmul(a, b)
        twice = out * 2
    torch.cuda.current_stream().wait_stream(side)
    assert c_calls(matmul) == before + 1
    assert torch.allclose(twice / 2, want, rtol=1e-4, atol=1e-4)


def test_cuda_graph_capture_and_replay_through_c_calls(matmul, rng):
    static_a = on_gpu(rng.standard_normal((70, 30)).astype("float32"))
    static_b = on_gpu(rng.standard_normal((30, 50)).astype("float32"))
    warm_up(matmul, static_a, static_b)
    before = c_calls(matmul)
    graph, static_out = capture(matmul, static_a, static_b)
    assert c_calls(matmul) == before + 1  # captured from C
    for _ in range(2):
        a = on_gpu(rng.standard_normal((70, 30)).astype("float32"))
        b = on_gpu(rng.standard_normal((30, 50)).astype("float32"))
        replay(graph, (static_a, static_b), (a, b))
        assert torch.allclose(static_out, (a.double() @ b.double()).float(), rtol=1e-4, atol=1e-4)


def test_non_contiguous_and_aliasing_arguments_get_the_python_paths_errors(matmul, rng):
    a = on_gpu(rng.standard_normal((70, 30)).astype("float32"))
    b = on_gpu(rng.standard_normal((30, 50)).astype("float32"))
    out = torch.empty(70, 50, device="cuda")
    for _ in range(2):
        matmul(a, b)
        matmul(a, b, out)
    before = c_calls(matmul)
    with pytest.raises(pt.InputError, match=r"argument A of matmul is not contiguous"):
        matmul(on_gpu(rng.standard_normal((30, 70)).astype("float32")).t(), b)
    buf = torch.empty(70 * 50, device="cuda")
    a_view = buf[: 70 * 30].view(70, 30)
    a_view.copy_(a)
    with pytest.raises(pt.InputError, match="output C of matmul shares memory with input A"):
        matmul(a_view, b, buf.view(70, 50))
    assert c_calls(matmul) == before
    assert matmul(a, b, out) is out and c_calls(matmul) == before + 1


def test_many_calls_keep_their_outputs_apart(matmul, rng):
    a = on_gpu(rng.standard_normal((70, 30)).astype("float32"))
    bs = [on_gpu(rng.standard_normal((30, 50)).astype("float32")) for _ in range(50)]
    outs = [matmul(a, b) for b in bs for _ in range(20)]
    torch.cuda.synchronize()
    assert len({o.data_ptr() for o in outs[-50:]}) == 50
    for k, b in enumerate(bs):
        want = (a.double() @ b.double()).float()
        assert torch.equal(outs[20 * k + 19], outs[20 * k]) and torch.allclose(outs[20 * k], want, rtol=1e-4,
                                                                                    atol=1e-4)
