"""Schedules of imported groups for the CPU and CUDA: the defaults, and the same recipes with the
parameters the tuning templates choose (``polytile.torch.templates``).

A group's Func carries a ``GroupInfo`` (its attribute ``torch_group``): the kind and name of each
anchor stage and what its schedule needs (sizes, operand layouts), so that a schedule — in this
process or in a tuning worker that unpickled the Func — knows the structure without re-deriving it.

Anchors that are operators of ``polytile.ops`` get that library's recipes: a matrix product the
BLIS-shaped CPU schedule (``ops.matmul.schedule_gemm_cpu``) or the CUDA GEMMs
(``ops.gpu_schedules``: tensor cores / warpgroup MMA for 16-bit operands, B row-major or transposed;
CUDA cores otherwise), a convolution the direct-convolution schedules of ``ops.conv2d``. Everything else gets
a generic schedule: elementwise stages run their rows in parallel and vectorize the last dimension
(CPU) or run one thread per element (CUDA); reductions over rows follow ``ops.softmax`` /
``ops.layernorm``: on the CPU the row's stages share one parallel row loop, on CUDA one block per
row reduces the row across its threads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..intrinsics import MMA_M16N8K16
from ..lang.func import Func
from ..lang.tensor import ComputeTensor
from ..schedule.state import Schedule
from ..target import CPUTarget, CUDATarget


@dataclass(frozen=True)
class StageInfo:
    kind: str  # "gemm", "conv", "reduce" or "partial" (vector partial results of a reduction)
    name: str  # the computation's name in the Func
    info: tuple[tuple[str, Any], ...] = ()

    def __getitem__(self, key: str) -> Any:
        return dict(self.info)[key]


@dataclass(frozen=True)
class GroupInfo:
    """The structure of an imported group's Func: kind, anchor stages, output computations."""

    kind: str
    stages: tuple[StageInfo, ...] = ()
    outputs: tuple[str, ...] = ()
    reduction_length: int = 1

    def of_kind(self, kind: str) -> list[StageInfo]:
        return [s for s in self.stages if s.kind == kind]


def group_info(func: Func) -> GroupInfo:
    info = getattr(func, "torch_group", None)
    if not isinstance(info, GroupInfo):
        raise TypeError(f"Func {func.name} was not imported from torch (it has no group description)")
    return info


@dataclass
class Knobs:
    """The tunable parameters of a group's schedule (None: the default)."""

    gemm_tiles: dict[str, int] | None = None  # CPU: mc, nc, kc, mr, nr (lanes from the target)
    gemm_cuda: dict[str, int] | None = None  # CUDA cores: bm, bn, bk, tm, tn
    conv_tiles: tuple[int, int] | None = None  # CPU: output channels × columns per register tile
    lanes_factor: int = 1  # elementwise and row stages: vectors per inner step (CPU)
    parallel: bool = True
    threads: int | None = None  # CUDA: threads per block (elementwise) or per row (reductions)
    vector: bool = False  # CUDA: an elementwise stage's thread computes 16 bytes of it (vector loads and stores)


def schedule_group(func: Func, target: CPUTarget | CUDATarget, knobs: Knobs | None = None) -> Schedule:
    """The schedule of an imported group's ``func`` on ``target`` (the default one without ``knobs``)."""
    g = group_info(func)
    k = knobs or Knobs()
    sched = Schedule(func)
    cuda = target.kind == "cuda"
    anchors = {s.name for s in g.stages}
    if g.kind == "reduce" and rowwise(func, g):
        (_rows_cuda if cuda else _rows_cpu)(sched, func, g, target, k)
        return sched
    for st in g.stages:
        if st.kind == "gemm":
            (_gemm_cuda if cuda else _gemm_cpu)(sched, st, target, k)
        elif st.kind == "conv":
            _conv(sched, st, target, k)
        elif st.kind == "reduce":  # vector partial results ("partial") keep their own loop order
            _elementwise(sched, _tensor(func, st.name), target, k)
    for name in g.outputs:
        if name not in anchors:
            _elementwise(sched, _tensor(func, name), target, k)
    return sched


