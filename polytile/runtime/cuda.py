"""CUDA kernels: nvcc (or NVRTC) to a cubin (content-hash cache, ptxas resource report) and the call path.

A call on GPU arrays (torch, CuPy, other ``__cuda_array_interface__`` objects) enqueues on the
caller's stream (the framework's current stream, or ``stream=``) and returns without synchronizing;
its outputs come from the arrays' framework (torch's caching allocator for torch tensors), outputs
that start as zeros are cleared by a memset on the same stream, and index arrays are checked by
device-side kernels that report asynchronously (``index_checks``). Nothing in it synchronizes,
copies to the host or allocates through the driver, so it can be captured in a CUDA graph. A call
on NumPy arrays copies them to the GPU and back and returns when done. Everything the arguments'
signature decides (parameters, grids, packed kernel arguments) is worked out by the first call of
that signature (``kernel.Kernel``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import operator
import os
import re
import tempfile
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..codegen.cuda import KernelSource, TensorMap, cuda_source
from ..dtypes import uint8
from ..errors import BuildError, DeviceError, InputError
from ..lang.func import Func
from ..lowering import loopir as ir
from ..target import CUDATarget
from ..toolchain import arch_flags, cuda_compiler, find_nvcc, nvcc, run_compiler
from .args import ArrayInfo, IndexCheck, Signature, bind
from .cpu import cache_dir
from .cuda_driver import CudaError, Device, KernelParams
from .frameworks import KEY_OF, NUMPY, ArrayInterfaceFramework, Framework, framework_of, stream_handle
from .index_checks import (
    DEVICE_SOURCE,
    DeviceReports,
    device_kernel,
    device_launch,
    host_scans,
    raise_pending_reports,
    run_host_scans,
)
from .kernel import Kernel, Plan


@dataclass
class Resources:
    """What ptxas reports for one kernel."""

    registers: int = 0
    shared_bytes: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0


def parse_ptxas(text: str) -> dict[str, Resources]:
    out: dict[str, Resources] = {}
    current = None
    for line in text.splitlines():
        m = re.search(r"(?:Compiling entry function|Function properties for) '?([A-Za-z_][\w$]*)'?", line)
        if m:
            current = m.group(1)
            out.setdefault(current, Resources())
            continue
        if current is None:
            continue
        r = out[current]
        if m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                          line):
            r.stack_bytes, r.spill_stores, r.spill_loads = (int(x) for x in m.groups())
        if m := re.search(r"Used (\d+) registers", line):
            r.registers = int(m.group(1))
        if m := re.search(r"(\d+) bytes smem", line):
            r.shared_bytes = int(m.group(1))
    return out


def compile_cuda(source: str, arch: str, extra: Sequence[str] = ()) -> tuple[bytes, dict[str, Resources]]:
    """A cubin of ``source`` for ``arch`` and ptxas's resource report, reusing earlier builds. nvcc
    compiles it, or NVRTC where ``POLYTILE_CUDA_COMPILER=nvrtc`` asks for it, is found and takes the
    source's headers (``runtime.nvrtc``; no ``extra`` nvcc flags)."""
    lib = None
    if cuda_compiler() == "nvrtc" and not extra:
        from .nvrtc import nvrtc, nvrtc_can_compile, options_key
        lib = nvrtc() if nvrtc_can_compile(source) else None
    if lib is not None:
        key_parts = options_key(lib, arch)
    else:
        cc, flags = _nvcc(), _nvcc_flags(arch, extra)
        key_parts = [cc, *flags]
    key = hashlib.sha256("\0".join([source, *key_parts]).encode()).hexdigest()[:24]
    cubin = cache_dir() / f"pt_{key}.cubin"
    report = cache_dir() / f"pt_{key}.ptxas"
    if cubin.exists() and report.exists():
        return cubin.read_bytes(), parse_ptxas(report.read_text())
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        out = Path(tmp) / "kernel.cubin"
        if lib is not None:
            binary, log = lib.compile(source, arch)
            out.write_bytes(binary)
            if not parse_ptxas(log):  # no kernel's registers in the log nor the cubin: nvcc, whose report has them
                lib, cc, flags = None, _nvcc(), _nvcc_flags(arch, extra)
        if lib is None:
            src = Path(tmp) / "kernel.cu"
            src.write_text(source)
            proc = run_compiler([cc, *flags, str(src), "-o", str(out)], "a CUDA kernel")
            if proc.returncode != 0:
                raise BuildError(f"nvcc rejected the generated CUDA:\n{proc.stderr[-4000:]}")
            log = proc.stderr
        (Path(tmp) / "report").write_text(log)
        os.replace(Path(tmp) / "report", report)
        os.replace(out, cubin)
    return cubin.read_bytes(), parse_ptxas(report.read_text())


