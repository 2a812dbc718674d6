"""A fake CUDA driver and a fake GPU array framework, for testing the CUDA call path without a GPU.

"Device" memory is host memory (so copies and the device-side index checks can really run: the
fake executes the check kernels on the host), launches are recorded with their decoded arguments,
contexts are tracked per thread, and every synchronization is counted.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import types
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from polytile.dtypes import DType
from polytile.runtime.args import ArrayInfo, dtype_name
from polytile.runtime.cuda_driver import Device
from polytile.runtime.frameworks import Framework
from polytile.target import DATASHEETS, CUDATarget

CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900
_CHECK_KINDS = {"range": ["pointer", "int64", "int64", "int64", "pointer"],
                "monotonic": ["pointer", "int64", "pointer"]}
_CTYPES = {"pointer": ctypes.c_uint64, "int32": ctypes.c_int32, "int64": ctypes.c_int64}


@dataclass
class Launch:
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    stream: int
    args: list[int]
    params_address: int
    context: int
    raw: list[bytes]  # the 8 bytes at each argument's address, as the driver read them


class FakeFunction:
    def __init__(self, name: str, context: int):
        self.name = name
        self.context = context

    def __int__(self) -> int:  # a CUfunction handle, as the C call path takes it
        return id(self)


class FakeDriver:
    """The part of `cuda.bindings.driver` polytile's runtime uses."""

    CUdevice_attribute = types.SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76,
        CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE=38)
    CUfunction_attribute = types.SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8)
    CUtensorMapDataType = types.SimpleNamespace(CU_TENSOR_MAP_DATA_TYPE_FLOAT16=6, CU_TENSOR_MAP_DATA_TYPE_FLOAT32=7,
                                                CU_TENSOR_MAP_DATA_TYPE_BFLOAT16=9)
    CUtensorMapInterleave = types.SimpleNamespace(CU_TENSOR_MAP_INTERLEAVE_NONE=0)
    CUtensorMapSwizzle = types.SimpleNamespace(CU_TENSOR_MAP_SWIZZLE_NONE=0, CU_TENSOR_MAP_SWIZZLE_128B=3)
    CUtensorMapL2promotion = types.SimpleNamespace(CU_TENSOR_MAP_L2_PROMOTION_L2_256B=3)
    CUtensorMapFloatOOBfill = types.SimpleNamespace(CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE=0)

    def __init__(self) -> None:
        self.launches: list[Launch] = []
        self.memsets: list[tuple[int, int, int, int]] = []  # (ptr, byte, nbytes, stream)
        self.syncs = 0
        self.events: list[int] = []  # streams events were recorded on
        self.kinds: dict[str, list[str]] = {}  # argument kinds of polytile kernels, by name
        self.behaviour: dict[str, Callable[[list[int]], None]] = {}  # what a launch of a kernel does
        self.capturing = False
        self.loads = 0
        self.tensor_maps: list[tuple] = []  # the arguments of every cuTensorMapEncodeTiled call
        self._memory: dict[int, ctypes.Array] = {}
        self._local = threading.local()
        self._functions: dict[int, FakeFunction] = {}  # by handle
        self._entry_points: tuple = ()  # the C functions c_entry_points made (kept alive here)
        self.c_launches = 0  # launches that came through the C entry points
        self.fail_launches = 0  # a status every launch returns when set

    # contexts: one primary context per device, a current one per thread
    def _stack(self) -> list[int]:
        if not hasattr(self._local, "stack"):
            self._local.stack = [0]
        return self._local.stack

    def current(self) -> int:
        return self._stack()[-1]

    def cuInit(self, flags):
        return (0,)

    def cuDeviceGet(self, ordinal):
        return 0, ordinal

    def cuDevicePrimaryCtxRetain(self, device):
        return 0, 0x1000 + device

    def cuCtxSetCurrent(self, ctx):
        self._stack()[-1] = int(ctx)
        return (0,)

    def cuCtxGetCurrent(self):
        return 0, self.current()

    def cuCtxPushCurrent(self, ctx):
        self._stack().append(int(ctx))
        return (0,)

    def cuCtxPopCurrent(self):
        return 0, self._stack().pop()

    def cuDeviceGetName(self, n, device):
        return 0, b"Fake GPU\0"

    def cuDeviceGetAttribute(self, attr, device):
        return 0, {75: 9, 76: 0, 38: 1 << 20}.get(attr, 0)

    def cuDriverGetVersion(self):
        return 0, 13000

    def cuGetErrorName(self, status):
        names = {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: b"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"}
        return 0, names.get(int(status), b"CUDA_ERROR_UNKNOWN")

    # memory: host memory
    def _alloc(self, nbytes: int) -> int:
        buf = (ctypes.c_char * max(1, nbytes))()
        ptr = ctypes.addressof(buf)
        self._memory[ptr] = buf
        return ptr

    def cuMemAlloc(self, nbytes):
        return 0, self._alloc(nbytes)

    def cuMemFree(self, ptr):
        del self._memory[int(ptr)]
        return (0,)

    def cuMemHostAlloc(self, nbytes, flags):
        assert flags == 3  # portable | devicemap
        return 0, self._alloc(nbytes)

    def cuMemFreeHost(self, ptr):
        del self._memory[int(ptr)]
        return (0,)

    def cuMemHostGetDevicePointer(self, ptr, flags):
        return 0, ptr

    def cuMemcpyHtoD(self, dst, src, nbytes):
        ctypes.memmove(dst, src, nbytes)
        return (0,)

    def cuMemcpyDtoH(self, dst, src, nbytes):
        ctypes.memmove(dst, src, nbytes)
        return (0,)

    def cuMemsetD8Async(self, ptr, byte, nbytes, stream):
        self.memsets.append((int(ptr), byte, nbytes, int(stream)))
        ctypes.memset(ptr, byte, nbytes)
        return (0,)

    def cuCtxSynchronize(self):
        self.syncs += 1
        return (0,)

    def cuStreamSynchronize(self, stream):
        self.syncs += 1
        return (0,)

    # modules and launches
    def cuModuleLoadData(self, image):
        if self.capturing:
            return (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        self.loads += 1
        return 0, object()

    def cuModuleGetFunction(self, module, name):
        f = FakeFunction(name.decode(), self.current())
        self._functions[int(f)] = f
        return 0, f

    def cuFuncSetAttribute(self, function, attr, value):
        return (0,)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        if self.fail_launches:
            return (self.fail_launches,)
        if self.current() != f.context:
            return (201,)  # CUDA_ERROR_INVALID_CONTEXT: launched outside its module's context
        kinds = self.kinds.get(f.name) or _CHECK_KINDS[f.name.split("_")[2]]
        args = []
        for k, kind in enumerate(kinds):
            slot = ctypes.c_void_p.from_address(params + 8 * k).value
            if kind == "tensormap":  # 128 bytes, 64-byte aligned: decoded as the fake encoded them
                assert slot % 64 == 0
                args.append(tuple(np.frombuffer(ctypes.string_at(slot, 128), dtype=np.uint64)[:8].tolist()))
                continue
            args.append(int(_CTYPES[kind].from_address(slot).value))
        raw = [ctypes.string_at(ctypes.c_void_p.from_address(params + 8 * k).value, 8) for k in range(len(kinds))]
        self.launches.append(Launch(f.name, (gx, gy, gz), (bx, by, bz), shared, int(stream), args, params,
                                    self.current(), raw))
        if f.name.startswith("pt_check_"):
            _run_check(f.name, args)
        elif f.name in self.behaviour:
            self.behaviour[f.name](args)
        return (0,)

    def c_entry_points(self) -> tuple[int, int, int]:
        """C functions for cuLaunchKernel, cuMemsetD8Async and cuCtxGetCurrent that call this fake (what the
        C call path takes from libcuda)."""
        vp, u = ctypes.c_void_p, ctypes.c_uint

        def launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # noqa: ANN001, ANN202
            self.c_launches += 1
            return self.cuLaunchKernel(self._functions[f], gx, gy, gz, bx, by, bz, shared, stream or 0, params,
                                       extra)[0]

        def memset(ptr, byte, nbytes, stream):  # noqa: ANN001, ANN202
            return self.cuMemsetD8Async(ptr, byte, nbytes, stream or 0)[0]

        def current(out):  # noqa: ANN001, ANN202
            out[0] = self.current() or None
            return 0

        self._entry_points = (
            ctypes.CFUNCTYPE(ctypes.c_int, vp, u, u, u, u, u, u, u, vp, vp, vp)(launch),
            ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, vp)(memset),
            ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(vp))(current))
        return tuple(ctypes.cast(f, vp).value for f in self._entry_points)  # type: ignore[return-value]

    # tensor maps: the opaque words hold the arguments, so that a launch shows which map it got
    def cuTensorMapEncodeTiled(self, dtype, rank, ptr, dims, strides, box, element_strides, interleave, swizzle,
                               l2, oob):
        args = (dtype, rank, int(ptr), *dims, *strides, *box, *element_strides, interleave, swizzle, l2, oob)
        self.tensor_maps.append(args)
        return 0, types.SimpleNamespace(opaque=([int(ptr), *dims, *strides, *box, swizzle] + [0] * 16)[:16])

    # events
    def cuEventCreate(self, flags):
        return 0, object()

    def cuEventRecord(self, event, stream):
        self.events.append(int(stream))
        return (0,)

    def cuEventSynchronize(self, event):
        return (0,)

    def cuEventElapsedTime(self, start, end):
        return 0, 0.25

    def cuEventDestroy(self, event):
        return (0,)


