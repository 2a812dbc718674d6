"""Constant weights packed once: a product's B or a convolution's filters, when they are parameters
or buffers of the model, are passed to the CPU kernel already in the blocked layout its schedule
would otherwise copy them into on every call (``ops.matmul.schedule_gemm_cpu``'s panels of B,
``ops.conv.schedule_conv2d_tiles_cpu``'s blocks of filters).

``WeightPacking`` tells the importer which group inputs are constant (the graph's static inputs —
AOT autograd's parameters and buffers — and views of them) and the block each kernel reads.
``PackedWeight`` is such an input's adapter: the kernel's array ``[d // block][other dims][d % block]``
(zeros past the end of ``d``) and how torch packs a tensor into it. ``PackCache`` keeps one packed
copy per compiled call: it packs on the first call and again only when the weight changed — another
tensor, or the same one written in place (its version counter moved: ``optimizer.step``,
``load_state_dict``, ``w.add_(...)`` under ``no_grad``). A write through ``w.data`` is not seen:
``.data`` has a version counter of its own, as autograd's own checks know.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from ..lang import expr as lx
from ..target import CPUTarget


@dataclass(frozen=True)
class PackedWeight:
    """How a constant weight of ``shape`` is passed packed: dimension ``blocked`` cut into blocks of
    ``block`` elements, the kernel's array ``[blocked // block][the other dimensions in order][blocked % block]``,
    zeros past the end of ``blocked``. A linear layer's B ([K][N], the transposed weight): blocked = 1,
    the panels ``[N / nr][K][nr]``; a convolution's filters [K][C][R][S]: blocked = 0, the blocks
    ``[K / k_tile][C][R][S][k_tile]``."""

    shape: tuple[int, ...]
    blocked: int
    block: int

    @property
    def rest(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.shape)) if d != self.blocked)

    @property
    def kernel_shape(self) -> tuple[int, ...]:
        return (math.ceil(self.shape[self.blocked] / self.block), *(self.shape[d] for d in self.rest), self.block)

    def index(self, idx: Sequence[lx.Expr]) -> tuple[lx.Expr, ...]:
        """The kernel array's index of element ``idx`` of the weight."""
        d = idx[self.blocked]
        return (d // self.block, *(idx[r] for r in self.rest), d % self.block)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` packed (a new tensor; ``x`` of any strides)."""
        with torch.no_grad():
            n = x.shape[self.blocked]
            padded = math.ceil(n / self.block) * self.block
            x = x.movedim(self.blocked, 0)
            if padded != n:
                x = torch.cat([x, x.new_zeros((padded - n, *x.shape[1:]))])
            x = x.reshape(padded // self.block, self.block, *x.shape[1:])
            return x.movedim(1, -1).contiguous()


class PackCache:
    """A weight's conversion (a ``PackedWeight``, ``layouts``' channels-last copy, or ``folding``'s batch
    norm folded into a convolution: a conversion of several tensors) with the last weights it converted:
    the converted copy is reused while each weight is the same tensor (or a view of the same base) with
    the same version, address and strides. A tensor without a version counter (made under
    ``torch.inference_mode``) is converted on every call. Inside the capture of a CUDA graph that does
    not refresh the cache (the caller's own graph), the conversion is captured too, so that each replay
    converts the weights as they are then; ``refreshed`` marks the captures of a replayer that
    refreshes the cache before each replay (``graphs.GraphedForward``), which read the copy."""

    def __init__(self, packing: Callable[..., Any]):
        self.packing = packing  # tensors -> a tensor (or a tuple of them)
        self.packs = 0  # how many times a weight was packed (tests read it)
        self._sources: list[weakref.ref[torch.Tensor]] | None = None
        self._weights: list[weakref.ref[torch.Tensor]] | None = None
        self._key: tuple[Any, ...] | None = None
        self._packed: Any = None
        self.refreshed = False

    def __call__(self, *xs: torch.Tensor) -> Any:
        if not self.refreshed and capturing(xs[0]):
            return self.packing(*xs)
        try:
            key = tuple(_key(x) for x in xs)
        except RuntimeError:  # an inference tensor: no version counter, so nothing tells a change
            self.packs += 1
            self._packed, self._key = None, None  # converted by every call (a captured one too)
            return self.packing(*xs)
        bases = [x._base if x._base is not None else x for x in xs]
        if self._packed is None or self._key != key or self._sources is None \
                or any(s() is not b for s, b in zip(self._sources, bases)):
            self._packed = self.packing(*xs)
            self._sources, self._weights = [weakref.ref(b) for b in bases], [weakref.ref(x) for x in xs]
            self._key = key
            self.packs += 1
        return self._packed

    def refresh(self) -> bool:
        """Convert the weights converted last again, into the same tensors, if one was written in place
        since (its version moved): a CUDA graph that reads the converted copy replays the new weight.
        False when a weight is gone or is no longer what was converted (another address or shape): the
        next call must convert it, into a new tensor. True for weights without a version counter: every
        call converts them, so a captured call does too."""
        if self.packs and self._key is None:
            return True
        xs = [w() for w in self._weights] if self._weights is not None else []
        if not xs or any(x is None for x in xs) or self._packed is None or self._key is None:
            return False
        if all(x._version == k[0] for x, k in zip(xs, self._key)):
            return True
        key = tuple(_key(x) for x in xs)
        if any(k[1:] != old[1:] for k, old in zip(key, self._key)):
            return False
        with torch.no_grad():
            new = self.packing(*xs)
            pairs = zip(self._packed, new) if isinstance(new, tuple) else [(self._packed, new)]
            for old, fresh in pairs:
                old.copy_(fresh)
        self._key = key
        self.packs += 1
        return True


def _key(x: torch.Tensor) -> tuple[Any, ...]:
    return (x._version, x.data_ptr(), tuple(x.shape), x.stride(), x.dtype)


def capturing(x: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on the current stream of ``x``'s (CUDA) device."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def call_adapters(adapters: Sequence[Callable[[torch.Tensor], torch.Tensor]]
                  ) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """The adapters of one compiled call: each ``PackedWeight`` with a cache of its own (the packed
    copy belongs to the call, so to the compiled graph)."""
    return [PackCache(a) if isinstance(a, PackedWeight) else a for a in adapters]


@dataclass(frozen=True)
class WeightPacking:
    """Which group inputs are constant weights (``constants``) and the blocks in which ``target``'s
    default kernels read them; the importer asks per product and convolution."""

    constants: frozenset[fx.Node]
    target: CPUTarget

    def product_block(self, b: fx.Node, M: int, N: int, K: int) -> int | None:
        """The panel width of a product's constant B (the register tile's columns, ``nr``), or None."""
        from ..ops.matmul import cpu_gemm_tiles
        return cpu_gemm_tiles(M, N, K, self.target, 4)["nr"] if b in self.constants else None

    def conv_block(self, w: fx.Node, K: int, Q: int, taps: int, stride: int) -> int | None:
        """The filters a block of a convolution's constant weight holds (``k_tile``), or None."""
        from ..ops.conv import conv2d_cpu_default
        return conv2d_cpu_default(K, Q, taps, stride, self.target)["k_tile"] if w in self.constants else None


def constant_inputs(gm: fx.GraphModule) -> frozenset[fx.Node]:
    """The nodes of an AOT autograd forward graph that hold constant weights: its static inputs (the
    model's parameters and buffers, as AOT autograd records them) and views of them (a linear
    layer's ``t``). Empty when no tracing context says which inputs are static."""
    from torch._guards import TracingContext
    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    static = set(getattr(meta, "static_input_indices", None) or ())
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    consts = {n for k, n in enumerate(placeholders) if k in static}
    from .importer import node_kind
    for n in gm.graph.nodes:
        if node_kind(n) == "view" and n.args and n.args[0] in consts:
            consts.add(n)
    return frozenset(consts)
