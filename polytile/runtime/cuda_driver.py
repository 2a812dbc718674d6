"""A small, checked layer over the CUDA driver API (`cuda.bindings.driver`): devices, memory, modules,
launches and event timing, used by the CUDA runtime and the SASS optimizer's timing worker.

Every call's status is checked and turned into `CudaError` naming the call and the error. The
module imports `cuda.bindings` lazily (falling back to the older `cuda.cuda` layout), so the rest
of polytile.sass works without it; tests pass a fake driver object.
"""

from __future__ import annotations

import ctypes
import statistics
from dataclasses import dataclass

import numpy as np

from ..errors import DeviceError


class CudaError(DeviceError):
    """A CUDA driver call failed. After a kernel fault the context is unusable: restart the process."""


def load_driver():
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver
        except ImportError as exc:
            raise CudaError("the CUDA driver bindings are missing: pip install cuda-bindings") from exc
    return driver


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    compute_capability: tuple[int, int]
    l2_bytes: int
    driver_version: int


class Device:
    """The primary context of one GPU, with the few operations the worker needs."""

    def __init__(self, ordinal: int = 0, driver=None) -> None:
        self.ordinal = ordinal
        self.cu = driver if driver is not None else load_driver()
        try:
            self._check(self.cu.cuInit(0), "cuInit")
        except CudaError:
            raise
        except Exception as exc:  # the bindings raise RuntimeError when libcuda cannot be loaded
            raise CudaError(f"cuInit failed: {exc} (is there an NVIDIA driver and GPU?)") from exc
        (self.device,) = self._check(self.cu.cuDeviceGet(ordinal), "cuDeviceGet")
        (self.context,) = self._check(
            self.cu.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain"
        )
        self._check(self.cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        (raw_name,) = self._check(self.cu.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        attr = self.cu.CUdevice_attribute
        major = self._attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = self._attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        (version,) = self._check(self.cu.cuDriverGetVersion(), "cuDriverGetVersion")
        name = raw_name.split(b"\0", 1)[0].decode() if isinstance(raw_name, bytes) else str(raw_name)
        self.info = DeviceInfo(
            name, (major, minor), self._attribute(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE), int(version)
        )

    def _check(self, result, what: str) -> tuple:
        status, values = (result[0], tuple(result[1:])) if isinstance(result, tuple) else (result, ())
        if int(status) != 0:
            name = str(status)
            try:
                err, text = self.cu.cuGetErrorName(status)
                if int(err) == 0 and text:
                    name = text.decode() if isinstance(text, bytes) else str(text)
            except Exception:  # error naming is best effort; the status is reported either way
                pass
            raise CudaError(f"{what} failed: {name}")
        return values

    def _attribute(self, attribute) -> int:
        (value,) = self._check(self.cu.cuDeviceGetAttribute(attribute, self.device), "cuDeviceGetAttribute")
        return int(value)

    # ---- memory ----------------------------------------------------------------------------------

    def alloc(self, nbytes: int) -> int:
        (ptr,) = self._check(self.cu.cuMemAlloc(max(1, nbytes)), f"cuMemAlloc({nbytes} bytes)")
        return int(ptr)

    def free(self, ptr: int) -> None:
        self._check(self.cu.cuMemFree(ptr), "cuMemFree")

    def upload(self, ptr: int, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array)
        self._check(self.cu.cuMemcpyHtoD(ptr, data.ctypes.data, data.nbytes), "cuMemcpyHtoD")

    def download(self, ptr: int, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like)
        self._check(self.cu.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes), "cuMemcpyDtoH")
        return out

    def memset(self, ptr: int, byte: int, nbytes: int) -> None:
        self._check(self.cu.cuMemsetD8(ptr, byte, nbytes), "cuMemsetD8")

    def memset_async(self, ptr: int, byte: int, nbytes: int, stream: int) -> None:
        self._check(self.cu.cuMemsetD8Async(ptr, byte, nbytes, stream), "cuMemsetD8Async")

    def host_alloc_mapped(self, nbytes: int) -> int:
        """Pinned host memory that every context can map into its device's address space."""
        (ptr,) = self._check(
            self.cu.cuMemHostAlloc(nbytes, MEMHOSTALLOC_PORTABLE | MEMHOSTALLOC_DEVICEMAP),
            f"cuMemHostAlloc({nbytes} bytes, mapped)",
        )
        return int(ptr)

    def host_free(self, ptr: int) -> None:
        self._check(self.cu.cuMemFreeHost(ptr), "cuMemFreeHost")

    def mapped_pointer(self, host_ptr: int) -> int:
        """The device address of mapped pinned host memory."""
        (ptr,) = self._check(self.cu.cuMemHostGetDevicePointer(host_ptr, 0), "cuMemHostGetDevicePointer")
        return int(ptr)

    def pointer_device(self, ptr: int) -> int:
        """The ordinal of the GPU that device pointer ``ptr`` lives on."""
        attr = self.cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        (ordinal,) = self._check(self.cu.cuPointerGetAttribute(attr, ptr), "cuPointerGetAttribute")
        return int(ordinal)

    def synchronize(self) -> None:
        self._check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize (a kernel faulted?)")

    def stream_synchronize(self, stream: int) -> None:
        self._check(self.cu.cuStreamSynchronize(stream), "cuStreamSynchronize (a kernel faulted?)")

    # ---- contexts --------------------------------------------------------------------------------

    def current_context(self) -> int:
        """The calling thread's current context (0: none)."""
        (ctx,) = self._check(self.cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        return int(ctx)

    def enter(self) -> bool:
        """Make this device's context current on the calling thread if it is not (a thread that never
        used CUDA, or one whose current device is another GPU); True when one was pushed, to be
        popped by ``leave``."""
        result = self.cu.cuCtxGetCurrent()  # every call of a kernel comes here: no _check unless it failed
        if int(result[0]) != 0:
            self._check(result, "cuCtxGetCurrent")
        current = int(result[1])
        if current == int(self.context):
            return False
        if current == 0:
            self._check(self.cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
            return False
        self._check(self.cu.cuCtxPushCurrent(self.context), "cuCtxPushCurrent")
        return True

    def leave(self) -> None:
        self._check(self.cu.cuCtxPopCurrent(), "cuCtxPopCurrent")

    # ---- kernels ---------------------------------------------------------------------------------

    def load(self, cubin: bytes, kernel: str, shared_bytes: int):
        """(module, function) for `kernel` in `cubin`, allowed `shared_bytes` of dynamic shared memory."""
        (module,) = self._check(self.cu.cuModuleLoadData(cubin), "cuModuleLoadData")
        (function,) = self._check(
            self.cu.cuModuleGetFunction(module, kernel.encode()), f"cuModuleGetFunction({kernel!r})"
        )
        if shared_bytes > 48 * 1024:
            attr = self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            self._check(
                self.cu.cuFuncSetAttribute(function, attr, shared_bytes),
                f"cuFuncSetAttribute(max dynamic shared memory = {shared_bytes})",
            )
        return module, function

    def unload(self, module) -> None:
        self._check(self.cu.cuModuleUnload(module), "cuModuleUnload")

    def launch(self, function, grid, block, shared_bytes: int, params: KernelParams, stream: int = 0) -> None:
        result = self.cu.cuLaunchKernel(function, *grid, *block, shared_bytes, stream, params.address, 0)
        if int(result[0] if isinstance(result, tuple) else result) != 0:
            self._check(result, "cuLaunchKernel")

    def time(
        self,
        function,
        grid,
        block,
        shared_bytes: int,
        params: KernelParams,
        reps: int,
        warmup: int,
        flush: tuple[int, int] | None,
    ) -> float:
        """Median milliseconds of `reps` launches after `warmup`, writing `flush` (ptr, bytes) before each."""
        for _ in range(warmup):
            self.launch(function, grid, block, shared_bytes, params)
        self.synchronize()
        events = []
        for _ in range(reps):
            start = self._check(self.cu.cuEventCreate(0), "cuEventCreate")[0]
            end = self._check(self.cu.cuEventCreate(0), "cuEventCreate")[0]
            if flush:
                self._check(self.cu.cuMemsetD8Async(flush[0], 0, flush[1], 0), "cuMemsetD8Async (L2 flush)")
            self._check(self.cu.cuEventRecord(start, 0), "cuEventRecord")
            self.launch(function, grid, block, shared_bytes, params)
            self._check(self.cu.cuEventRecord(end, 0), "cuEventRecord")
            events.append((start, end))
        times = []
        for start, end in events:
            self._check(self.cu.cuEventSynchronize(end), "cuEventSynchronize (a kernel faulted?)")
            times.append(float(self._check(self.cu.cuEventElapsedTime(start, end), "cuEventElapsedTime")[0]))
            self._check(self.cu.cuEventDestroy(start), "cuEventDestroy")
            self._check(self.cu.cuEventDestroy(end), "cuEventDestroy")
        return statistics.median(times)


MEMHOSTALLOC_PORTABLE = 0x01  # CU_MEMHOSTALLOC_PORTABLE: pinned for every context
MEMHOSTALLOC_DEVICEMAP = 0x02  # CU_MEMHOSTALLOC_DEVICEMAP: mapped into the device address space


class KernelParams:
    """A `void**` array of kernel arguments, kept alive as long as this object; `set` changes one
    argument in place (a signature's launch packs its arguments once and sets the pointers per call)."""

    _CTYPES = {
        "int8": ctypes.c_int8,
        "uint8": ctypes.c_uint8,
        "int16": ctypes.c_int16,
        "uint16": ctypes.c_uint16,
        "int32": ctypes.c_int32,
        "uint32": ctypes.c_uint32,
        "int64": ctypes.c_int64,
        "uint64": ctypes.c_uint64,
        "float32": ctypes.c_float,
        "float64": ctypes.c_double,
    }

    def __init__(self, values: list[tuple[str, int | float]]) -> None:
        """`values`: (ctype name or "pointer", value) in parameter order."""
        self._holders = [
            ctypes.c_uint64(int(v)) if kind == "pointer" else self._CTYPES[kind](v) for kind, v in values
        ]
        self._array = (ctypes.c_void_p * max(1, len(self._holders)))(
            *[ctypes.addressof(h) for h in self._holders]
        )
        self.address = ctypes.addressof(self._array)

    def set(self, index: int, value: int) -> None:
        self._holders[index].value = value

    def values(self) -> list[int | float]:
        return [h.value for h in self._holders]
