"""The ``torch.compile`` backend "polytile": FX graph → groups → polytile kernels, the rest to torch.

Dynamo hands the backend a graph of torch calls; AOT autograd turns it into aten operations (the
backward graph, when there is one, stays with torch). ``compile_graph`` then partitions the aten
graph (``partition``), writes each group as a Func (``importer``), builds it with the best schedule
of the tuning records when there is one and the default schedule otherwise (``schedules``), runs
it beside torch's own operations on random inputs of the same shapes, and keeps it only when it
computes the same values and — with ``choose="measure"``, the default — runs faster than torch
(so a compiled model is not slower than eager by construction, up to measurement noise). The graph
is rewritten with each kept group replaced by one call of its kernel; everything else runs in torch.

Bad input never crashes inside torch: a graph with dynamic sizes, dtypes polytile lacks or
operations it does not import runs those parts in torch, with the reason in the ``Report``
(``polytile.torch.explain``) and, for whole graphs left, a warning.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import operator
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from ..errors import PolytileError
from .customop import KernelCall
from .explain import Report, TakenGroup
from .folding import conv_bias_relu, fuse_conv_bn_relu, is_folded
from .importer import Imported, import_group, meta, node_kind
from .layouts import cache_weights, channels_last, is_weight_copy, to_channels_last, weight_source
from .packing import PackedWeight, WeightPacking, call_adapters, constant_inputs
from .partition import Group, group_outputs, partition
from .schedules import Knobs, group_info, schedule_group

CHOICES = ("measure", "always")
ATTENTION = ("torch", "pieces")


@dataclass
class Options:
    """The backend's options (``torch.compile(model, backend="polytile", options={...})``).

    ``target``: "cpu", "cuda", "cuda:sm_90a" or a target object (default: where the inputs live).
    ``records``: a tuning-records file (``polytile.torch.tune``); groups with records use their best
    schedule. ``choose``: "measure" keeps a group only when it is faster than torch on random inputs
    of its shapes; "always" keeps every group that builds and computes the right values.
    ``report``: a ``Report`` to fill (``explain`` passes one). ``attention``: "torch" keeps torch's
    fused scaled-dot-product attention kernels; "pieces" decomposes attention into its pieces (a batched
    product of queries and keys with the scale and mask, a softmax, a batched product with the values),
    which the backend then compiles or leaves one by one — giving up the fused kernel.
    ``cuda_graphs``: replay each compiled graph as one CUDA graph from its second call on
    (``polytile.torch.graphs``: one launch for the whole forward instead of a host call per kernel);
    None (the default): on a CUDA target when gradients are off (inference), False: never, True: on a
    CUDA target whenever the forward is compiled with gradients off.
    ``pack_weights``: on the CPU, pass the model's constant weights (parameters and buffers) of
    products and convolutions packed in the blocks their kernels read, packed once per compiled
    graph and again only when a weight changes (``polytile.torch.packing``); False: every call packs.
    ``channels_last``: pass the convolutions their constant weights channels-last (converted once per
    compiled graph, again only when a weight changes), so that activations stay channels-last from one
    convolution to the next (``polytile.torch.layouts``: cuDNN's fp16 convolutions compute in NHWC and
    otherwise convert each input and result; ResNet-50 b1 fp16 on an H200 went 0.83 → 0.59 ms); for
    inference (gradients off) only. None (the default): on a CUDA target; True: on any target; False: never.
    ``vector_elementwise``: on a CUDA target, each thread of an elementwise group's default schedule
    computes 16 bytes of its result with 16-byte loads and stores (``schedules.Knobs.vector``, lowering's
    ``vector_lanes`` pass; a batch norm + ReLU over ResNet-50's channels-last activations at batch 32 moved
    a third of an H200's bandwidth one 2-byte element per thread), and the partition computes an
    elementwise group that only feeds another inside it (``partition``'s ``merge_elementwise``: a
    downsampling branch's batch norm inside the residual sum + ReLU that reads it, one kernel, its result
    never written). None (the default):
    ``VECTOR_ELEMENTWISE`` (on, measured: ResNet-50 fp16 on an H200); True: on; False: off.
    ``cudnn_fusion``: with ``channels_last``, each chain of a convolution, an inference batch norm, an
    optional residual sum and a ReLU, all with constant weights, runs as one cuDNN convolution with the
    batch norm folded into its weight and bias (``polytile.torch.folding``; the folded weights computed
    once, again when one changes); None (the default): ``CUDNN_FUSION`` (on, measured: ResNet-50 fp16 on an
    H200); True: on; False: off.
    """

    target: Any = None
    records: str | Path | None = None
    choose: str = "measure"
    report: Report | None = None
    attention: str = "torch"
    min_time: float = 0.01  # seconds of calls per timing round
    rounds: int = 5
    cuda_graphs: bool | None = None
    pack_weights: bool = True
    channels_last: bool | None = None
    vector_elementwise: bool | None = None
    cudnn_fusion: bool | None = None

    def __post_init__(self) -> None:
        if self.choose not in CHOICES:
            raise PolytileError(f"backend option choose={self.choose!r}: use one of {', '.join(CHOICES)}")
        if self.cudnn_fusion not in (None, True, False):
            raise PolytileError(f"backend option cudnn_fusion={self.cudnn_fusion!r}: use True, False or None")
        if self.vector_elementwise not in (None, True, False):
            raise PolytileError(f"backend option vector_elementwise={self.vector_elementwise!r}: use True, False or "
                                "None")
        if self.channels_last not in (None, True, False):
            raise PolytileError(f"backend option channels_last={self.channels_last!r}: use True, False or None")
        if self.cuda_graphs not in (None, True, False):
            raise PolytileError(f"backend option cuda_graphs={self.cuda_graphs!r}: use True, False or None")
        if self.attention not in ATTENTION:
            raise PolytileError(f"backend option attention={self.attention!r}: use one of {', '.join(ATTENTION)}")
        if self.target is not None:
            from ..target import as_target
            try:
                as_target(self.target)
            except PolytileError as err:
                raise PolytileError(f"backend option target={self.target!r}: {err}") from None
        if self.records is not None:
            if not Path(self.records).exists():
                raise PolytileError(f"backend option records={str(self.records)!r}: no such file; tune the model "
                                    "first (polytile.torch.tune or `polytile tune-model`)")
            from ..tune import RecordLog
            RecordLog(self.records).check()  # another file, or a folder: a clear error now, not per graph


def check_model(model: Any, caller: str) -> None:
    """A ``PolytileError`` naming the argument unless ``model`` is something ``torch.compile`` takes
    (a module or a function; torch's own check is a bare AssertionError)."""
    if not callable(model):
        raise PolytileError(f"{caller}: model must be a torch.nn.Module or a function, got "
                            f"{type(model).__name__} {model!r:.60}")


def backend(**options: Any) -> Callable[..., Any]:
    """A ``torch.compile`` backend with these ``Options``: ``torch.compile(m, backend=pt.torch.backend(
    records="model.jsonl"))``."""
    return functools.partial(_compile, opts=_options(options))


def polytile_backend(gm: fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None) -> Any:
    """The backend registered as "polytile" (``torch.compile(m, backend="polytile", options={...})``)."""
    return _compile(gm, example_inputs, opts=_options(options or {}))


def _options(options: dict[str, Any]) -> Options:
    known = [f.name for f in dataclasses.fields(Options)]
    unknown = [k for k in options if k not in known]
    if unknown:
        raise PolytileError(f"unknown backend option(s) {', '.join(map(repr, unknown))}; the options are "
                            f"{', '.join(known)}")
    return Options(**options)


def _compile(gm: fx.GraphModule, example_inputs: list[Any], opts: Options) -> Any:
    from torch._dynamo.backends.common import aot_autograd
    report = opts.report if opts.report is not None else Report()
    dynamic = [i for i in example_inputs if isinstance(i, torch.Tensor)
               and any(not isinstance(s, int) for s in i.shape)]
    if dynamic or any(isinstance(i, torch.SymInt) for i in example_inputs):
        reason = ("the graph has dynamic sizes, which polytile cannot specialize: compile with dynamic=False "
                  "(torch.compile(..., dynamic=False)) to get static shapes")
        warnings.warn(f"polytile backend: {reason}; the graph runs in torch", stacklevel=2)
        report.leave("graph", reason)
        return gm.forward

    # the caller's mode, read here: AOT autograd may compile the forward with gradients off even for
    # a training graph
    grad = torch.is_grad_enabled()

    def forward_compiler(fgm: fx.GraphModule, inputs: list[Any]) -> Any:
        try:
            target = _target_of(fgm, opts)
            return compile_graph(fgm, inputs, opts, report, cuda_graphs=_graphs_wanted(opts, target, grad),
                                 channels_last=channels_last_wanted(opts, target, grad))
        except Exception as err:  # noqa: BLE001 - a polytile bug must not take the user's model down
            note = f"polytile failed on this graph ({type(err).__name__}: {err}); the graph runs in torch"
            warnings.warn(f"polytile backend: {note}", stacklevel=2)
            report.notes.append(note)
            return _boxed(fgm.forward)

    return aot_autograd(fw_compiler=forward_compiler, bw_compiler=_torch_only,
                        decompositions=_decompositions(opts))(gm, example_inputs)


def _decompositions(opts: Options) -> dict[Any, Any]:
    """What AOT autograd decomposes before the backend sees the graph: with ``attention="pieces"``,
    scaled-dot-product attention into torch's math formulation (products, softmax), on every device."""
    if opts.attention != "pieces":
        return {}
    from torch._decomp import core_aten_decompositions
    table = core_aten_decompositions()
    aten = torch.ops.aten
    ops = (aten.scaled_dot_product_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default)
    return {op: table[op] for op in ops if op in table}


def _torch_only(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    return _boxed(gm.forward)


def _boxed(fn: Callable[..., Any]) -> Any:
    """``fn`` in AOT autograd's boxed calling convention (one list of arguments, freed as it goes)."""
    from torch._functorch.aot_autograd import make_boxed_func
    return make_boxed_func(fn)


def _target_of(gm: fx.GraphModule, opts: Options) -> Any:
    from ..target import as_target
    if opts.target is not None:
        return as_target(opts.target)
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            return as_target("cuda" if val.device.type == "cuda" else "cpu")
    return as_target("cpu")


# --- compiling one aten graph ----------------------------------------------------------------------------

@dataclass
class Candidate:
    group: Group
    imported: Imported
    call: KernelCall
    schedule: str
    polytile_s: float | None = None
    torch_s: float | None = None


@dataclass
class _Decision:
    keep: bool
    reason: str
    polytile_s: float | None
    torch_s: float | None


_DECISIONS: dict[tuple[Any, ...], _Decision] = {}
"""Measured decisions by group (workload key, operations, layouts, target, records): a model's
repeated layers are measured once."""

_KERNELS: dict[tuple[str, str, str], Any] = {}


def extract(gm: fx.GraphModule, target: Any, exclude: dict[fx.Node, str] | None = None, pack_weights: bool = True,
            merge_elementwise: bool = False
            ) -> tuple[list[tuple[Group, Imported]], dict[fx.Node, str], dict[fx.Node, str]]:
    """The groups of an aten graph that import, the operations left with their reasons (those of
    ``exclude`` with the reason given there), and the anchors of groups that did not import but fused
    more than their anchor (with the reason): without them, another partition may fuse the rest.
    ``pack_weights``: on the CPU, constant weights are passed packed (``Options.pack_weights``);
    ``merge_elementwise``: see ``partition``."""
    part = partition(gm, target.kind, exclude, merge_elementwise=merge_elementwise)
    packing = WeightPacking(constant_inputs(gm), target) if pack_weights and target.kind == "cpu" else None
    left = dict(part.left)
    graph_outputs = _graph_outputs(gm)
    imported = []
    unimported: dict[fx.Node, str] = {}
    for g in part.groups:
        try:
            imp = import_group(g.nodes, group_outputs(g, graph_outputs), g.kind,
                               target.vector_lanes(4) if target.kind == "cpu" else None,
                               fuse_epilogue=True, packing=packing)
        except PolytileError as err:
            for n in g.nodes:
                if node_kind(n) not in ("view", "getitem"):
                    left[n] = f"not imported: {err}"
            if g.anchor is not None and len(_ops_of(g)) > 1:
                unimported[g.anchor] = f"not imported: {err}"
            continue
        imported.append((g, imp))
    return imported, left, unimported


def compile_graph(gm: fx.GraphModule, example_inputs: list[Any], opts: Options, report: Report,
                  cuda_graphs: bool = False, channels_last: bool = False) -> Any:
    """Compile an aten graph (see the module docstring); returns the rewritten graph's callable,
    replayed as a CUDA graph with ``cuda_graphs`` (``_graphs_wanted``); with ``channels_last``, the
    convolutions' constant weights are passed channels-last (``layouts.channels_last``)."""
    start = time.perf_counter()
    target = _target_of(gm, opts)
    report.graphs += 1
    records = _Records.load(opts.records, target, report)
    folds: list[Any] = []
    if channels_last:
        gm = _channels_last(gm, report)
        if _on(opts.cudnn_fusion, CUDNN_FUSION) and target.kind == "cuda":
            folds = fuse_conv_bn_relu(gm, constant_inputs(gm))
            if folds:
                report.notes.append(f"cudnn_fusion: {len(folds)} convolution + batch norm (+ residual) + ReLU chains "
                                    "run as cuDNN's fused convolutions")
    excluded: dict[fx.Node, str] = {n: "a weight's channels-last copy" for n in gm.graph.nodes if is_weight_copy(n)}
    excluded.update({n: "cuDNN's fused convolution + bias (+ residual) + ReLU, a batch norm folded in"
                     for n in gm.graph.nodes if is_folded(n)})
    for _ in range(MAX_ROUNDS):
        chosen, left, rejected = _choose(gm, target, opts, records, excluded)
        if not rejected:
            break
        excluded.update(rejected)
    for n, reason in left.items():
        if is_weight_copy(n) or (is_folded(n) and n.target is not conv_bias_relu):
            continue
        name = "convolution" if n.target is conv_bias_relu else str(getattr(n.target, "overloadpacket", n.target))
        report.leave(name.removeprefix("aten."), reason)
    try:
        new_gm = _rewrite(gm, chosen)
    except _CycleError as err:  # a partition bug must not take the model down: run it in torch
        warnings.warn(f"polytile backend: {err}; the graph runs in torch", stacklevel=2)
        report.notes.append(str(err))
        return _boxed(gm.forward)
    for c in chosen:
        report.taken.append(TakenGroup(c.group.kind, c.group.ops, _key(c.imported), c.schedule,
                                       _us(c.polytile_s), _us(c.torch_s), len(getattr(c.call.kernel, "kernels", [1])),
                                       sum(isinstance(a, PackedWeight) for a in c.imported.adapters)))
    weights = [*cache_weights(new_gm), *folds]
    report.compile_s += time.perf_counter() - start
    if cuda_graphs:
        from .graphs import GraphedForward
        report.cuda_graphs += 1
        return _boxed(GraphedForward(new_gm.forward, report, weights))
    return _boxed(new_gm.forward)


def _channels_last(gm: fx.GraphModule, report: Report) -> fx.GraphModule:
    """``gm`` with channels-last convolution weights (``layouts.channels_last``), or ``gm`` as it is with
    a note saying why not (a failure of the pass itself too: the graph is then compiled as it is)."""
    try:
        new = channels_last(gm, constant_inputs(gm))
    except Exception as err:  # noqa: BLE001 - Unsupported, or a polytile bug: the layouts stay as traced
        reason = str(err) if isinstance(err, PolytileError) else f"{type(err).__name__}: {err}"
        report.notes.append(f"channels_last: the graph keeps its layouts: {reason}")
        return gm
    copies = sum(is_weight_copy(n) for n in new.graph.nodes)
    if copies:
        report.notes.append(f"channels_last: {copies} convolution weight(s) passed channels-last")
    return new


def channels_last_wanted(opts: Options, target: Any, grad: bool) -> bool:
    """Whether the convolutions' weights are passed channels-last (``Options.channels_last``): only for
    inference (``grad`` off: a training graph's saved activations are the backward's, in its layouts);
    by default on a CUDA target (cuDNN's convolutions compute in NHWC; polytile's CPU ones read NCHW)."""
    from ..target import CUDATarget
    if grad or opts.channels_last is False:
        return False
    return opts.channels_last is True or isinstance(target, CUDATarget)


def _graphs_wanted(opts: Options, target: Any, grad: bool) -> bool:
    """Whether the compiled forward is replayed as a CUDA graph (``Options.cuda_graphs``): only on a
    CUDA target, only for inference (``grad`` off: a forward compiled for training saves tensors for
    the backward pass, which a replay would overwrite)."""
    from ..target import CUDATarget
    if opts.cuda_graphs is False or not isinstance(target, CUDATarget) or grad:
        return False
    return torch.cuda.is_available()


MAX_ROUNDS = 3
"""Partitions tried per graph: each round leaves the anchors torch runs faster to torch, so that their
epilogues and prologues can still be fused into elementwise or reduction groups."""


def _choose(gm: fx.GraphModule, target: Any, opts: Options, records: _Records, excluded: dict[fx.Node, str]
            ) -> tuple[list[Candidate], dict[fx.Node, str], dict[fx.Node, str]]:
    """One round: partition (without ``excluded``), import, build, check and decide. Returns the chosen
    groups, the operations left with their reasons, and the anchors of groups that did not import,
    build or win but fused more than their anchor (with the reason): without them, the next round may
    fuse the rest."""
    vector = vector_wanted(opts, target)
    imported, left, rejected = extract(gm, target, excluded, opts.pack_weights, merge_elementwise=vector)
    chosen: list[Candidate] = []
    built = build_groups([imp.func for _, imp in imported], target, records, vector=vector)
    for (g, imp), (kernel, origin) in zip(imported, built):
        if isinstance(kernel, PolytileError):
            first = str(kernel).strip().splitlines()[0] if str(kernel).strip() else type(kernel).__name__
            for n in _ops_of(g):
                left[n] = f"polytile could not build the group: {first}"
            if g.anchor is not None and len(_ops_of(g)) > 1:
                rejected[g.anchor] = left[g.anchor]
            continue
        shapes = [tuple(meta(n).shape[d] for d in order) for n, order in zip(imp.outputs, imp.out_orders)]
        written = [tuple(int(d.value) for d in t.shape) for t in imp.func.outputs]  # a product's, with its epilogue
        cand = Candidate(g, imp, KernelCall(kernel, call_adapters(imp.adapters), written, imp.out_orders, shapes),
                         origin)
        decision = _decide(cand, opts, target, records)
        cand.polytile_s, cand.torch_s = decision.polytile_s, decision.torch_s
        if decision.keep:
            chosen.append(cand)
            continue
        for n in _ops_of(g):
            left[n] = decision.reason
        anchor = g.anchor
        if anchor is not None and len(_ops_of(g)) > 1:
            rejected[anchor] = decision.reason
    return chosen, left, rejected


def vector_wanted(opts: Options, target: Any) -> bool:
    """Whether elementwise groups take 16-byte vector schedules and merge (``Options.vector_elementwise``):
    on CUDA targets, when turned on."""
    return _on(opts.vector_elementwise, VECTOR_ELEMENTWISE) and target.kind == "cuda"


VECTOR_ELEMENTWISE = True
"""``Options.vector_elementwise=None`` means this. On: ResNet-50 fp16 channels-last on an H200 (2026-11-29,
``benchmarks/models.py --torch-convs``, same rounds) batch 32 2.52 -> 1.85 ms, batch 1 0.61 -> 0.59 ms
(``models-20261129-044050-gpu.json``, ``…-044301-gpu.json``)."""
CUDNN_FUSION = True
"""``Options.cudnn_fusion=None`` means this. On: the same runs, ResNet-50 batch 32 2.52 -> 1.64 ms (1.63 with
``vector_elementwise`` too; inductor reduce-overhead 1.88), batch 1 0.61 -> 0.58 ms (0.56 both; inductor 0.62)."""


def _on(option: bool | None, default: bool) -> bool:
    return default if option is None else option


def vectorizes(func: Any) -> bool:
    """Whether ``Knobs.vector`` may change the default schedule of an imported group: elementwise and
    reduction groups (a product's or convolution's keeps its library schedule, built once for both)."""
    return group_info(func).kind in ("elementwise", "reduce")


def _us(s: float | None) -> float | None:
    return None if s is None else s * 1e6


def _ops_of(g: Group) -> list[fx.Node]:
    return [n for n in g.nodes if node_kind(n) not in ("view", "getitem")]


def _graph_outputs(gm: fx.GraphModule) -> set[fx.Node]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return set(out.all_input_nodes)


def _key(imp: Imported) -> str:
    from ..tune import Workload
    return Workload(imp.func.name, (), imp.func).key


# --- building -----------------------------------------------------------------------------------------------

class _Records:
    """The best records of one file for one target, read once per compiled graph."""

    def __init__(self, best: dict[str, Any], path: str | None):
        self.best = best
        self.path = path

    @staticmethod
    def load(path: str | Path | None, target: Any, report: Report) -> _Records:
        if path is None:
            return _Records({}, None)
        from ..tune import RecordLog
        best: dict[str, Any] = {}
        others: set[str] = set()
        for rec in RecordLog(path):
            if rec.target != target.key:
                others.add(rec.target)
            elif rec.ok and (rec.workload not in best or rec.cost < best[rec.workload].cost):
                best[rec.workload] = rec
        if not best and others:
            note = (f"records file {path} holds tuning records for {', '.join(sorted(others))} only, not for "
                    f"this target ({target.key}): every group uses its default schedule; tune on this machine "
                    "(`polytile tune-model`) to use records here")
            warnings.warn(note, stacklevel=3)
            report.notes.append(note)
        return _Records(best, str(path))


def template_name(target: Any) -> str:
    return f"torch_group_{target.kind}"


def build_groups(funcs: list[Any], target: Any, records: _Records | None = None, vector: bool = False
                 ) -> list[tuple[Any, str]]:
    """The kernel of each imported group's Func (or the ``PolytileError`` that stopped it) and its
    schedule's origin: the best recorded configuration when the records have one for this workload and
    target ("tuned"), else the default schedule ("default"). Kernels are kept per process, and the
    groups of repeated layers are scheduled once; the new ones are compiled in parallel
    (``_build_schedules``). ``vector``: default schedules with ``Knobs.vector`` (``Options.vector_elementwise``)."""
    plans: list[tuple[Any, str, tuple[str, str, str]] | PolytileError] = []
    planned: set[tuple[str, str, str]] = set()
    for func in funcs:
        try:
            plans.append(_schedule_of(func, target, records, lambda key: key in _KERNELS or key in planned, vector))
        except PolytileError as err:
            plans.append(err)
            continue
        planned.add(plans[-1][2])  # type: ignore[index]
    todo = {p[2]: p[0] for p in plans if not isinstance(p, PolytileError) and p[0] is not None}
    for key, kernel in zip(todo, _build_schedules(list(todo.values()), target)):
        if not isinstance(kernel, PolytileError):
            _KERNELS[key] = kernel
        else:
            todo[key] = kernel
    out: list[tuple[Any, str]] = []
    for p in plans:
        if isinstance(p, PolytileError):
            out.append((p, ""))
        else:
            out.append((_KERNELS.get(p[2], todo.get(p[2])), p[1]))
    return out


def _schedule_of(func: Any, target: Any, records: _Records | None, have: Callable[[tuple[str, str, str]], bool],
                 vector: bool = False) -> tuple[Any, str, tuple[str, str, str]]:
    """The schedule of ``func`` (None when ``have`` says its kernel is built or scheduled already), its
    origin and the kernel's cache key."""
    key = _func_key(func)
    if records is not None and records.best:
        from ..tune import make_task
        task = make_task(func, target, template=template_name(target))
        rec = records.best.get(task.key)
        if rec is not None:
            cache_key = (key, target.key, repr(sorted(rec.config.items())))
            return (None if have(cache_key) else task.schedule(rec.config)), "tuned", cache_key
    vector = vector and vectorizes(func)
    cache_key = (key, target.key, "default-vector" if vector else "default")
    knobs = Knobs(vector=True) if vector else None
    return (None if have(cache_key) else schedule_group(func, target, knobs)), "default", cache_key


def _build_schedules(scheds: list[Any], target: Any) -> list[Any]:
    """Build each schedule (a ``PolytileError`` in place of a kernel that failed). Lowering holds the isl
    context: one schedule at a time; the compiler (the C++ compiler, or nvcc) then runs in threads, one
    per core, into its cache, where making each kernel finds the compiled code. On a GPU machine nvcc
    takes seconds per group: a model's dozens of groups would otherwise compile one by one."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from ..build import build_lowered
    from ..lowering.pipeline import lower
    lowered: list[Any] = []
    for sched in scheds:  # lowering and code generation: one at a time
        try:
            low = lower(sched, target)
            lowered.append((low, _source(low, target)))
        except PolytileError as err:
            lowered.append(err)
    sources = list(dict.fromkeys(x[1] for x in lowered if not isinstance(x, PolytileError)))
    with ThreadPoolExecutor(max_workers=max(1, min(len(sources), os.cpu_count() or 1))) as pool:
        failed = dict(zip(sources, pool.map(functools.partial(_try_compile, target=target), sources)))
    out = []
    for sched, x in zip(scheds, lowered):
        if isinstance(x, PolytileError) or failed[x[1]] is not None:
            out.append(x if isinstance(x, PolytileError) else failed[x[1]])
            continue
        try:
            out.append(build_lowered(sched, x[0], target))  # its code is in the compiler's cache now
        except PolytileError as err:
            out.append(err)
    return out


def _source(lowered: Any, target: Any) -> str:
    if target.kind == "cpu":
        from ..codegen.cpu import cpu_source
        return cpu_source(lowered)
    from ..codegen.cuda import cuda_source
    from ..runtime.cuda import index32_ok
    return cuda_source(lowered, index32_ok(lowered))[0]


def _try_compile(source: str, target: Any) -> PolytileError | None:
    """Compile ``source`` into the compiler's cache (what stopped it, else None)."""
    from ..runtime import cpu, cuda
    try:
        if target.kind == "cpu":
            cpu.compile_shared(source)
        else:
            cuda.compile_cuda(source, target.arch)
    except PolytileError as err:
        return err
    return None


def _func_key(func: Any) -> str:
    from ..tune import Workload
    return Workload(func.name, (), func).key


# --- checking and measuring beside torch ------------------------------------------------------------------

def _decide(c: Candidate, opts: Options, target: Any, records: _Records) -> _Decision:
    imp = c.imported
    dkey = (_key(imp), tuple(c.group.ops), tuple(a for a in imp.adapters), target.key, records.path,
            opts.choose, tuple(tuple(meta(n).stride()) for n in imp.inputs),
            vector_wanted(opts, target) and vectorizes(imp.func))
    if dkey in _DECISIONS:
        return _DECISIONS[dkey]
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily(), torch.no_grad():
        d = _check_and_time(c, opts, target)
    _DECISIONS[dkey] = d
    return d


def _check_and_time(c: Candidate, opts: Options, target: Any) -> _Decision:
    """Run the group's kernel and torch's operations on the same random inputs: differ → torch keeps the
    group (with a warning: a polytile bug); else time both."""
    imp = c.imported
    sub, copied = _subgraph(c.group, imp)
    inputs = [_random_like(meta(n)) for n in imp.inputs]
    try:
        ours = _as_list(c.call(*inputs))
    except PolytileError as err:
        return _Decision(False, f"the polytile kernel failed on example inputs: {err}", None, None)

    def torch_inputs(xs: list[torch.Tensor]) -> list[torch.Tensor]:  # with the weights' channels-last copies
        return [*xs, *(to_channels_last(xs[k]) for k in copied)]

    theirs_in = torch_inputs(inputs)
    theirs = _as_list(sub(*theirs_in))
    exact = _as_list(sub(*torch_inputs([x.double() if x.dtype.is_floating_point else x for x in inputs])))
    info = group_info(imp.func)
    for k, (o, t, r) in enumerate(zip(ours, theirs, exact)):
        err, torch_err = _rel_error(o, r), _rel_error(t, r)
        tol = max(_tolerance(t.dtype, info.reduction_length), 4 * torch_err)
        if not err <= tol:
            msg = (f"polytile's result {k} differs from the exact one (relative error {err:.2e} > {tol:.1e}; "
                   f"torch's: {torch_err:.1e}) on {' + '.join(c.group.ops)}")
            warnings.warn(f"polytile backend: {msg}; the group runs in torch", stacklevel=4)
            return _Decision(False, msg, None, None)
    if opts.choose == "always":
        return _Decision(True, "", None, None)
    pt_s, torch_s = _time_pair(lambda: c.call(*inputs), lambda: sub(*theirs_in), target.kind == "cuda", opts)
    if pt_s < torch_s:
        return _Decision(True, "", pt_s, torch_s)
    return _Decision(False, f"torch is faster ({torch_s * 1e6:.1f} µs vs polytile {pt_s * 1e6:.1f} µs, "
                            f"{c.schedule} schedule)", pt_s, torch_s)


def _as_list(x: Any) -> list[torch.Tensor]:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _subgraph(g: Group, imp: Imported) -> tuple[fx.GraphModule, list[int]]:
    """torch's own computation of a group: its nodes copied into a graph of their own, whose inputs are
    the group's and then the channels-last copies of weights its convolutions read in torch (converted
    once per compiled graph, so not timed); with, for each such copy, the input it copies."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for k, n in enumerate(imp.inputs):
        env[n] = graph.placeholder(f"in{k}")
    copies = [x for n in g.nodes for x in n.all_input_nodes if is_weight_copy(x)]
    copies = list(dict.fromkeys(copies))
    for k, x in enumerate(copies):
        env[x] = graph.placeholder(f"channels_last{k}")
    for n in g.nodes:
        env[n] = graph.node_copy(n, lambda x: env[x])
    graph.output(tuple(env[n] for n in imp.outputs))
    return fx.GraphModule(torch.nn.Module(), graph), [imp.inputs.index(weight_source(x)) for x in copies]


def _random_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor of ``t``'s shape, strides, dtype and device with random values (never zeros)."""
    span = sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0) + 1
    device = t.device
    if t.dtype == torch.bool:
        base = torch.rand(span, device=device) < 0.5
    elif t.dtype.is_floating_point:
        base = (torch.rand(span, device=device) * 2 - 1).to(t.dtype)
    else:
        base = torch.randint(1, 8, (span,), device=device).to(t.dtype)
    return torch.as_strided(base, tuple(t.shape), tuple(t.stride()))


def _rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    if out.shape != ref.shape:
        return math.inf
    if not out.dtype.is_floating_point:
        return 0.0 if torch.equal(out.cpu(), ref.to(out.dtype).cpu()) else math.inf
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    finite = torch.isfinite(r)  # where torch's result is NaN or infinite (random inputs: sqrt of -1), any
    o, r = o[finite], r[finite]
    if not bool(torch.isfinite(o).all()):
        return math.inf
    den = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(o - r).item()
    return num / den if den > 0 else num


def _tolerance(dtype: torch.dtype, reduction: int) -> float:
    """The error a result may show against the float64 one: ``dtypes.tolerance`` with a margin (the
    float64 reference rounds its inputs' products exactly; ill-conditioned random inputs — a root of a
    mean near zero — also loosen the check through torch's own error, see ``_check_and_time``)."""
    from ..dtypes import tolerance
    name = str(dtype).removeprefix("torch.")
    if name == "bool" or not dtype.is_floating_point:
        return 0.0
    return 2 * tolerance(name, reduction)


GRAPH_CALLS = 10  # calls of each side captured in one CUDA graph for timing


def _time_pair(ours: Callable[[], Any], theirs: Callable[[], Any], cuda: bool, opts: Options) -> tuple[float, float]:
    """Median time of one call of each, measured in interleaved rounds. On a GPU, kernel-only: each side's
    calls are captured in a CUDA graph whose replays are timed by CUDA events, so that neither side's host
    time counts (a compiled model replays as one CUDA graph; timed as enqueued from Python, torch's
    ``addmm + _to_copy + mul`` of BERT-base b1 measured 109 µs for 7 µs of kernels, its host time)."""
    for fn in (ours, theirs):
        fn()
    per = 1
    if cuda:
        graphs = _captured((ours, theirs), GRAPH_CALLS)
        if graphs is not None:  # otherwise (a side that cannot be captured) both timed as enqueued
            (ours, theirs), per = graphs, GRAPH_CALLS
    timer = _cuda_time if cuda else _cpu_time
    calls = max(1, min(1000, int(opts.min_time / max(timer(ours, 1), timer(theirs, 1), 1e-7))))
    a, b = [], []
    for _ in range(opts.rounds):
        a.append(timer(ours, calls))
        b.append(timer(theirs, calls))
    return statistics.median(a) / per, statistics.median(b) / per


def _captured(fns: tuple[Callable[[], Any], ...], calls: int) -> list[Callable[[], Any]] | None:
    """For each of ``fns``, the replay of a CUDA graph of ``calls`` calls of it (None if one cannot be
    captured: it synchronizes, or runs on another stream)."""
    replays = []
    for fn in fns:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    fn()
        except (RuntimeError, PolytileError):
            torch.cuda.synchronize()
            return None
        replays.append(graph.replay)
    return replays


def _cpu_time(fn: Callable[[], Any], calls: int) -> float:
    """Time of one call: with one torch thread, the process's CPU time (on a shared machine wall time
    mostly measures the other processes, which made the choice close to random for groups near even;
    polytile's own threads, where it runs more, count too: the choice errs towards torch), else wall
    time (several threads: CPU time would not be the latency)."""
    clock = time.process_time if torch.get_num_threads() == 1 else time.perf_counter
    t0 = clock()
    for _ in range(calls):
        fn()
    return (clock() - t0) / calls


def _cuda_time(fn: Callable[[], Any], calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


# --- rewriting the graph ------------------------------------------------------------------------------------

class _CycleError(PolytileError):
    pass


def _rewrite(gm: fx.GraphModule, chosen: list[Candidate]) -> fx.GraphModule:
    """``gm`` with each chosen group replaced by one call of its kernel, in an order that respects every
    dependence (a group's call comes after all its inputs; views of its results stay in torch)."""
    nodes = list(gm.graph.nodes)
    order = {n: k for k, n in enumerate(nodes)}
    unit_of: dict[fx.Node, Any] = {}
    for c in chosen:
        members = set(c.group.nodes)
        in_torch: set[fx.Node] = set()  # views torch computes too: read outside, or by such a view
        for n in reversed(c.group.nodes):
            if node_kind(n) == "view" and any(u not in members or u in in_torch for u in n.users):
                in_torch.add(n)
        for n in c.group.nodes:
            if n not in in_torch:
                unit_of[n] = c
    units: list[Any] = [c for c in chosen] + [n for n in nodes if n not in unit_of]
    deps: dict[int, set[int]] = {}
    index = {id(u): k for k, u in enumerate(units)}

    def unit(n: fx.Node) -> int:
        return index[id(unit_of.get(n, n))]

    for k, u in enumerate(units):
        ins = u.imported.inputs if isinstance(u, Candidate) else u.all_input_nodes
        deps[k] = {unit(x) for x in ins} - {k}
    users: dict[int, list[int]] = {k: [] for k in range(len(units))}
    for k, ds in deps.items():
        for d in ds:
            users[d].append(k)
    first = [min(order[n] for n in u.group.nodes) if isinstance(u, Candidate) else order[u] for u in units]
    waiting = {k: len(ds) for k, ds in deps.items()}
    ready = [(first[k], k) for k, w in waiting.items() if w == 0]
    heapq.heapify(ready)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    emitted = 0
    while ready:
        _, k = heapq.heappop(ready)
        u = units[k]
        emitted += 1
        if isinstance(u, Candidate):
            _emit_call(graph, u, env, emitted)
        else:
            env[u] = graph.node_copy(u, lambda x: env[x])
        for v in users[k]:
            waiting[v] -= 1
            if waiting[v] == 0:
                heapq.heappush(ready, (first[v], v))
    if emitted != len(units):
        raise _CycleError("the groups chosen for polytile would form a cycle in the graph")
    graph.lint()
    return fx.GraphModule(gm, graph)


def _emit_call(graph: fx.Graph, c: Candidate, env: dict[fx.Node, fx.Node], serial: int) -> None:
    call = c.call

    def run(*tensors: torch.Tensor) -> Any:
        return call(*tensors)

    run.__name__ = f"polytile_{c.group.kind}_{serial}"
    node = graph.call_function(run, tuple(env[x] for x in c.imported.inputs))
    outs = c.imported.outputs
    if len(outs) == 1:
        env[outs[0]] = node
    else:
        for k, n in enumerate(outs):
            env[n] = graph.call_function(operator.getitem, (node, k))

