"""The importer: a group of aten operations of an FX graph written as one polytile Func.

Every value of the group is a function from its own indices to an expression (``Lowering.value``):
elementwise operations compose expressions, so elementwise chains are inlined into whatever reads
them (a GEMM's epilogue, a reduction's prologue); views (reshape, transpose, permute, expand, slice,
select) map indices; the anchors — matrix products, convolutions and reductions — are computations
(stages) of the Func, read through loads. Each value the rest of the graph needs becomes an output
computed over its own shape.

Group inputs are torch tensors of any layout: an ``InputAdapter`` turns each into a contiguous array
without copying where its strides allow (expanded dimensions narrowed to one element, permuted
layouts permuted back) and the Func reads it through the matching index map. A constant weight of
a product or convolution (``polytile.torch.packing``) is instead passed in the blocked layout the
CPU schedule reads (``PackedWeight``), packed once per compiled graph rather than by every call.

Arithmetic follows torch: 16-bit floating-point values are computed in float32 and rounded where
a value leaves the kernel; products and convolutions sum in ``dtypes.accumulator``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.fx as fx

from .. import dtypes
from ..dtypes import DType
from ..errors import PolytileError
from ..lang import expr as lx
from ..lang.expr import Expr, call, select
from ..lang.func import Func
from ..lang.tensor import ComputeTensor, Placeholder, compute, placeholder, reduce_axis, with_epilogue
from ..lang.tensor import max as pt_max
from ..lang.tensor import min as pt_min
from ..lang.tensor import sum as pt_sum
from .packing import PackedWeight, WeightPacking

aten = torch.ops.aten
Index = tuple[Expr, ...]


class Unsupported(PolytileError):
    """A node polytile does not import (the message is the reason ``explain`` reports)."""


# --- what the importer knows ------------------------------------------------------------------------

def _packet(target: object) -> object:
    return getattr(target, "overloadpacket", target)


_UNARY: dict[object, Callable[[Expr], Expr]] = {
    aten.neg: lambda x: -x, aten.exp: lambda x: call("exp", x), aten.log: lambda x: call("log", x),
    aten.sqrt: lambda x: call("sqrt", x), aten.rsqrt: lambda x: call("rsqrt", x),
    aten.tanh: lambda x: call("tanh", x), aten.sigmoid: lambda x: call("sigmoid", x),
    aten.erf: lambda x: call("erf", x), aten.abs: lambda x: call("abs", x), aten.sin: lambda x: call("sin", x),
    aten.cos: lambda x: call("cos", x), aten.reciprocal: lambda x: 1.0 / x,
    aten.relu: lambda x: call("max", x, 0), aten.silu: lambda x: x * call("sigmoid", x),
    aten.clone: lambda x: x,
    aten.logical_not: lambda x: ~x, aten.bitwise_not: lambda x: ~x, aten.square: lambda x: x * x,
}

_BINARY: dict[object, Callable[[Expr, Expr], Expr]] = {
    aten.mul: lambda a, b: a * b, aten.div: lambda a, b: a / b, aten.maximum: lambda a, b: call("max", a, b),
    aten.minimum: lambda a, b: call("min", a, b), aten.eq: lambda a, b: a == b, aten.ne: lambda a, b: a != b,
    aten.lt: lambda a, b: a < b, aten.le: lambda a, b: a <= b, aten.gt: lambda a, b: a > b,
    aten.ge: lambda a, b: a >= b, aten.logical_and: lambda a, b: a & b, aten.logical_or: lambda a, b: a | b,
    aten.bitwise_and: lambda a, b: a & b, aten.bitwise_or: lambda a, b: a | b,  # on booleans (else refused)
}

ELEMENTWISE = {*_UNARY, *_BINARY, aten.add, aten.sub, aten.rsub, aten.pow, aten.gelu, aten.clamp,
               aten.clamp_min, aten.clamp_max, aten.hardtanh, aten.where, aten._to_copy,
               torch.ops.prims.convert_element_type, aten.masked_fill, aten._native_batch_norm_legit_no_training}
VIEWS = {aten.view, aten._unsafe_view, aten.reshape, aten.t, aten.transpose, aten.permute, aten.expand,
         aten.unsqueeze, aten.squeeze, aten.slice, aten.select, aten.alias, aten.detach}
GEMMS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm}
CONVS = {aten.convolution}
REDUCTIONS = {aten.sum, aten.mean, aten.amax, aten.amin, aten._softmax, aten._safe_softmax, aten.native_layer_norm}

FLOAT_TYPES = {"float16", "bfloat16", "float32", "float64"}


def node_kind(node: fx.Node) -> str:
    """"gemm", "conv", "reduce", "elementwise", "view", "getitem" or "other" (left to torch)."""
    if node.op != "call_function":
        return "other"
    if node.target is __import__("operator").getitem:
        return "getitem"
    p = _packet(node.target)
    for kind, ops in (("gemm", GEMMS), ("conv", CONVS), ("reduce", REDUCTIONS), ("elementwise", ELEMENTWISE),
                      ("view", VIEWS)):
        if p in ops:
            return kind
    return "other"


def meta(node: object) -> torch.Tensor:
    """The fake tensor an FX node stands for (its shape, dtype, strides and device; for an operation with
    several results, its first)."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if isinstance(val, (tuple, list)) and val:
        val = val[0]
    if not isinstance(val, torch.Tensor):
        raise Unsupported(f"{_name(node)} has no tensor metadata")
    return val


def _name(node: object) -> str:
    if isinstance(node, fx.Node):
        return f"{node.name} ({_packet(node.target) if node.op == 'call_function' else node.op})"
    return repr(node)


def static_shape(t: torch.Tensor, who: str) -> tuple[int, ...]:
    """The shape of ``t`` as integers; a symbolic (dynamic) size is refused with the reason."""
    shape = []
    for s in t.shape:
        if not isinstance(s, int):
            raise Unsupported(f"{who} has a dynamic size {s}: polytile compiles static shapes "
                              "(compile with dynamic=False, or mark the dimension static)")
        shape.append(s)
    return tuple(shape)


