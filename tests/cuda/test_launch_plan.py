"""pt.launch_plan: the launches of a built GPU function read off it without a GPU (what the SASS
optimizer builds its launches from), and pt.with_cubin."""

import numpy as np
import pytest

import polytile as pt
from polytile import ops

pytestmark = pytest.mark.needs_nvcc


def _two_kernels():
    """C = A * 2 + 1 in two kernels through the device temporary B, with a size parameter N."""
    N = pt.param("N")
    A = pt.placeholder((N,), "float32", "A")
    B = pt.compute((N,), lambda i: A[i] * 2.0, "B")
    C = pt.compute((N,), lambda i: B[i] + 1.0, "C")
    s = pt.create_schedule(pt.Func([A], [C], name="two"))
    for t in (B, C):
        s[t].split("i", 128, "bx", "tx").bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")
    return pt.build(s, "cuda:sm_80")


def test_the_launches_of_a_call():
    kern = _two_kernels()
    first, second = pt.launch_plan(kern, [np.zeros(1000, np.float32)])
    assert (first.kernel, first.grid, first.block, first.shared_bytes) == ("two_kernel0", (8, 1, 1), (128, 1, 1), 0)
    assert first.buffers == (pt.LaunchBuffer("B", "float32", (1000,), "temporary", "none"),
                             pt.LaunchBuffer("A", "float32", (1000,), "input", "random"))
    assert first.scalars == (("N", "int64", 1000),)  # a symbolic size keeps 64-bit indices
    assert (first.reads, first.writes) == ({"A"}, {"B"}) and (second.reads, second.writes) == ({"B"}, {"C"})
    assert [b.role for b in second.buffers] == ["output", "temporary"]
    with pytest.raises(pt.InputError, match="two takes 1 input array"):
        pt.launch_plan(kern, [])


def test_values_that_matter_and_zeroed_outputs():
    op = ops.segment_sum(rows=50, nnz=400)
    kern = op.build("cuda:sm_80")
    offsets, x = op.make_inputs(np.random.default_rng(0))
    (launch,) = pt.launch_plan(kern, [offsets, x], op.params)
    init = {b.name: (b.role, b.init) for b in launch.buffers}
    assert init["offsets"] == ("input", "given") and init["x"] == ("input", "random")
    with pytest.raises(pt.InputError, match="index array offsets must not decrease"):
        pt.launch_plan(kern, [offsets[::-1].copy(), x], op.params)


def test_gpu_functions_only():
    cpu = pt.build(ops.softmax(8, 33).func)
    assert not pt.is_gpu_function(cpu) and pt.is_gpu_function(ops.softmax(8, 33).build("cuda:sm_80"))
    with pytest.raises(TypeError, match="built for a GPU"):
        pt.launch_plan(cpu, [np.zeros((8, 33), np.float32)])
    with pytest.raises(TypeError, match="built for a GPU"):
        pt.with_cubin(cpu, b"")


def test_with_cubin_keeps_everything_but_the_cubin():
    kern = ops.softmax(37, 1000).build("cuda:sm_80")
    other = pt.with_cubin(kern, b"\x7fELF other")
    assert other.cubin == b"\x7fELF other" and kern.cubin != other.cubin
    assert (other.source, other.kernels, other.func) == (kern.source, kern.kernels, kern.func)
