"""The channels-last pass: a graph's convolutions take their constant weights channels-last (NHWC),
converted once per compiled graph, so that activations stay channels-last from one convolution to
the next (the backend's ``channels_last`` option).

Why: cuDNN's fp16 convolutions compute in NHWC; given NCHW tensors, each call converts its input to
NHWC and its result back (two kernels per convolution: a quarter of ResNet-50's GPU time at batch 1
on an H200). torch runs a convolution channels-last when its input or its weight is: with the weights
converted, the first convolution converts the image once, and every later activation — the
convolutions' results, the batch norms, ReLUs and residual sums that polytile's elementwise groups
compute (they read and write their tensors in storage order, ``importer.storage_order``), the
pooling — stays channels-last.

``channels_last`` inserts a channels-last copy of each constant 4-D convolution weight (a node
tagged ``WEIGHT_LAYOUT``), propagates the new strides through the graph with fake tensors, and
restores the strides of the graph's outputs where they changed (one copy each: the caller sees
eager's strides). After partitioning, ``cache_weights`` turns each tagged copy into a cached one
(``packing.PackCache``): converted on the first call and again only when the weight changes.
polytile's own convolution groups read the weight itself (``weight_source``): they read NCHW filters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from .importer import Unsupported, _packet, meta
from .packing import PackCache

aten = torch.ops.aten

WEIGHT_LAYOUT = "polytile_channels_last_weight"
"""The meta key that tags a convolution weight's channels-last copy."""


def channels_last(gm: fx.GraphModule, constants: frozenset[fx.Node]) -> fx.GraphModule:
    """A copy of ``gm`` whose convolutions read their constant weights (of ``constants``) through
    channels-last copies, with the strides propagated (see the module docstring); ``gm`` itself when
    no weight needs converting. Raises ``Unsupported`` when the strides cannot be propagated (a view
    that channels-last strides do not allow) or an output's strides cannot be restored."""
    from torch._guards import detect_fake_mode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    convs = [n for n in gm.graph.nodes if n.op == "call_function" and _packet(n.target) is aten.convolution
             and meta(n).ndim == 4]
    weights = list(dict.fromkeys(n.args[1] for n in convs if n.args[1] in constants
                                 and not _is_channels_last(meta(n.args[1]))))
    if not weights:
        return gm
    out = fx.GraphModule(gm, _copy(gm.graph))
    by_name = {n.name: n for n in out.graph.nodes}
    placeholders = [n for n in out.graph.nodes if n.op == "placeholder"]
    mode = detect_fake_mode([n.meta.get("val") for n in placeholders])
    if mode is None:
        raise Unsupported("the graph carries no fake tensors to propagate channels-last strides with")
    before = {n: tuple(meta(n).stride()) for n in _tensor_outputs(out)}
    for w in (by_name[w.name] for w in weights):
        first = min((u for u in w.users if _packet(u.target) is aten.convolution), key=_position(out))
        with out.graph.inserting_before(first):
            cl = out.graph.call_function(aten.clone.default, (w,), {"memory_format": torch.channels_last})
        cl.meta[WEIGHT_LAYOUT] = True
        for u in list(w.users):
            if u is not cl and _packet(u.target) is aten.convolution and u.args[1] is w:
                u.replace_input_with(w, cl)
    try:
        FakeTensorProp(out, mode).propagate_dont_convert_inputs(*[n.meta["val"] for n in placeholders])
    except Exception as err:  # noqa: BLE001 - a view the new strides do not allow, and the like
        raise Unsupported(f"channels-last strides do not propagate through the graph ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''})") from None
    for n, strides in before.items():
        if tuple(meta(n).stride()) != strides:
            _restore(out, n, strides, mode)
    out.recompile()
    return out


def weight_source(node: object) -> object:
    """The weight itself where ``node`` is its channels-last copy (polytile's convolutions read NCHW
    filters), else ``node``."""
    if isinstance(node, fx.Node) and node.meta.get(WEIGHT_LAYOUT):
        return node.args[0]
    return node


def is_weight_copy(node: fx.Node) -> bool:
    """Whether ``node`` is a weight's channels-last copy made by ``channels_last``."""
    return bool(node.meta.get(WEIGHT_LAYOUT))


def cache_weights(gm: fx.GraphModule) -> list[PackCache]:
    """Make each channels-last weight copy of ``gm`` (rewritten by the backend) a cached conversion:
    done on the first call, again only when the weight changes; copies nothing reads any more (their
    convolutions went to polytile) are dropped. Returns the caches (a CUDA-graph replay refreshes them,
    ``graphs.GraphedForward``)."""
    caches = []
    copies = [n for n in gm.graph.nodes if is_weight_copy(n)]
    for n in copies:
        if not n.users:
            gm.graph.erase_node(n)
            continue
        cache = PackCache(to_channels_last)
        caches.append(cache)
        with gm.graph.inserting_before(n):
            new = gm.graph.call_function(_cached(cache, len(caches)), tuple(n.args))
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        gm.graph.erase_node(n)
    if copies:
        gm.recompile()
    return caches


def to_channels_last(w: torch.Tensor) -> torch.Tensor:
    """A channels-last copy of weight ``w``."""
    with torch.no_grad():
        return w.clone(memory_format=torch.channels_last)


def _cached(cache: PackCache, serial: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def channels_last_weight(w: torch.Tensor) -> torch.Tensor:
        return cache(w)

    channels_last_weight.__name__ = f"polytile_channels_last_weight_{serial}"
    return channels_last_weight


def _is_channels_last(t: torch.Tensor) -> bool:
    N, C, H, W = t.shape
    return tuple(t.stride()) == (H * W * C, 1, W * C, C)


def _copy(graph: fx.Graph) -> fx.Graph:
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    result = new.graph_copy(graph, env)
    new.output(result)
    return new


def _position(gm: fx.GraphModule) -> Callable[[fx.Node], int]:
    order = {n: k for k, n in enumerate(gm.graph.nodes)}
    return order.__getitem__


def _tensor_outputs(gm: fx.GraphModule) -> list[fx.Node]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return [n for n in dict.fromkeys(out.all_input_nodes) if isinstance(n.meta.get("val"), torch.Tensor)]


def _restore(gm: fx.GraphModule, n: fx.Node, strides: tuple[int, ...], mode: Any) -> None:
    """Make graph output ``n`` (channels-last now) have ``strides`` again: a copy in that layout."""
    val = meta(n)
    formats = [torch.contiguous_format, torch.channels_last] if val.ndim == 4 else [torch.contiguous_format]
    fmt = next((f for f in formats
                if tuple(torch.empty(tuple(val.shape), device="meta", memory_format=f).stride()) == strides), None)
    if fmt is None:
        raise Unsupported(f"output {n.name} had strides {strides}, which a copy cannot restore")
    out = next(x for x in gm.graph.nodes if x.op == "output")
    with gm.graph.inserting_before(out):
        copy = gm.graph.call_function(aten.clone.default, (n,), {"memory_format": fmt})
    with mode:
        copy.meta["val"] = aten.clone.default(val, memory_format=fmt)
    out.replace_input_with(n, copy)