def pt_dtype(dt: torch.dtype, who: str) -> DType:
    name = str(dt).removeprefix("torch.")
    try:
        return dtypes.as_dtype("bool" if name == "bool" else name)
    except PolytileError:
        raise Unsupported(f"{who} has dtype {name}, which polytile does not compile") from None


def compute_type(d: DType) -> DType:
    """The type a value of ``d`` is computed in: float32 for 16-bit floats, else ``d``."""
    return dtypes.float32 if d.is_float and d.bits == 16 else d


def check_node(node: fx.Node, target_kind: str) -> None:
    """Refuse what the importer cannot write for ``target_kind``: dynamic shapes, dtypes polytile
    lacks (and bfloat16 on the CPU, which NumPy cannot pass), operations on other devices, and
    argument forms outside the supported ones. Raises ``Unsupported`` with the reason."""
    vals = node.meta.get("val")
    outs = vals if isinstance(vals, (tuple, list)) else [vals]
    for v in [*outs, *(a.meta.get("val") for a in node.all_input_nodes)]:
        if isinstance(v, torch.Tensor):
            static_shape(v, _name(node))
            d = pt_dtype(v.dtype, _name(node))
            if target_kind == "cpu" and d.name == "bfloat16":
                raise Unsupported(f"{_name(node)} is bfloat16, which polytile's CPU kernels do not take "
                                  "(use float32 or float16 on the CPU)")
            if (v.device.type == "cuda") != (target_kind == "cuda"):
                raise Unsupported(f"{_name(node)} runs on {v.device}, not on the {target_kind} target")
    p = _packet(node.target)
    args, kw = node.args, node.kwargs
    if p in (aten.div,) and kw.get("rounding_mode") is not None:
        raise Unsupported(f"{_name(node)}: division with rounding_mode={kw['rounding_mode']}")
    if p is aten._to_copy and (kw.get("device") not in (None, meta(node).device) or kw.get("layout") is not None):
        raise Unsupported(f"{_name(node)}: a copy to another device or layout")
    if p is aten.convolution:
        _, w, _, stride, padding, dilation, transposed, _, groups = args
        if len(stride) != 2 or transposed or groups != 1 or len(set(stride)) != 1 or len(set(padding)) != 1 \
                or len(set(dilation)) != 1:
            raise Unsupported(f"{_name(node)}: only 2-D, ungrouped, untransposed convolutions with equal "
                              "strides, paddings and dilations along H and W are imported")
    if p in (aten._softmax, aten._safe_softmax) and _dim(args[1], meta(args[0]).ndim) != meta(args[0]).ndim - 1:
        raise Unsupported(f"{_name(node)}: softmax over a dimension other than the last")
    if p in (aten.sum, aten.mean, aten.amax, aten.amin):
        x = meta(args[0])
        dims = _reduced_dims(node)
        if not dims or dims != list(range(x.ndim - len(dims), x.ndim)):
            raise Unsupported(f"{_name(node)}: reductions over the trailing dimensions only")
        if p is aten.sum and len(args) < 2:
            raise Unsupported(f"{_name(node)}: a full reduction to a scalar")
    if p is aten.gelu and kw.get("approximate", "none") not in ("none", "tanh"):
        raise Unsupported(f"{_name(node)}: gelu approximation {kw['approximate']!r}")
    if p in GEMMS:
        a, b = (args[1], args[2]) if p in (aten.addmm, aten.baddbmm) else (args[0], args[1])
        if meta(a).dtype != meta(b).dtype:
            raise Unsupported(f"{_name(node)}: operands of different dtypes")
        if not pt_dtype(meta(a).dtype, _name(node)).is_float:
            raise Unsupported(f"{_name(node)}: integer matrix products are left to torch")


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def _reduced_dims(node: fx.Node) -> list[int]:
    x = meta(node.args[0])
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", list(range(x.ndim)))
    dims = [dims] if isinstance(dims, int) else list(dims or range(x.ndim))
    return sorted(_dim(d, x.ndim) for d in dims)


# --- input layouts ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class InputAdapter:
    """How a group input (a torch tensor of shape ``shape``) is passed to the kernel: dimensions in
    ``narrowed`` (expanded: stride 0) are cut to one element, the rest permuted by ``perm`` (to the
    order of decreasing strides), then made contiguous when they are not (a copy only when the
    strides are not those of a permuted dense array). With ``merged`` (a position in the permuted
    order), that dimension and the next one are one dimension of the kernel's array (a view: they
    are dense): a batched product's operand whose batch lies inside a row (attention's heads, split
    from the model's width) is a matrix whose columns hold the batches one after the other."""

    shape: tuple[int, ...]
    narrowed: tuple[int, ...]
    perm: tuple[int, ...]
    merged: int | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.shape:  # a single value: an array of one element (polytile has no rank-0 arrays)
            return x.reshape(1)
        if self.narrowed or self.perm != tuple(range(len(self.perm))):
            for d in self.narrowed:
                x = x.narrow(d, 0, 1)
            x = x.permute(self.perm)
        x = x if x.is_contiguous() else x.contiguous()
        return x if self.merged is None else x.reshape(self.kernel_shape)

    @property
    def kernel_shape(self) -> tuple[int, ...]:
        dims = [1 if d in self.narrowed else self.shape[d] for d in self.perm]
        if self.merged is not None:
            m = self.merged
            dims[m:m + 2] = [dims[m] * dims[m + 1]]
        return tuple(dims) or (1,)

    def index(self, idx: Index) -> Index:
        """The kernel array's index of element ``idx`` of the tensor."""
        if not self.shape:
            return (lx.Const(0, dtypes.INDEX),)
        out = [lx.Const(0, dtypes.INDEX) if d in self.narrowed else idx[d] for d in self.perm]
        if self.merged is not None:
            m = self.merged
            out[m:m + 2] = [out[m] * self.shape[self.perm[m + 1]] + out[m + 1]]
        return tuple(out)

    @staticmethod
    def of(t: torch.Tensor, permute: bool = True) -> InputAdapter:
        shape, strides = tuple(t.shape), tuple(t.stride())
        narrowed = tuple(d for d, (n, s) in enumerate(zip(shape, strides)) if s == 0 and n > 1)
        identity = tuple(range(len(shape)))
        if not permute:
            return InputAdapter(shape, narrowed, identity)
        perm = _stride_order(shape, strides, narrowed)
        if perm != identity and not _dense(tuple(shape[d] for d in perm), tuple(strides[d] for d in perm), narrowed,
                                           perm):
            perm = identity  # not a permuted dense array: copied in its own order
        return InputAdapter(shape, narrowed, perm)


