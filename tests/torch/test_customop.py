"""polytile kernels as torch operators: eager calls, torch.library.opcheck, torch.compile, symbolic sizes."""

from __future__ import annotations

import pytest
from torch_helpers import assert_close

import polytile as pt
from polytile.errors import PolytileError

torch = pytest.importorskip("torch")


def _scaled_rows(name: str, target: str = "cpu") -> object:
    """Y[i, j] = X[i, j] * sum_k X[i, k] over an N × 13 input (N symbolic)."""
    N = pt.param("N")
    X = pt.placeholder((N, 13), "float32", "X")
    k = pt.reduce_axis(13, "k")
    s = pt.compute((N,), lambda i: pt.sum(X[i, k], axis=k), "s")
    Y = pt.compute((N, 13), lambda i, j: X[i, j] * s[i], "Y")
    func = pt.Func([X], [Y], name=name)
    if target == "cpu":
        return pt.build(func, target)
    sched = pt.create_schedule(func)  # a GPU kernel needs its rows bound to the grid
    for c in ("s", "Y"):
        sched[c].split("i", 32)
        sched[c].bind("io", "blockIdx.x")
        sched[c].bind("ii", "threadIdx.x")
    return pt.build(sched, target)


def _reference(x: torch.Tensor) -> torch.Tensor:
    return x * x.sum(-1, keepdim=True)


def test_a_kernel_as_a_torch_operator_passes_opcheck() -> None:
    from polytile.torch import custom_op
    op = custom_op(_scaled_rows("scaled_rows_a"))
    x = torch.randn(9, 13)
    assert_close(op(x), _reference(x))
    assert_close(op(x.t().contiguous().t()), _reference(x))  # a non-contiguous input is copied
    torch.library.opcheck(op, (torch.randn(5, 13),))


def test_the_operator_under_torch_compile_with_symbolic_sizes() -> None:
    from polytile.torch import custom_op
    op = custom_op(_scaled_rows("scaled_rows_b"))
    fn = torch.compile(lambda x: op(x) * 2 + 1, backend="aot_eager", fullgraph=True, dynamic=True)
    for n in (4, 7):
        x = torch.randn(n, 13)
        assert_close(fn(x), _reference(x) * 2 + 1)


def test_registering_two_kernels_under_one_name_is_refused() -> None:
    from polytile.torch import custom_op
    custom_op(_scaled_rows("scaled_rows_c"))
    with pytest.raises(PolytileError, match="registered for another kernel"):
        custom_op(_scaled_rows("scaled_rows_c"))


@pytest.mark.gpu
def test_the_operator_on_the_gpu_in_a_cuda_graph() -> None:
    from polytile.torch import custom_op
    op = custom_op(_scaled_rows("scaled_rows_gpu", "cuda"))
    x = torch.randn(64, 13, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        assert_close(op(x), _reference(x))  # on the caller's stream
    stream.synchronize()
    op(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = op(x)
    x.copy_(torch.randn(64, 13, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(y, _reference(x))


@pytest.mark.parametrize("kernel", [5, None, "scaled_rows"])
def test_custom_op_of_something_not_a_kernel(kernel: object) -> None:
    """An AttributeError before (independent fuzzer's probes)."""
    from polytile.torch import custom_op
    with pytest.raises(PolytileError, match="custom_op takes a kernel built by pt.build"):
        custom_op(kernel)
