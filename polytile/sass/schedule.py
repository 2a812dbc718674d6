"""A kernel's instruction order, the moves that change it, and the words it assembles to.

A move takes one movable (memory) instruction one slot up or down inside its basic block,
swapping it with its neighbour. Each instruction keeps its own control bits (its barriers,
wait mask and stall travel with it) with two derived edits:

- stall repair: when the new order shortens the distance a fixed-latency producer needs before
  a consumer (see `analysis.DistanceRule`), the missing cycles are added to the stall of the
  instruction just before the consumer (spilling to earlier slots of the window when a stall
  field would pass 15). A move whose repair does not fit is illegal. Repairs are recomputed
  from the compiler's stalls for every order, so undoing a move undoes its repair.
- reuse flags: an instruction whose successor changed loses its operand-reuse bits, since the
  reuse cache is only valid for the instruction that originally followed it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from polytile.sass.analysis import END, START, KernelAnalysis

UP, DOWN = -1, 1


class IllegalMove(ValueError):
    """A move that would break a dependence or leave the block."""


@dataclass(frozen=True)
class Move:
    instruction: int  # index of the instruction in the compiler's order
    direction: int  # UP (-1) or DOWN (+1)

    def describe(self, analysis: KernelAnalysis) -> str:
        ins = analysis.instructions[self.instruction]
        return f"{ins.offset:#06x} {ins.text} {'up' if self.direction == UP else 'down'}"


class _BlockRules:
    """One block's distance rules as arrays, for checking many candidate orders quickly."""

    def __init__(self, analysis: KernelAnalysis, block_index: int) -> None:
        rules = analysis.rules[block_index]
        block = analysis.blocks[block_index]
        producer = np.array([r.producer for r in rules], dtype=np.int64)
        consumer = np.array([r.consumer for r in rules], dtype=np.int64)
        self.producer_is_start = producer == START
        self.consumer_is_end = consumer == END
        self.producer = np.where(self.producer_is_start, block.start, producer)
        self.consumer = np.where(self.consumer_is_end, block.start, consumer)
        self.required = np.array([r.required for r in rules], dtype=np.int64)


