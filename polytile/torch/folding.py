"""Batch norms folded into the convolutions before them, each chain run as one cuDNN convolution with
its bias, residual and ReLU (the backend's ``cudnn_fusion`` option; inference on a GPU).

In inference a batch norm is a per-channel affine map, so ``bn(conv(x, W) + b)`` is
``conv(x, W·s) + (b − mean)·s + beta`` with ``s = gamma / sqrt(var + eps)``. A chain
``relu(bn(conv(x)))`` or ``relu(bn(conv(x)) + z)`` whose convolution weight, bias and batch-norm
values are constant (the model's parameters and buffers) becomes one call of cuDNN's fused
convolution + bias (+ z) + ReLU (``aten.cudnn_convolution_relu`` / ``cudnn_convolution_add_relu``): the
activation is written once, by the convolution, where otherwise the convolution writes it and an
elementwise kernel reads and writes it again (ResNet-50 at batch 32: about 1.5 GB of the forward's
traffic). The folded weight and bias are computed on the first call and again only when one of the
six tensors changes (``packing.PackCache``), channels-last like the other convolutions' weights
(``layouts``). A chain with anything else (a non-constant weight, a batch norm's other results used,
an intermediate result read elsewhere) is left as it is.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from .importer import _packet
from .layouts import weight_source
from .packing import PackCache

aten = torch.ops.aten

FOLDED = "polytile_folded_batch_norm"
"""The meta key that tags the nodes this pass adds (the folded weights and the fused convolutions)."""


def fuse_conv_bn_relu(gm: fx.GraphModule, constants: frozenset[fx.Node]) -> list[PackCache]:
    """Rewrite ``gm`` in place (see the module docstring); the caches of the folded weights (a CUDA-graph
    replay refreshes them, ``graphs.GraphedForward``)."""
    caches: list[PackCache] = []
    for relu in [n for n in gm.graph.nodes if n.op == "call_function" and _packet(n.target) is aten.relu]:
        chain = _chain(relu, constants)
        if chain is None:
            continue
        main, z, branch, dead = chain
        x = main.conv.args[0]
        stride, padding, dilation, _, _, groups = main.conv.args[3:9]
        cache = PackCache(_folding(main, branch))
        caches.append(cache)
        with gm.graph.inserting_before(relu):
            tensors = (*main.tensors, *(branch.tensors if branch else ()))
            fold = gm.graph.call_function(_cached(cache, len(caches)), tensors)
            added = [fold, *(gm.graph.call_function(operator.getitem, (fold, k)) for k in range(3 if branch else 2))]
            if branch is not None:  # the residual: the branch's convolution of its folded weight, without bias
                bconv = branch.conv
                z = gm.graph.call_function(aten.convolution.default, (bconv.args[0], added[3], None, *bconv.args[3:9]))
                z.meta["val"] = bconv.meta.get("val")
                added.append(z)
            fused = gm.graph.call_function(conv_bias_relu,
                                           (x, added[1], added[2], z, stride, padding, dilation, groups))
            added.append(fused)
        for n in added:
            n.meta[FOLDED] = True
        fused.meta["val"] = relu.meta.get("val")
        relu.replace_all_uses_with(fused)
        for n in [relu, *dead]:
            gm.graph.erase_node(n)
    if caches:
        gm.recompile()
    return caches


def is_folded(node: fx.Node) -> bool:
    """Whether ``node`` was added by ``fuse_conv_bn_relu`` (torch runs it)."""
    return bool(node.meta.get(FOLDED))


def conv_bias_relu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, z: torch.Tensor | None, stride: Any,
                   padding: Any, dilation: Any, groups: int) -> torch.Tensor:
    """``relu(conv2d(x, w, b) + z)`` (z optional): cuDNN's fused kernel on a GPU, torch's operations
    elsewhere and where cuDNN has no fused kernel for the shapes (it raises before launching anything;
    remembered per shapes, so that later calls and a CUDA-graph capture go straight to the operations)."""
    key = (tuple(x.shape), tuple(w.shape), x.dtype, z is None, tuple(stride), tuple(padding), tuple(dilation), groups)
    if x.is_cuda and key not in UNFUSED:
        try:
            if z is None:
                return aten.cudnn_convolution_relu(x, w, b, stride, padding, dilation, groups)
            return aten.cudnn_convolution_add_relu(x, w, z, 1.0, b, stride, padding, dilation, groups)
        except RuntimeError as err:
            UNFUSED[key] = str(err).splitlines()[0] if str(err) else type(err).__name__
    y = torch.nn.functional.conv2d(x, w, b, stride, padding, dilation, groups)
    return torch.relu(y if z is None else y + z)


UNFUSED: dict[tuple[Any, ...], str] = {}
"""Shapes cuDNN had no fused kernel for, with its error (``conv_bias_relu``)."""


@dataclass(frozen=True)
class _ConvBatchNorm:
    """A convolution and the inference batch norm that alone reads it (``item``: the norm's first result)."""

    conv: fx.Node
    bn: fx.Node
    item: fx.Node

    @property
    def tensors(self) -> tuple[fx.Node, ...]:
        """What its folding reads: the weight, the bias if any, then gamma, beta, mean, var."""
        bias = self.conv.args[2]
        return (weight_source(self.conv.args[1]), *([bias] if bias is not None else []), *self.bn.args[1:5])

    @property
    def has_bias(self) -> bool:
        return self.conv.args[2] is not None

    @property
    def eps(self) -> float:
        return float(self.bn.args[6])

    def nodes(self) -> list[fx.Node]:
        """Its nodes, users first."""
        return [self.item, *(u for u in self.bn.users if u is not self.item), self.bn, self.conv]


def _chain(relu: fx.Node, constants: frozenset[fx.Node]
           ) -> tuple[_ConvBatchNorm, fx.Node | None, _ConvBatchNorm | None, list[fx.Node]] | None:
    """(the convolution and batch norm, the residual or None, the residual's own convolution and batch norm
    when it folds too, the nodes the fused call replaces but ``relu``, users first) of a chain ending in
    ``relu`` that folds, else None."""
    src = relu.args[0]
    if not isinstance(src, fx.Node) or len(src.users) != 1:
        return None
    if not (_packet(src.target) is aten.add and len(src.args) == 2 and not src.kwargs):
        main = _conv_batch_norm(src, constants)
        return None if main is None else (main, None, None, main.nodes())
    for item, z in (src.args, src.args[::-1]):
        main = _conv_batch_norm(item, constants)
        if main is None or not isinstance(z, fx.Node):
            continue
        if tuple(_val(z).shape) != tuple(_val(item).shape) or _val(z).dtype != _val(item).dtype:
            return None
        branch = _conv_batch_norm(z, constants)
        return main, z, branch, [src, *main.nodes(), *(branch.nodes() if branch else ())]
    return None


def _conv_batch_norm(item: Any, constants: frozenset[fx.Node]) -> _ConvBatchNorm | None:
    """The convolution and batch norm when ``item`` is an inference batch norm's first result, read once,
    of a 2-D convolution read only by it, with constant weight, bias and batch-norm values."""
    if not (isinstance(item, fx.Node) and item.target is operator.getitem and item.args[1] == 0
            and len(item.users) == 1):
        return None
    bn = item.args[0]
    if not (isinstance(bn, fx.Node) and _packet(bn.target) is aten._native_batch_norm_legit_no_training):
        return None
    if any(u.target is not operator.getitem or (u.args[1] != 0 and u.users) for u in bn.users):
        return None
    conv = bn.args[0]
    if not (isinstance(conv, fx.Node) and _packet(conv.target) is aten.convolution and len(conv.users) == 1):
        return None
    weight, bias, transposed = weight_source(conv.args[1]), conv.args[2], conv.args[6]
    if transposed or _val(conv).ndim != 4 or weight not in constants or (bias is not None and bias not in constants):
        return None
    if not all(p in constants for p in bn.args[1:5]):
        return None
    return _ConvBatchNorm(conv, bn, item)


def _val(n: fx.Node) -> torch.Tensor:
    return n.meta["val"]


def _folding(main: _ConvBatchNorm, branch: _ConvBatchNorm | None) -> Callable[..., tuple[torch.Tensor, ...]]:
    """The folding of ``main``'s tensors (then ``branch``'s): its weight and bias (plus the branch's shift),
    then the branch's weight; each weight channels-last. (What it needs of the nodes is read now: the
    rewrite erases them.)"""
    n_main = len(main.tensors)
    forms = [(cb.has_bias, cb.eps) for cb in (main, branch) if cb is not None]

    def fold(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            w, bias = _fold(*forms[0], tensors[:n_main])
            if branch is None:
                return w, bias
            w_branch, shift = _fold(*forms[1], tensors[n_main:])
            return w, bias + shift, w_branch
    return fold


def _fold(has_bias: bool, eps: float, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    w, rest = tensors[0], tensors[1:]
    bias, (gamma, beta, mean, var) = (rest[0], rest[1:]) if has_bias else (None, rest)
    scale = gamma.float() * torch.rsqrt(var.float() + eps)
    shift = beta.float() + ((bias.float() if bias is not None else 0) - mean.float()) * scale
    folded = (w.float() * scale.reshape(-1, 1, 1, 1)).to(w.dtype)
    return folded.contiguous(memory_format=torch.channels_last), shift.to(w.dtype)


def _cached(cache: PackCache, serial: int) -> Callable[..., tuple[torch.Tensor, ...]]:
    def folded_batch_norm(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return cache(*tensors)

    folded_batch_norm.__name__ = f"polytile_folded_batch_norm_{serial}"
    return folded_batch_norm