def _run_check(name: str, args: list[int]) -> None:
    """What polytile's device-side check kernels do, on the host."""
    _, _, kind, dtype = name.split("_", 3)
    a = np.ctypeslib.as_array((ctypes.c_char * (args[1] * np.dtype(dtype).itemsize)).from_address(args[0]))
    values = np.frombuffer(a, dtype=dtype).astype(np.int64)
    report = ctypes.c_int64.from_address(args[-1])
    if kind == "range":
        bad = np.flatnonzero((values < args[2]) | (values > args[3]))
    else:
        bad = np.flatnonzero(values[:-1] > values[1:])
    if bad.size:
        report.value = int(bad[-1]) + 1  # any failing thread's position


def fake_devices(monkeypatch, count: int = 1) -> FakeDriver:  # noqa: ANN001 - pytest's monkeypatch
    """Fake GPUs 0..count-1 behind polytile's CUDA runtime; GPU 0's context is current."""
    from polytile.runtime import cuda, cuda_device, index_checks
    driver = FakeDriver()
    # report words live in the fake's memory, which goes with it
    monkeypatch.setattr(index_checks, "_WORDS", index_checks._ReportWords())
    monkeypatch.setattr(index_checks, "_REPORTS", [])
    devices = {k: Device(k, driver) for k in range(count)}
    driver.cuCtxSetCurrent(0x1000)
    monkeypatch.setattr(cuda, "_DEVICES", devices)
    monkeypatch.setattr(cuda_device, "device", lambda: devices[0])
    # the present GPU's facts are cached for the process: the fake reports none of the sizes, so it
    # gets the datasheet facts of the architecture in a cache of its own (was: a fake test run first
    # failed reading them, and a real GPU's facts cached before would have stood for the fake)
    monkeypatch.setattr(cuda_device, "cuda_target", functools.cache(
        lambda arch=None: CUDATarget(arch=arch or "sm_90a", name=str(DATASHEETS[arch or "sm_90a"]["name"]))))
    return driver


