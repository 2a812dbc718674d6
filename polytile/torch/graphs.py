"""The compiled forward replayed as one CUDA graph (the backend's ``cuda_graphs`` option).

At batch 1 a model is mostly host time: each of its 50–90 kernels costs polytile's call path 10–20 µs
on the host (``benchmarks/launch_breakdown.py``), where the GPU needs a few. Captured once, the whole
forward — polytile's kernels and the operations left to torch — is enqueued by one graph launch.

The capture happens on the second call (the first one runs as compiled: lazy initializations, the
kernels' first-call planning and any compilation are done then, none of which a capture allows) on a
side stream, in a memory pool of its own. Inputs that dynamo marks static (the model's parameters and
buffers) are used in place: a later call with another tensor in their place (new weights assigned to
the module) is run as compiled and captured again; weights the forward reads through a converted
copy (the ``channels_last`` option's) are converted again into that copy before a replay when they
were written in place (``packing.PackCache.refresh``; inside the caller's own capture the conversion
is captured instead). Other inputs (the user's tensors) are copied into
the graph's own input tensors before each replay. Outputs are cloned out of the graph's memory, so a
result stays valid after the next call. A forward that cannot be captured (an operation that
synchronizes or copies to the host) runs as compiled from then on, with one warning saying why.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

DATA_PTRS_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
"""torch's check that ``tensors[i].data_ptr() == ptrs[i]`` for each ``i`` of ``indices`` (CUDA builds)."""


def static_input(x: object) -> bool:
    """Whether dynamo marks ``x`` as a static address (parameters and buffers of the module)."""
    return isinstance(x, torch.nn.Parameter) or getattr(x, "_dynamo_static_input_type", None) is not None


@contextlib.contextmanager
def _refreshed(weights: Sequence[Any]) -> Iterator[None]:
    """While capturing: the converted weights are refreshed before each replay, so the graph reads their
    copies (``packing.PackCache.refreshed``)."""
    for w in weights:
        w.refreshed = True
    try:
        yield
    finally:
        for w in weights:
            w.refreshed = False


class GraphedForward:
    """``forward`` (a function of tensors returning a tuple or list of tensors) replayed as one CUDA
    graph from its second call on."""

    def __init__(self, forward: Callable[..., Any], report: Any = None, weights: Sequence[Any] = ()):
        self.forward = forward
        self.report = report  # an explain.Report: its notes and replay count
        self.weights = list(weights)  # the forward's converted weights (packing.PackCache), refreshed before a replay
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: list[Any] = []  # the graph's input tensors (static ones: the caller's own)
        self.copied_at: list[int] = []  # the inputs copied in before a replay (a loop over 300 parameters: 10 µs)
        self.outputs: Any = None
        self.static_at: list[int] = []  # the static inputs' positions and their addresses at the capture
        self.static_ptrs: list[int | None] = []  # by position (None: not a static input)
        self.others_at: list[int] = []
        self.failed = False

    def __call__(self, *args: Any) -> Any:
        if torch.cuda.is_current_stream_capturing():  # inside the caller's own graph: a part of it
            return self.forward(*args)
        self.calls += 1
        if self.failed or self.calls == 1:
            return self.forward(*args)
        if self.graph is None or not self._matches(args) or not all(w.refresh() for w in self.weights):
            if not self._capture(args):
                return self.forward(*args)
        for k in self.copied_at:
            self.inputs[k].copy_(args[k])
        self.graph.replay()  # type: ignore[union-attr]
        if self.report is not None:
            self.report.cuda_graph_replays += 1
        return type(self.outputs)(o.clone() if isinstance(o, torch.Tensor) else o for o in self.outputs)

    def _matches(self, args: Sequence[Any]) -> bool:
        """Whether the captured graph computes the forward of ``args``: the static inputs (the model's
        parameters, 200 for BERT-base) at the addresses captured — only their addresses are compared,
        dynamo guards their shapes and strides as those of every input (as inductor's CUDA graphs do;
        comparing them too cost 0.3-1.6 ms a call) — and the others of the captured shapes, or equal."""
        if len(args) != len(self.inputs):
            return False
        if not self._static_in_place(args):
            return False
        for k in self.others_at:
            a, s = args[k], self.inputs[k]
            if isinstance(a, torch.Tensor) != isinstance(s, torch.Tensor):
                return False
            if not isinstance(a, torch.Tensor):
                if a != s:
                    return False
            elif a.shape != s.shape or a.dtype != s.dtype or a.device != s.device or a.stride() != s.stride():
                return False
        return True

    def _static_in_place(self, args: Sequence[Any]) -> bool:
        """Whether the static inputs of ``args`` are at the addresses captured: in one call of torch's own
        check where torch has it (CUDA builds; inductor's CUDA graphs use it: ResNet-50's 320 parameters
        and buffers cost a Python loop 15-40 µs before each replay), else in Python."""
        try:
            if DATA_PTRS_EQUAL is not None:
                return DATA_PTRS_EQUAL(list(args), self.static_ptrs, self.static_at)
            return all(args[k].data_ptr() == self.static_ptrs[k] for k in self.static_at)
        except (AttributeError, TypeError, RuntimeError):  # not a tensor where a static one was
            return False

    def _capture(self, args: Sequence[Any]) -> bool:
        self.graph = None
        try:
            copied = [isinstance(a, torch.Tensor) and not static_input(a) for a in args]
            inputs = [a.clone() if c else a for a, c in zip(args, copied)]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.forward(*inputs)  # warm-up on the capture's stream
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), _refreshed(self.weights):
                outputs = self.forward(*inputs)
            if not isinstance(outputs, (tuple, list)):
                raise TypeError(f"the forward returned {type(outputs).__name__}, not a tuple or list")
        except Exception as err:  # noqa: BLE001 - the model must run, graph or not
            self.failed = True
            reason = (f"the compiled graph could not be captured as a CUDA graph ({type(err).__name__}: {err}); "
                      "it runs without one")
            warnings.warn(f"polytile backend: {reason}", stacklevel=3)
            if self.report is not None:
                self.report.notes.append(reason)
            return False
        self.graph, self.inputs, self.outputs = graph, inputs, outputs
        self.copied_at = [k for k, c in enumerate(copied) if c]
        self.static_at = [k for k, (a, c) in enumerate(zip(inputs, copied)) if isinstance(a, torch.Tensor) and not c]
        static = set(self.static_at)
        self.static_ptrs = [inputs[k].data_ptr() if k in static else None for k in range(len(inputs))]
        self.others_at = [k for k in range(len(inputs)) if k not in static]
        return True