class Schedule:
    """An order of a kernel's instructions with the stall repairs it needs (immutable)."""

    def __init__(
        self,
        analysis: KernelAnalysis,
        order: tuple[int, ...] | None = None,
        extra: dict[int, int] | None = None,
        _caches: dict | None = None,
        path: tuple[Move, ...] = (),
        _position: np.ndarray | None = None,
    ) -> None:
        n = len(analysis.instructions)
        self.analysis = analysis
        self.order = tuple(range(n)) if order is None else tuple(order)
        self.extra = dict(extra or {})
        self.path = path  # the moves that led here from the compiler's order
        if _position is None:
            _position = np.empty(n, dtype=np.int64)
            _position[list(self.order)] = np.arange(n)
        self.position = _position
        if _caches is None:
            _caches = {
                "conflict": {},
                "rules": {},
                "blocks": {},
                "base_stall": np.array([c.stall for c in analysis.controls], dtype=np.int64),
                "max_stall": np.array([c.max_stall for c in analysis.controls], dtype=np.int64),
            }
        self._caches = _caches
        self._base_stall = _caches["base_stall"]
        self._max_stall = _caches["max_stall"]

    @classmethod
    def original(cls, analysis: KernelAnalysis) -> Schedule:
        return cls(analysis)

    @property
    def key(self) -> tuple:
        return self.order, tuple(sorted(self.extra.items()))

    def stall(self, instruction: int) -> int:
        return int(self._base_stall[instruction]) + self.extra.get(instruction, 0)

    def is_original(self) -> bool:
        return self.order == tuple(range(len(self.order))) and not self.extra

    # ---- legality --------------------------------------------------------------------------------

    def check(self, move: Move) -> tuple[Schedule | None, str]:
        """The schedule after `move`, or None and the reason it is illegal."""
        a = self.analysis
        if move.instruction not in a.movable:
            return None, f"{a.instructions[move.instruction].opcode} is not a movable memory instruction"
        p = int(self.position[move.instruction])
        q = p + move.direction
        block = a.blocks[a.block_of[move.instruction]]
        if not block.start <= q < block.end:
            return None, "it would leave its basic block"
        neighbour = self.order[q]
        first, second = (
            (neighbour, move.instruction) if move.direction == UP else (move.instruction, neighbour)
        )
        reason = self._conflict(first, second)
        if reason:
            return None, reason
        order = list(self.order)
        order[p], order[q] = order[q], order[p]
        position = self.position.copy()
        position[order[p]], position[order[q]] = p, q
        repaired = self._block_extras(block.index, order, position)
        if repaired is None:
            return None, "the stall repair it needs does not fit in the stall fields"
        extra = {i: e for i, e in self.extra.items() if a.block_of[i] != block.index}
        extra.update(repaired)
        return Schedule(a, tuple(order), extra, self._caches, self.path + (move,), position), ""

    def apply(self, move: Move) -> Schedule:
        result, reason = self.check(move)
        if result is None:
            raise IllegalMove(f"cannot move {move.describe(self.analysis)}: {reason}")
        return result

    def legal_mask(self) -> np.ndarray:
        """Boolean mask over actions 2k (move movable[k] up) and 2k+1 (down).

        Legality depends only on the instruction's block, so verdicts are cached per distinct
        block state (its order and repairs), each state interned once.
        """
        a = self.analysis
        mask = np.zeros(2 * len(a.movable), dtype=bool)
        verdicts, states = self._caches["blocks"], self._caches.setdefault("block_states", {})
        block_ids: dict[int, int] = {}
        for k, instruction in enumerate(a.movable):
            block = a.blocks[a.block_of[instruction]]
            if block.index not in block_ids:
                state = (
                    self.order[block.start : block.end],
                    tuple((i, e) for i, e in sorted(self.extra.items()) if a.block_of[i] == block.index),
                )
                block_ids[block.index] = states.setdefault(state, len(states))
            key = (instruction, block_ids[block.index])
            if key not in verdicts:
                verdicts[key] = tuple(self.check(Move(instruction, d))[0] is not None for d in (UP, DOWN))
            mask[2 * k], mask[2 * k + 1] = verdicts[key]
        return mask

    def _conflict(self, first: int, second: int) -> str | None:
        cache = self._caches["conflict"]
        if (first, second) not in cache:
            cache[(first, second)] = self.analysis.order_conflict(first, second)
        return cache[(first, second)]

    def _block_extras(
        self, block_index: int, order: list[int], position: np.ndarray
    ) -> dict[int, int] | None:
        """Minimal stall additions that satisfy the block's distance rules in the new order."""
        rules = self._caches["rules"].get(block_index)
        if rules is None:
            rules = self._caches["rules"][block_index] = _BlockRules(self.analysis, block_index)
        if not len(rules.required):
            return {}
        block = self.analysis.blocks[block_index]
        n = block.end - block.start
        order = np.array(order[block.start : block.end], dtype=np.int64)
        base = self._base_stall[order]
        limit = self._max_stall[order]
        prefix = np.concatenate(([0], np.cumsum(base)))
        lp = np.where(rules.producer_is_start, 0, position[rules.producer] - block.start)
        lc = np.where(rules.consumer_is_end, n, position[rules.consumer] - block.start)
        deficit = rules.required - (prefix[lc] - prefix[lp])
        short = np.nonzero(deficit > 0)[0]
        if not len(short):
            return {}
        extras = np.zeros(n, dtype=np.int64)
        for consumer_pos in sorted(set(lc[short].tolist())):
            items = [(int(lp[r]), int(rules.required[r])) for r in short if lc[r] == consumer_pos]
            needs = [
                (req - int(prefix[consumer_pos] - prefix[p] + extras[p:consumer_pos].sum()), p)
                for p, req in items
            ]
            needs = [(need, p) for need, p in needs if need > 0]
            if not needs:
                continue
            need = max(nd for nd, _ in needs)
            low = max(p for _, p in needs)
            slot = consumer_pos - 1
            while need > 0 and slot >= low:
                add = min(int(limit[slot] - base[slot] - extras[slot]), need)
                if add > 0:
                    extras[slot] += add
                    need -= add
                slot -= 1
            if need > 0:
                return None
        return {int(order[k]): int(e) for k, e in enumerate(extras) if e}

    # ---- output ----------------------------------------------------------------------------------

    def words(self) -> list[int]:
        """The kernel's instruction words in this order, with repaired stalls and reuse flags."""
        a = self.analysis
        words = []
        n = len(self.order)
        for p, instruction in enumerate(self.order):
            control = a.controls[instruction].with_stall(self.stall(instruction))
            successor = self.order[p + 1] if p + 1 < n else None
            if successor != instruction + 1 and control.reuse:
                control = replace(control, reuse=0)
            words.append(control.apply(a.kernel.words[instruction]))
        return words


def random_legal(analysis: KernelAnalysis, moves: int, seed: int) -> Schedule:
    """A schedule ``moves`` random legal moves away from the compiler's order (fewer when no move is
    legal): the walk the GPU tests, the schedule audit and scripts/sass_bisect.py replay by seed."""
    rng = np.random.default_rng(seed)
    schedule = Schedule.original(analysis)
    for _ in range(moves):
        legal = np.nonzero(schedule.legal_mask())[0]
        if not len(legal):
            break
        k = int(rng.choice(legal))
        schedule = schedule.apply(Move(analysis.movable[k // 2], UP if k % 2 == 0 else DOWN))
    return schedule
