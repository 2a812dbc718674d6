"""Load–compute pipelining (ALCOP §III) of the buffers a schedule marked with ``pipeline``.

For a buffer X filled by a copy at the top of a sequential loop L and read by the rest of L's body:

* X is enlarged ×S (one slot per stage) and allocated outside L;
* a prologue issues the copies of the first S−1 iterations;
* iteration ``ko`` first waits for its own copy (``cp.async.wait_group S−2``) and a barrier, then
  issues the copy of iteration ``ko + S − 1`` into the slot iteration ``ko − 1`` just released, and
  computes from slot ``(ko − lo) mod S``.

Copies from global to shared memory become ``cp.async`` (16 bytes where the copy is vectorized;
zero-filling copies of whole tiles use its source-size operand; 2-byte copies stay synchronous);
register-level buffers (copies from shared memory into registers) are double-buffered the same way
without asynchronous copies or barriers. A register pipeline inside a shared-memory pipeline is
fused with it (ALCOP Fig. 3d): the last step of the inner loop waits for the next shared tile and
loads its first fragments, so the inner prologue runs inside the outer loop, overlapped with the
last products of the current tile; when that is not possible (an odd number of inner steps) the
inner prologue stays right after the outer wait.

Buffers asked with ``producer="tma"`` are filled by the tensor memory accelerator instead
(``passes/tma.py`` proves the copy is one TMA does): one thread (the block's first) issues bulk
tensor copies that complete on the slot's *full* mbarrier, armed with the slot's byte count
(``mbarrier.arrive.expect_tx``); iteration ``ko`` waits for the phase ``(ko − lo) / S`` of its
slot's full barrier (``mbarrier.try_wait.parity``) instead of a commit group and a barrier, and once
its MMA groups that read a slot have completed each warp arrives on that slot's *empty* mbarrier,
on which the issuing thread waits before it refills the slot. The prologue and the distance ahead
are the same as with cp.async.

In a persistent kernel (``Stage.persistent``: a loop over each block's tiles around the pipelined
loop) a TMA ring is initialized once, before the tiles, and its uses are counted over all the
block's iterations (tile × iterations + iteration), so the slots and the parities of their phases
continue across tiles instead of restarting (``TmaRing.uses_before``); the copies past a tile's end
load the next tile's first iterations. The threads' copies wait at a barrier before a tile's prologue.

Asynchronous consumers (wgmma groups) may be left running across iterations (``inflight`` groups,
asked with ``pipeline(..., inflight=1)``): their ``wgmma.wait_group 0`` becomes ``wait_group
inflight``, the copies run S−1−inflight iterations ahead — so that the slot refilled at iteration
``ko`` is the one the group of ``ko − 1 − inflight`` read, already complete — and the groups still
running after the loop are waited for before the accumulators are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ... import dtypes
from ...errors import LoweringError
from ...intrinsics import instruction
from ...schedule.pipeline import Producer
from .. import loopir as ir
from .barriers import SYNC, thread_dependent_vars
from .kernels import TILE_LOOP, thread_var
from .simplify import simplify_expr
from .tma import TmaTile, tile_loads, tma_tile

COMMIT = ir.call_stmt("pt_cp_async_commit")


def _wait(n: int) -> ir.Stmt:
    return ir.call_stmt("pt_cp_async_wait", ir.const(max(0, n), dtypes.int32))


def _peel_allocates(st: ir.Stmt) -> tuple[list[ir.Buffer], ir.Stmt]:
    bufs: list[ir.Buffer] = []
    while isinstance(st, ir.Allocate):
        bufs.append(st.buffer)
        st = st.body
    return bufs, st


def _stores_to(st: ir.Stmt) -> set[str]:
    """The buffers ``st`` writes: stores, and the fragments ``ldmatrix`` fills (its first argument)."""
    out = {x.buffer.name for x in ir.walk_stmt(st) if isinstance(x, ir.Store)}
    for x in ir.walk_stmt(st):
        if isinstance(x, ir.Evaluate) and getattr(instruction(x.call.name), "loads_fragment", False):
            dst = x.call.args[0]
            assert isinstance(dst, ir.Load)
            out.add(dst.buffer.name)
    return out


def _reads(st: ir.Stmt) -> set[str]:
    return {e.buffer.name for e in ir.all_exprs(st) if isinstance(e, ir.Load)}


class _Reslot(ir.Mutator):
    """Accesses of the pipelined buffers get a leading slot index; copies into shared memory from
    global memory become asynchronous copies."""

    def __init__(self, enlarged: dict[str, ir.Buffer], slot: ir.Expr, async_copy: bool):
        self.enlarged, self.slot, self.async_copy = enlarged, slot, async_copy

    def visit_Load(self, e: ir.Load) -> ir.Expr:
        idx = tuple(self.expr(i) for i in e.index)
        if e.buffer.name in self.enlarged:
            return ir.Load(self.enlarged[e.buffer.name], (self.slot, *idx))
        return ir.Load(e.buffer, idx)

    def visit_Store(self, s: ir.Store) -> ir.Stmt:
        idx = tuple(self.expr(i) for i in s.index)
        value = self.expr(s.value)
        if s.buffer.name not in self.enlarged:
            return ir.Store(s.buffer, idx, value)
        buf = self.enlarged[s.buffer.name]
        dst = ir.Load(buf, (self.slot, *idx))
        nbytes = max(value.lanes, dst.index[0].lanes) * buf.dtype.itemsize
        if self.async_copy and nbytes in (4, 8, 16):
            if isinstance(value, ir.Load) and value.buffer.scope in ("arg", "global"):
                return ir.call_stmt("pt_cp_async", dst, value)
            if isinstance(value, ir.Select) and isinstance(value.a, ir.Load) and value.a.buffer.scope in (
                    "arg", "global") and isinstance(value.b, ir.Const) and value.b.value == 0:
                return ir.call_stmt("pt_cp_async_zfill", dst, value.a, value.cond)  # zeros past the tensor's end
        return ir.Store(buf, (self.slot, *idx), value)


@dataclass
class _Piped:
    """One pipelined loop, kept in pieces so that an outer pipeline can fuse with it."""

    loop: ir.For
    stages: int
    producers: list[ir.Stmt]
    consumers: list[ir.Stmt]
    allocs: list[ir.Buffer]
    enlarged: dict[str, ir.Buffer]
    async_copy: bool
    inflight: int = 0  # asynchronous MMA groups left running across iterations
    tma: TmaRing | None = None  # filled by TMA copies on an mbarrier ring (None: the threads' copies)
    tiles: ir.Var | None = None  # inside a persistent block's loop over its tiles: that loop's variable

    @property
    def ahead(self) -> int:
        """How many iterations ahead the copies run."""
        return self.stages - 1 - self.inflight

    @property
    def rel(self) -> ir.Expr:
        return ir.BinOp("-", self.loop.var, self.loop.lo)

    @property
    def end(self) -> ir.Expr:
        return ir.BinOp("+", self.loop.lo, self.loop.extent)

    def produce(self, iteration: ir.Expr, slot: ir.Expr) -> ir.Stmt:
        if self.tma is not None:
            return self.tma.produce(self.enlarged, {self.loop.var.name: iteration}, slot)
        moved = [ir.substitute(p, {self.loop.var.name: iteration}) for p in self.producers]
        return _Reslot(self.enlarged, slot, self.async_copy).stmt(ir.block(moved))  # type: ignore[arg-type]

    def prologue(self) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        for s in range(self.ahead):
            it = ir.BinOp("+", self.loop.lo, ir.const(s))
            out.append(ir.If(ir.Cmp("<", it, self.end), self.produce(it, ir.const(s))))
            if self.async_copy and self.tma is None:
                out.append(COMMIT)
        return out

    def issue(self) -> ir.Stmt:
        """The copy of iteration ``i + A`` (A = S − 1 − inflight) into the slot that iteration
        ``i − 1 − inflight`` released."""
        S, A = self.stages, self.ahead
        ahead = ir.BinOp("+", self.loop.var, ir.const(A))
        slot = ir.BinOp("%", ir.BinOp("+", self.rel, ir.const(A)), ir.const(S))
        return ir.If(ir.Cmp("<", ahead, self.end), self.produce(ahead, slot))

    def compute(self, slot: ir.Expr | None = None) -> ir.Stmt:
        slot = ir.BinOp("%", self.rel, ir.const(self.stages)) if slot is None else slot
        body = _Reslot(self.enlarged, slot, False).stmt(ir.block(self.consumers))
        if self.inflight:
            body = _in_flight(body, self.inflight)
        return body

    def wrap(self, st: ir.Stmt, allocs: list[ir.Buffer] | None = None) -> ir.Stmt:
        for b in reversed(self.allocs if allocs is None else allocs):
            st = ir.Allocate(self.enlarged.get(b.name, b), st)
        return st

    def enter(self) -> list[ir.Stmt]:
        """What a tile of a persistent block does before its prologue refills the slots with the
        threads' copies: wait until every warp has read the last tile's (TMA rings wait on their
        empty barriers instead)."""
        return [SYNC] if self.tiles is not None and self.async_copy else []

    def stmt(self) -> ir.Stmt:
        if self.tma is not None:
            return self.tma_stmt(self.tma)
        if self.async_copy:
            body = [_wait(self.ahead - 1), SYNC, self.issue(), COMMIT, self.compute()]
            after = [_wait(0)]
        else:
            body, after = [self.issue(), self.compute()], []
        if self.inflight:
            after.insert(0, ir.call_stmt("pt_wgmma_wait", ir.const(0, dtypes.int32)))
        return self.wrap(ir.block([*self.enter(), *self.prologue(), replace(self.loop, body=ir.block(body)),
                                   *after]))


    def tma_stmt(self, ring: TmaRing) -> ir.Stmt:
        """The loop with TMA copies on full/empty mbarrier rings (module docstring); specialized, the
        consumers' loop, the producer's left in ``ring`` for the kernel (``_specialize``). In a
        persistent block the ring lives across its tiles: uses are counted from the block's first
        tile (``ring.uses_before``), so slots and phases continue where the last tile left them, the
        prologue waits for the slots it refills to be released, and the slots of the MMA groups
        still in flight at a tile's end are released after them; where the copies' boxes follow
        from the tile's leading lets (``ring.prefetch``), the copies past a tile's last iteration
        load the first iterations of the block's next tile and only the first tile has a
        prologue."""
        S, A, n = self.stages, self.ahead, self.inflight
        rel = self.rel
        base = ring.uses_before(self.loop)
        use = ir.BinOp("+", base, rel) if base is not None else rel  # the slot's use, counted over the block

        def released(it: ir.Expr) -> ir.Stmt:
            at = ir.BinOp("+", base, it) if base is not None else it
            return ir.If(ring.lane0(), ring.arrive(ring.empty, ir.BinOp("%", at, ir.const(S))))

        release = released(ir.BinOp("-", rel, ir.const(n)) if n else rel)
        if n:
            release = ir.If(ir.Cmp(">=", rel, ir.const(n)), release)
        consume = [ring.wait(ring.full, ir.BinOp("%", use, ir.const(S)),
                             ir.BinOp("%", ir.BinOp("div", use, ir.const(S)), ir.const(2))),
                   self.compute(ir.BinOp("%", use, ir.const(S))), release]
        after = [ir.call_stmt("pt_wgmma_wait", ir.const(0, dtypes.int32))] if n else []
        if base is not None:  # the last n uses of the tile, released once their groups completed
            for j in range(n):
                last = ir.BinOp("-", self.loop.extent, ir.const(n - j))
                after.append(ir.If(ir.Cmp(">=", last, ir.const(0)), released(last)))
        if ring.producer is not None:
            refill = ir.block([
                ir.If(ir.Cmp(">=", rel, ir.const(S)),  # refilled: wait until the slot's last readers released it
                      ring.wait(ring.empty, ir.BinOp("%", rel, ir.const(S)),
                                ir.BinOp("%", ir.BinOp("+", ir.BinOp("div", rel, ir.const(S)), ir.const(1)),
                                         ir.const(2)))),
                self.produce(self.loop.var, ir.BinOp("%", rel, ir.const(S)))])
            ring.loop = replace(self.loop, body=refill)
            ring.buffers = [self.enlarged[b.name] for b in self.allocs if b.name in self.enlarged]
            ring.stages = S
            others = [b for b in self.allocs if b.name not in self.enlarged]
            return self.wrap(ir.block([replace(self.loop, body=ir.block(consume)), *after]), others)
        def refill(it: ir.Expr, at: dict[str, ir.Expr] | None = None) -> ir.Stmt:
            """The copy of iteration ``it`` (relative to the loop's start) into its slot, once the
            slot's last readers released it; ``at``: the iteration and tile it copies, when another
            (a persistent block's next tile)."""
            u = ir.BinOp("+", use, it)
            iteration = ir.BinOp("+", self.loop.var, it)
            wait = ir.If(ir.Cmp(">=", u, ir.const(S)),
                         ring.wait(ring.empty, ir.BinOp("%", u, ir.const(S)),
                                   ir.BinOp("%", ir.BinOp("+", ir.BinOp("div", u, ir.const(S)), ir.const(1)),
                                            ir.const(2))))
            if at is not None:
                fill = ring.produce(self.enlarged, at, ir.BinOp("%", u, ir.const(S)))
            else:
                fill = self.produce(iteration, ir.BinOp("%", u, ir.const(S)))
            return ir.block([wait, fill])

        ahead = ir.BinOp("+", self.loop.var, ir.const(A))
        refill_ahead: ir.Stmt = ir.If(ir.Cmp("<", ahead, self.end), refill(ir.const(A)))
        extent = simplify_expr(self.loop.extent)
        prefetch = ring.prefetch and isinstance(extent, ir.Const) and int(extent.value) >= A
        if prefetch:
            # the last A iterations load the first A of the block's next tile, if it has one: its
            # prologue then overlaps this tile's last products and its epilogue
            assert ring.persistent is not None
            count = ring.persistent
            there = {**count.following, self.loop.var.name: ir.BinOp("-", ahead, self.loop.extent)}
            has_next = ir.Cmp("<", ir.BinOp("+", count.step, ir.const(1)), count.trips)
            refill_ahead = ir.If(ir.Cmp("<", ahead, self.end), refill(ir.const(A)),
                                 ir.If(has_next, refill(ir.const(A), there)))
        loop = replace(self.loop, body=ir.block([ir.If(ring.leader(), refill_ahead), *consume]))
        if base is None:
            start = ir.block([ir.If(ring.leader(), ir.block([*ring.init(S), *self.prologue()])), SYNC])
            return self.wrap(ir.block([start, loop, *after]), [*self.allocs, ring.full, ring.empty])
        # persistent: the ring is initialized once before the tiles (``_Pipeline.visit_For``)
        first = {self.loop.var.name: self.loop.lo}
        prologue: ir.Stmt = ir.If(ring.leader(), ir.block([
            ir.If(ir.Cmp("<", ir.const(s), self.loop.extent), ir.substitute(refill(ir.const(s)), first))  # type: ignore[arg-type]
            for s in range(A)]))
        if prefetch:  # only the block's first tile loads its own first iterations
            assert ring.persistent is not None
            prologue = ir.If(ir.Cmp("==", ring.persistent.step, ir.const(0)), prologue)
        return self.wrap(ir.block([prologue, loop, *after]))


@dataclass
class TmaRing:
    """The TMA copies of one pipelined loop and its two rings of mbarriers (one per slot): *full*,
    completed by the copies' bytes, and *empty*, completed when every warp released the slot."""

    tiles: list[TmaTile]
    full: ir.Buffer
    empty: ir.Buffer
    threads: int
    tid: ir.Expr
    producer: Producer | None = None  # warp specialization: the producer warpgroup's registers
    loop: ir.For | None = None  # specialized: the producer's loop of copies, placed by ``_specialize``
    buffers: list[ir.Buffer] = field(default_factory=list)  # specialized: the slots, allocated by the kernel
    stages: int = 0
    persistent: _TileCount | None = None  # in a persistent block: the loop over its tiles
    prefetch: bool = False  # persistent: the last iterations of a tile load the first ones of the next

    def uses_before(self, loop: ir.For) -> ir.Expr | None:
        """How many iterations of ``loop`` the block ran in its earlier tiles (persistent blocks;
        None: the kernel's blocks run one tile each)."""
        if self.persistent is None:
            return None
        return ir.BinOp("*", self.persistent.step, loop.extent)

    def leader(self) -> ir.Expr:
        return ir.Cmp("==", self.tid, ir.const(0))

    def lane0(self) -> ir.Expr:
        return ir.Cmp("==", ir.BinOp("mod", self.tid, ir.const(32)), ir.const(0))

    def init(self, stages: int) -> list[ir.Stmt]:
        out = []
        for s in range(stages):
            out.append(ir.call_stmt("pt_mbar_init", ir.Load(self.full, (ir.const(s),)), ir.const(1, dtypes.int32)))
            out.append(ir.call_stmt("pt_mbar_init", ir.Load(self.empty, (ir.const(s),)),
                                    ir.const(self.threads // 32, dtypes.int32)))
        return [*out, ir.call_stmt("pt_fence_mbar_init")]

    def wait(self, ring: ir.Buffer, slot: ir.Expr, parity: ir.Expr) -> ir.Stmt:
        return ir.call_stmt("pt_mbar_wait", ir.Load(ring, (slot,)), ir.Cast(dtypes.int32, parity))

    def arrive(self, ring: ir.Buffer, slot: ir.Expr) -> ir.Stmt:
        return ir.call_stmt("pt_mbar_arrive", ir.Load(ring, (slot,)))

    def produce(self, enlarged: dict[str, ir.Buffer], at: dict[str, ir.Expr], slot: ir.Expr) -> ir.Stmt:
        bar = ir.Load(self.full, (slot,))
        nbytes = sum(t.nbytes for t in self.tiles)
        loads = [st for t in self.tiles for st in tile_loads(t, enlarged[t.cache.name], slot, bar, at)]
        return ir.block([ir.call_stmt("pt_mbar_expect_tx", bar, ir.const(nbytes, dtypes.int32)), *loads])


def _in_flight(body: ir.Stmt, n: int) -> ir.Stmt:
    """The consumers' ``wgmma.wait_group 0`` as ``wait_group n``."""
    found = []

    def visit(st: ir.Stmt) -> ir.Stmt | None:
        if isinstance(st, ir.Evaluate) and st.call.name == "pt_wgmma_wait":
            found.append(st)
            return ir.call_stmt("pt_wgmma_wait", ir.const(n, dtypes.int32))
        return None
    out = ir.map_stmts(body, visit)
    if not found:
        raise LoweringError(f"pipeline with inflight={n}: the loop's consumers issue no asynchronous MMA groups "
                            "(wgmma) that could be left running")
    return out


def _split(loop: ir.For, body: ir.Stmt, stages: dict[str, int], inflight: dict[str, int],
           producer: dict[str, Producer], kernel: _KernelScope | None) -> _Piped | None:
    allocs, inner = _peel_allocates(body)
    piped = [b for b in allocs if b.name in stages]
    if not piped:
        return None
    counts = {stages[b.name] for b in piped}
    if len(counts) != 1:
        raise LoweringError(f"buffers {', '.join(b.name for b in piped)} of loop {loop.var.name} ask for different "
                            "numbers of stages; give them the same")
    S = counts.pop()
    if S == 1:
        return None
    shared = {b.scope for b in piped}
    if len(shared) != 1:
        raise LoweringError(f"loop {loop.var.name}: shared and register buffers cannot be pipelined in one loop")
    async_copy = shared.pop() == "shared"
    names = {b.name for b in piped}
    parts = list(inner.body) if isinstance(inner, ir.Block) else [inner]
    producers: list[ir.Stmt] = []
    k = 0
    while k < len(parts) and _stores_to(parts[k]) and _stores_to(parts[k]) <= names:
        producers.append(parts[k])
        k += 1
    consumers = parts[k:]
    if not producers:
        raise LoweringError(f"pipeline of {', '.join(sorted(names))}: the copy is not at the top of loop "
                            f"{loop.var.name}")
    if any(_stores_to(c) & names for c in consumers):
        raise LoweringError(f"pipeline of {', '.join(sorted(names))}: loop {loop.var.name} writes the buffer "
                            "after its copy; producer and consumers do not match")
    enlarged = {b.name: replace(b, shape=(ir.const(S), *b.shape)) for b in piped}
    lag = {inflight.get(b.name, 0) for b in piped}
    if len(lag) != 1:
        raise LoweringError(f"buffers {', '.join(b.name for b in piped)} of loop {loop.var.name} ask for different "
                            "numbers of groups in flight; give them the same")
    n = lag.pop()
    if n and S - 1 - n < 1:
        raise LoweringError(f"loop {loop.var.name}: {S} stages leave no slot to load ahead with {n} MMA groups in "
                            f"flight; use at least {n + 2} stages")
    kinds = {producer.get(b.name) for b in piped}
    if len(kinds) != 1:
        raise LoweringError(f"buffers {', '.join(b.name for b in piped)} of loop {loop.var.name} ask for different "
                            "producers (TMA or the threads' copies, specialized or not); give them the same")
    kind = kinds.pop()
    ring = _tma_ring(loop, piped, producers, kernel, S, kind) if kind is not None else None
    return _Piped(loop, S, producers, consumers, allocs, enlarged, async_copy, n, ring)


def _tma_ring(loop: ir.For, piped: list[ir.Buffer], producers: list[ir.Stmt], kernel: _KernelScope | None,
              stages: int, kind: Producer) -> TmaRing:
    names = ", ".join(b.name for b in piped)
    if kernel is None:
        raise LoweringError(f"pipeline of {names} with producer='tma': loop {loop.var.name} is not in a kernel")
    if kernel.tiles is not None and kind.specialize:
        raise LoweringError(f"pipeline of {names} with specialize=True in a persistent kernel: the producer "
                            "warpgroup does not loop over the tiles; use persistent blocks with one issuing thread "
                            "(specialize=False) or leave persistent off")
    if kernel.tiles is not None:
        varying = sorted({n.name for n in ir.walk_expr(loop.extent) if isinstance(n, ir.Var)} & kernel.tiles.defined)
        if varying:
            raise LoweringError(f"pipeline of {names} in a persistent kernel: loop {loop.var.name} runs a number of "
                                f"iterations that differs between tiles ({', '.join(varying)}); the ring's phases are "
                                "counted as tiles × iterations")
    if kernel.divergent:
        raise LoweringError(f"pipeline of {names} with producer='tma': loop {loop.var.name} runs under a condition "
                            f"on the threads ({kernel.divergent}); every warp of the block must run it, since each "
                            "releases the slots it read")
    threads = kernel.block[0] * kernel.block[1] * kernel.block[2]
    if threads % 32:
        raise LoweringError(f"pipeline of {names} with producer='tma': the block of {threads} threads is not "
                            "whole warps")
    tiles = []
    for b in piped:
        copy = [p for p in producers if b.name in _stores_to(p)]
        if len(copy) != 1:
            raise LoweringError(f"pipeline of {b.name} with producer='tma': {len(copy)} copies fill it; TMA "
                                "replaces one")
        tiles.append(tma_tile(copy[0], b, kernel.block, kernel.thread_vars))
    if kind.specialize and kernel.nested:
        raise LoweringError(f"pipeline of {names} with specialize=True: loop {loop.var.name} is inside another loop "
                            "or a condition of its kernel; a producer warpgroup runs a kernel's top-level loop only")
    first = piped[0].name
    ring = [ir.Buffer(f"{first}_{r}", dtypes.int64, (ir.const(stages),), "shared") for r in ("full", "empty")]
    return TmaRing(tiles, *ring, threads, kernel.tid, kind if kind.specialize else None, stages=stages,
                   persistent=kernel.tiles, prefetch=_prefetches(loop, tiles, kernel))


def _prefetches(loop: ir.For, tiles: list[TmaTile], kernel: _KernelScope) -> bool:
    """Whether the copies of a persistent block's next tile can be issued by the current one: the
    loop lies directly in the loop over the tiles (no condition could skip a tile the copies were
    issued for), and the boxes' origins depend on the loops' variables only through the tile's
    leading lets (``_TileCount.following``)."""
    count = kernel.tiles
    if count is None or kernel.nested != count.depth:
        return False
    used = {n.name for t in tiles for e in (t.row, t.col, *t.lead) for n in ir.walk_expr(e) if isinstance(n, ir.Var)}
    return not (used & count.defined) - set(count.following) - {loop.var.name}


@dataclass(frozen=True)
class _TileCount:
    """A persistent block's loop over its tiles: its variable (the tiles done before), the variables
    defined inside it (which differ between tiles), its leading lets as they are at the block's next
    tile (the tile index and the block coordinates made of it), its trip count, and the nesting depth
    of its body (a loop directly inside has it)."""

    step: ir.Var
    defined: frozenset[str]
    following: dict[str, ir.Expr]
    trips: ir.Expr
    depth: int

    @staticmethod
    def of(loop: ir.For, depth: int) -> _TileCount:
        defined = frozenset(x.var.name for x in ir.walk_stmt(loop) if isinstance(x, (ir.For, ir.LetStmt)))
        following: dict[str, ir.Expr] = {}
        st = loop.body
        nxt = {loop.var.name: ir.BinOp("+", loop.var, ir.const(1))}
        while isinstance(st, ir.LetStmt):
            following[st.var.name] = simplify_expr(ir.substitute(st.value, {**nxt, **following}))  # type: ignore[arg-type]
            st = st.body
        return _TileCount(loop.var, defined, following, loop.extent, depth)


@dataclass
class _KernelScope:
    """The kernel a loop is in: its block, its linear thread index, and the condition on the threads
    that the loop runs under (empty: every thread runs it)."""

    block: tuple[int, int, int]
    tid: ir.Expr
    thread_vars: frozenset[str] = frozenset()  # variables whose values differ between threads
    divergent: str = ""
    nested: int = 0  # loops and conditions around the statement being lowered
    rings: list[TmaRing] = field(default_factory=list)  # the TMA rings made in the kernel
    tiles: _TileCount | None = None  # inside a persistent block's loop over its tiles


def _fused(outer: _Piped, inner: _Piped) -> ir.Stmt | None:
    """Inner pipeline fusion (ALCOP Fig. 3d): the register-level pipeline inside a shared-memory one
    loads the first fragments of the next shared tile during the last step of the current one, so
    the wait for that tile (and its barrier) moves there, and the fragments live across the outer
    loop. Needs an even number of inner steps (the last step's fragments are in the other slot)."""
    ext = simplify_expr(inner.loop.extent)
    if inner.async_copy or not outer.async_copy or inner.stages != 2 or not isinstance(ext, ir.Const) or \
            int(ext.value) % 2 or outer.inflight or inner.inflight:
        return None
    S = outer.stages
    ko = outer.loop.var
    here = ir.BinOp("%", outer.rel, ir.const(S))
    after_here = ir.BinOp("%", ir.BinOp("+", outer.rel, ir.const(1)), ir.const(S))

    def inner_prologue(at: ir.Expr, slot: ir.Expr) -> ir.Stmt:
        moved = ir.substitute(ir.block(inner.prologue()), {ko.name: at})
        return _Reslot(outer.enlarged, slot, False).stmt(moved)  # type: ignore[arg-type]

    kk = inner.loop.var
    step_ahead = ir.BinOp("+", kk, ir.const(1))
    next_tile = ir.If(ir.Cmp("<", ir.BinOp("+", ko, ir.const(1)), outer.end),
                      ir.block([_wait(S - 2), SYNC, inner_prologue(ir.BinOp("+", ko, ir.const(1)), after_here)]))
    this_tile = _Reslot(outer.enlarged, here, False)
    inner_issue = this_tile.stmt(inner.produce(step_ahead, ir.BinOp("%", ir.BinOp("+", inner.rel, ir.const(1)),
                                                                            ir.const(2))))
    inner_body = ir.block([ir.If(ir.Cmp("<", step_ahead, inner.end), inner_issue, next_tile),
                           this_tile.stmt(inner.compute())])
    inner_loop = replace(inner.loop, body=inner_body)
    body = ir.block([outer.issue(), COMMIT, inner_loop])
    out: ir.Stmt = ir.block([*outer.enter(), *outer.prologue(), _wait(S - 2), SYNC,
                             inner_prologue(outer.loop.lo, ir.const(0)), replace(outer.loop, body=body), _wait(0)])
    return outer.wrap(inner.wrap(out))


class _Pipeline(ir.Mutator):
    def __init__(self, stages: dict[str, int], inflight: dict[str, int], producer: dict[str, Producer]):
        self.stages = stages
        self.inflight = inflight
        self.producer = producer
        self.kernel: _KernelScope | None = None
        # pipelined loops already transformed, by the id of their result; the result is kept with it, so
        # that its id cannot be reused by a later statement (ids of freed objects are, and a false match
        # fused the wrong loops: found by the exhaustive tuning run, 17 of 2706 convolutions)
        self.pieces: dict[int, tuple[ir.Stmt, _Piped]] = {}

    def visit_Kernel(self, s: ir.Kernel) -> ir.Stmt:
        outer = self.kernel
        divergent = thread_dependent_vars(s.body)
        self.kernel = scope = _KernelScope(s.block, _linear_thread(s.block), frozenset(divergent))
        try:
            body = self.stmt(s.body)
        finally:
            self.kernel = outer
        special = [r for r in scope.rings if r.producer is not None]
        if not special:
            return replace(s, body=body)
        if len(scope.rings) > 1:
            raise LoweringError(f"kernel {s.name}: a specialized TMA pipeline must be the kernel's only one "
                                f"({len(scope.rings)} loops are pipelined with TMA)")
        body, block = _specialize(s.name, body, special[0], s.block)
        return replace(s, body=body, block=block)

    def visit_If(self, s: ir.If) -> ir.Stmt:
        kernel = self.kernel
        if kernel is None:
            return self.default_stmt(s)
        thread = any(isinstance(n, ir.Var) and (n.name.startswith("threadIdx") or n.name in kernel.thread_vars)
                     for n in ir.walk_expr(s.cond))
        self.kernel = replace(kernel, divergent=kernel.divergent or (ir.expr_text(s.cond) if thread else ""),
                              nested=kernel.nested + 1)
        try:
            return self.default_stmt(s)
        finally:
            self.kernel = kernel

    def visit_For(self, s: ir.For) -> ir.Stmt:
        kernel = self.kernel
        if kernel is not None:
            tiles = kernel.tiles
            if s.kind == TILE_LOOP:
                tiles = _TileCount.of(s, kernel.nested + 1)
            self.kernel = replace(kernel, nested=kernel.nested + 1, tiles=tiles)
        try:
            body = self.stmt(s.body)
        finally:
            self.kernel = kernel
        if s.kind == TILE_LOOP and kernel is not None:
            return _rings_across_tiles(replace(s, body=body), [r for r in kernel.rings if r.persistent is not None
                                                               and r.persistent.step is s.var])
        if s.kind != "serial":
            return replace(s, body=body)
        piped = _split(s, body, self.stages, self.inflight, self.producer, self.kernel)
        if piped is not None and piped.tma is not None and self.kernel is not None:
            self.kernel.rings.append(piped.tma)
        if piped is None:
            return replace(s, body=body)
        piped.tiles = self.kernel.tiles.step if self.kernel is not None and self.kernel.tiles is not None else None
        inner = self.pieces.get(id(piped.consumers[0])) if len(piped.consumers) == 1 else None
        if inner is not None:
            fused = _fused(piped, inner[1])
            if fused is not None:
                return fused
        out = piped.stmt()
        self.pieces[id(out)] = (out, piped)
        return out


def _rings_across_tiles(loop: ir.For, rings: list[TmaRing]) -> ir.Stmt:
    """A persistent block's loop over its tiles with the TMA rings used inside it allocated and
    initialized once before it (their phases run on across the tiles)."""
    if not rings:
        return loop
    init = [st for r in rings for st in r.init(r.stages)[:-1]]
    out: ir.Stmt = ir.block([ir.If(rings[0].leader(), ir.block([*init, ir.call_stmt("pt_fence_mbar_init")])), SYNC,
                             loop])
    for r in reversed(rings):
        out = ir.Allocate(r.full, ir.Allocate(r.empty, out))
    return out


def _linear_thread(block: tuple[int, int, int]) -> ir.Expr:
    """The linear index of a thread in a block of ``block`` threads."""
    bx, by, _ = block
    tid: ir.Expr = ir.Cast(dtypes.INDEX, thread_var("threadIdx.x"))
    if block[1] > 1:
        tid = ir.BinOp("+", tid, ir.BinOp("*", ir.Cast(dtypes.INDEX, thread_var("threadIdx.y")), ir.const(bx)))
    if block[2] > 1:
        tid = ir.BinOp("+", tid, ir.BinOp("*", ir.Cast(dtypes.INDEX, thread_var("threadIdx.z")), ir.const(bx * by)))
    return tid


def pipeline_buffers(s: ir.Stmt, stages: dict[str, int], inflight: dict[str, int] | None = None,
                     producer: dict[str, Producer] | None = None) -> ir.Stmt:
    """Multi-buffer the requested buffers across the iterations of their load–use loops
    (``inflight``: asynchronous MMA groups left running, per buffer; ``producer``: "tma" for the
    buffers filled by TMA copies)."""
    if not stages:
        return s
    return _Pipeline(stages, inflight or {}, producer or {}).stmt(s)


REGISTERS = 64 * 1024  # 32-bit registers of an SM, shared by the warps of a block that fills it
PRODUCER_WARPS = 4  # the producer warpgroup
PRODUCER_REGISTERS = 40  # per producer thread, unless asked


def register_split(consumer_warps: int, asked: tuple[int, int] | None, where: str) -> tuple[int, int]:
    """(producer, consumer) registers per thread for a producer warpgroup beside ``consumer_warps``
    warps: as asked, or 40 and the most (a multiple of 8, at most 256) the consumers can have — never
    fewer than the kernel starts with (the SM's registers shared by all its threads, the cap that
    ``__launch_bounds__(threads, 1)`` sets), which ``setmaxnreg.inc`` cannot go below. A split above
    the SM's registers is refused: ``setmaxnreg.inc`` would wait forever."""
    producers, consumers = 32 * PRODUCER_WARPS, 32 * consumer_warps
    p, c = asked or (PRODUCER_REGISTERS, min(256, (REGISTERS - producers * PRODUCER_REGISTERS) // consumers // 8 * 8))
    total = producers * p + consumers * c
    if total > REGISTERS or c < 24:
        raise LoweringError(f"{where}: {producers} producer threads × {p} registers + {consumers} consumer threads × "
                            f"{c} = {total} registers, more than the {REGISTERS} of an SM: setmaxnreg would hang the "
                            "GPU; ask for fewer registers (pipeline(..., registers=(producer, consumer))) or fewer "
                            "consumer warps")
    return p, c


def _specialize(name: str, body: ir.Stmt, ring: TmaRing, block: tuple[int, int, int]
                ) -> tuple[ir.Stmt, tuple[int, int, int]]:
    """Warp specialization of kernel ``name``: after the kernel's leading lets, the slots and
    barriers are allocated and initialized for the whole block, then a producer warpgroup (four
    more warps, threadIdx.z from the consumers' count on) gives up registers and issues the copies
    from one thread, while the consumer warps take the registers and run the kernel's body."""
    where = f"kernel {name} with a specialized TMA pipeline"
    bx, by, warps = block
    if bx != 32 or by != 1:
        raise LoweringError(f"{where}: its warps must be numbered along threadIdx.z (block (32, 1, z)), got {block}")
    assert ring.producer is not None and ring.loop is not None
    p, c = register_split(warps, ring.producer.registers, where)
    lets: list[ir.LetStmt] = []
    rest = body
    while isinstance(rest, ir.LetStmt):
        lets.append(rest)
        rest = rest.body
    known = {let.var.name for let in lets} | {ring.loop.var.name}
    local = {st.var.name for st in ir.walk_stmt(rest) if isinstance(st, (ir.LetStmt, ir.For))}
    missing = sorted({n.name for n in ir.all_exprs(ring.loop) if isinstance(n, ir.Var)} & local - known)
    if missing:
        raise LoweringError(f"{where}: the copies use {', '.join(missing)}, defined inside the kernel's body; the "
                            "producer warpgroup sees the kernel's leading definitions only")
    z = ir.Cast(dtypes.INDEX, thread_var("threadIdx.z"))
    lane = ir.Cast(dtypes.INDEX, thread_var("threadIdx.x"))
    issuer = ir.Logic("&&", (ir.Cmp("==", z, ir.const(warps)), ir.Cmp("==", lane, ir.const(0))))
    producer = ir.block([ir.call_stmt("pt_setmaxnreg_dec", ir.const(p, dtypes.int32)), ir.If(issuer, ring.loop)])
    consumer = ir.block([ir.call_stmt("pt_setmaxnreg_inc", ir.const(c, dtypes.int32)), rest])
    out: ir.Stmt = ir.block([ir.If(ring.leader(), ir.block(ring.init(ring.stages))), SYNC,
                             ir.If(ir.Cmp(">=", z, ir.const(warps)), producer, consumer)])
    for b in reversed([*ring.buffers, ring.full, ring.empty]):
        out = ir.Allocate(b, out)
    for let in reversed(lets):
        out = replace(let, body=out)
    return out, (bx, by, warps + PRODUCER_WARPS)
