"""The array frameworks a CUDA kernel takes, and what a call needs from each: the signature of an
array (shape, dtype, strides, device) as a cheap hashable key, its description (``ArrayInfo``), its
data pointer, the framework's current stream on a device, and new arrays owned by the framework.

- NumPy arrays live on the host: a call copies them in and out and is synchronous.
- torch tensors: the current stream is torch's (``torch.cuda.current_stream``); outputs come from
  torch's caching allocator, which is stream-ordered and safe inside CUDA graph capture.
- CuPy arrays: CuPy's current stream and memory pool.
- Other ``__cuda_array_interface__`` objects: the legacy default stream; polytile cannot allocate
  for them, so their calls must pass the outputs.

A call takes its arrays from one framework. Frameworks are found by the array's type, once per type.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from .. import dtypes
from ..dtypes import DType
from ..errors import InputError
from .args import ArrayInfo, dtype_name, numpy_info


class Framework:
    """How polytile reads and makes one framework's arrays (the methods below, per framework)."""

    name = ""
    on_gpu = True
    # for the C call path (``fastcall``): the attributes that make an array's signature key (a name and
    # whether it is a method called without arguments), and how to read its data pointer; None: calls
    # on this framework's arrays stay in Python
    c_probes: tuple[tuple[str, bool], ...] | None = None
    c_pointer: tuple[str, bool] = ("", False)

    def key(self, a: Any) -> Hashable:
        """The array's signature: shape, dtype, strides, device (and the framework)."""
        raise NotImplementedError

    def info(self, a: Any) -> ArrayInfo:
        raise NotImplementedError

    def pointer(self, a: Any) -> int:
        raise NotImplementedError

    def current_stream(self, device: int) -> int:
        """The handle of the framework's current stream on GPU ``device``."""
        return 0

    def empty(self, shape: tuple[int, ...], dtype: DType, device: int, stream: int | None) -> Any:
        """A new array on ``device``; ``stream``: the stream it will be used on when that is not the
        framework's current one (so stream-ordered allocators order its reuse after that stream)."""
        raise NotImplementedError

    def allocator(self, shape: tuple[int, ...], dtype: DType, device: int,
                  inputs: Sequence[tuple[tuple[int, ...], DType]]) -> tuple[int | None, Callable[..., Any]]:
        """How a signature's calls allocate an output, worked out once: ``(k, make)``, where
        ``make(arrays[k])`` returns a new array for the framework's current stream (k None:
        ``make()`` does); ``inputs``: the inputs' shapes and dtypes."""
        return None, functools.partial(self.empty, shape, dtype, device, None)


class NumPyFramework(Framework):
    name = "NumPy"
    on_gpu = False

    def key(self, a: np.ndarray) -> Hashable:
        return NumPyFramework, a.shape, a.dtype, a.strides

    def info(self, a: np.ndarray) -> ArrayInfo:
        return numpy_info(a)

    def pointer(self, a: np.ndarray) -> int:
        return int(a.__array_interface__["data"][0])


class TorchFramework(Framework):
    name = "torch"
    c_probes = (("shape", False), ("dtype", False), ("stride", True), ("get_device", True))  # as key() reads them
    c_pointer = ("data_ptr", True)

    def __init__(self) -> None:
        import torch
        self.torch = torch
        # torch's own fast path to the current stream (what Triton's launcher uses), else the public one
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self.current_stream = raw if raw is not None else (  # type: ignore[method-assign]
            lambda device: torch.cuda.current_stream(device).cuda_stream)
        self._dtypes = {d.name: getattr(torch, d.name) for d in dtypes.ALL}
        self._devices: dict[int, Any] = {}
        self.pointer = torch.Tensor.data_ptr  # type: ignore[method-assign]  # no Python frame per array

    def key(self, a: Any) -> Hashable:
        return TorchFramework, a.shape, a.dtype, a.stride(), a.get_device()

    def info(self, a: Any) -> ArrayInfo:
        device = a.get_device() if a.is_cuda else None
        return ArrayInfo(tuple(a.shape), str(a.dtype).removeprefix("torch."), a.is_contiguous(), device, "torch")

    def empty(self, shape: tuple[int, ...], dtype: DType, device: int, stream: int | None) -> Any:
        torch = self.torch
        dev = self._device(device)
        if stream is None:
            return torch.empty(shape, dtype=self._dtypes[dtype.name], device=dev)
        with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=dev)):
            return torch.empty(shape, dtype=self._dtypes[dtype.name], device=dev)

    def allocator(self, shape: tuple[int, ...], dtype: DType, device: int,
                  inputs: Sequence[tuple[tuple[int, ...], DType]]) -> tuple[int | None, Callable[..., Any]]:
        # From an input (on the call's device, contiguous), the fewer arguments torch parses the
        # better; host µs on the H100 machine: empty_like 2.0, new_empty(shape) 2.8,
        # torch.empty(shape, dtype=, device=) 7.4 (benchmarks/launch_breakdown.py).
        torch, name = self.torch, dtype.name
        for k, (s, d) in enumerate(inputs):
            if s == shape and d.name == name:
                return k, torch.empty_like  # a contiguous input's strides: a contiguous output
        same = next((k for k, (_, d) in enumerate(inputs) if d.name == name), None)
        if same is not None:
            return same, operator.methodcaller("new_empty", shape)
        if inputs:
            return 0, operator.methodcaller("new_empty", shape, dtype=self._dtypes[name])
        return None, functools.partial(torch.empty, shape, dtype=self._dtypes[name], device=self._device(device))

    def _device(self, ordinal: int) -> Any:
        dev = self._devices.get(ordinal)
        if dev is None:
            dev = self._devices[ordinal] = self.torch.device("cuda", ordinal)
        return dev