class FakeArray:
    """A "GPU" array of the fake framework: host memory with a device ordinal."""

    def __init__(self, data: np.ndarray, device: int | None = 0):
        self.data = data
        self.device = device

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    # what the C call path reads (FakeFramework.c_probes, c_pointer)
    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def strides(self) -> tuple[int, ...]:
        return self.data.strides

    @property
    def ptr(self) -> int:
        return self.data.ctypes.data


class FakeFramework(Framework):
    """Like torch: a current stream per device, outputs allocated by the framework."""

    name = "fake"
    c_probes = (("shape", False), ("dtype", False), ("strides", False), ("device", False))  # as key() reads them
    c_pointer = ("ptr", False)

    def __init__(self) -> None:
        self.streams = {0: 0x5000, 1: 0x5001}
        self.allocations: list[tuple[tuple[int, ...], str, int, int | None]] = []

    def key(self, a: FakeArray) -> Hashable:
        return FakeFramework, a.data.shape, a.data.dtype, a.data.strides, a.device

    def info(self, a: FakeArray) -> ArrayInfo:
        return ArrayInfo(a.data.shape, dtype_name(a.data.dtype), bool(a.data.flags.c_contiguous), a.device, "fake")

    def pointer(self, a: FakeArray) -> int:
        return a.data.ctypes.data

    def current_stream(self, device: int) -> int:
        return self.streams[device]

    def empty(self, shape: tuple[int, ...], dtype: DType, device: int, stream: int | None) -> Any:
        self.allocations.append((shape, dtype.name, device, stream))
        return FakeArray(np.full(shape, 7, dtype=dtype.numpy), device)


def fake_framework(monkeypatch) -> FakeFramework:  # noqa: ANN001 - pytest's monkeypatch
    """A ``FakeFramework`` registered for ``FakeArray`` arguments for the test's duration."""
    from polytile.runtime import frameworks
    fake = FakeFramework()
    monkeypatch.setitem(frameworks._BY_TYPE, FakeArray, fake)
    monkeypatch.setitem(frameworks.KEY_OF, FakeArray, fake.key)
    return fake
