"""polytile kernels as torch operators: the call path from torch tensors, and ``torch.library`` custom
ops with a fake (meta) implementation.

``KernelCall`` runs a built kernel on torch tensors: each input goes through its adapter (a view
where the layout allows, else a contiguous copy); on the CPU the tensors are passed as NumPy views
of the same memory (no copy) into outputs that torch allocates; on a GPU the kernel enqueues on
torch's current stream and torch's caching allocator provides the outputs, so calls run inside
CUDA graph capture.

``custom_op(kernel)`` registers a kernel as ``torch.ops.polytile.<name>``: usable in eager mode,
under ``torch.compile`` (the fake implementation gives the output shapes from the Func, symbolic
sizes included) and in CUDA graphs; ``torch.library.opcheck`` passes on it.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import InputError, PolytileError
from ..lang import expr as lx
from ..lang.func import Func

_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                 "float64": torch.float64, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
                 "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool}


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]


def _host_array(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor's memory (bfloat16 through ml_dtypes)."""
    if t.requires_grad:
        t = t.detach()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


class KernelCall:
    """Calls ``kernel`` on torch tensors (see the module docstring). ``adapters`` turn each input into
    the array the kernel takes (default: contiguous); ``out_shapes``, when the kernel's outputs have
    fixed shapes, saves working them out per call; ``out_orders`` gives, per output, the dimensions in
    the order the kernel stores them (the result is that array viewed in its natural order);
    ``stored_shapes``, per output, the shape in that order as which the kernel's array is viewed
    first, where it differs (a product's result written through its epilogue as [B·S][N], returned
    as the [B][S][N] the graph's reshape made of it)."""

    def __init__(self, kernel: Any, adapters: Sequence[Callable[[torch.Tensor], torch.Tensor]] | None = None,
                 out_shapes: Sequence[tuple[int, ...]] | None = None,
                 out_orders: Sequence[tuple[int, ...]] | None = None,
                 stored_shapes: Sequence[tuple[int, ...]] | None = None):
        self.kernel = kernel
        func: Func = kernel.func
        self.func = func
        self.adapters = list(adapters) if adapters is not None else [_contiguous] * len(func.inputs)
        self.out_dtypes = [torch_dtype(t.dtype.name) for t in func.outputs]
        self.out_shapes = list(out_shapes) if out_shapes is not None else None
        self.on_gpu = kernel.target.kind == "cuda"
        self.single = len(func.outputs) == 1
        # outputs written in another order than their dimensions' are returned as permuted views
        inverse = [tuple(sorted(range(len(p)), key=p.__getitem__)) for p in out_orders or ()]
        self.out_views = [inv if inv != tuple(range(len(inv))) else None for inv in inverse] or None
        reshaped = [tuple(r) if out_shapes is None or tuple(r) != tuple(s) else None
                    for r, s in zip(stored_shapes or (), out_shapes or stored_shapes or ())]
        self.reshaped = reshaped if any(r is not None for r in reshaped) else None

    def __call__(self, *tensors: torch.Tensor) -> Any:
        if len(tensors) != len(self.adapters):
            raise InputError(f"{self.func.name} takes {len(self.adapters)} tensor(s), got {len(tensors)}")
        xs = [ad(x) for ad, x in zip(self.adapters, tensors)]
        if self.on_gpu:
            out = self.kernel(*xs)
            outs = [out] if self.single else list(out)
        else:
            outs = self._host_call(xs)
        if self.reshaped is not None:
            outs = [o if r is None else o.view(r) for o, r in zip(outs, self.reshaped)]
        if self.out_views is not None:
            outs = [o if v is None else o.permute(v) for o, v in zip(outs, self.out_views)]
        return outs[0] if self.single else tuple(outs)

    def _host_call(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        for x in xs:
            if x.device.type != "cpu":
                raise InputError(f"{self.func.name} is a CPU kernel; its inputs must be CPU tensors, got {x.device}")
        arrays = [_host_array(x) for x in xs]
        shapes = self.out_shapes or self.kernel.signature(*arrays).shapes[len(arrays):]
        outs = [torch.empty(s, dtype=d) for s, d in zip(shapes, self.out_dtypes)]
        self.kernel(*arrays, *[_host_array(o) for o in outs])
        return outs


def _contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_contiguous() else x.contiguous()


# --- torch.library custom ops -----------------------------------------------------------------------

_REGISTERED: dict[str, Any] = {}


def custom_op(kernel: Any, name: str | None = None) -> Any:
    """Register ``kernel`` (built by ``pt.build``) as the torch operator ``torch.ops.polytile.<name>``
    and return it. Its arguments are the Func's inputs (any layout: non-contiguous tensors are
    copied), its results the Func's outputs (a tensor, or a tuple). ``name`` defaults to the Func's
    name; registering another kernel under a name in use is an error."""
    func = getattr(kernel, "func", None)
    if not isinstance(func, Func) or not callable(kernel):
        raise PolytileError(f"custom_op takes a kernel built by pt.build, got {type(kernel).__name__}")
    name = name or func.name
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise PolytileError(f"custom op name {name!r} is not an identifier")
    if name in _REGISTERED:
        if _REGISTERED[name][0] is kernel:
            return _REGISTERED[name][1]
        raise PolytileError(f"torch.ops.polytile.{name} is registered for another kernel; pass name=...")
    call = KernelCall(kernel)
    args = ", ".join(f"Tensor {t.name}" for t in func.inputs)
    outs = "Tensor" if len(func.outputs) == 1 else "(" + ", ".join("Tensor" for _ in func.outputs) + ")"
    device = "cuda" if kernel.target.kind == "cuda" else "cpu"

    def impl(*tensors: torch.Tensor) -> Any:
        return call(*tensors)

    op = torch.library.custom_op(f"polytile::{name}", impl, mutates_args=(), device_types=device,
                                 schema=f"({args}) -> {outs}")

    def fake(*tensors: torch.Tensor) -> Any:
        shapes = output_shapes(func, [tuple(t.shape) for t in tensors])
        outs = [tensors[0].new_empty(s, dtype=d) for s, d in zip(shapes, call.out_dtypes)]
        return outs[0] if len(outs) == 1 else tuple(outs)

    op.register_fake(fake)
    _REGISTERED[name] = (kernel, op)
    return getattr(torch.ops.polytile, name)


def output_shapes(func: Func, input_shapes: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """The outputs' shapes of ``func`` for inputs of ``input_shapes`` (integers or torch's symbolic
    sizes): each parameter takes its value from the first input dimension that is exactly it."""
    values: dict[str, Any] = {}
    for t, shape in zip(func.inputs, input_shapes):
        if len(shape) != t.ndim:
            raise InputError(f"argument {t.name} of {func.name} must have {t.ndim} dimension(s), got {len(shape)}")
        for d, s in zip(t.shape, shape):
            if isinstance(d, lx.Param) and d.name not in values:
                values[d.name] = s
    return [tuple(_evaluate(d, values, func) for d in t.shape) for t in func.outputs]


_ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod}


def _evaluate(e: lx.Expr, values: dict[str, Any], func: Func) -> Any:
    if isinstance(e, lx.Const):
        return int(e.value)
    if isinstance(e, lx.Param):
        if e.name not in values:
            raise InputError(f"output size {e.name} of {func.name} is fixed by no input dimension")
        return values[e.name]
    if isinstance(e, lx.Cast):
        return _evaluate(e.a, values, func)
    if isinstance(e, lx.BinOp) and e.op in ("+", "-", "*", "//", "%"):
        return _ARITHMETIC[e.op](_evaluate(e.a, values, func), _evaluate(e.b, values, func))
    raise InputError(f"cannot work out the output size {e} of {func.name}")
