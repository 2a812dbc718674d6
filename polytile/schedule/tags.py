"""Loop annotations: parallel, vectorize, unroll, and GPU block/thread bindings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ScheduleError
from .transaction import transactional

if TYPE_CHECKING:
    from .state import Stage


@transactional
def tag(self: Stage, loop: str, kind: str) -> Stage:
    """Annotate ``loop``: "parallel" (OpenMP), "vectorize" (SIMD), "unroll", "serial", or a GPU
    binding "blockIdx.x/y/z", "threadIdx.x/y/z". Parallel kinds are checked against dependences."""
    from .state import LOOP_TAGS, PARALLEL_TAGS
    if kind not in LOOP_TAGS:
        raise ScheduleError(f"unknown loop tag {kind!r} for loop {loop} of {self.name}; "
                            f"use one of {', '.join(LOOP_TAGS)}")
    st = self.schedule.state_copy(self.name)
    st.loops.index(loop)
    if (kind.startswith(("blockIdx", "threadIdx")) or kind == "vectorize") and kind in st.tags.values():
        other = next(lp for lp, t in st.tags.items() if t == kind)
        raise ScheduleError(f"loop {other} of {self.name} is already {kind}; a computation has one such loop")
    st.tags[loop] = kind
    old = self.schedule.states[self.name]
    self.schedule.states[self.name] = st
    try:
        if kind in PARALLEL_TAGS:
            self.schedule.check_parallel(self.name, loop, kind, self.schedule.stage_schedules())
    finally:
        self.schedule.states[self.name] = old
    self.schedule.commit(self.name, st)
    return self


def parallel(self: Stage, loop: str) -> Stage:
    """Run the iterations of ``loop`` on several CPU threads (OpenMP)."""
    return tag(self, loop, "parallel")


def vectorize(self: Stage, loop: str) -> Stage:
    """Run ``loop`` as SIMD operations (its extent, where constant, is the vector length)."""
    return tag(self, loop, "vectorize")


def unroll(self: Stage, loop: str) -> Stage:
    """Unroll ``loop`` completely where its extent is constant (up to ``MAX_UNROLL`` iterations). The
    loops left inside unrolled loops are copied with them: a schedule whose copies hold more than
    ``MAX_UNROLLED_LOOPS`` loops is refused (``polytile.schedule.unrolling``)."""
    return tag(self, loop, "unroll")


def bind(self: Stage, loop: str, thread_axis: str) -> Stage:
    """Map ``loop`` onto a GPU grid or block dimension ("blockIdx.x", "threadIdx.y", …)."""
    if not thread_axis.startswith(("blockIdx.", "threadIdx.")):
        raise ScheduleError(f"bind of {self.name}: {thread_axis!r} is not blockIdx.x/y/z or threadIdx.x/y/z")
    return tag(self, loop, thread_axis)


@transactional
def raster(self: Stage, group: int) -> Stage:
    """Launch the blocks of this computation's loops bound to blockIdx.y (rows of blocks) and
    blockIdx.x (columns) in groups of ``group`` rows: the launch order runs down the ``group`` rows
    of a group one column after the other, then on to the next group (the last group may be
    shorter). A wave of resident blocks then reads ``group`` row tiles of one operand and few
    column tiles of the other, which stay in L2, where row by row it would read a tile of every
    column (Triton's GROUP_M, CUTLASS's threadblock swizzle). The grid becomes one-dimensional
    along x (rows × columns blocks; blockIdx.z unchanged). Blocks are independent (their binding
    is checked), so any order computes the same result; ``group=1`` is the row-by-row order."""
    if not isinstance(group, int) or isinstance(group, bool) or group < 1:
        raise ScheduleError(f"raster of {self.name}: group must be a positive integer (rows of blocks), got {group!r}")
    st = self.schedule.state_copy(self.name)
    bound = set(st.tags.values())
    missing = [axis for axis in ("blockIdx.y", "blockIdx.x") if axis not in bound]
    if missing:
        raise ScheduleError(f"raster of {self.name}: it orders the blocks of the loops bound to blockIdx.y and "
                            f"blockIdx.x; bind a loop to {' and '.join(missing)} first")
    st.raster = group
    self.schedule.commit(self.name, st)
    return self


@transactional
def persistent(self: Stage, blocks_per_sm: int = 1) -> Stage:
    """Run the blocks of this computation's loops bound to blockIdx as persistent blocks: the grid
    is ``blocks_per_sm`` blocks per multiprocessor of the target (the blocks an SM holds at once;
    fewer where there are fewer tiles), and
    each block loops over the tiles (the block loops' iterations) from its own index in steps of
    the grid, in the launch order the tiles would have had (row by row, or grouped by ``raster``).
    A pipelined loop inside carries its state across the tiles (``lowering/passes/pipeline.py``:
    TMA rings initialized once, their phases counted over all the block's iterations)."""
    if not isinstance(blocks_per_sm, int) or isinstance(blocks_per_sm, bool) or blocks_per_sm < 1:
        raise ScheduleError(f"persistent of {self.name}: blocks_per_sm must be a positive integer, got "
                            f"{blocks_per_sm!r}")
    st = self.schedule.state_copy(self.name)
    if not any(t.startswith("blockIdx") for t in st.tags.values()):
        raise ScheduleError(f"persistent of {self.name}: it loops over the tiles of the loops bound to blockIdx; "
                            "bind a loop to blockIdx.x first")
    st.persistent = blocks_per_sm
    self.schedule.commit(self.name, st)
    return self


@transactional
def cluster(self: Stage) -> Stage:
    """Run the threads along ``threadIdx.z`` of this computation's kernel as the blocks of a
    thread-block cluster (sm_90: the target's ``clusters``), one block for each value of the loops
    bound to threadIdx.z, the kernel's block then being the threads along x and y: a block of the
    schedule larger than a multiprocessor holds. Its reductions across threadIdx.z combine the
    blocks' partial results through distributed shared memory (``lowering/passes/allreduce.py``);
    statements outside the threads' loops (the reductions' totals, statistics in shared memory) run
    in every block of the cluster, on its own copy; a buffer in shared or global memory that one
    block writes inside a loop bound to threadIdx.z is not read by the others (refused:
    ``lowering/passes/kernels.py``). The grid's x dimension is the cluster's blocks (the kernel's
    loops bound to blockIdx.x have one block): bind the blocks to blockIdx.y and blockIdx.z. The
    kernel is known by this computation's loops bound to blockIdx or threadIdx.z: mark each computation
    of the kernel that has such loops."""
    st = self.schedule.state_copy(self.name)
    bound = set(st.tags.values())
    if not any(t.startswith("blockIdx") or t == "threadIdx.z" for t in bound):
        raise ScheduleError(f"cluster of {self.name}: it spreads a kernel's threadIdx.z over the blocks of a cluster; "
                            "bind a loop of it to blockIdx.y or threadIdx.z first")
    if "blockIdx.x" in bound:
        raise ScheduleError(f"cluster of {self.name}: the cluster's blocks take the grid's x dimension; bind the "
                            "loop bound to blockIdx.x to blockIdx.y or blockIdx.z instead")
    st.cluster = True
    self.schedule.commit(self.name, st)
    return self


def _tile_store_state(self: Stage, primitive: str, verb: str, done: str):  # noqa: ANN202 - a StageState
    """A copy of this stage's state for a store of its blocks' tiles (``tma_store``, ``staged_store``):
    ScheduleError unless a loop is bound to blockIdx and the computation is an output."""
    st = self.schedule.state_copy(self.name)
    if not any(t.startswith("blockIdx") for t in st.tags.values()):
        raise ScheduleError(f"{primitive} of {self.name}: it {verb} the tiles of blocks; bind a loop to blockIdx.x "
                            "first")
    if self.name not in {o.name for o in self.schedule.func.outputs}:
        raise ScheduleError(f"{primitive} of {self.name}: only an output of the function is {done}")
    return st


@transactional
def tma_store(self: Stage) -> Stage:
    """Write this computation's results with TMA stores (sm_90): each block stages its tile in shared
    memory and one thread copies it to the tensor with ``cp.async.bulk.tensor``, which clips the
    tile at the tensor's end (``lowering/passes/tma_store.py``: the write-back must fill one box of
    at most 256 × 256 elements whose rows are whole 16 bytes; the tensor's rows too)."""
    st = _tile_store_state(self, "tma_store", "stores", "stored by TMA")
    if st.staged_store:
        raise ScheduleError(f"tma_store of {self.name}: its tiles are already staged for the threads (staged_store); "
                            "use one of them")
    st.tma_store = True
    self.schedule.commit(self.name, st)
    return self


@transactional
def staged_store(self: Stage, overlay: bool = False) -> Stage:
    """Write this computation's results through shared memory: each block stages its tile there and its
    threads copy the tile to the tensor row by row, consecutive threads on consecutive elements, those
    inside the tensor (``lowering/passes/staged_stores.py``: the write-back must fill one box). For
    16-bit results in rows only 2-byte aligned, whose accumulators a warp otherwise stores 8 rows an
    instruction. ``overlay``: the staging tile in the storage of a shared buffer of the kernel that
    no statement uses after the write-back begins (a product's operand tiles), where one is large
    enough and the block does not loop over tiles; its own shared memory otherwise."""
    st = _tile_store_state(self, "staged_store", "stages", "staged")
    if st.tma_store:
        raise ScheduleError(f"staged_store of {self.name}: its tiles are already written by TMA (tma_store); "
                            "use one of them")
    st.staged_store = True
    st.staged_overlay = bool(overlay)
    self.schedule.commit(self.name, st)
    return self