def _tensor(func: Func, name: str) -> ComputeTensor:
    return func.tensor(name)  # type: ignore[return-value]


# --- matrix products and convolutions (polytile.ops) --------------------------------------------------

def _gemm_cpu(sched: Schedule, st: StageInfo, target: CPUTarget, k: Knobs) -> None:
    from ..ops.matmul import cpu_gemm_tiles, schedule_dot_cpu, schedule_gemm_cpu
    if st["dot"]:  # a linear layer's few rows: dot products over K (``ops.dense``'s form)
        tiles = gemm_dot_tiles(st, target)
        if k.gemm_tiles:
            tiles.update(mr=k.gemm_tiles["mr"], nj=k.gemm_tiles["nr"] // tiles["lanes"])
        schedule_dot_cpu(sched, st.name, {**tiles, "parallel": tiles["parallel"] if k.parallel else None})
        return
    whole_k = sched.computation(st.name).finished  # an epilogue applies to complete sums: K in one block
    tiles = cpu_gemm_tiles(st["M"], st["N"], st["K"], target, 4, whole_k=whole_k)
    if k.gemm_tiles:
        tiles.update(k.gemm_tiles)
    if whole_k:
        tiles["kc"] = st["K"]
    if st["b_block"]:  # B comes packed in the panels the schedule would copy it into
        tiles["pack_b"] = False
    schedule_gemm_cpu(sched, st.name, "A", "B", tiles, b_transposed=st["b_transposed"],
                      batch="bb" if st["batch"] is not None else None)
    if not k.parallel:
        sched[st.name].tag("bb" if st["batch"] is not None else "ic", "serial")


def gemm_dot_tiles(st: StageInfo, target: CPUTarget) -> dict[str, Any]:
    """The dot-product tiles of a GEMM stage the importer wrote as dot products (``ops.matmul.cpu_dot_tiles``;
    the importer decided by the vector lanes alone, which fit the target's)."""
    from ..ops.matmul import cpu_dot_tiles
    tiles = cpu_dot_tiles(st["M"], st["N"], st["K"], target, 4)
    assert tiles is not None, "the importer wrote dot products the target's tiles do not take"
    return tiles


def gemm_cuda_kernel(func: Func, st: StageInfo, target: CUDATarget) -> str:
    """The kernel of a GEMM stage's default CUDA schedule: the operator library's choice
    (``ops.gpu_schedules.gemm_choice``, unsplit: "wgmma", "mma", "gemv" or, opted in, "gemv_mma") for
    16-bit operands on tensor-core targets — B row-major or transposed (a linear layer's weight, read
    K-major by the tensor cores), except on the GEMV kernels, which stream row-major B — else "cuda"
    (the CUDA cores' ``gemm_cuda``)."""
    from ..ops import gpu_schedules as gs
    dtype = func.tensor("A").dtype
    if st["a_broadcast"] or st["b_broadcast"] or dtype.name not in MMA_M16N8K16.operand_dtypes \
            or not target.has("mma.sync"):
        return "cuda"
    kernel = gs.gemm_choice(target, st["M"], st["N"], st["K"], dtype, batch=st["batch"] or 1, split_k=1,
                            out_bytes=func.tensor("C").dtype.itemsize).kernel
    return "cuda" if kernel in ("gemv", "gemv_mma") and st["b_transposed"] else kernel


def _gemm_cuda(sched: Schedule, st: StageInfo, target: CUDATarget, k: Knobs) -> None:
    from ..ops import gpu_schedules as gs
    if k.gemm_cuda is None and gemm_cuda_kernel(sched.func, st, target) != "cuda":
        # the operator library's choice of kernel and tile, unsplit: a split of K would restructure the
        # algorithm into partial products and lose the group's prologue and epilogue
        if st["batch"] is None:
            gs.matmul(sched, target, st["M"], st["N"], st["K"], split_k=1)
        else:
            gs.batch_matmul(sched, target, st["batch"], st["M"], st["N"], st["K"], split_k=1)
        return
    gs.gemm_cuda(sched, st.name, "A", "B", b_transposed=st["b_transposed"],
                 batch="bb" if st["batch"] is not None else None, **(k.gemm_cuda or {}))


def _conv(sched: Schedule, st: StageInfo, target: CPUTarget | CUDATarget, k: Knobs) -> None:
    if target.kind == "cuda":
        from ..ops import gpu_schedules as gs
        gs.conv2d(sched, target, *(st[n] for n in ("N", "C", "H", "W", "K", "R", "S", "stride", "padding",
                                                   "dilation")))
        return
    from ..ops.conv import conv_out, schedule_conv2d_cpu, schedule_conv2d_default_cpu
    Q = conv_out(st["W"], st["S"], st["stride"], st["padding"], st["dilation"])
    pack_w = not st["w_block"]  # else the weights come packed in the default schedule's blocks of filters
    if k.conv_tiles is None:
        schedule_conv2d_default_cpu(sched, target, st["K"], Q, st["R"] * st["S"], st["stride"], has_pad=st["has_pad"],
                                    pack_w=pack_w)
        return
    k_tile, q_tile = k.conv_tiles
    schedule_conv2d_cpu(sched, target, st["K"], Q, has_pad=st["has_pad"], k_tile=k_tile, q_tile=q_tile, pack_w=pack_w)


# --- elementwise stages ----------------------------------------------------------------------------------

VECTOR_BYTES = 16
"""Bytes of an elementwise stage a CUDA thread computes with ``Knobs.vector``: one 16-byte access per tensor."""


def shape_of(t: ComputeTensor) -> list[int]:
    return [int(d.value) for d in t.shape]  # type: ignore[attr-defined]


def _names(t: ComputeTensor) -> list[str]:
    return [str(a.name) for a in t.axes]


def _fuse_all(sched: Schedule, t: ComputeTensor, names: list[str], fused: str) -> str:
    """Fuse the nested loops ``names`` of ``t`` into one loop ``fused`` (the one loop if there is one)."""
    if len(names) == 1:
        return names[0]
    st = sched[t.name]
    cur = names[0]
    for n, nxt in enumerate(names[1:]):
        name = fused if n == len(names) - 2 else f"{fused}{n}"
        st.fuse(cur, nxt, name)
        cur = name
    return cur


def _elementwise(sched: Schedule, t: ComputeTensor, target: CPUTarget | CUDATarget, k: Knobs) -> None:
    names, shape = _names(t), shape_of(t)
    st = sched[t.name]
    if target.kind == "cuda":
        loop = _fuse_all(sched, t, names, "e")
        lanes = VECTOR_BYTES // t.dtype.itemsize
        if k.vector and t.reduction is None and lanes > 1 and math.prod(shape) % lanes == 0:
            # whole vectors only (no guard inside one): lowering's vector_lanes pass turns them into 16-byte
            # loads and stores where the indices allow (a channels-last activation and its per-channel values);
            # a reduction's sums stay one per thread (n of them in a row would be n serial reductions)
            st.split(loop, lanes, "ev_o", "ev").vectorize("ev")
            loop = "ev_o"
        st.split(loop, k.threads or 256, "eb", "et").bind("eb", "blockIdx.x").bind("et", "threadIdx.x")
        return
    width = target.vector_lanes(4) * k.lanes_factor
    inner = inner_dims(shape, width)
    rows = _fuse_all(sched, t, names[:-inner], "rows") if len(names) > inner else None
    last = _fuse_all(sched, t, names[-inner:], "cols")
    cols = math.prod(shape[-inner:])
    if cols >= width:
        # no ``separate`` here: the full tiles of one statement are isolated per kernel, and a
        # convolution's register tiles (3×3 on 14×14: 13 + 1 columns) lost theirs to the epilogue's
        # (accumulators in memory, 0.46× torch); GCC vectorizes this loop and its tail
        st.split(last, width, f"{last}_o", f"{last}_v").vectorize(f"{last}_v")
    outer = rows if rows is not None else (f"{last}_o" if cols >= width else None)
    if outer is not None and k.parallel:
        st.parallel(outer)


def inner_dims(shape: list[int], width: int) -> int:
    """How many trailing dimensions of an elementwise stage of ``shape`` form its vectorized inner loop:
    the last one, or with the ones before it as few as make at least ``width`` elements (a convolution's
    7×7 to 28×28 maps, whose rows are shorter than a vector or not a multiple of it, vectorize over the
    whole map; the loops outside — the channels — then hold what is constant along a map, a batch
    norm's per-channel values, out of the vector loop)."""
    n, size = 1, shape[-1] if shape else 1
    while size < width and n < len(shape):
        n += 1
        size *= shape[-n]
    return n


# --- row reductions (the structure of ops.softmax and ops.layernorm) -----------------------------------

def rowwise(func: Func, g: GroupInfo) -> bool:
    """Whether every stage of a reduction group iterates over the same rows with one reduced dimension:
    the stages can then share the row loop."""
    red = g.of_kind("reduce")
    rows = {st["rows"] for st in red}
    if not red or len(rows) != 1 or any(len(st["cols"]) != 1 for st in red):
        return False
    row_shape = list(next(iter(rows)))
    return all(shape_of(_tensor(func, n))[:len(row_shape)] == row_shape
               and len(shape_of(_tensor(func, n))) in (len(row_shape), len(row_shape) + 1) for n in g.outputs)


def _row_stages(func: Func, g: GroupInfo) -> tuple[list[ComputeTensor], list[ComputeTensor], int]:
    red = [_tensor(func, st.name) for st in g.of_kind("reduce")]
    names = {t.name for t in red}
    outs = [_tensor(func, n) for n in g.outputs if n not in names]
    return red, outs, len(red[0].axes)


def _rows_cpu(sched: Schedule, func: Func, g: GroupInfo, target: CPUTarget, k: Knobs) -> None:
    red, outs, nrows = _row_stages(func, g)
    width = target.vector_lanes(4) * k.lanes_factor
    stages = [_tensor(func, s.name) for s in g.stages if s.kind in ("reduce", "partial")]
    row = _fuse_all(sched, stages[0], _names(stages[0])[:nrows], "i")
    for t in [*stages[1:], *outs]:
        _fuse_all(sched, t, _names(t)[:nrows], "i")
    for s in g.of_kind("partial"):  # the lanes innermost: one vector of partial results per step
        t = _tensor(func, s.name)
        lane, chunk = _names(t)[-1], str(t.reduction.axes[0].name)  # type: ignore[union-attr]
        sched[t.name].reorder(row, chunk, lane).vectorize(lane)
    first = prev = sched[stages[0].name]
    for t in [*stages[1:], *outs]:
        st = sched[t.name]
        st.after(prev, row)
        prev = st
    for t in outs:
        names = _names(t)
        if len(names) > nrows and shape_of(t)[-1] >= width:
            sched[t.name].split(names[-1], width, "jo", "jv").vectorize("jv")
    if k.parallel:
        first.parallel(row)


def _rows_cuda(sched: Schedule, func: Func, g: GroupInfo, target: CUDATarget, k: Knobs) -> None:
    red, outs, nrows = _row_stages(func, g)
    cols = g.of_kind("reduce")[0]["cols"][0]
    nt = k.threads or (32 if cols <= 2048 else 128)
    row = _fuse_all(sched, red[0], _names(red[0])[:nrows], "i")
    for t in [*red[1:], *outs]:
        _fuse_all(sched, t, _names(t)[:nrows], "i")
    prev = None
    for t in red:
        st = sched[t.name]
        axis = str(t.reduction.axes[0].name)  # type: ignore[union-attr]
        st.reassociate().split(axis, nt, f"{axis}o", f"{axis}t").reorder(row, f"{axis}t", f"{axis}o")
        st.bind(f"{axis}t", "threadIdx.x")
        if prev is None:
            st.bind(row, "blockIdx.x")
        else:
            st.after(prev, row)
        prev = st
    for t in outs:
        names = _names(t)
        st = sched[t.name]
        if len(names) > nrows:
            st.split(names[-1], nt, "jo", "jt").reorder(row, "jt", "jo").bind("jt", "threadIdx.x")
        st.after(prev, row)
        prev = st
    for t in red:
        sched[t.name].store_at(row).set_loc("shared")
