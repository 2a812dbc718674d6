"""The hot path of a CUDA kernel call below the plan: the kernel-parameter buffer a signature packs
once (every argument kind, the per-call pointers written in one go), the launcher a signature keeps
(grid, block, shared memory, the call's stream, failures named), and torch's pointers and
allocators (the plan's use of them: test_call_path_fake)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from fake_gpu import FakeDriver

from polytile.runtime import frameworks
from polytile.runtime.cuda_driver import Device, KernelParams


def arguments(params: KernelParams, kinds: list[type]) -> list[int | float]:
    """The argument values a kernel would read through the `void**` array at ``params.address``."""
    out = []
    for k, ctype in enumerate(kinds):
        slot = ctypes.c_void_p.from_address(params.address + 8 * k).value
        out.append(ctype.from_address(slot).value)
    return out


def test_parameter_buffer_holds_every_kind_and_writes_the_per_call_pointers():
    values = [("int32", -7), ("pointer", 0x10), ("float32", 0.5), ("int64", -(2**40)), ("pointer", 0x20),
              ("float64", 2.25), ("pointer", 0x30), ("uint8", 200), ("int16", -3)]
    kinds = [ctypes.c_int32, ctypes.c_uint64, ctypes.c_float, ctypes.c_int64, ctypes.c_uint64, ctypes.c_double,
             ctypes.c_uint64, ctypes.c_uint8, ctypes.c_int16]
    params = KernelParams(values, per_call=[6, 1])  # any order of any pointer arguments
    assert arguments(params, kinds) == [-7, 0x10, 0.5, -(2**40), 0x20, 2.25, 0x30, 200, -3]
    params.write(0x7f00_0000_1000, 0x7f00_0000_2000)
    assert arguments(params, kinds) == [-7, 0x7f00_0000_2000, 0.5, -(2**40), 0x20, 2.25, 0x7f00_0000_1000, 200, -3]
    address = params.address
    params.write(2**64 - 16, 0)
    assert params.address == address  # packed once: the array the driver reads stays put
    assert arguments(params, kinds)[1] == 0 and arguments(params, kinds)[6] == 2**64 - 16
    params.set(0, 11)  # the old single-argument setter still works
    assert arguments(params, kinds)[0] == 11
    with pytest.raises(ValueError, match="must be distinct pointers"):
        KernelParams(values, per_call=[0])
    with pytest.raises(ValueError, match="must be distinct pointers"):
        KernelParams(values, per_call=[1, 1])
    empty = KernelParams([])
    empty.write()


def test_launcher_passes_the_launch_and_the_stream_and_names_failures():
    driver = FakeDriver()
    dev = Device(0, driver)
    _, function = dev.load(b"cubin", "pt_kernel", 0)
    driver.kinds["pt_kernel"] = ["pointer", "int32"]
    params = KernelParams([("pointer", 0), ("int32", 5)], per_call=[0])
    start = dev.launcher(function, (70000, 3, 2), (256, 1, 1), 1024, params)
    params.write(0x7f00_0000_1000)
    assert start(0x7fff_dead_bee0) == 0
    (launch,) = driver.launches
    assert (launch.grid, launch.block, launch.shared, launch.stream) == ((70000, 3, 2), (256, 1, 1), 1024,
                                                                         0x7fff_dead_bee0)
    assert launch.args == [0x7f00_0000_1000, 5] and launch.params_address == params.address
    driver.cuCtxSetCurrent(0)  # no context: the fake refuses the launch as the driver does
    assert start(0) == 201 and dev.error_name(201) == "CUDA_ERROR_UNKNOWN"


def test_torch_pointers_and_allocators_need_little_python_per_call():
    torch = pytest.importorskip("torch")
    from polytile import dtypes
    f32, f16, i64 = dtypes.float32, dtypes.float16, dtypes.int64
    fw = frameworks.TorchFramework()
    x = torch.from_numpy(np.arange(12, dtype="float32").reshape(3, 4))
    h = torch.from_numpy(np.arange(6, dtype="float16"))
    assert fw.pointer is torch.Tensor.data_ptr and fw.pointer(x) == x.data_ptr()
    inputs = [((3, 4), f32), ((6,), f16)]

    def new(shape, dtype, arrays, inputs=inputs):  # noqa: ANN001, ANN202
        k, make = fw.allocator(shape, dtype, 0, inputs)
        return make() if k is None else make(arrays[k])

    for shape, dtype, want in (((3, 4), f32, torch.float32), ((6,), f16, torch.float16),
                               ((2, 5), f16, torch.float16), ((7,), i64, torch.int64)):
        out = new(shape, dtype, [x, h])
        assert (out.shape, out.dtype, out.device) == (shape, want, x.device) and out.is_contiguous()
        assert out.data_ptr() not in (x.data_ptr(), h.data_ptr())
    assert fw.allocator((3, 4), f32, 0, inputs)[0] == 0 and fw.allocator((5,), f16, 0, inputs)[0] == 1
    assert fw.allocator((6,), f32, 0, [])[0] is None  # no input to allocate from: torch.empty on the GPU
    x.requires_grad_(True)
    assert not new((3, 4), f32, [x, h]).requires_grad and not new((9,), f32, [x, h]).requires_grad
