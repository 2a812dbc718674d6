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
from polytile.sass.isa import CONTROL_FLOW, Semantics, memory_conflict, semantics, unit_name

START, END = -1, -2  # pseudo producer at a block's entry, pseudo consumer at its exit
DEFAULT_FIXED_LATENCY = 15  # cycles assumed for a fixed-latency opcode never seen inside a block
ASYNC_WINDOW = 32  # cycles kept around unguarded variable-latency reads and results
# Cycles from an instruction that sets a scoreboard to the first one that may wait on it: the set
# lands a cycle after issue, so a wait one cycle later sees the scoreboard clear and does not
# wait at all. ptxas never schedules a wait closer than 2 cycles to the set (in every sm_90 cubin
# looked at, 2 is also its most common distance), and a move that made it 1 broke a Triton
# kernel on an H100 (a load's deferred address read lost to the overwrite that waited for it).
SCOREBOARD_SETUP = 2
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
        self.guards = self._scoreboard_guards()
        self.latency = self._latency_table(latency_overrides or {})
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
        out = set(self.controls[i].waits)
        ins = self.instructions[i]
        if ins.base == "DEPBAR":
            out |= {int(m) for op in ins.operands for m in re.findall(r"\bSB(\d)\b", op)}
        return out

    def scoreboard_sets(self, i: int) -> set[int]:
        """Scoreboards instruction `i` sets (its write and read barriers)."""
        c = self.controls[i]
        return {b for b in (c.write_barrier, c.read_barrier) if b != NO_BARRIER}

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
        common = self.barriers(first) & self.barriers(second)
        if common:
            return f"both use scoreboard SB{min(common)}"
        for x, y in ((first, second), (second, first)):
            if self.unguarded_result(x) and self.barriers(y):
                return f"{self.instructions[x].opcode} completes unguarded; its wait is a later scoreboard's"
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

    def latency_key(self, i: int) -> str:
        return self.instructions[i].opcode

    def required_latency(self, i: int) -> int:
        """Cycles the result of instruction `i` needs before a consumer may issue."""
        if self.semantics[i].fixed_latency:
            return self.latency.get(self.latency_key(i), DEFAULT_FIXED_LATENCY)
        return ASYNC_WINDOW

    def _timed_producer(self, i: int) -> bool:
        s = self.semantics[i]
        return bool(s.defs) and (s.fixed_latency or self.unguarded_result(i))

    def _pairs(self, block: Block):
        """(producer, consumer, kind) pairs in one block, in the compiler's order.

        Besides register results and unguarded source reads, a scoreboard's last setter is the
        producer of the next instruction that waits on that scoreboard (SCOREBOARD_SETUP).
        """
        last_def: dict[int, int] = {}
        async_readers: dict[int, list[int]] = {}
        last_set: dict[int, int] = {}
        pairs = []
        for c in range(block.start, block.end):
            s = self.semantics[c]
            for u in s.uses | s.defs:
                p = last_def.get(u, START)
                if p == START or self._timed_producer(p):
                    pairs.append((p, c, "live-in" if p == START else "result"))
            for u in s.defs:
                for m in async_readers.pop(u, []):
                    pairs.append((m, c, "unguarded source read"))
            for u in s.defs:
                last_def[u] = c
            if c in self._async_reads:
                for u in s.uses:
                    async_readers.setdefault(u, []).append(c)
            for b in self.scoreboard_waits(c):
                p = last_set.pop(b, START)
                pairs.append((p, c, "live-in" if p == START else "scoreboard set"))
            for b in self.scoreboard_sets(c):
                last_set[b] = c
        pairs.extend((p, END, "scoreboard set, live-out") for p in last_set.values())
        for p in last_def.values():
            if self._timed_producer(p):
                pairs.append((p, END, "live-out"))
        for readers in async_readers.values():
            pairs.extend((m, END, "unguarded source read, live-out") for m in readers)
        return pairs

    def _distance(self, block: Block, producer: int, consumer: int) -> int:
        lo = block.start if producer == START else producer
        hi = block.end if consumer == END else consumer
        return sum(self.controls[k].stall for k in range(lo, hi))

    def _latency_table(self, overrides: dict[str, int]) -> dict[str, int]:
        table: dict[str, int] = {}
        for block in self.blocks:
            for p, c, kind in self._pairs(block):
                if kind == "result" and c != END and self.semantics[p].fixed_latency:
                    key = self.latency_key(p)
                    table[key] = min(table.get(key, 1 << 30), self._distance(block, p, c))
        for key in list(table):
            base = key.split(".", 1)[0]
            if key in overrides or base in overrides:
                table[key] = overrides.get(key, overrides.get(base))
        for key, value in overrides.items():
            table.setdefault(key, value)
        return table

    def _live_in_needs(self) -> list[dict]:
        """Per block, the cycles each live-in dependence may still need after the block starts.

        Keys are register units (a timed producer's result), ("war", unit) (a source read
        without a read barrier, before its overwrite) and ("sb", b) (a set of scoreboard b, before
        a wait on it). A producer near the end of a predecessor block leaves `required - distance
        to the block end` cycles for the successor to wait; values flow through blocks that do not
        touch the key, shrinking by their stall total. With indirect control flow every live-in
        dependence is assumed to need the full window (`_live_in_requirement`).
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
            for i in range(block.start, block.end):
                s = self.semantics[i]
                for b in self.scoreboard_waits(i):
                    last_set.pop(b, None)
                    touched.add(("sb", b))
                for b in self.scoreboard_sets(i):
                    last_set[b] = i
                    touched.add(("sb", b))
                for u in s.defs:
                    last_def[u] = i
                    reads.pop(u, None)
                    touched |= {u, ("war", u)}
                if i in self._async_reads:
                    for u in s.uses:
                        reads.setdefault(u, []).append(i)

            def need(key, producer, required, needs=needs, block=block):
                value = required - self._distance(block, producer, END)
                if value > needs.get(key, 0):
                    needs[key] = value

            for u, p in last_def.items():
                if self._timed_producer(p):
                    need(u, p, self.required_latency(p))
            for u, readers in reads.items():
                for m in readers:
                    need(("war", u), m, self.required_latency(m))
            for b, p in last_set.items():
                need(("sb", b), p, SCOREBOARD_SETUP)
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
                        if key not in cut[q]:
                            outgoing[key] = max(outgoing.get(key, 0), v - total[q])
                    for key, v in outgoing.items():
                        if v > 0 and v > new.get(key, 0):
                            new[key] = v
                if new != need_in[k]:
                    need_in[k] = new
                    changed = True
        return need_in

    def _live_in_requirement(self, block: Block, consumer: int) -> int:
        s = self.semantics[consumer]
        if self.has_indirect_flow:
            return ASYNC_WINDOW
        keys = [*(s.uses | s.defs), *(("war", u) for u in s.defs)]
        keys += [("sb", b) for b in self.scoreboard_waits(consumer)]
        need = self._live_in_need[block.index]
        return max((need.get(key, 0) for key in keys), default=0)

    def _distance_rules(self) -> dict[int, list[DistanceRule]]:
        rules: dict[int, list[DistanceRule]] = {}
        for block in self.blocks:
            best: dict[tuple[int, int], DistanceRule] = {}
            for p, c, kind in self._pairs(block):
                original = self._distance(block, p, c)
                if p == START:
                    required = min(original, self._live_in_requirement(block, c))
                elif kind == "result" and c != END and self.semantics[p].fixed_latency:
                    required = min(original, self.required_latency(p))
                elif kind == "result":
                    required = min(original, ASYNC_WINDOW)
                elif kind.startswith("scoreboard set"):
                    required = min(original, SCOREBOARD_SETUP)
                else:
                    required = min(original, self.required_latency(p))
                if required <= 0:
                    continue
                rule = DistanceRule(p, c, required, kind)
                if (p, c) not in best or best[(p, c)].required < required:
                    best[(p, c)] = rule
            rules[block.index] = list(best.values())
        return rules


def _differs(old, new) -> bool:
    if isinstance(old, _All) or isinstance(new, _All):
        return not (isinstance(old, _All) and isinstance(new, _All))
    return old != new