class CuPyFramework(Framework):
    name = "CuPy"

    def __init__(self) -> None:
        import cupy
        self.cupy = cupy

    def key(self, a: Any) -> Hashable:
        return CuPyFramework, a.shape, a.dtype, a.strides, a.device.id

    def info(self, a: Any) -> ArrayInfo:
        return ArrayInfo(tuple(a.shape), dtype_name(a.dtype), bool(a.flags.c_contiguous), a.device.id, "CuPy")

    def pointer(self, a: Any) -> int:
        return a.data.ptr

    def current_stream(self, device: int) -> int:
        cuda = self.cupy.cuda
        if cuda.runtime.getDevice() == device:
            return cuda.get_current_stream().ptr
        with cuda.Device(device):
            return cuda.get_current_stream().ptr

    def empty(self, shape: tuple[int, ...], dtype: DType, device: int, stream: int | None) -> Any:
        cuda = self.cupy.cuda
        on_stream = cuda.ExternalStream(stream) if stream is not None else contextlib.nullcontext()
        with cuda.Device(device), on_stream:
            return self.cupy.empty(shape, dtype=dtype.numpy)


class ArrayInterfaceFramework(Framework):
    """Any object with ``__cuda_array_interface__`` (Numba, JAX, ...); its device comes from the driver."""

    name = "CUDA array interface"

    def __init__(self, device_of: Callable[[int], int]) -> None:
        self.device_of = device_of  # a pointer's GPU ordinal

    def key(self, a: Any) -> Hashable:
        cai = a.__cuda_array_interface__
        return (ArrayInterfaceFramework, tuple(cai["shape"]), cai["typestr"], cai.get("strides"),
                self.device_of(cai["data"][0]) if cai["data"][0] else -1)

    def info(self, a: Any) -> ArrayInfo:
        cai = a.__cuda_array_interface__
        dt = np.dtype(cai["typestr"])
        shape = tuple(int(s) for s in cai["shape"])
        strides = cai.get("strides")
        contiguous = strides is None or tuple(strides) == _c_strides(shape, dt.itemsize)
        device = self.device_of(cai["data"][0]) if cai["data"][0] else 0
        return ArrayInfo(shape, dtype_name(dt), contiguous, device, self.name)

    def pointer(self, a: Any) -> int:
        return int(a.__cuda_array_interface__["data"][0])

    def empty(self, shape: tuple[int, ...], dtype: DType, device: int, stream: int | None) -> Any:
        raise InputError("polytile cannot allocate arrays for __cuda_array_interface__ objects of other "
                         "frameworks: pass the outputs too, or use torch tensors or CuPy arrays")


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, acc = [], itemsize
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


NUMPY = NumPyFramework()
_BY_TYPE: dict[type, Framework | None] = {}
KEY_OF: dict[type, Callable[[Any], Hashable]] = {}
"""The signature key function of each array type seen so far (what a call's lookup uses)."""


def framework_of(a: object, device_of: Callable[[int], int]) -> Framework | None:
    """The framework of ``a`` (None: not an array polytile takes), found once per type."""
    t = type(a)
    if t in _BY_TYPE:
        return _BY_TYPE[t]
    fw: Framework | None = None
    module = t.__module__.split(".", 1)[0]
    if isinstance(a, np.ndarray):
        fw = NUMPY
    elif module == "torch" and hasattr(a, "data_ptr"):
        fw = _shared(TorchFramework)
    elif module == "cupy" and hasattr(a, "data"):
        fw = _shared(CuPyFramework)
    elif hasattr(a, "__cuda_array_interface__"):
        fw = ArrayInterfaceFramework(device_of)
    register(t, fw)
    return fw


def register(t: type, fw: Framework | None) -> None:
    """Take arrays of type ``t`` through ``fw`` (None: refuse them; tests use a fake GPU framework)."""
    _BY_TYPE[t] = fw
    if fw is not None:
        KEY_OF[t] = fw.key
    else:
        KEY_OF.pop(t, None)


_SHARED: dict[type, Framework] = {}


def _shared(cls: type[Framework]) -> Framework:
    if cls not in _SHARED:
        _SHARED[cls] = cls()
    return _SHARED[cls]


def stream_handle(stream: object) -> int:
    """The CUstream handle of a ``stream=`` argument: an int, a torch stream (``cuda_stream``), a
    CuPy stream (``ptr``) or an object with the ``__cuda_stream__`` protocol."""
    if isinstance(stream, (int, np.integer)) and not isinstance(stream, bool):
        return int(stream)
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)  # type: ignore[attr-defined]
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])  # type: ignore[attr-defined]
    if hasattr(stream, "ptr"):
        return int(stream.ptr)  # type: ignore[attr-defined]
    raise InputError("stream= takes a CUDA stream (an int handle, a torch or CuPy stream), "
                     f"got {type(stream).__name__}")
