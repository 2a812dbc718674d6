"""A small, checked layer over the CUDA driver API (`cuda.bindings.driver`): devices, memory, modules,
launches and event timing, used by the CUDA runtime and the SASS optimizer's timing worker.

Every call's status is checked and turned into `CudaError` naming the call and the error. The
module imports `cuda.bindings` lazily (falling back to the older `cuda.cuda` layout), so the rest
of polytile.sass works without it; tests pass a fake driver object.
"""

from __future__ import annotations

import ctypes
import functools
import statistics
import struct
from collections.abc import Callable, Sequence
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
        self._context = int(self.context)  # what enter() compares the current context with
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
            raise CudaError(f"{what} failed: {self.error_name(status)}")
        return values

    def error_name(self, status) -> str:
        """The name of a CUresult (CUDA_ERROR_...)."""
        try:
            if isinstance(status, int) and hasattr(self.cu, "CUresult"):  # a status the hot path read as int
                status = self.cu.CUresult(status)
            err, text = self.cu.cuGetErrorName(status)
            if int(err) == 0 and text:
                return text.decode() if isinstance(text, bytes) else str(text)
        except Exception:  # naming is best effort; the status is reported either way
            pass
        return str(status)

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
        if current == self._context:
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

    def tensor_map(self, ptr: int, dtype: str, shape: tuple[int, ...], row_bytes: int, box: tuple[int, int],
                   swizzle: int = 128) -> bytes:
        """The 128 bytes of a tensor map (``cuTensorMapEncodeTiled``) of the row-major tensor at ``ptr``
        of ``shape`` (2 to 5 dimensions, outermost first; rows ``row_bytes`` apart, the outer
        dimensions packed), read in boxes of ``box`` (rows, columns) elements of its last two
        dimensions and one index of the others, ``swizzle``-byte swizzled in shared memory (0: not
        swizzled), zeros past its end (a store: clipped there)."""
        cu = self.cu
        kind = {"float16": "FLOAT16", "bfloat16": "BFLOAT16", "float32": "FLOAT32"}[dtype]
        u64 = getattr(cu, "cuuint64_t", int)
        u32 = getattr(cu, "cuuint32_t", int)
        dims = list(reversed(shape))  # the contiguous dimension first
        strides = [row_bytes]
        for d in dims[1:-1]:
            strides.append(strides[-1] * d)
        boxes = [box[1], box[0]] + [1] * (len(dims) - 2)
        result = cu.cuTensorMapEncodeTiled(
            getattr(cu.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{kind}"), len(dims), ptr,
            [u64(d) for d in dims], [u64(s) for s in strides], [u32(b) for b in boxes], [u32(1)] * len(dims),
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            getattr(cu.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzle}B" if swizzle else
                    "CU_TENSOR_MAP_SWIZZLE_NONE"),
            cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        (tmap,) = self._check(result, f"cuTensorMapEncodeTiled({dtype} {'x'.join(map(str, shape))}, box "
                                      f"{box[0]}x{box[1]})")
        if hasattr(tmap, "getPtr"):
            return ctypes.string_at(int(tmap.getPtr()), TENSOR_MAP_BYTES)
        return struct.pack(f"<{TENSOR_MAP_BYTES // 8}Q", *tmap.opaque)

    def unload(self, module) -> None:
        self._check(self.cu.cuModuleUnload(module), "cuModuleUnload")

    def launch(self, function, grid, block, shared_bytes: int, params: KernelParams, stream: int = 0) -> None:
        result = self.cu.cuLaunchKernel(function, *grid, *block, shared_bytes, stream, params.address, 0)
        if int(result[0] if isinstance(result, tuple) else result) != 0:
            self._check(result, "cuLaunchKernel")

    def launcher(self, function, grid, block, shared_bytes: int, params: KernelParams) -> Callable[[int], int]:
        """A launch of ``function`` with ``params`` (whose values may change between launches) as a
        function of the stream returning the driver's status (0: launched): a kernel call's hot
        path. It calls the bindings' cuLaunchKernel, whose argument conversion took 5.1 µs of host
        time per launch on the H100 machine where ctypes on libcuda itself took 7.3 µs
        (benchmarks/launch_breakdown.py)."""
        launch, (gx, gy, gz), (bx, by, bz), address = self.cu.cuLaunchKernel, grid, block, params.address
        return lambda stream: int(launch(function, gx, gy, gz, bx, by, bz, shared_bytes, stream, address, 0)[0])

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


TENSOR_MAP_BYTES = 128  # a CUtensorMap, passed to kernels by value (64-byte aligned)
MEMHOSTALLOC_PORTABLE = 0x01  # CU_MEMHOSTALLOC_PORTABLE: pinned for every context
MEMHOSTALLOC_DEVICEMAP = 0x02  # CU_MEMHOSTALLOC_DEVICEMAP: mapped into the device address space


class KernelParams:
    """A `void**` array of kernel arguments, kept alive as long as this object; `set` changes one
    argument in place. Every value sits in an 8-byte slot of one buffer; the slots of the arguments
    named in ``per_call`` come first, in that order, so that `write` can replace all of them with
    one `struct.pack_into` (a signature's launch packs its arguments once and writes the pointers
    per call)."""

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

    def __init__(self, values: list[tuple[str, int | float]], per_call: Sequence[int] = (), tensor_maps: int = 0
                 ) -> None:
        """`values`: (ctype name or "pointer", value) in parameter order; `per_call`: the positions
        of the pointer arguments that `write` sets; `tensor_maps`: how many 128-byte tensor maps
        follow the values (set by `set_tensor_map`)."""
        if any(values[k][0] != "pointer" for k in per_call) or len(set(per_call)) != len(per_call):
            raise ValueError(f"per-call arguments {list(per_call)} must be distinct pointers of {values}")
        order = [*per_call, *(k for k in range(len(values)) if k not in set(per_call))]
        slot = {k: n for n, k in enumerate(order)}
        words = TENSOR_MAP_BYTES // 8
        self._buffer = (ctypes.c_uint64 * (max(1, len(values)) + (tensor_maps + 1) * words))()
        self._holders = [
            (ctypes.c_uint64 if kind == "pointer" else self._CTYPES[kind]).from_buffer(self._buffer, 8 * slot[k])
            for k, (kind, _) in enumerate(values)
        ]
        for holder, (kind, v) in zip(self._holders, values):
            holder.value = int(v) if kind == "pointer" else v
        base = ctypes.addressof(self._buffer)
        first = -(-(base + 8 * max(1, len(values))) // 64) * 64  # tensor maps are 64-byte aligned
        self.tensor_maps = [first + TENSOR_MAP_BYTES * k for k in range(tensor_maps)]
        self._array = (ctypes.c_void_p * max(1, len(values) + tensor_maps))(
            *[base + 8 * slot[k] for k in range(len(values))], *self.tensor_maps)
        self.address = ctypes.addressof(self._array)
        self._offsets = tuple(8 * slot[k] for k in range(len(values)))
        # write(*pointers) sets the `per_call` arguments, in their order (no Python frame per call)
        self.write: Callable[..., None] = functools.partial(
            struct.Struct(f"<{len(per_call)}Q").pack_into, self._buffer, 0)

    def set(self, index: int, value: int) -> None:
        self._holders[index].value = value

    def packed(self) -> tuple[bytes, tuple[int, ...]]:
        """The values' bytes as they stand (the per-call pointers first) and each argument's byte
        offset in them, in parameter order (what the C call path copies; tensor maps excluded)."""
        return ctypes.string_at(ctypes.addressof(self._buffer), 8 * max(1, len(self._holders))), self._offsets

    def set_tensor_map(self, index: int, data: bytes) -> None:
        ctypes.memmove(self.tensor_maps[index], data, TENSOR_MAP_BYTES)

    def values(self) -> list[int | float]:
        return [h.value for h in self._holders]
