"""Static analysis of one kernel's schedule (CuAsmRL section 3, made conservative for Hopper).

From the disassembly and the control bits it finds: basic blocks; pinned instructions; which pairs
of neighbours must keep their order (register, memory and scoreboard dependences); and the
stall distance each fixed-latency producer needs before its consumers, inferred from the
compiler's own schedule (the minimum distance it used for that opcode) in a table that
microbenchmarked latencies may override.

The order rules are pairwise and checked only between neighbours, so every order reachable by
legal swaps keeps every dependence: two instructions that must stay ordered can never become
neighbours in the wrong order without one of them first crossing an instruction it depends on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from polytile.sass.cubin import NO_BARRIER, WORD_BYTES, Control, KernelText
from polytile.sass.disasm import SassInstruction
from polytile.sass.isa import (
    CONTROL_FLOW,
    SETTLING,
    Semantics,
    fixed_pipe,
    memory_conflict,
    semantics,
    unit_name,
)

START, END = -1, -2  # pseudo producer at a block's entry, pseudo consumer at its exit
DEFAULT_FIXED_LATENCY = 15  # cycles assumed for a fixed-latency opcode never seen inside a block
ASYNC_WINDOW = 32  # cycles kept around unguarded variable-latency reads and results
# Cycles from an instruction that sets a scoreboard to the first one that may wait on it: the set
# lands a cycle after issue, so a wait one cycle later sees the scoreboard clear and does not
# wait at all. ptxas never schedules a wait closer than 2 cycles to the set (in every sm_90 cubin
# looked at, 2 is also its most common distance), and a move that made it 1 broke a Triton
# kernel on an H100 (a load's deferred address read lost to the overwrite that waited for it).
SCOREBOARD_SETUP = 2
ACCESSES = ("read", "write")
_INDIRECT = {"CALL", "RET", "BRX", "BRXU", "JMX", "JMXU", "JMP"}


class _All:
    """Every register: the scoreboard state where control flow cannot be followed."""

    def __and__(self, other):
        return bool(other)

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __repr__(self) -> str:
        return "ALL"


ALL = _All()


@dataclass(frozen=True)
class Block:
    index: int
    start: int  # first instruction index
    end: int  # one past the last
    successors: tuple[int, ...]


@dataclass(frozen=True)
class DistanceRule:
    """Sum of stalls from `producer` up to (not including) `consumer` must stay >= `required`."""

    producer: int
    consumer: int
    required: int
    why: str


class KernelAnalysis:
    """Everything the schedule optimizer needs to know about one kernel, computed once."""

    def __init__(
        self,
        kernel: KernelText,
        instructions: list[SassInstruction],
        latency_overrides: dict[str, int] | None = None,
    ) -> None:
        if len(instructions) != len(kernel.words):
            raise ValueError(
                f"kernel {kernel.name!r}: {len(instructions)} instructions for {len(kernel.words)} words"
            )
        self.kernel = kernel
        self.name = kernel.name
        self.instructions = instructions
        self.controls = [Control.from_word(w) for w in kernel.words]
        self.semantics: list[Semantics] = [semantics(ins) for ins in instructions]
        self.pinned: dict[int, str] = {}
        for i, sem in enumerate(self.semantics):
            if sem.pinned:
                self.pinned[i] = sem.pinned
        for offset, reason in kernel.pinned.items():
            if offset // WORD_BYTES < len(instructions):
                self.pinned[offset // WORD_BYTES] = reason
        self.blocks, self.has_indirect_flow = self._find_blocks()
        self.block_of = [0] * len(instructions)
        for block in self.blocks:
            for i in range(block.start, block.end):
                self.block_of[i] = block.index
        self.movable = tuple(i for i, s in enumerate(self.semantics) if s.movable and i not in self.pinned)
        self._async_reads = self._find_async_reads()
        # A global-memory access whose sources are read unguarded (no read barrier) reads them some
        # time after issue, and how long the compiler counted on is not in the stall bits (waits and
        # queued memory instructions in between add slack): on an H100, moving such a load, or an
        # instruction out of the window between it and the overwrite of its sources, gave illegal
        # addresses with the cycle distance kept (Triton's layernorm). So those accesses stay, and
        # nothing leaves their windows. (Shared-memory and other unguarded reads keep the
        # distance rule: no failure seen in the GPU audits.)
        self._global_async = {i for i in self._async_reads if _global(self.semantics[i])}
        self.movable = tuple(i for i in self.movable if i not in self._global_async)
        self._async_overwriters = self._find_async_overwriters()
        self.guards = self._scoreboard_guards()
        self.counted_scoreboards = self._find_counted_scoreboards()
        self.latency_overrides = dict(latency_overrides or {})
        self.consumer_kinds = sorted({self.consumer_kind(i) for i in range(len(instructions))})
        self._block_pairs = [self._pairs(block) for block in self.blocks]
        self.latency = self._latency_table()
        self.settle = self._settle_table()
        self._live_in_need = self._live_in_needs()
        self.rules = self._distance_rules()

    # ---- instruction facts -------------------------------------------------------------------

    def barriers(self, i: int) -> set[int]:
        c = self.controls[i]
        out = set(c.waits)
        for b in (c.write_barrier, c.read_barrier):
            if b != NO_BARRIER:
                out.add(b)
        return out

    def scoreboard_waits(self, i: int) -> set[int]:
        """Scoreboards instruction `i` waits on: its wait mask, and the SB operand of a DEPBAR."""
        return set(self.controls[i].waits) | _depbar_scoreboards(self.instructions[i])

    def scoreboard_sets(self, i: int) -> set[int]:
        """Scoreboards instruction `i` sets (its write and read barriers)."""
        c = self.controls[i]
        return {b for b in (c.write_barrier, c.read_barrier) if b != NO_BARRIER}

    def _find_counted_scoreboards(self) -> set[int]:
        """Scoreboards some `DEPBAR.LE SBn, k` with k > 0 waits on: such a wait lets the last k
        operations stay pending, which assumes they complete in issue order, so the setters of
        these scoreboards keep their order."""
        counted = set()
        for ins in self.instructions:
            count = [op for op in ins.operands if re.fullmatch(r"0x[0-9a-f]+|\d+", op)]
            if not count or int(count[-1], 0) > 0:
                counted |= _depbar_scoreboards(ins)
        return counted

    def unguarded_result(self, i: int) -> bool:
        """A variable-latency result no scoreboard of its own tracks.

        The compiler then waits on a later instruction's scoreboard (shared-memory loads
        complete in order) or relies on timing; such an instruction keeps its order with every
        instruction that sets or waits on a scoreboard, and with its consumers' distances.
        """
        s, c = self.semantics[i], self.controls[i]
        return not s.fixed_latency and not s.pinned and bool(s.defs) and c.write_barrier == NO_BARRIER

    def _find_async_reads(self) -> set[int]:
        """Variable-latency readers without a read barrier whose sources something may overwrite later.

        Such a source is read some cycles after issue; the compiler leaves out the read barrier
        only when the overwrite comes late enough, so the distance to it must not shrink.
        """
        definers: dict[int, list[int]] = {}
        for j, sem in enumerate(self.semantics):
            for u in sem.defs:
                definers.setdefault(u, []).append(j)
        reach = self._reachable()
        out = set()
        for i, (s, c) in enumerate(zip(self.semantics, self.controls, strict=True)):
            if s.fixed_latency or s.pinned or c.read_barrier != NO_BARRIER or not s.uses:
                continue
            later = reach[self.block_of[i]]
            for u in s.uses:
                if any(
                    j > i and self.block_of[j] == self.block_of[i] or self.block_of[j] in later
                    for j in definers.get(u, ())
                ):
                    out.add(i)
                    break
        return out

    def _find_async_overwriters(self) -> set[int]:
        """Instructions of a block that overwrite a source of an earlier unguarded global access."""
        out = set()
        for m in self._global_async:
            uses = self.semantics[m].uses
            for j in range(m + 1, self.blocks[self.block_of[m]].end):
                if self.semantics[j].defs & uses:
                    out.add(j)
        return out

    def _reachable(self) -> list[set[int]]:
        """Blocks reachable from each block through at least one edge (all, with indirect flow)."""
        if self.has_indirect_flow:
            return [set(range(len(self.blocks))) for _ in self.blocks]
        out = []
        for block in self.blocks:
            seen: set[int] = set()
            work = list(block.successors)
            while work:
                k = work.pop()
                if k not in seen:
                    seen.add(k)
                    work.extend(self.blocks[k].successors)
            out.append(seen)
        return out

    def order_conflict(self, first: int, second: int) -> str | None:
        """Why `first` (now just before `second`) must stay before it, or None if they may swap."""
        if first in self.pinned or second in self.pinned:
            i = first if first in self.pinned else second
            return f"{self.instructions[i].opcode} is pinned ({self.pinned[i]})"
        a, b = self.semantics[first], self.semantics[second]
        shared = a.defs & (b.defs | b.uses) | a.uses & b.defs
        if shared:
            return f"register dependence on {unit_name(min(shared))}"
        if a.memory and b.memory and memory_conflict(a.memory, b.memory):
            return "memory accesses that may overlap"
        # Two instructions that only set the same scoreboard commute: the counter sees both
        # increments before any later wait, which waits for both (SCOREBOARD_SETUP rules cover
        # every setter since the last wait). A wait on it, or a counted DEPBAR that assumes
        # completion in issue order, keeps the order.
        common = self.barriers(first) & self.barriers(second)
        waited = set(self.controls[first].waits) | set(self.controls[second].waits)
        ordered = {sb for sb in common if sb in waited or sb in self.counted_scoreboards}
        if ordered:
            return f"both use scoreboard SB{min(ordered)}"
        for x, y in ((first, second), (second, first)):
            if self.unguarded_result(x) and self.barriers(y):
                return f"{self.instructions[x].opcode} completes unguarded; its wait is a later scoreboard's"
        if first in self._global_async:
            return f"{self.instructions[first].opcode} reads its sources unguarded: nothing may leave their window"
        if second in self._async_overwriters:
            return (f"{self.instructions[second].opcode} overwrites an unguarded load's source: nothing may leave "
                    "that window")
        guarded = self.guards.get(first)
        if guarded is not None and guarded & (b.defs | b.uses):
            return (
                f"{self.instructions[first].opcode} waits on a scoreboard that guards registers of the other"
            )
        return None

    # ---- blocks --------------------------------------------------------------------------------

    def _targets(self, i: int) -> list[int]:
        out = []
        for operand in self.instructions[i].operands:
            if operand.startswith("0x"):
                value = int(operand, 16)
                if value % WORD_BYTES == 0 and value // WORD_BYTES < len(self.instructions):
                    out.append(value // WORD_BYTES)
        return out

    def _find_blocks(self) -> tuple[list[Block], bool]:
        n = len(self.instructions)
        leaders = {0}
        indirect = False
        for i, ins in enumerate(self.instructions):
            if ins.base in CONTROL_FLOW:
                leaders.update(self._targets(i))
                if i + 1 < n:
                    leaders.add(i + 1)
            indirect |= ins.base in _INDIRECT
        for offset, reason in self.kernel.pinned.items():
            if "INDIRECT" in reason:
                leaders.add(offset // WORD_BYTES)
        starts = sorted(s for s in leaders if s < n)
        index_of = {s: k for k, s in enumerate(starts)}
        blocks = []
        for k, start in enumerate(starts):
            end = starts[k + 1] if k + 1 < len(starts) else n
            last = self.instructions[end - 1]
            succ: list[int] = []
            falls_through = end < n
            if last.base in CONTROL_FLOW:
                succ = [index_of[t] for t in self._targets(end - 1) if t in index_of]
                unconditional = last.predicate in ("", "@PT")
                if last.base in ("BRA", "EXIT", "RET", "BRX", "BRXU", "JMX", "JMXU", "JMP", "KILL", "RTT"):
                    falls_through = falls_through and not unconditional
            if falls_through:
                succ.append(k + 1)
            blocks.append(Block(k, start, end, tuple(sorted(set(succ)))))
        return blocks, indirect

    # ---- scoreboards ---------------------------------------------------------------------------

    def _transfer(self, i: int, state: list) -> None:
        c, s = self.controls[i], self.semantics[i]
        for b in c.waits:
            state[b] = frozenset()
        if c.write_barrier != NO_BARRIER:
            state[c.write_barrier] = state[c.write_barrier] | s.defs
        if c.read_barrier != NO_BARRIER:
            state[c.read_barrier] = state[c.read_barrier] | s.uses
        if self.unguarded_result(i):
            for b in range(6):
                state[b] = state[b] | s.defs

    def _scoreboard_guards(self) -> dict[int, frozenset | _All]:
        """For each instruction with a wait mask, the registers whose readiness that wait ensures."""
        top = [ALL] * 6
        entry: dict[int, list] = {}
        if self.blocks:
            entry[0] = [frozenset()] * 6
        if self.has_indirect_flow:
            entry = {b.index: list(top) for b in self.blocks}
        work = [b.index for b in self.blocks]
        preds_seen = {0}
        while work:
            k = work.pop(0)
            state = list(entry.get(k, top))
            block = self.blocks[k]
            for i in range(block.start, block.end):
                self._transfer(i, state)
            for succ in block.successors:
                preds_seen.add(succ)
                old = entry.get(succ)
                new = state if old is None else [o | n for o, n in zip(old, state, strict=True)]
                if old is None or any(_differs(o, n) for o, n in zip(old, new, strict=True)):
                    entry[succ] = new
                    if succ not in work:
                        work.append(succ)
        guards: dict[int, frozenset | _All] = {}
        for block in self.blocks:
            known = block.index in preds_seen and not self.has_indirect_flow
            state = list(entry.get(block.index, top)) if known else list(top)
            for i in range(block.start, block.end):
                waits = self.controls[i].waits
                if waits:
                    guarded = frozenset()
                    for b in waits:
                        guarded = guarded | state[b]
                    if guarded:
                        guards[i] = guarded
                self._transfer(i, state)
        return guards

    # ---- stall distances -----------------------------------------------------------------------

    def consumer_kind(self, i: int) -> str:
        """The kind of consumer in `latency_key`: "fixed:<pipe>" (a fixed-latency instruction on
        that pipe, `isa.fixed_pipe`), "memory" or "other"."""
        s = self.semantics[i]
        if s.fixed_latency:
            return "fixed:" + fixed_pipe(self.instructions[i])
        return "memory" if s.memory is not None else "other"

    def latency_key(self, producer: int, consumer: int, unit: int) -> tuple[str, str, str, str]:
        """What the distance from a fixed-latency result to its next user depends on.

        The producer's opcode (with modifiers), the kind of consumer, the register file of the
        unit (R, UR, P, UP) and whether the consumer reads it or only overwrites it. ptxas keeps
        13 cycles between an ISETP and the load its predicate guards but 2 before an ALU
        instruction reads that predicate, and more before a load overwrites an ALU result than
        before an ALU instruction reads it: one latency per opcode would take the smallest of
        these for all of them. Fixed-latency consumers are told apart by pipe: ptxas keeps IMAD ->
        IMAD.WIDE 4 cycles apart but IMAD -> IADD3 5, and 4 is too few for the IADD3 on an H100.
        """
        access = "read" if unit in self.semantics[consumer].uses else "write"
        return self.instructions[producer].opcode, self.consumer_kind(consumer), _register_file(unit), access

    def required_latency(self, producer: int, consumer: int, unit: int) -> int:
        """Cycles `consumer` must issue after `producer` when it reads or overwrites `unit`."""
        return self._latency(producer, self.latency_key(producer, consumer, unit))

    def _latency(self, producer: int, key: tuple[str, str, str, str]) -> int:
        """The latency table's value for `key`, DEFAULT_FIXED_LATENCY if the compiler never
        placed such a pair in a block. An override replaces only latencies to ALU consumers (what
        a microbenchmark of dependent instructions measures). A variable-latency result that no
        scoreboard tracks keeps ASYNC_WINDOW."""
        if not self.semantics[producer].fixed_latency:
            return ASYNC_WINDOW
        opcode, kind = key[0], key[1]
        for name in (opcode, opcode.split(".", 1)[0]):
            if kind.startswith("fixed") and name in self.latency_overrides:
                return self.latency_overrides[name]
        return self.latency.get(key, DEFAULT_FIXED_LATENCY)

    def _latencies_of(self, producer: int, unit: int) -> dict[tuple[str, str], int]:
        """The latency of `producer`'s result in `unit` for each (consumer kind, access): a
        consumer in another block is not known where the producer's rules are made."""
        opcode, file = self.instructions[producer].opcode, _register_file(unit)
        return {
            (kind, access): self._latency(producer, (opcode, kind, file, access))
            for kind in self.consumer_kinds
            for access in ACCESSES
        }

    def _timed_producer(self, i: int) -> bool:
        s = self.semantics[i]
        return bool(s.defs) and (s.fixed_latency or self.unguarded_result(i))

    def _pairs(self, block: Block):
        """(producer, consumer, kind, unit) in one block, in the compiler's order.

        Register results (unit: the register) and unguarded source reads; besides, every
        setter of a scoreboard since the last wait on it is a producer of the next instruction
        that waits on that scoreboard (SCOREBOARD_SETUP: setters may swap, so any may end last).
        Every memory access after a settling instruction (`isa.SETTLING`: barriers, dependency
        barriers) is paired with the last one before it ("barrier settle"), START standing for
        one in a predecessor block. Unit is None where no one register is concerned.
        """
        last_def: dict[int, int] = {}
        async_readers: dict[int, list[int]] = {}
        setters: dict[int, list[int]] = {}  # per scoreboard, its setters since the last wait on it
        barrier = START  # the last settling instruction (a barrier from a predecessor: START)
        pairs = []
        for c in range(block.start, block.end):
            s = self.semantics[c]
            if self._settling(c):
                barrier = c
            elif s.memory is not None:
                pairs.append((barrier, c, "barrier settle", None))
            for u in sorted(s.uses | s.defs):
                p = last_def.get(u, START)
                if p == START or self._timed_producer(p):
                    pairs.append((p, c, "live-in" if p == START else "result", u))
            for u in s.defs:
                for m in async_readers.pop(u, []):
                    pairs.append((m, c, "unguarded source read", u))
            for u in s.defs:
                last_def[u] = c
            if c in self._async_reads:
                for u in s.uses:
                    async_readers.setdefault(u, []).append(c)
            for b in self.scoreboard_waits(c):
                for p in setters.pop(b, [START]):
                    pairs.append((p, c, "live-in" if p == START else "scoreboard set", None))
            for b in self.scoreboard_sets(c):
                setters.setdefault(b, []).append(c)
        pairs.extend((p, END, "scoreboard set, live-out", None) for ps in setters.values() for p in ps)
        for u, p in last_def.items():
            if self._timed_producer(p):
                pairs.append((p, END, "live-out", u))
        for u, readers in async_readers.items():
            pairs.extend((m, END, "unguarded source read, live-out", u) for m in readers)
        return pairs

    def _distance(self, block: Block, producer: int, consumer: int) -> int:
        lo = block.start if producer == START else producer
        hi = block.end if consumer == END else consumer
        return sum(self.controls[k].stall for k in range(lo, hi))

    def _latency_table(self) -> dict[tuple[str, str, str, str], int]:
        """The compiler's smallest distance per `latency_key`, over the pairs inside blocks."""
        table: dict[tuple[str, str, str, str], int] = {}
        for block in self.blocks:
            for p, c, kind, u in self._block_pairs[block.index]:
                if kind == "result" and self.semantics[p].fixed_latency:
                    key = self.latency_key(p, c, u)
                    table[key] = min(table.get(key, 1 << 30), self._distance(block, p, c))
        return table

    def _settling(self, i: int) -> bool:
        return self.instructions[i].base in SETTLING

    def _settle_table(self) -> dict[str, int]:
        """Per settling opcode, the fewest cycles the compiler left from one to a memory access
        after it in the same block.

        `BAR.SYNC.DEFER_BLOCKING` does not hold the warp at once: on an H100 an `LDSM` moved to 4
        cycles after one (Triton's matmul epilogue; the compiler had 24) read shared memory before
        the other warps' stores, while ptxas itself puts 6 cycles (the barrier's stall) between a
        barrier and a shared load. So a memory access keeps min(its distance in the compiler's
        order, this minimum) to the barrier before it; an opcode the compiler never placed a
        memory access near keeps every distance.
        """
        table: dict[str, int] = {}
        for block in self.blocks:
            for p, c, kind, _ in self._block_pairs[block.index]:
                if kind == "barrier settle" and p != START:
                    base = self.instructions[p].base
                    table[base] = min(table.get(base, 1 << 30), self._distance(block, p, c))
        return table

    def _settle_need(self, barrier: int) -> int:
        return self.settle.get(self.instructions[barrier].base, 1 << 30)

    def _settle_requirement(self, block: Block) -> int:
        """Cycles a memory access may need after the start of `block` for a barrier in a
        predecessor block."""
        if self.has_indirect_flow:
            return ASYNC_WINDOW
        return self._live_in_need[block.index].get(("bar", 0), 0)

    def _live_in_needs(self) -> list[dict]:
        """Per block, the cycles each live-in dependence may still need after the block starts.

        Keys are ("reg", unit, consumer kind, access) (a timed producer's result, for each kind
        of consumer `latency_key` distinguishes), ("war", unit) (a source read without a read
        barrier, before its overwrite), ("sb", b) (a set of scoreboard b, before a wait on
        it) and ("bar", 0) (a settling instruction before a memory access: `_settle_table`).
        A producer near the end of a predecessor block leaves `required - distance to the
        block end` cycles for the successor to wait; values flow through blocks that neither
        write the unit nor touch the scoreboard, shrinking by their stall total. With indirect
        control flow every live-in dependence is assumed to need the full window
        (`_live_in_requirement`).
        """
        n = len(self.blocks)
        if self.has_indirect_flow:
            return [{} for _ in range(n)]
        own: list[dict] = []
        cut: list[set] = []
        total = []
        for block in self.blocks:
            needs: dict = {}
            last_def: dict[int, int] = {}
            last_set: dict[int, int] = {}
            reads: dict[int, list[int]] = {}
            touched: set = set()
            barrier = None
            for i in range(block.start, block.end):
                s = self.semantics[i]
                if self._settling(i):
                    barrier = i
                    touched.add(("bar", 0))
                for b in self.scoreboard_waits(i):
                    last_set.pop(b, None)
                    touched.add(("sb", b))
                for b in self.scoreboard_sets(i):
                    last_set[b] = i
                    touched.add(("sb", b))
                for u in s.defs:
                    last_def[u] = i
                    reads.pop(u, None)
                    touched |= {("reg", u), ("war", u)}
                if i in self._async_reads:
                    for u in s.uses:
                        reads.setdefault(u, []).append(i)

            def need(key, producer, required, needs=needs, block=block):
                value = required - self._distance(block, producer, END)
                if value > needs.get(key, 0):
                    needs[key] = value

            for u, p in last_def.items():
                if self._timed_producer(p):
                    for (kind, access), latency in self._latencies_of(p, u).items():
                        need(("reg", u, kind, access), p, latency)
            for u, readers in reads.items():
                for m in readers:
                    need(("war", u), m, ASYNC_WINDOW)
            for b, p in last_set.items():
                need(("sb", b), p, SCOREBOARD_SETUP)
            if barrier is not None:
                need(("bar", 0), barrier, min(self._settle_need(barrier), ASYNC_WINDOW))
            own.append(needs)
            cut.append(touched)
            total.append(self._distance(block, START, END))
        preds: list[list[int]] = [[] for _ in range(n)]
        for block in self.blocks:
            for succ in block.successors:
                preds[succ].append(block.index)
        need_in: list[dict] = [{} for _ in range(n)]
        changed = True
        while changed:
            changed = False
            for k in range(n):
                new: dict = {}
                for q in preds[k]:
                    outgoing = dict(own[q])
                    for key, v in need_in[q].items():
                        if key[:2] not in cut[q]:
                            outgoing[key] = max(outgoing.get(key, 0), v - total[q])
                    for key, v in outgoing.items():
                        if v > 0 and v > new.get(key, 0):
                            new[key] = v
                if new != need_in[k]:
                    need_in[k] = new
                    changed = True
        return need_in

    def _live_in_requirement(self, block: Block, consumer: int, unit: int | None) -> int:
        """Cycles `consumer` may need after the start of its block for its live-in dependences
        (on `unit`, or on the scoreboards it waits for when unit is None)."""
        if self.has_indirect_flow:
            return ASYNC_WINDOW
        need = self._live_in_need[block.index]
        if unit is None:
            return max((need.get(("sb", b), 0) for b in self.scoreboard_waits(consumer)), default=0)
        access = "read" if unit in self.semantics[consumer].uses else "write"
        keys = [("reg", unit, self.consumer_kind(consumer), access)]
        if unit in self.semantics[consumer].defs:
            keys.append(("war", unit))
        return max(need.get(key, 0) for key in keys)

    def _distance_rules(self) -> dict[int, list[DistanceRule]]:
        rules: dict[int, list[DistanceRule]] = {}
        for block in self.blocks:
            best: dict[tuple[int, int], DistanceRule] = {}
            for p, c, kind, u in self._block_pairs[block.index]:
                if kind == "barrier settle":
                    need = self._settle_requirement(block) if p == START else self._settle_need(p)
                elif p == START:
                    need = self._live_in_requirement(block, c, u)
                elif kind == "result":
                    need = self.required_latency(p, c, u)
                elif kind == "live-out":  # the most any consumer in a later block may need
                    need = max(self._latencies_of(p, u).values())
                elif kind.startswith("scoreboard set"):
                    need = SCOREBOARD_SETUP
                else:  # an unguarded source read before its overwrite
                    need = ASYNC_WINDOW
                required = min(self._distance(block, p, c), need)
                if required <= 0:
                    continue
                rule = DistanceRule(p, c, required, kind)
                if (p, c) not in best or best[(p, c)].required < required:
                    best[(p, c)] = rule
            rules[block.index] = list(best.values())
        return rules


def _depbar_scoreboards(ins: SassInstruction) -> set[int]:
    """The scoreboards a `DEPBAR` names as operands (`DEPBAR.LE SB0, 0x1`); empty for other opcodes."""
    if ins.base != "DEPBAR":
        return set()
    return {int(m) for op in ins.operands for m in re.findall(r"\bSB(\d)\b", op)}


def _global(s: Semantics) -> bool:
    """A memory access that may touch global memory (global, or generic addresses)."""
    m = s.memory
    return m is not None and bool((m.reads | m.writes) - {"shared", "local"})


def _register_file(unit: int) -> str:
    """R, UR, P or UP."""
    return unit_name(unit).rstrip("0123456789")


def _differs(old, new) -> bool:
    if isinstance(old, _All) or isinstance(new, _All):
        return not (isinstance(old, _All) and isinstance(new, _All))
    return old != new
