"""The hot path of a CUDA kernel call below the plan: the kernel-parameter buffer a signature packs
once (every argument kind, the per-call pointers written in one go), the ctypes calls into libcuda
(checked against a stand-in libcuda compiled here that records what it was given), and torch's
pointers and allocators (the plan's use of them: test_call_path_fake)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys

import numpy as np
import pytest
from fake_gpu import FakeDriver

from polytile.runtime import frameworks
from polytile.runtime.cuda_driver import Device, KernelParams, LibCuda

STAND_IN = r"""
#include <stdint.h>
#include <string.h>
uint64_t seen[11];
void* current = (void*)0x7ff0000012340000ull;
int next_status = 0;
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void* stream, void** params, void** extra) {
    uint64_t v[11] = {(uint64_t)f, gx, gy, gz, bx, by, bz, shared, (uint64_t)stream, (uint64_t)params,
                      (uint64_t)extra};
    memcpy(seen, v, sizeof v);
    return next_status;
}
int cuMemsetD8Async(uint64_t ptr, unsigned char byte, size_t n, void* stream) {
    seen[0] = ptr; seen[1] = byte; seen[2] = n; seen[3] = (uint64_t)stream;
    return next_status;
}
int cuCtxGetCurrent(void** ctx) { *ctx = current; return next_status; }
int cuGetErrorName(int status, const char** name) {
    *name = status == 700 ? "CUDA_ERROR_ILLEGAL_ADDRESS" : 0;
    return status == 700 ? 0 : 1;
}
"""


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> ctypes.CDLL:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or sys.platform != "linux":
        pytest.skip("a C compiler on Linux is needed to build the stand-in libcuda")
    d = tmp_path_factory.mktemp("libcuda")
    (d / "fake_cuda.c").write_text(STAND_IN)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", str(d / "fake_cuda.c"), "-o", str(d / "libfakecuda.so")],
                   check=True)
    return ctypes.CDLL(str(d / "libfakecuda.so"))


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


def test_libcuda_calls_pass_every_argument_through_ctypes(stand_in):
    hot = LibCuda(stand_in)
    seen = (ctypes.c_uint64 * 11).in_dll(stand_in, "seen")
    params = KernelParams([("pointer", 0), ("int32", 5)], per_call=[0])

    class Function:  # a CUfunction of the bindings converts to its handle with int()
        def __int__(self) -> int:
            return 0x7f12_3456_7000

    launch = hot.launcher(Function(), (70000, 3, 2), (256, 1, 1), 99 * 1024, params.address)
    stream = 0x7fff_dead_bee0  # a 64-bit handle must not be truncated
    assert launch(stream) == 0
    assert list(seen) == [0x7f12_3456_7000, 70000, 3, 2, 256, 1, 1, 99 * 1024, stream, params.address, 0]
    assert launch(0) == 0 and seen[8] == 0  # the legacy default stream
    ctypes.c_int.in_dll(stand_in, "next_status").value = 700
    assert launch(stream) == 700 and hot.error_name(700) == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert hot.error_name(999) == "CUresult 999"
    assert hot.current_context() == -700
    ctypes.c_int.in_dll(stand_in, "next_status").value = 0
    assert hot.current_context() == 0x7ff0000012340000
    assert hot.memset_d8_async(0x7f00_0000_0010, 0, 3 << 32, stream) == 0
    assert list(seen[:4]) == [0x7f00_0000_0010, 0, 3 << 32, stream]


def test_device_checks_the_context_through_the_hot_calls(stand_in):
    hot = LibCuda(stand_in)
    driver = FakeDriver()
    dev = Device(0, driver, hot=hot)
    dev._context = 0x7ff0000012340000  # the stand-in's current context is this device's
    assert dev.enter() is False
    ctypes.c_int.in_dll(stand_in, "next_status").value = 700
    with pytest.raises(Exception, match="cuCtxGetCurrent failed: CUDA_ERROR_ILLEGAL_ADDRESS"):
        dev.enter()
    ctypes.c_int.in_dll(stand_in, "next_status").value = 0


def test_torch_pointers_and_allocators_need_little_python_per_call():
    torch = pytest.importorskip("torch")
    from polytile import dtypes
    fw = frameworks.TorchFramework()
    x = torch.from_numpy(np.arange(6, dtype="float32"))
    h = torch.from_numpy(np.arange(6, dtype="float16"))
    assert fw.pointer is torch.Tensor.data_ptr and fw.pointer(x) == x.data_ptr()
    # outputs come from new_empty on an input (its device; its dtype where one matches)
    out = fw.allocator((3, 4), dtypes.float16, 0, [dtypes.float32, dtypes.float16])([x, h])
    assert out.dtype == torch.float16 and out.shape == (3, 4) and out.is_contiguous()
    assert out.data_ptr() not in (x.data_ptr(), h.data_ptr())
    out = fw.allocator((5,), dtypes.int64, 0, [dtypes.float32])([x])
    assert out.dtype == torch.int64 and out.shape == (5,) and out.device == x.device
    x.requires_grad_(True)
    assert not fw.allocator((2,), dtypes.float32, 0, [dtypes.float32])([x]).requires_grad