def _nvcc_flags(arch: str, extra: Sequence[str]) -> list[str]:
    return ["-cubin", "-O3", "-std=c++17", "-Xptxas", "-v", *arch_flags(arch), *extra]


def _nvcc() -> str:
    """nvcc's path; where NVRTC was asked for but could not be used, an error that says so too."""
    if cuda_compiler() == "nvrtc" and find_nvcc() is None:
        raise BuildError("neither NVRTC (POLYTILE_CUDA_COMPILER=nvrtc) nor nvcc can compile this kernel: NVRTC's "
                         "library was not found (pip install polytile[nvrtc], or set POLYTILE_NVRTC=/path/to/"
                         "libnvrtc.so.13) or the source includes a host header, and nvcc was not found (install "
                         "the CUDA toolkit or set NVCC=/path/to/nvcc)")
    return nvcc()


def eval_expr(e: ir.Expr, env: Mapping[str, int]) -> int:
    """An integer IR expression on the host (grid sizes, temporary sizes)."""
    try:
        return ir.eval_int(e, env)
    except ValueError as err:
        raise DeviceError(f"{err} on the host") from None


ALIGNMENT = 16  # bytes: generated kernels copy 16-byte vectors and store element pairs

_DEVICES: dict[int, Device] = {}


def gpu(ordinal: int) -> Device:
    """The primary context of GPU ``ordinal`` (created once; the calling thread's current context
    is left as it was)."""
    dev = _DEVICES.get(ordinal)
    if dev is None:
        from .cuda_device import device
        first = device()
        if ordinal == 0:
            dev = first
        else:
            (previous,) = first._check(first.cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
            dev = Device(ordinal, first.cu)
            first._check(first.cu.cuCtxSetCurrent(previous), "cuCtxSetCurrent")
        _DEVICES[ordinal] = dev
    return dev


def synchronize() -> None:
    """Wait for the work polytile queued on every GPU it used, and raise what the device-side
    index-array checks of any kernel reported (``pt.synchronize()``; nothing to do without a GPU)."""
    for dev in list(_DEVICES.values()):
        _synchronize_device(dev)
    raise_pending_reports()


def _synchronize_device(dev: Device) -> None:
    pushed = dev.enter()
    try:
        dev.synchronize()
    except DeviceError:
        raise_pending_reports()  # a broken index promise explains the fault better
        raise
    finally:
        if pushed:
            dev.leave()


TENSOR_MAPS_KEPT = 64  # tensor maps kept per launch and tensor, by the tensor's address


class _TensorMaps:
    """The tensor maps of one TMA operand of a launch, made once per address of the call's array
    (``cuTensorMapEncodeTiled``, some microseconds) and copied into the launch's arguments."""

    __slots__ = ("array", "slot", "encode", "made")

    def __init__(self, array: int, slot: int, encode: Callable[[int], bytes]):
        self.array, self.slot, self.encode = array, slot, encode
        self.made: dict[int, bytes] = {}

    def get(self, ptr: int) -> bytes:
        data = self.made.get(ptr)
        if data is None:
            if len(self.made) >= TENSOR_MAPS_KEPT:
                self.made.clear()
            data = self.made[ptr] = self.encode(ptr)
        return data


class _Launch:
    """One kernel launch of a signature: its arguments packed once, the call's pointers written into
    them per call with one ``struct.pack_into`` (and the tensor maps of its TMA operands, made once
    per array address)."""

    __slots__ = ("name", "device", "params", "write", "pick", "start", "maps", "function", "grid", "block",
                 "shared_bytes", "pointer_of")

    def __init__(self, name: str, dev: Device, function: object, grid: tuple[int, int, int],
                 block: tuple[int, int, int], shared_bytes: int, values: list[tuple[str, int | float]],
                 pointers: Sequence[tuple[int, int]], maps: Sequence[tuple[int, Callable[[int], bytes]]] = ()):
        """``values``: the arguments as ``KernelParams`` takes them; ``pointers``: (argument position,
        index of the call's array) of the arguments set per call; ``maps``: (index of the call's
        array, its tensor map for an address) of the tensor-map arguments that follow the values."""
        params = KernelParams(values, [slot for slot, _ in pointers], len(maps))
        self.params = params  # owns the array that the driver reads at every launch
        self.name = name
        self.device = dev
        self.write = params.write
        self.pointer_of = tuple(k for _, k in pointers)
        self.pick = _picker(self.pointer_of)
        self.maps = tuple(_TensorMaps(k, slot, encode) for slot, (k, encode) in enumerate(maps))
        self.function, self.grid, self.block, self.shared_bytes = function, grid, block, shared_bytes
        self.start = dev.launcher(function, grid, block, shared_bytes, params)

    def run(self, pointers: Sequence[int], stream: int) -> None:
        self.write(*self.pick(pointers))
        for m in self.maps:
            self.params.set_tensor_map(m.slot, m.get(pointers[m.array]))
        status = self.start(stream)
        if status:
            raise self.failure(status)

    def failure(self, status: int) -> DeviceError:
        return DeviceError(f"kernel {self.name} could not be launched: cuLaunchKernel failed: "
                           f"{self.device.error_name(status)}")

    def for_c(self) -> tuple:
        """This launch as the C call path takes it (``fastcall.call_for``)."""
        values, offsets = self.params.packed()
        return (int(self.function), self.grid, self.block, self.shared_bytes,  # type: ignore[call-overload]
                values, offsets, self.pointer_of)


def _picker(indices: Sequence[int]) -> Callable[[Sequence[int]], Sequence[int]]:
    """The items at ``indices`` of a sequence, as a tuple (``itemgetter`` alone returns a bare item
    for one index)."""
    if len(indices) == 1:
        (k,) = indices
        return lambda items: (items[k],)
    return operator.itemgetter(*indices) if indices else lambda items: ()


def _c_call_failed(dev: Device, launches: Sequence[_Launch], k: int, status: int) -> None:
    """Raise the Python path's error for a failed launch ``k`` of a C call (-1: its memset); bound to the
    device and launches, not the plan, which holds the C call."""
    if k < 0:
        raise CudaError(f"cuMemsetD8Async failed: {dev.error_name(status)}")
    raise launches[k].failure(status)


class _DeviceBuffer:
    """Device memory from the driver (NumPy calls; temporaries of calls on other frameworks' arrays).
    Freeing it waits for the device, so calls that use it are synchronous."""

    def __init__(self, dev: Device, nbytes: int):
        self.dev = dev
        self.ptr = dev.alloc(nbytes)

    def __del__(self) -> None:
        try:
            self.dev.free(self.ptr)
        except Exception:  # interpreter shutdown or a dead context: nothing to free
            pass


class _CUDAPlan(Plan):
    """One signature of a CUDA function: launches with packed arguments, index checks, sizes, and
    the framework's functions that a call needs, looked up once."""

    __slots__ = ("signature", "framework", "device", "launches", "checks", "temp_bytes", "reports", "scans",
                 "zero_outputs", "single", "lock", "ordinal", "pointer", "current_stream", "allocators",
                 "all_launches", "c_call", "temp_allocators")

    def __init__(self, sig: Signature, fw: Framework, dev: Device, launches: list[_Launch],
                 checks: list[_Launch], temp_bytes: list[int], reports: DeviceReports | None):
        self.signature = sig
        self.framework = fw
        self.device = dev
        self.ordinal = dev.ordinal
        self.launches = tuple(launches)
        self.checks = tuple(checks)  # device-side index checks (GPU arrays)
        self.all_launches = (*checks, *launches)
        self.scans = () if fw.on_gpu else host_scans(sig.index_checks)  # host-side ones (NumPy arrays)
        self.temp_bytes = temp_bytes
        self.reports = reports
        n_in = sig.n_inputs
        self.zero_outputs = [(n_in + k, sig.nbytes[n_in + k]) for k, z in enumerate(sig.zero_init)
                             if z and sig.nbytes[n_in + k]]
        self.single = len(sig.names) - n_in == 1
        self.lock = threading.Lock()  # the packed arguments are shared by the calls of this signature
        self.pointer = fw.pointer
        self.current_stream = fw.current_stream
        allocates = fw.on_gpu and not isinstance(fw, ArrayInterfaceFramework)
        inputs = list(zip(sig.shapes[:n_in], sig.dtypes[:n_in]))
        self.allocators = () if sig.outputs_given or not allocates else tuple(
            fw.allocator(shape, dt, self.ordinal, inputs) for shape, dt in zip(sig.output_shapes, sig.dtypes[n_in:]))
        # global temporaries: byte arrays of the framework, made like outputs
        self.temp_allocators = () if not allocates else \
            tuple(fw.allocator((nbytes,), uint8, self.ordinal, inputs) for nbytes in temp_bytes)
        self.c_call: object = None if self._takes_c_calls() else False  # None: not made yet; False: none

    # --- the C call path ---------------------------------------------------------------------------

    def _takes_c_calls(self) -> bool:
        """Whether calls of this signature can run in C (``fastcall``): GPU arrays of a framework that
        names its signature attributes and allocates the outputs and temporaries, no index checks or
        tensor maps."""
        from .fastcall import MAX_ARRAYS
        sig = self.signature
        return (self.framework.c_probes is not None and not self.checks
                and (sig.outputs_given or bool(self.allocators)) and len(self.temp_allocators) == len(self.temp_bytes)
                and len(sig.names) + len(self.temp_bytes) <= MAX_ARRAYS
                and not any(launch.maps for launch in self.launches))

    def make_c_call(self, arrays: Sequence[object]) -> object:
        """The C call of this signature, recorded from ``arrays`` (a call's arrays, which the Python
        path has just run); None when the C path is unavailable."""
        from . import fastcall
        sig, fw = self.signature, self.framework
        zero = () if sig.outputs_given else tuple(self.zero_outputs)
        self.c_call = fastcall.call_for(
            arrays, sig.n_inputs, fw.c_probes, fw.c_pointer, (*self.allocators, *self.temp_allocators),
            self.current_stream, self.ordinal,
            zero, sig.nbytes, sig.disjoint, self.device._context, [x.for_c() for x in self.launches],
            functools.partial(_c_call_failed, self.device, self.launches), self.launches, self.device.cu) or False
        return self.c_call

    # --- GPU arrays: enqueue on the caller's stream ------------------------------------------------

    def call(self, arrays: Sequence[object], stream: int | None) -> object:
        if not self.framework.on_gpu:
            return self.call_numpy(arrays, 0 if stream is None else stream)
        reports = self.reports
        if reports is not None and reports.pending():
            reports.raise_pending()
        pointers, outputs, _alive, stream = self.bind(arrays, stream)
        self.enqueue(pointers, stream, zero_outputs=not self.signature.outputs_given)
        return outputs[0] if self.single else tuple(outputs)

    def bind(self, arrays: Sequence[object], stream: int | None) -> tuple[list[int], list, list, int]:
        """Pointers of a call's arrays, its outputs (allocated when not given), its temporaries, its stream."""
        sig, fw, ordinal = self.signature, self.framework, self.ordinal
        pointer = self.pointer
        pointers = list(map(pointer, arrays))
        if sig.outputs_given:
            outputs = list(arrays[sig.n_inputs:])
            if sig.disjoint:
                sig.check_disjoint(pointers)
        elif stream is None:  # the framework's current stream, for which its allocator works
            outputs = [make() if k is None else make(arrays[k]) for k, make in self.allocators]
            pointers += map(pointer, outputs)
        else:
            outputs = [fw.empty(shape, dt, ordinal, stream)
                       for shape, dt in zip(sig.output_shapes, sig.dtypes[sig.n_inputs:])]
            pointers += map(pointer, outputs)
        alive: list[object] = []
        if stream is None and self.temp_allocators:
            alive = [make() if k is None else make(arrays[k]) for k, make in self.temp_allocators]
            pointers += map(pointer, alive)
        for nbytes in self.temp_bytes if not alive else ():
            if isinstance(fw, ArrayInterfaceFramework):
                buf = _DeviceBuffer(self.device, nbytes)
                alive.append(buf)
                pointers.append(buf.ptr)
            else:
                tmp = fw.empty((nbytes,), uint8, ordinal, stream)
                alive.append(tmp)
                pointers.append(pointer(tmp))
        if functools.reduce(operator.or_, pointers, 0) % ALIGNMENT:
            self._misaligned(pointers)
        return pointers, outputs, alive, self.current_stream(ordinal) if stream is None else stream

    def enqueue(self, pointers: Sequence[int], stream: int, zero_outputs: bool, checks: bool = True) -> None:
        dev = self.device
        pushed = dev.enter()
        try:
            if zero_outputs:
                for k, nbytes in self.zero_outputs:
                    dev.memset_async(pointers[k], 0, nbytes, stream)
            with self.lock:
                for launch in self.all_launches if checks else self.launches:
                    launch.run(pointers, stream)
        finally:
            if pushed:
                dev.leave()

    def _misaligned(self, pointers: Sequence[int]) -> None:
        sig = self.signature
        k = next(k for k, p in enumerate(pointers) if p % ALIGNMENT)
        raise InputError(f"argument {sig.names[k]} of {sig.func} starts at an address that is not a multiple of "
                         f"{ALIGNMENT} bytes (a view into another array?); pass a freshly allocated or cloned array")

    # --- NumPy arrays: copy in, launch, wait, copy out ---------------------------------------------

    def call_numpy(self, arrays: Sequence[np.ndarray], stream: int) -> object:
        sig = self.signature
        n_in = sig.n_inputs
        inputs = [np.ascontiguousarray(a) for a in arrays[:n_in]]
        outputs = list(arrays[n_in:]) if sig.outputs_given else [
            (np.zeros if zero else np.empty)(shape, dt.numpy)
            for zero, shape, dt in zip(sig.zero_init, sig.output_shapes, sig.dtypes[n_in:])]
        host = [int(a.__array_interface__["data"][0]) for a in [*inputs, *outputs]]
        if sig.disjoint:
            sig.check_disjoint(host)
        if self.scans:
            run_host_scans(sig.func, self.scans, host, arrays)
        for k, out in enumerate(outputs):
            if not out.flags.writeable:
                raise InputError(f"output {sig.names[n_in + k]} of {sig.func} is read-only; pass a writeable array")
        dev = self.device
        pushed = dev.enter()
        buffers: list[_DeviceBuffer] = []
        try:
            buffers += [_DeviceBuffer(dev, a.nbytes) for a in [*inputs, *outputs]]
            buffers += [_DeviceBuffer(dev, n) for n in self.temp_bytes]
            # a given output keeps its values where the kernel does not write; a new one may start as zeros
            needed = [True] * n_in + [sig.outputs_given or z for z in sig.zero_init]
            for a, buf, upload in zip([*inputs, *outputs], buffers, needed):
                if upload and a.nbytes:
                    dev.upload(buf.ptr, a)
            pointers = [b.ptr for b in buffers]
            self.enqueue(pointers, stream, zero_outputs=False, checks=False)
            _synchronize_device(dev)
            raise_pending_reports()
            for out, buf in zip(outputs, buffers[n_in:]):
                if out.nbytes:
                    out[...] = dev.download(buf.ptr, out)
        finally:
            buffers.clear()  # freed in this device's context
            if pushed:
                dev.leave()
        return outputs[0] if self.single else tuple(outputs)


@dataclass
class CUDAKernel(Kernel):
    """A built CUDA function: one or more kernels launched in order (see ``Kernel``).

    Called on GPU arrays (torch, CuPy, ``__cuda_array_interface__``) it enqueues on the caller's
    current stream (``stream=`` picks another) and returns at once, outputs allocated by the
    arrays' framework; called on NumPy arrays it copies them to the GPU and back and returns when
    done. ``resources`` holds ptxas's report per kernel.
    """

    func: Func
    lowered: ir.LoweredFunc
    source: str
    kernels: list[KernelSource]
    cubin: bytes
    resources: dict[str, Resources]
    target: CUDATarget
    temporaries: list[ir.Buffer] = field(default_factory=list)
    index32: bool = True
    _functions: dict[tuple[int, str], object] = field(default_factory=dict)
    check_cubin: bytes | None = None  # the device-side index checks (functions with index arrays)
    _reports: dict[int, DeviceReports] = field(init=False, repr=False, compare=False)  # per GPU
    _devices: set[int] = field(init=False, repr=False, compare=False)  # the GPUs its calls used
    # C calls of signatures the Python path has run (``fastcall``), newest first, and the C function
    # that runs the first of them that takes a call's arrays
    _c_calls: list = field(init=False, repr=False, compare=False)
    _c_first: Callable = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if "stream" in {p.name for p in self.func.params}:
            raise BuildError(f"{self.func.name}: the parameter name 'stream' is taken by the stream= argument "
                             "of CUDA kernels; rename the parameter")
        self._init_signatures()
        self._reports = {}
        self._devices = set()
        self._c_calls = []

    def __call__(self, *arrays: object, stream: object = None, **params: object) -> object:
        """Run on ``arrays``; ``stream``: a CUDA stream (handle, torch or CuPy stream) instead of the
        current one of the arrays' framework."""
        plain = stream is None and not params
        if plain and self._c_calls:
            out = self._c_first(self._c_calls, arrays)
            if out is not None:
                return out
        try:
            plan = self._plans[tuple([KEY_OF[type(a)](a) for a in arrays]), tuple(params.items())]
        except (KeyError, TypeError):  # a new signature, an array type not seen yet, or a bad argument
            plan = self._plan(self._key(arrays, params), arrays, params)
        out = plan.call(arrays, None if stream is None else stream_handle(stream))
        if plain and plan.c_call is not False:
            self._keep_c_call(plan, arrays)
        return out

    def _keep_c_call(self, plan: _CUDAPlan, arrays: Sequence[object]) -> None:
        """Let later calls of ``plan``'s signature run in C (``fastcall``), once the Python path has run one."""
        from . import fastcall
        call = plan.c_call or plan.make_c_call(arrays)
        if not call or call in self._c_calls:
            return
        self._c_calls.insert(0, call)
        del self._c_calls[fastcall.CALLS_KEPT:]
        self._c_first = fastcall.module().first  # type: ignore[union-attr]

    def synchronize(self) -> None:
        for ordinal in self._devices:
            _synchronize_device(_DEVICES[ordinal])
        for reports in self._reports.values():
            reports.raise_pending()

    def benchmark(self, *arrays: object, repeat: int = 50, warmup: int = 5, min_time: float = 0.0,
                  flush_cache: bool = True, stream: object = None, **params: object) -> float:
        """Median seconds of one call (all its kernels), timed with CUDA events on the call's stream after
        ``warmup`` calls: at least ``repeat`` runs, more until the timed runs add up to ``min_time``
        seconds or that much time has passed (``CPUKernel.benchmark`` counts the latter). ``flush_cache``
        writes a buffer twice the L2 size before each run. The index-array checks run once, before the timing."""
        from .timing import time_gpu
        self._check_timing(repeat, warmup, min_time)
        plan = self._plan(self._key(arrays, params), arrays, params)
        handle = None if stream is None else stream_handle(stream)
        dev = plan.device
        pushed = dev.enter()
        try:
            with _staged(plan, arrays, handle) as (pointers, handle):
                return time_gpu(lambda: plan.enqueue(pointers, handle, zero_outputs=False, checks=False),
                                repeat, warmup, flush_cache, self.target.l2_bytes, min_time, stream=handle)
        finally:
            if pushed:
                dev.leave()

    # --- signatures -------------------------------------------------------------------------------

    def _key(self, arrays: Sequence[object], params: Mapping[str, object]) -> Hashable:
        parts = []
        for a in arrays:
            fw = framework_of(a, _pointer_device)
            if fw is None:
                return None
            parts.append(fw.key(a))
        return tuple(parts), tuple(params.items())

    def _new_plan(self, arrays: Sequence[object], params: Mapping[str, object]) -> _CUDAPlan:
        func = self.func
        tensors = [*func.inputs, *func.outputs]
        fws = []
        for t, a in zip(tensors, arrays):
            fw = framework_of(a, _pointer_device)
            if fw is None:
                raise InputError(f"argument {t.name} of {func.name} must be a GPU array (torch, CuPy, "
                                 f"__cuda_array_interface__) or a NumPy array, got {type(a).__name__}")
            fws.append(fw)
        fw = fws[0] if fws else NUMPY
        for t, other in zip(tensors, fws):
            if other is not fw:
                raise InputError(f"arguments {tensors[0].name} ({fw.name}) and {t.name} ({other.name}) of "
                                 f"{func.name} come from different frameworks; pass every array from one")
        infos = [fw.info(a) for a in arrays]
        sig = bind(func, infos, params)
        ordinal = self._device_of(sig, infos) if fw.on_gpu else 0
        dev = gpu(ordinal)
        self._devices.add(ordinal)
        pushed = dev.enter()
        try:
            launches = [self._launch(k, dev, sig) for k in self.kernels]
            checks: list[_Launch] = []
            reports = None
            if fw.on_gpu and sig.index_checks:
                reports = self._reports.get(ordinal)
                if reports is None:
                    reports = self._reports[ordinal] = DeviceReports(dev, func)
                checks = [self._check_launch(chk, dev, reports) for chk in sig.index_checks]
        except CudaError as err:
            if "CAPTURE" in str(err).upper():
                raise InputError(f"the first call of {func.name} with these argument shapes came during CUDA graph "
                                 "capture, which forbids loading its kernels; call it once before capturing "
                                 "(torch.cuda.graph wants warm-up calls anyway)") from err
            raise
        finally:
            if pushed:
                dev.leave()
        temp_bytes = [b.dtype.itemsize * int(np.prod([max(0, eval_expr(d, sig.params)) for d in b.shape],
                                                     dtype=np.int64)) for b in self.temporaries]
        return _CUDAPlan(sig, fw, dev, [x for x in launches if x is not None], checks, temp_bytes, reports)

    def _device_of(self, sig: Signature, infos: Sequence[ArrayInfo]) -> int:
        """The GPU of a call's arrays, which must all be on one, contiguous."""
        first = None
        for name, info in zip(sig.names, infos):
            if info.device is None:
                raise InputError(f"argument {name} of {sig.func} is a CPU {info.framework} tensor; move it to "
                                 "the GPU with .cuda() (or pass NumPy arrays, which are copied)")
            if first is None:
                first = (name, info.device)
            elif info.device != first[1]:
                raise InputError(f"arguments {first[0]} (cuda:{first[1]}) and {name} (cuda:{info.device}) of "
                                 f"{sig.func} are on different GPUs; move them to one")
            if not info.contiguous:
                raise InputError(f"argument {name} of {sig.func} is not contiguous (a transposed or strided view); "
                                 f"pass {name}.contiguous(): CUDA kernels read dense row-major arrays")
        return first[1] if first is not None else 0

    def _launch(self, k: KernelSource, dev: Device, sig: Signature) -> _Launch | None:
        grid = tuple(max(0, eval_expr(g, sig.params)) for g in k.grid)
        if 0 in grid:
            return None
        index = {name: n for n, name in enumerate(sig.names)}
        index.update({b.name: len(sig.names) + n for n, b in enumerate(self.temporaries)})
        values: list[tuple[str, int | float]] = [("pointer", 0) for _ in k.args]
        values += [("int32" if self.index32 else "int64", sig.params[p.name]) for p in k.params]
        pointers = [(slot, index[b.name]) for slot, b in enumerate(k.args)]
        maps = [(index[m.buffer.name], _tensor_map_encoder(m, dev, sig, self.func.name)) for m in k.tensor_maps]
        function = self._function(dev, k.name, self.cubin, k.dynamic_shared)
        return _Launch(k.name, dev, function, grid, k.block, k.dynamic_shared, values, pointers,  # type: ignore[arg-type]
                       maps)

    def _check_launch(self, chk: IndexCheck, dev: Device, reports: DeviceReports) -> _Launch:
        if self.check_cubin is None:
            raise BuildError(f"{self.func.name} was built without its index-array checks; rebuild it with pt.build")
        name = device_kernel(chk)
        grid, block, scalars = device_launch(chk)
        values: list[tuple[str, int | float]] = [("pointer", 0), *scalars, ("pointer", reports.word(chk))]
        function = self._function(dev, name, self.check_cubin, 0)
        return _Launch(name, dev, function, grid, block, 0, values, [(0, chk.arg)])

    def _function(self, dev: Device, name: str, cubin: bytes, shared: int):  # noqa: ANN202 - a CUfunction
        key = (dev.ordinal, name)
        if key not in self._functions:
            _, fn = dev.load(cubin, name, shared)
            self._functions[key] = fn
        return self._functions[key]


@contextlib.contextmanager
def _staged(plan: _CUDAPlan, arrays: Sequence[object], stream: int | None) -> Iterator[tuple[list[int], int]]:
    """A call's arguments ready for repeated launches (``benchmark``): GPU arrays bound and their
    index checks run once; NumPy arrays checked on the host and copied to device buffers."""
    sig = plan.signature
    if plan.framework.on_gpu:
        pointers, _outputs, _alive, handle = plan.bind(arrays, stream)
        if plan.checks:
            plan.enqueue(pointers, handle, zero_outputs=False)
            _synchronize_device(plan.device)
            if plan.reports is not None:
                plan.reports.raise_pending()
        yield pointers, handle
        return
    hosts = [np.ascontiguousarray(a) for a in arrays[:sig.n_inputs]]
    if plan.scans:
        run_host_scans(sig.func, plan.scans, [int(a.ctypes.data) for a in hosts], arrays)
    buffers = [_DeviceBuffer(plan.device, n) for n in [*sig.nbytes, *plan.temp_bytes]]
    for a, buf in zip(hosts, buffers):
        if a.nbytes:
            plan.device.upload(buf.ptr, a)
    yield [b.ptr for b in buffers], 0 if stream is None else stream


def _tensor_map_encoder(m: TensorMap, dev: Device, sig: Signature, func: str) -> Callable[[int], bytes]:
    """The tensor map of ``m``'s tensor at an address, for this signature's sizes; refuses rows that
    TMA cannot address (their stride must be a multiple of 16 bytes)."""
    shape = tuple(int(eval_expr(d, sig.params)) for d in m.buffer.shape)
    cols = shape[-1]
    row_bytes = cols * m.buffer.dtype.itemsize
    if row_bytes % 16:
        raise InputError(f"{func}: {m.buffer.name} has rows of {cols} {m.buffer.dtype} elements ({row_bytes} bytes), "
                         "which TMA copies cannot read (rows must be multiples of 16 bytes); build it with "
                         "pipeline(..., producer='threads') or pad the rows")
    dtype, box = m.buffer.dtype.name, (m.rows, m.width)
    return lambda ptr: dev.tensor_map(ptr, dtype, shape, row_bytes, box, m.swizzle)


def _pointer_device(ptr: int) -> int:
    return gpu(0).pointer_device(ptr)


def index32_ok(lowered: ir.LoweredFunc) -> bool:
    """32-bit index arithmetic is safe when every buffer has fewer than 2^31 elements (known sizes)."""
    for b in lowered.args:
        n = 1
        for d in b.shape:
            if not isinstance(d, ir.Const):
                return False
            n *= int(d.value)
        if n >= 2**31:
            return False
    return True


def build_cuda_kernel(sched: object, lowered: ir.LoweredFunc, target: CUDATarget) -> CUDAKernel:
    idx32 = index32_ok(lowered)
    source, kernels = cuda_source(lowered, idx32)
    for k in kernels:
        if k.dynamic_shared > target.shared_per_block:
            raise BuildError(f"{lowered.name}: kernel {k.name} needs {k.dynamic_shared} bytes of shared "
                             f"memory, more than the {target.shared_per_block} a block of {target.name} "
                             f"({target.arch}) can have; use smaller tiles or fewer pipeline stages")
    cubin, resources = compile_cuda(source, target.arch)
    for k in kernels:
        used = resources.get(k.name)
        if k.register_split is not None and used is not None and not \
                k.register_split[0] <= used.registers <= k.register_split[1]:
            p, c = k.register_split
            raise BuildError(f"{lowered.name}: kernel {k.name} starts with {used.registers} registers per thread, "
                             f"outside its warp specialization's split ({p} for the producer, {c} for the consumers): "
                             "setmaxnreg cannot reach it; ask for other registers (pipeline(..., registers=...))")
    func = sched.func  # type: ignore[attr-defined]
    has_checks = any(t.value_range is not None or t.monotonic for t in func.inputs)
    check_cubin = compile_cuda(DEVICE_SOURCE, target.arch)[0] if has_checks else None
    temps = [st.buffer for st in ir.walk_stmt(lowered.body)
             if isinstance(st, ir.Allocate) and st.buffer.scope == "global"]
    return CUDAKernel(func, lowered, source, kernels, cubin, resources, target, temps, idx32,
                      check_cubin=check_cubin)