def product_operand(t: torch.Tensor, role: str) -> InputAdapter:
    """How operand ``role`` ("A" or "B") of a matrix product is passed: in its storage order where the
    GEMM kernels read it that way — A with k contiguous, B with n or k contiguous (transposed), a
    batch outermost or inside the rows (merged with the next dimension: attention's heads split from
    the model's width, [tokens][heads · head size]) — else copied row-major."""
    ad = InputAdapter.of(t)
    n = t.ndim
    if n == 3 and not ad.narrowed and ad.perm[0] != 0 and ad.perm[1] == 0:
        ad = replace(ad, merged=1)
    contiguous = ad.perm[-1] == n - 1 or (role == "B" and ad.perm[-1] == n - 2)
    if not contiguous or (n == 3 and ad.perm[0] != 0 and ad.merged is None):
        return InputAdapter.of(t, permute=False)
    return ad


def _stride_order(shape: tuple[int, ...], strides: tuple[int, ...], fixed: tuple[int, ...]) -> tuple[int, ...]:
    """The dimensions by decreasing stride; dimensions of one element and those in ``fixed`` keep their
    places (their strides mean nothing)."""
    movable = [d for d in range(len(shape)) if d not in fixed and shape[d] > 1]
    ranked = iter(sorted(movable, key=lambda d: (-strides[d], d)))
    return tuple(next(ranked) if d in movable else d for d in range(len(shape)))


def storage_order(t: torch.Tensor) -> tuple[int, ...]:
    """The dimensions of ``t`` from the largest stride to the smallest when its strides are those of a
    permuted dense array (an output is then written in that order, so torch sees the strides it
    expects: views of it stay views); the natural order otherwise."""
    identity = tuple(range(t.ndim))
    shape, strides = tuple(t.shape), tuple(t.stride())
    perm = _stride_order(shape, strides, ())
    if perm == identity or not _dense(tuple(shape[d] for d in perm), tuple(strides[d] for d in perm), (), perm):
        return identity
    return perm


def _dense(shape: tuple[int, ...], strides: tuple[int, ...], narrowed: tuple[int, ...],
           perm: tuple[int, ...]) -> bool:
    expected = 1
    for d in reversed(range(len(shape))):
        if perm[d] in narrowed or shape[d] == 1:
            continue
        if strides[d] != expected:
            return False
        expected *= shape[d]
    return True


# --- the lowering of one group -----------------------------------------------------------------------

@dataclass
class Stage:
    """An anchor computation of the Func and what its schedule needs to know about it."""

    kind: str  # "gemm", "conv", "reduce" or "partial" (a reduction's vector partial results)
    tensor: ComputeTensor
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Imported:
    """A group written as a Func: its inputs (graph nodes and how each is passed) and its outputs
    (graph nodes, each computed over its own shape, and their torch dtypes)."""

    func: Func
    kind: str  # "gemm", "conv", "reduce" or "elementwise"
    inputs: list[fx.Node]
    adapters: list[InputAdapter | PackedWeight]  # a constant weight packed once: PackedWeight
    outputs: list[fx.Node]
    out_dtypes: list[torch.dtype]
    out_orders: list[tuple[int, ...]]  # each output's dimensions in storage order (``storage_order``)


