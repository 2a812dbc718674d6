"""CUDA kernels: nvcc to a cubin (content-hash cache, ptxas resource report), loading and launching
through the driver API, arguments from torch, CuPy, any ``__cuda_array_interface__`` array or NumPy
(copied to and from the device), and event timing with an L2 flush."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..codegen.cuda import KernelSource, cuda_source
from ..dtypes import DType
from ..errors import BuildError, DeviceError, InputError
from ..lang.func import Func
from ..lowering import loopir as ir
from ..target import CUDATarget
from ..toolchain import arch_flags, nvcc
from .args import bind_params, check_index_arrays, check_shapes, expected_shape, needs_zero_init
from .cpu import cache_dir


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
    """A cubin of ``source`` for ``arch`` and ptxas's resource report, reusing earlier builds."""
    cc = nvcc()
    flags = ["-cubin", "-O3", "-std=c++17", "-Xptxas", "-v", *arch_flags(arch), *extra]
    key = hashlib.sha256("\0".join([source, cc, *flags]).encode()).hexdigest()[:24]
    cubin = cache_dir() / f"pt_{key}.cubin"
    report = cache_dir() / f"pt_{key}.ptxas"
    if cubin.exists() and report.exists():
        return cubin.read_bytes(), parse_ptxas(report.read_text())
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        out = Path(tmp) / "kernel.cubin"
        proc = subprocess.run([cc, *flags, str(src), "-o", str(out)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"nvcc rejected the generated CUDA:\n{proc.stderr[-4000:]}")
        (Path(tmp) / "report").write_text(proc.stderr)
        os.replace(Path(tmp) / "report", report)
        os.replace(out, cubin)
    return cubin.read_bytes(), parse_ptxas(report.read_text())


def eval_expr(e: ir.Expr, env: Mapping[str, int]) -> int:
    """An integer IR expression on the host (grid sizes, temporary sizes)."""
    try:
        return ir.eval_int(e, env)
    except ValueError as err:
        raise DeviceError(f"{err} on the host") from None


@dataclass
class _Arg:
    ptr: int
    shape: tuple[int, ...]
    owner: object  # keeps the memory alive
    host: np.ndarray | None = None  # NumPy argument: copied back after the call (outputs)


def _typestr_dtype(typestr: str) -> np.dtype:
    return np.dtype(typestr)


def device_array(x: object, t_dtype: DType, name: str) -> _Arg:
    """A device pointer for ``x`` (torch, CuPy, ``__cuda_array_interface__``); NumPy arrays are copied."""
    from .cuda_device import device
    if isinstance(x, np.ndarray):
        if x.dtype != t_dtype.numpy:
            raise InputError(f"argument {name} must have dtype {t_dtype}, got {x.dtype}")
        host = np.ascontiguousarray(x)
        dev = device()
        ptr = dev.alloc(host.nbytes)
        dev.upload(ptr, host)
        return _Arg(ptr, host.shape, _DeviceBuffer(ptr), x)
    mod = type(x).__module__
    if mod.startswith("torch"):
        if not x.is_cuda:  # type: ignore[attr-defined]
            raise InputError(f"argument {name} is a CPU torch tensor; move it to the GPU with .cuda()")
        if str(x.dtype).removeprefix("torch.") != t_dtype.name:  # type: ignore[attr-defined]
            raise InputError(f"argument {name} must have dtype {t_dtype}, got {x.dtype}")  # type: ignore[attr-defined]
        if not x.is_contiguous():  # type: ignore[attr-defined]
            raise InputError(f"argument {name} must be contiguous; call .contiguous()")
        return _aligned_arg(_Arg(int(x.data_ptr()), tuple(x.shape), x), name)  # type: ignore[attr-defined]
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None:
        raise InputError(f"argument {name} must be a GPU array (torch, CuPy, __cuda_array_interface__) or a "
                         f"NumPy array, got {type(x).__name__}")
    dt = _typestr_dtype(cai["typestr"])
    if t_dtype.name != "bfloat16" and dt != t_dtype.numpy:
        raise InputError(f"argument {name} must have dtype {t_dtype}, got {dt}")
    shape = tuple(int(s) for s in cai["shape"])
    strides = cai.get("strides")
    if strides is not None:
        expect = []
        acc = dt.itemsize
        for s in reversed(shape):
            expect.append(acc)
            acc *= s
        if tuple(reversed(expect)) != tuple(strides):
            raise InputError(f"argument {name} must be C-contiguous")
    return _aligned_arg(_Arg(int(cai["data"][0]), shape, x), name)


ALIGNMENT = 16  # bytes: generated kernels copy 16-byte vectors and store element pairs


def _aligned_arg(arg: _Arg, name: str) -> _Arg:
    if arg.ptr % ALIGNMENT:
        raise InputError(f"argument {name} starts at an address that is not a multiple of {ALIGNMENT} bytes "
                         "(a view into another array?); pass a freshly allocated or .clone()d array")
    return arg


class _DeviceBuffer:
    def __init__(self, ptr: int):
        self.ptr = ptr

    def __del__(self) -> None:
        try:
            from .cuda_device import device
            device().free(self.ptr)
        except Exception:  # interpreter shutdown or a dead context: nothing to free
            pass


class _Shape:
    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape


@dataclass
class CUDAKernel:
    """A built CUDA function: one or more kernels launched in order. Call it on GPU arrays (torch,
    CuPy) or NumPy arrays; ``source``, ``ir``, ``resources`` (ptxas, per kernel), ``benchmark()``."""

    func: Func
    lowered: ir.LoweredFunc
    source: str
    kernels: list[KernelSource]
    cubin: bytes
    resources: dict[str, Resources]
    target: CUDATarget
    temporaries: list[ir.Buffer] = field(default_factory=list)
    index32: bool = True
    _functions: dict[str, object] = field(default_factory=dict)

    @property
    def ir(self) -> str:
        return str(self.lowered)

    def _function(self, k: KernelSource):  # noqa: ANN202 - a CUfunction
        if k.name not in self._functions:
            from .cuda_device import device
            _, fn = device().load(self.cubin, k.name, k.dynamic_shared)
            self._functions[k.name] = fn
        return self._functions[k.name]

    def _prepare(self, arrays: Sequence[object], kwargs: Mapping[str, object]):  # noqa: ANN202
        func = self.func
        n_in, n_out = len(func.inputs), len(func.outputs)
        if len(arrays) not in (n_in, n_in + n_out):
            raise InputError(f"{func.name} takes {n_in} input array(s), optionally followed by {n_out} "
                             f"output array(s); got {len(arrays)}")
        tensors = [*func.inputs, *func.outputs]
        shapes = [_Shape(tuple(int(s) for s in a.shape)) for a in arrays]  # type: ignore[attr-defined]
        params = bind_params(func, shapes, kwargs)
        index_arrays = [a if isinstance(a, np.ndarray) else _host_copy(a) if t.value_range is not None
                        or t.monotonic else None for t, a in zip(func.inputs, arrays, strict=False)]
        check_index_arrays(func, index_arrays, params)
        args: dict[str, _Arg] = {}
        like = next((a for a in arrays if not isinstance(a, np.ndarray)), None)
        for t, a in zip(tensors, arrays, strict=False):
            args[t.name] = device_array(a, t.dtype, t.name)
        outputs = []
        for t in func.outputs[len(arrays) - n_in:]:
            shape = expected_shape(t, params)
            out = _allocate_like(like, shape, t.dtype, zero=needs_zero_init(t))
            args[t.name] = device_array(out, t.dtype, t.name)
            outputs.append(out)
        check_shapes(func, [_Shape(args[t.name].shape) for t in tensors], params)
        for b in self.temporaries:
            nbytes = b.dtype.itemsize
            for d in b.shape:
                nbytes *= eval_expr(d, params)
            from .cuda_device import device
            ptr = device().alloc(nbytes)
            args[b.name] = _Arg(ptr, (), _DeviceBuffer(ptr))
        return args, params, [*arrays[n_in:], *outputs]

    def _launch_all(self, args: Mapping[str, _Arg], params: Mapping[str, int]) -> None:
        from .cuda_device import device
        from .cuda_driver import KernelParams
        dev = device()
        for k in self.kernels:
            grid = tuple(max(0, eval_expr(g, params)) for g in k.grid)
            if 0 in grid:
                continue
            values: list[tuple[str, int | float]] = [("pointer", args[b.name].ptr) for b in k.args]
            values += [("int32" if self.index32 else "int64", params[p.name]) for p in k.params]
            try:
                dev.launch(self._function(k), grid, k.block, k.dynamic_shared, KernelParams(values))
            except DeviceError as err:
                raise DeviceError(f"kernel {k.name} could not be launched: {err}") from None

    def __call__(self, *arrays: object, **params: object):  # noqa: ANN204
        from .cuda_device import device
        args, bound, outs = self._prepare(arrays, params)
        self._launch_all(args, bound)
        try:
            device().synchronize()
        except DeviceError as err:
            names = ", ".join(k.name for k in self.kernels)
            raise DeviceError(f"{self.lowered.name} ({names}) failed on the GPU: {err}") from None
        results = []
        for t, o in zip(self.func.outputs, outs, strict=True):
            a = args[t.name]
            if isinstance(o, np.ndarray):
                o[...] = device().download(a.ptr, o)
            results.append(o)
        return results[0] if len(results) == 1 else tuple(results)

    def benchmark(self, *arrays: object, repeat: int = 50, warmup: int = 5, min_time: float = 0.0,
                  flush_cache: bool = True, **params: object) -> float:
        """Median seconds of one call (all its kernels), timed with CUDA events after ``warmup`` calls:
        at least ``repeat`` runs, more until the timed runs add up to ``min_time`` seconds (as
        ``CPUKernel.benchmark``). ``flush_cache`` writes a buffer twice the L2 size before each run."""
        from .timing import time_gpu
        args, bound, _ = self._prepare(arrays, params)
        return time_gpu(lambda: self._launch_all(args, bound), repeat, warmup, flush_cache,
                        self.target.l2_bytes, min_time)


def _host_copy(a: object) -> np.ndarray | None:
    if hasattr(a, "cpu"):
        return a.cpu().numpy()  # type: ignore[attr-defined]
    if hasattr(a, "get"):
        return a.get()  # type: ignore[attr-defined]
    return None


def _allocate_like(like: object, shape: tuple[int, ...], dtype: DType, zero: bool) -> object:
    if like is not None and type(like).__module__.startswith("torch"):
        import torch
        tdt = getattr(torch, dtype.name)
        return (torch.zeros if zero else torch.empty)(shape, dtype=tdt, device=like.device)  # type: ignore[attr-defined]
    if like is not None and type(like).__module__.startswith("cupy"):
        import cupy
        return (cupy.zeros if zero else cupy.empty)(shape, dtype=dtype.numpy)
    return (np.zeros if zero else np.empty)(shape, dtype=dtype.numpy)


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
    temps = [st.buffer for st in ir.walk_stmt(lowered.body)
             if isinstance(st, ir.Allocate) and st.buffer.scope == "global"]
    func = sched.func  # type: ignore[attr-defined]
    return CUDAKernel(func, lowered, source, kernels, cubin, resources, target, temps, idx32)