class Lowering:
    """Writes the nodes of one group as expressions and stages (see the module docstring)."""

    def __init__(self, nodes: Sequence[fx.Node], name: str, lanes: int | None = None,
                 packing: WeightPacking | None = None):
        self.lanes = lanes  # CPU vector lanes: row reductions go through vector partial results
        self.packing = packing  # constant weights passed packed (CPU)
        self.nodes = list(nodes)
        self.members = set(self.nodes)
        self.name = name
        self.inputs: dict[fx.Node, tuple[Placeholder, InputAdapter | PackedWeight]] = {}
        self.stages: dict[fx.Node, Any] = {}
        self.stage_list: list[Stage] = []
        self._axes = 0

    # values --------------------------------------------------------------------------------------------
    def value(self, node: object, idx: Index) -> Expr:
        """The value of ``node`` at index ``idx`` (of the node's own shape), in its compute type."""
        if not isinstance(node, fx.Node):
            raise Unsupported(f"a non-tensor operand {node!r} where a tensor was expected")
        if node not in self.members:
            ph, adapter = self.input(node)
            return _cast(ph[adapter.index(idx)], compute_type(ph.dtype))
        kind = node_kind(node)
        if kind == "view":
            return self.value(node.args[0], self._view_index(node, idx))
        if kind == "getitem":
            return self._getitem(node, idx)
        if kind == "elementwise":
            return self._elementwise(node, idx)
        if kind == "gemm":
            return self._gemm(node, idx)
        if kind == "conv":
            return self._conv(node, idx)
        if kind == "reduce":
            return self._reduce(node, idx)
        raise Unsupported(f"{_name(node)} is not imported")

    def input(self, node: fx.Node, permute: bool = True, adapter: InputAdapter | PackedWeight | None = None
              ) -> tuple[Placeholder, InputAdapter | PackedWeight]:
        """The kernel array of group input ``node`` and how it is passed (``adapter``, else in its storage
        order with ``permute``, as given otherwise); the first use decides."""
        if node not in self.inputs:
            t = meta(node)
            adapter = adapter or InputAdapter.of(t, permute)
            ph = placeholder(adapter.kernel_shape, pt_dtype(t.dtype, _name(node)), f"in{len(self.inputs)}")
            self.inputs[node] = (ph, adapter)
        return self.inputs[node]

    def operand(self, x: object, idx: Index, like: DType) -> Expr:
        """An operand of an elementwise operation at ``idx`` of the result (broadcast as torch does):
        a tensor's value, or a Python number typed like the result."""
        if isinstance(x, fx.Node):
            shape = meta(x).shape
            lead = len(idx) - len(shape)
            sub = tuple(lx.Const(0, dtypes.INDEX) if n == 1 else idx[lead + d] for d, n in enumerate(shape))
            return _cast(self.value(x, sub), like)
        if isinstance(x, (bool, int, float)):
            return lx.Const(x, like) if not isinstance(x, bool) or like.is_bool else lx.Const(int(x), like)
        raise Unsupported(f"operand {x!r} of type {type(x).__name__}")

    def _elementwise(self, node: fx.Node, idx: Index) -> Expr:
        p = _packet(node.target)
        ct = compute_type(pt_dtype(meta(node).dtype, _name(node)))
        a = node.args
        # operands are computed in the result's type, except for comparisons and selections
        op_ct = self._operand_type(node) if p in (aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge,
                                                  aten.where, aten.masked_fill) else ct
        if p in (aten.bitwise_and, aten.bitwise_or, aten.bitwise_not) and not ct.is_bool:
            raise Unsupported(f"{_name(node)}: bitwise operations on integers are left to torch")
        x = lambda k, like=op_ct: self.operand(a[k], idx, like)  # noqa: E731
        if p in _UNARY:
            return _cast(_UNARY[p](x(0)), ct)
        if p in _BINARY:
            return _cast(_BINARY[p](x(0), x(1)), ct)
        alpha = node.kwargs.get("alpha", 1)
        if p is aten.add:
            return x(0) + (x(1) if alpha == 1 else x(1) * alpha)
        if p is aten.sub:
            return x(0) - (x(1) if alpha == 1 else x(1) * alpha)
        if p is aten.rsub:
            return x(1) - (x(0) if alpha == 1 else x(0) * alpha)
        if p is aten.pow:
            return _pow(x(0), a[1]) if not isinstance(a[1], fx.Node) else call("pow", x(0), x(1))
        if p is aten.gelu:
            return _gelu(x(0), node.kwargs.get("approximate", "none"))
        if p in (aten.clamp, aten.hardtanh, aten.clamp_min, aten.clamp_max):
            lo = a[1] if p is not aten.clamp_max and len(a) > 1 else None
            hi = a[2] if p in (aten.clamp, aten.hardtanh) and len(a) > 2 else (a[1] if p is aten.clamp_max else None)
            v = x(0)
            if lo is not None:
                v = call("max", v, self.operand(lo, idx, ct))
            if hi is not None:
                v = call("min", v, self.operand(hi, idx, ct))
            return v
        if p is aten.where:
            return _cast(select(self.operand(a[0], idx, dtypes.bool_), x(1), x(2)), ct)
        if p is aten.masked_fill:
            return _cast(select(self.operand(a[1], idx, dtypes.bool_), self.operand(a[2], idx, ct), x(0)), ct)
        if p in (aten._to_copy, torch.ops.prims.convert_element_type):
            src = self.value(a[0], idx)
            return _cast(_cast(src, pt_dtype(meta(node).dtype, _name(node))), ct)  # rounds to a 16-bit type
        if p is aten._native_batch_norm_legit_no_training:
            raise Unsupported(f"{_name(node)} is read through its first result only")
        raise Unsupported(f"{_name(node)} is not imported")

    def _operand_type(self, node: fx.Node) -> DType:
        types = [compute_type(pt_dtype(meta(x).dtype, _name(x))) for x in node.args if isinstance(x, fx.Node)
                 and not meta(x).dtype == torch.bool]
        out = types[0] if types else dtypes.float32
        for t in types[1:]:
            out = dtypes.promote(out, t)
        return out

    def _getitem(self, node: fx.Node, idx: Index) -> Expr:
        src, k = node.args
        p = _packet(src.target) if isinstance(src, fx.Node) and src.op == "call_function" else None
        if k != 0 or src not in self.members:
            raise Unsupported(f"{_name(node)}: only the first result of {_name(src)} is imported")
        if p is aten.native_layer_norm:
            return self._layer_norm(src, idx)
        if p is aten._native_batch_norm_legit_no_training:
            return self._batch_norm(src, idx)
        raise Unsupported(f"{_name(node)} reads a result of {_name(src)}")

    def _batch_norm(self, node: fx.Node, idx: Index) -> Expr:
        x, w, b, mean, var, _momentum, eps = node.args
        ct = compute_type(pt_dtype(meta(x).dtype, _name(node)))
        c = (idx[1],)
        v = (self.value(x, idx) - self.value(mean, c)) * call("rsqrt", self.value(var, c) + eps)
        if w is not None:
            v = v * _cast(self.value(w, c), ct)
        if b is not None:
            v = v + _cast(self.value(b, c), ct)
        return _cast(v, ct)

    # views ---------------------------------------------------------------------------------------------
    def _view_index(self, node: fx.Node, idx: Index) -> Index:
        p = _packet(node.target)
        src = meta(node.args[0])
        src_shape = tuple(src.shape)
        out_shape = tuple(meta(node).shape)
        if p in (aten.view, aten._unsafe_view, aten.reshape, aten.squeeze, aten.unsqueeze):
            return reshape_index(idx, out_shape, src_shape)
        if p in (aten.alias, aten.detach):
            return idx
        if p is aten.t:
            return idx[::-1]
        if p is aten.transpose:
            d0, d1 = (_dim(d, len(out_shape)) for d in node.args[1:3])
            out = list(idx)
            out[d0], out[d1] = idx[d1], idx[d0]
            return tuple(out)
        if p is aten.permute:
            perm = [_dim(d, len(out_shape)) for d in node.args[1]]
            out = [idx[0]] * len(perm)
            for k, d in enumerate(perm):
                out[d] = idx[k]
            return tuple(out)
        if p is aten.expand:
            lead = len(out_shape) - len(src_shape)
            return tuple(lx.Const(0, dtypes.INDEX) if n == 1 else idx[lead + d] for d, n in enumerate(src_shape))
        if p is aten.slice:
            d = _dim(node.args[1] if len(node.args) > 1 else 0, len(out_shape))
            start = node.args[2] if len(node.args) > 2 and node.args[2] is not None else 0
            step = node.args[4] if len(node.args) > 4 else 1
            start = max(0, min(start + src_shape[d] if start < 0 else start, src_shape[d]))
            out = list(idx)
            out[d] = idx[d] * step + start if step != 1 else idx[d] + start
            return tuple(out)
        if p is aten.select:
            d = _dim(node.args[1], len(src_shape))
            k = node.args[2] + src_shape[d] if node.args[2] < 0 else node.args[2]
            return (*idx[:d], lx.Const(k, dtypes.INDEX), *idx[d:])
        raise Unsupported(f"{_name(node)} is not imported")

    # anchors -------------------------------------------------------------------------------------------
    def _gemm(self, node: fx.Node, idx: Index) -> Expr:
        p = _packet(node.target)
        if node not in self.stages:
            a, b = (node.args[1], node.args[2]) if p in (aten.addmm, aten.baddbmm) else (node.args[0], node.args[1])
            self.stages[node] = self._product(node, a, b)
        C = self.stages[node]
        v = C[idx]
        if p in (aten.addmm, aten.baddbmm):
            beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
            v = (v if alpha == 1 else v * alpha) + (self.operand(node.args[0], idx, C.dtype) *
                                                    (1 if beta == 1 else beta))
        return _cast(v, compute_type(pt_dtype(meta(node).dtype, _name(node))))

    def _product(self, node: fx.Node, a: fx.Node, b: fx.Node) -> ComputeTensor:
        from ..ops.matmul import dot_form_fits, product
        from ..ops.norm import lanewise_row_reduce
        if a in self.members or b in self.members or a is b:
            raise Unsupported(f"{_name(node)}: operands computed in the same kernel")
        A, ad = self.input(a, adapter=product_operand(meta(a), "A"))
        batched = meta(node).ndim == 3
        shape = tuple(meta(node).shape)
        K = meta(a).shape[-1]
        stored = self.inputs[b][1] if b in self.inputs else product_operand(meta(b), "B")
        n = len(stored.shape)
        # k contiguous: B stored [n][k] (a linear layer's weight)
        b_transposed = isinstance(stored, InputAdapter) and stored.perm[-1] == n - 2
        # a linear layer's few rows (B transposed, on the CPU): dot products over K in vector lanes
        dot = bool(self.lanes) and b_transposed and not batched and dot_form_fits(shape[-2], K, self.lanes or 0)
        # a constant B (a weight) of the packed form: passed as the schedule's panels, packed once
        block = stored.block if isinstance(stored, PackedWeight) else None
        if self.packing is not None and not batched and not dot and b not in self.inputs and not stored.narrowed:
            block = self.packing.product_block(b, shape[-2], shape[-1], K)
        B, bd = self.input(b, adapter=PackedWeight(tuple(meta(b).shape), 1, block) if block else stored)
        if ad.perm[-1] != n - 1 or (isinstance(bd, InputAdapter) and bd.perm[-1] not in (n - 1, n - 2)):
            raise Unsupported(f"{_name(node)}: an operand is also read elsewhere in the group in a layout the product "
                              "does not read (A with k contiguous, B with k or n contiguous)")
        A.name, B.name = "A", "B"
        k = reduce_axis(K, "k")
        dt = A.dtype
        if batched:
            C = compute(shape, lambda bb, i, j: pt_sum(product(A[ad.index((bb, i, k))], B[bd.index((bb, k, j))], dt),
                                                      axis=k), "C")
        elif dot:
            C = lanewise_row_reduce(shape[-2], K, self.lanes or 0, lambda i, j, kk: product(
                A[ad.index((i, kk))], B[bd.index((kk, j))], dt), "sum", "C", cols=shape[-1])
        else:
            C = compute(shape, lambda i, j: pt_sum(product(A[ad.index((i, k))], B[bd.index((k, j))], dt), axis=k),
                        "C")
        info = {"M": shape[-2], "N": shape[-1], "K": K, "batch": shape[0] if batched else None,
                "b_transposed": b_transposed, "dot": dot, "b_block": block or 0,
                "a_broadcast": bool(ad.narrowed), "b_broadcast": isinstance(bd, InputAdapter) and bool(bd.narrowed)}
        self.stage_list.append(Stage("gemm", C, info))
        return C

    def _conv(self, node: fx.Node, idx: Index) -> Expr:
        from ..ops.conv import conv2d_func, conv_out
        from .layouts import weight_source
        x, w, bias, stride, padding, dilation = node.args[:6]
        w = weight_source(w)  # polytile's convolutions read the filters NCHW, not a channels-last copy
        if node not in self.stages:
            if x in self.members or w in self.members:
                raise Unsupported(f"{_name(node)}: operands computed in the same kernel")
            N, C, H, W = static_shape(meta(x), _name(x))
            K, _, R, S = static_shape(meta(w), _name(w))
            for n in (x, w):
                if InputAdapter.of(meta(n), permute=False).narrowed:
                    raise Unsupported(f"{_name(node)}: a broadcast convolution operand")
            Q = conv_out(W, S, stride[0], padding[0], dilation[0])
            # a constant weight (the model's) is passed in the schedule's blocks of filters, packed once
            block = (self.packing.conv_block(w, K, Q, R * S, stride[0])
                     if self.packing is not None and w not in self.inputs else None)
            func = conv2d_func(N, C, H, W, K, R, S, stride=stride[0], padding=padding[0], dilation=dilation[0],
                               dtype=pt_dtype(meta(x).dtype, _name(x)).name, pad_stage=True, weight_block=block)
            I, Wt = func.inputs
            self.inputs[x] = (I, InputAdapter.of(meta(x), permute=False))
            self.inputs[w] = (Wt, PackedWeight(tuple(meta(w).shape), 0, block) if block
                              else InputAdapter.of(meta(w), permute=False))
            O = func.outputs[0]
            self.stages[node] = O
            shape: dict[str, Any] = {"N": N, "C": C, "H": H, "W": W, "K": K, "R": R, "S": S, "stride": stride[0],
                                     "padding": padding[0], "dilation": dilation[0]}
            if O.narrowed:  # as ops.conv2d describes it
                shape["out_dtype"] = O.dtype.name
            self.stage_list.append(Stage("conv", O, {**shape, "has_pad": padding[0] > 0, "w_block": block or 0}))
        O = self.stages[node]
        v = O[idx]
        if bias is not None:
            v = v + _cast(self.value(bias, (idx[1],)), O.dtype)
        return _cast(v, compute_type(pt_dtype(meta(node).dtype, _name(node))))

    def _reduce(self, node: fx.Node, idx: Index) -> Expr:
        p = _packet(node.target)
        x = node.args[0]
        if p in (aten._softmax, aten._safe_softmax):
            mx, sm = self._softmax_stats(node)
            rows = idx[:-1]
            e = call("exp", self.value(x, idx) - mx[rows]) / sm[rows]
            if p is aten._safe_softmax:  # a row of -inf only (fully masked) gives zeros, not NaN
                e = select(mx[rows] == lx.Const(-math.inf, mx.dtype), lx.Const(0.0, e.dtype), e)
            return _cast(e, compute_type(pt_dtype(meta(node).dtype, _name(node))))
        if p is aten.native_layer_norm:
            raise Unsupported(f"{_name(node)} is read through its first result only")
        dims = _reduced_dims(node)
        keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        if node not in self.stages:
            op = {aten.sum: "sum", aten.mean: "sum", aten.amax: "max", aten.amin: "min"}[p]
            st = self._row_stage(x, len(dims), op, lambda v, rows, red: v, f"r{len(self.stage_list)}")
            if p is aten.mean:
                st = (st, 1.0 / math.prod(meta(x).shape[d] for d in dims))
            self.stages[node] = st
        st = self.stages[node]
        scale = None
        if isinstance(st, tuple):
            st, scale = st
        rows = idx[:len(idx) - len(dims)] if keep else idx
        v = st[rows]
        if scale is not None:
            v = v * scale
        return _cast(v, compute_type(pt_dtype(meta(node).dtype, _name(node))))

    def _row_stage(self, x: fx.Node, nred: int, op: str, body: Callable[[Expr, Index, Index], Expr],
                   name: str) -> ComputeTensor:
        """A reduction (``op``) over the trailing ``nred`` dimensions of ``x``: one value per row."""
        shape = tuple(meta(x).shape)
        rows_shape, red_shape = shape[:len(shape) - nred], shape[len(shape) - nred:]
        if not rows_shape:
            raise Unsupported(f"a reduction of {_name(x)} to a single value is left to torch")
        reducer = {"sum": pt_sum, "max": pt_max, "min": pt_min}[op]
        info: dict[str, Any] = {"rows": tuple(rows_shape), "cols": tuple(red_shape)}
        lanes = self.lanes
        if lanes and nred == 1 and red_shape[0] >= 2 * lanes:
            # vector partial results first (lane l sums columns l, l + lanes, ...), then the lanes: a
            # row reduces at vector speed instead of one dependent addition per column
            n = red_shape[0]
            c = reduce_axis(-(-n // lanes), f"{name}_c")

            def part(*rl: Expr) -> Expr:
                rows, col = rl[:-1], c * lanes + rl[-1]
                v = body(self.value(x, (*rows, col)), rows, (col,))
                if n % lanes:
                    v = select(col < n, v, lx.reduce_identity(op, v.dtype))
                return reducer(v, axis=c)

            P = compute((*rows_shape, lanes), part, f"{name}_part")
            self.stage_list.append(Stage("partial", P, {"rows": tuple(rows_shape), "cols": tuple(red_shape)}))
            lane = reduce_axis(lanes, f"{name}_l")
            T = compute(rows_shape, lambda *rows: reducer(P[(*rows, lane)], axis=lane), name)
            info["partial"] = P.name
        else:
            axes = [reduce_axis(n, f"{name}_k{d}") for d, n in enumerate(red_shape)]

            def fn(*rows: Expr) -> Expr:
                return reducer(body(self.value(x, (*rows, *axes)), rows, tuple(axes)), axis=axes)

            T = compute(rows_shape, fn, name)
        self.stage_list.append(Stage("reduce", T, info))
        return T

    def _softmax_stats(self, node: fx.Node) -> tuple[ComputeTensor, ComputeTensor]:
        if node not in self.stages:
            x = node.args[0]
            base = f"r{len(self.stage_list)}"
            mx = self._row_stage(x, 1, "max", lambda v, rows, red: v, f"{base}_max")
            sm = self._row_stage(x, 1, "sum", lambda v, rows, red: call("exp", v - mx[rows]), f"{base}_sum")
            self.stages[node] = (mx, sm)
        return self.stages[node]

    def _layer_norm(self, node: fx.Node, idx: Index) -> Expr:
        x, normalized, w, b, eps = node.args
        nred = len(normalized)
        if node not in self.stages:
            base = f"r{len(self.stage_list)}"
            inv = 1.0 / math.prod(normalized)
            mean = self._row_stage(x, nred, "sum", lambda v, rows, red: v * inv, f"{base}_mean")
            var = self._row_stage(x, nred, "sum", lambda v, rows, red: _sq(v - mean[rows]) * inv, f"{base}_var")
            self.stages[node] = (mean, var)
        mean, var = self.stages[node]
        rows, cols = idx[:len(idx) - nred], idx[len(idx) - nred:]
        ct = mean.dtype
        v = (self.value(x, idx) - mean[rows]) * call("rsqrt", var[rows] + lx.Const(float(eps), ct))
        if w is not None:
            v = v * _cast(self.value(w, cols), ct)
        if b is not None:
            v = v + _cast(self.value(b, cols), ct)
        return _cast(v, compute_type(pt_dtype(meta(x).dtype, _name(node))))


def _sq(v: Expr) -> Expr:
    return v * v


def _cast(e: Expr, d: DType) -> Expr:
    return e if e.dtype == d else lx.cast(d, e)


def _pow(x: Expr, p: object) -> Expr:
    if p == 2:
        return x * x
    if p == 3:
        return x * x * x
    if p == 0.5:
        return call("sqrt", x)
    if p == -0.5:
        return call("rsqrt", x)
    if p == 1:
        return x
    return call("pow", x, lx.Const(float(p), x.dtype))


def _gelu(x: Expr, approximate: str) -> Expr:
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
        return x * 0.5 * (call("tanh", inner) + 1.0)
    return x * 0.5 * (call("erf", x * (1.0 / math.sqrt(2.0))) + 1.0)


def reshape_index(idx: Index, out_shape: Sequence[int], src_shape: Sequence[int]) -> Index:
    """The index into a ``src_shape`` array of element ``idx`` of its reshape to ``out_shape``, written
    group by group (dimensions whose products agree), so that merges stay affine and splits use one
    division and remainder."""
    out: list[Expr] = []
    i = j = 0
    n_out, n_src = len(out_shape), len(src_shape)
    while i < n_out or j < n_src:
        gi, gj = [i], [j]
        po = out_shape[i] if i < n_out else 1
        ps = src_shape[j] if j < n_src else 1
        i, j = i + 1, j + 1
        while po != ps:
            if po < ps:
                po *= out_shape[i]
                gi.append(i)
                i += 1
            else:
                ps *= src_shape[j]
                gj.append(j)
                j += 1
        gi = [d for d in gi if d < n_out]
        gj = [d for d in gj if d < n_src]
        flat: Expr = lx.Const(0, dtypes.INDEX)
        for d in gi:
            flat = idx[d] if _is_zero(flat) else flat * out_shape[d] + idx[d]
        stride = 1
        strides = []
        for d in reversed(gj):
            strides.append(stride)
            stride *= src_shape[d]
        strides.reverse()
        for k, d in enumerate(gj):
            v = flat
            if strides[k] != 1:
                v = v // strides[k]
            if k > 0 and src_shape[d] != 1:
                v = v % src_shape[d]
            out.append(lx.Const(0, dtypes.INDEX) if src_shape[d] == 1 else v)
    return tuple(out)


def _is_zero(e: Expr) -> bool:
    return isinstance(e, lx.Const) and e.value == 0


def import_group(nodes: Sequence[fx.Node], outputs: Sequence[fx.Node], kind: str, lanes: int | None = None,
                 fuse_epilogue: bool = False, packing: WeightPacking | None = None) -> Imported:
    """Write ``nodes`` (a group, in graph order) as a Func computing ``outputs``; the Func carries its
    ``GroupInfo`` as ``func.torch_group``. ``lanes``: the CPU's vector lanes (row reductions are then
    written as vector partial results and their sum). ``fuse_epilogue``: a product's epilogue that
    reads the product element by element in place becomes the product's own epilogue, applied as
    its sums are written back (``product_epilogue``; a convolution's too, on the CPU). ``packing``:
    the constant weights of products and convolutions are passed packed (``polytile.torch.packing``;
    CPU). Raises ``Unsupported`` (or another ``PolytileError``) when the group cannot be written."""
    from .schedules import GroupInfo, StageInfo
    low = Lowering(nodes, f"torch_{kind}", lanes, packing)
    out_tensors: list[ComputeTensor] = []
    out_dtypes: list[torch.dtype] = []
    out_perms: list[tuple[int, ...]] = []
    for k, node in enumerate(outputs):
        t = meta(node)
        d = pt_dtype(t.dtype, _name(node))
        shape = static_shape(t, _name(node))
        if not shape:
            raise Unsupported(f"{_name(node)} is a single value; left to torch")
        perm = storage_order(t)

        def body(*kidx: Expr, node: fx.Node = node, d: DType = d, perm: tuple[int, ...] = perm) -> Expr:
            idx: list[Expr] = list(kidx)
            for pos, dim in enumerate(perm):
                idx[dim] = kidx[pos]
            return _cast(low.value(node, tuple(idx)), d)

        stage = compute(tuple(shape[dim] for dim in perm), body, f"out{k}")
        reused = _reused_stage(stage, low.stage_list)
        out_tensors.append(reused if reused is not None and reused not in out_tensors else stage)
        out_dtypes.append(t.dtype)
        out_perms.append(perm)
    # a convolution's epilogue in its write-back on the CPU (lanes given); the GPU convolutions'
    # schedules (ops.gpu_schedules) store the sums as they are
    if fuse_epilogue and (kind == "gemm" or (kind == "conv" and lanes is not None)):
        out_tensors = product_epilogue(low, list(outputs), out_tensors)
    ins = list(low.inputs)
    func = Func([low.inputs[n][0] for n in ins], out_tensors, name=low.name)
    longest = max([st.info.get("K", 1) if st.kind == "gemm" else
                   st.info.get("C", 1) * st.info.get("R", 1) * st.info.get("S", 1) if st.kind == "conv" else
                   math.prod(st.info.get("cols", (1,))) for st in low.stage_list] or [1])
    func.torch_group = GroupInfo(  # type: ignore[attr-defined]
        kind, tuple(StageInfo(st.kind, st.tensor.name, tuple(sorted(st.info.items()))) for st in low.stage_list),
        tuple(t.name for t in out_tensors), longest)
    return Imported(func, kind, ins, [low.inputs[n][1] for n in ins], list(outputs), out_dtypes, out_perms)


RESHAPES = {aten.view, aten._unsafe_view, aten.reshape, aten.squeeze, aten.unsqueeze, aten.alias, aten.detach}
"""Views that keep every element's row-major position (its linear index)."""

ENUMERATED_ELEMENTS = 1 << 22
"""Outputs up to this many elements have their reads of the product checked element by element
(``_enumerated_in_place``); larger ones only by the graph's structure (``_reads_in_place``)."""


def product_epilogue(low: Lowering, outputs: list[fx.Node], out_tensors: list[ComputeTensor]
                     ) -> list[ComputeTensor]:
    """The outputs of a product's (or convolution's) group with its epilogue moved into the product
    (``with_epilogue``):
    the output's value at each element, as a function of the product's sum at the same position, is
    then computed where the sum leaves the accumulator registers, and the product's sums are never
    stored. Only where every read of the product is at the element being written: one output, of the
    product's number of elements, whose kernel array (in storage order, row-major) reads the product
    at its own linear index — checked for every element (``_enumerated_in_place``: views to heads
    and their permutes, written in the permuted storage order torch gives them), or for larger outputs
    by structure (``_reads_in_place``: elementwise operations and reshapes, row-major). Otherwise
    (several outputs — the raw product read outside the group —, broadcasts, transposes, slices)
    ``out_tensors`` as they are: the epilogue is a kernel of its own after the product's."""
    products = [st for st in low.stage_list if st.kind in ("gemm", "conv")]
    if len(products) != 1 or len(outputs) != 1 or out_tensors[0] is products[0].tensor:
        return out_tensors
    stage = products[0]
    (node,) = [n for n, t in low.stages.items() if t is stage.tensor]
    out, C = out_tensors[0], stage.tensor
    C_shape = [int(d.value) for d in C.shape]  # type: ignore[attr-defined]
    out_shape = [int(d.value) for d in out.shape]  # type: ignore[attr-defined]
    if math.prod(out_shape) != math.prod(C_shape):
        return out_tensors
    if math.prod(out_shape) <= ENUMERATED_ELEMENTS:
        in_place = _enumerated_in_place(out, C, C_shape, out_shape)
    else:
        in_place = storage_order(meta(outputs[0])) == tuple(range(len(out_shape))) and \
            _reads_in_place(outputs[0], node, low.members)
    if not in_place:
        return out_tensors

    def epilogue(acc: Expr, *cidx: Expr) -> Expr:
        at = dict(zip((id(a) for a in out.axes), reshape_index(cidx, C_shape, out_shape)))
        # every read of the product is at the element being written (checked above)
        return lx.rebuild(out.body, lambda n: acc if isinstance(n, lx.Load) and n.tensor is C else at.get(id(n)))

    fused = with_epilogue(C, epilogue)
    stage.tensor = fused
    low.stages[node] = fused
    return [fused]


def _enumerated_in_place(out: ComputeTensor, C: ComputeTensor, C_shape: list[int], out_shape: list[int]) -> bool:
    """Whether every read of ``C`` in ``out``'s body, at every element of ``out``, is at the element of
    ``C`` with ``out``'s linear index (both row-major): the index expressions evaluated on all elements."""
    import numpy as np
    linear = np.arange(math.prod(out_shape), dtype=np.int64)
    env = {id(a): v for a, v in zip(out.axes, np.unravel_index(linear, out_shape))}
    reads = [n for n in lx.walk(out.body) if isinstance(n, lx.Load) and n.tensor is C]
    try:
        for r in reads:
            idx = [np.broadcast_to(_index_values(i, env), linear.shape) for i in r.indices]
            if any(((i < 0) | (i >= n)).any() for i, n in zip(idx, C_shape)):
                return False
            if not np.array_equal(np.ravel_multi_index(idx, C_shape), linear):
                return False
    except Unsupported:
        return False
    return True


def _reads_in_place(output: fx.Node, product: fx.Node, members: set[fx.Node]) -> bool:
    """Whether every path from ``output`` back to ``product`` inside the group reads the element at the
    same linear index: elementwise operations whose operands from the group have their shape, and
    reshapes."""
    seen: set[fx.Node] = set()
    stack = [output]
    while stack:
        n = stack.pop()
        if n in seen or n is product:
            continue
        seen.add(n)
        kind = node_kind(n)
        if kind == "view" and _packet(n.target) in RESHAPES:
            inner = [n.args[0]]
        elif kind == "elementwise" and _packet(n.target) is not aten._native_batch_norm_legit_no_training:
            inner = [x for x in n.all_input_nodes if x in members]
            if any(tuple(meta(x).shape) != tuple(meta(n).shape) for x in inner):
                return False
        else:
            return False
        stack.extend(x for x in inner if isinstance(x, fx.Node) and x in members)
    return True


def _index_values(e: Expr, env: dict[int, Any]) -> Any:
    """An index expression (integers, axes, + - * // %) on arrays of the axes' values."""
    if isinstance(e, lx.Const):
        return e.value
    if isinstance(e, lx.IterVar) and id(e) in env:
        return env[id(e)]
    if isinstance(e, lx.Cast) and e.dtype.is_int:
        return _index_values(e.a, env)
    if isinstance(e, lx.BinOp) and e.op in ("+", "-", "*", "//", "%"):
        a, b = _index_values(e.a, env), _index_values(e.b, env)
        return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
                "//": lambda: a // b, "%": lambda: a % b}[e.op]()
    raise Unsupported(f"index {e} is not an integer expression of the output's axes")


def _reused_stage(stage: ComputeTensor, stages: list[Stage]) -> ComputeTensor | None:
    """The anchor stage itself when an output is exactly that stage (same type, same element): no copy."""
    body = stage.body
    if not isinstance(body, lx.Load):
        return None
    for st in stages:
        t = st.tensor
        if body.tensor is t and t.dtype == stage.dtype and len(body.indices) == len(stage.axes) and all(
                a is b for a, b in zip(body.indices, stage.axes)):
            return t
    return None
