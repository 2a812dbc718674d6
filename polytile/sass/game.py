"""The assembly game: a gymnasium environment over one kernel's schedule (CuAsmRL's formulation).

State: one row of features per instruction, in the current order (control fields, opcode class,
memory operand, pinned/movable, legal moves). Actions, with m movable instructions and the walk
lengths `strides` (1, 4, 16, 64 slots by default): action j*2m + 2k moves movable instruction k up
by up to strides[j] slots (one legal move at a time, stopping where the next is illegal), j*2m +
2k + 1 down; after them, two actions per block of `moves.run_blocks`: hoist all its loads, sink all
its stores (`moves.block_run`). CuAsmRL's game is strides=(1,) without block actions.
`action_masks()` gives the legal ones (sb3-contrib's MaskablePPO reads it): a walk is legal when
its first move is, a block action when some load (store) of the block can move up (down).
Reward: (T_prev - T_new) / T_0 * 100 with T from a `Measurer` (the GPU in real runs, a cost model
in tests). An episode ends when no move is legal (terminated), after `max_steps` actions or when the
measurement budget is spent (truncated). A measurement that fails (the variant faulted, hung or
was rejected) gives `failure_reward` and ends the episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import gymnasium as gym
import numpy as np

from polytile.sass.analysis import KernelAnalysis
from polytile.sass.cubin import NO_BARRIER
from polytile.sass.isa import OPCODE_CLASSES
from polytile.sass.moves import block_run, is_expert, run_blocks, walk
from polytile.sass.schedule import DOWN, UP, Move, Schedule

STRIDES = (1, 4, 16, 64)  # walk lengths offered as actions, in slots


class MeasurementFailed(RuntimeError):
    """A variant could not be timed: it faulted, hung, or failed verification."""


class Measurer(Protocol):
    """Times a schedule; lower is better. Raises MeasurementFailed for a broken variant."""

    def measure(self, schedule: Schedule) -> float: ...


@dataclass
class MeasurementLog:
    """Every distinct schedule measured, with a budget on real measurements (cache hits are free)."""

    measurer: Measurer
    budget: int
    times: dict[tuple, float] = field(default_factory=dict)
    schedules: dict[tuple, Schedule] = field(default_factory=dict)
    failed: set[tuple] = field(default_factory=set)
    history: list[float] = field(default_factory=list)  # time of each real measurement, in order
    best: Schedule | None = None
    best_time: float = float("inf")

    @property
    def used(self) -> int:
        return len(self.history)

    @property
    def exhausted(self) -> bool:
        return self.used >= self.budget

    def measure(self, schedule: Schedule) -> float:
        """Cached time of `schedule`; raises MeasurementFailed for known-bad or newly failing ones."""
        key = schedule.key
        if key in self.failed:
            raise MeasurementFailed("this variant failed before")
        if key not in self.times:
            try:
                t = float(self.measurer.measure(schedule))
            except MeasurementFailed:
                self.failed.add(key)
                self.history.append(float("nan"))
                raise
            self.times[key] = t
            self.schedules[key] = schedule
            self.history.append(t)
            if t < self.best_time:
                self.best, self.best_time = schedule, t
        return self.times[key]


FEATURES = 22 + len(OPCODE_CLASSES)
_STALL, _UP, _DOWN, _POSITION = 0, 19, 20, 21  # the columns that change with the order


def _static_features(analysis: KernelAnalysis) -> np.ndarray:
    """Per instruction (original index), the feature columns that do not depend on the order."""
    rows = np.zeros((len(analysis.instructions), FEATURES), dtype=np.float32)
    for i, (c, s) in enumerate(zip(analysis.controls, analysis.semantics, strict=True)):
        mem = s.memory
        spaces = (mem.reads | mem.writes) if mem else frozenset()
        rows[i, 1:19] = [
            c.yield_bit,
            c.write_barrier != NO_BARRIER,
            c.write_barrier / 7.0,
            c.read_barrier != NO_BARRIER,
            c.read_barrier / 7.0,
            *[(c.wait_mask >> b) & 1 for b in range(6)],
            c.reuse != 0,
            "global" in spaces,
            "shared" in spaces,
            bool(mem and mem.writes),
            (mem.width / 16.0) if mem else 0.0,
            i in analysis.pinned,
            i in analysis.movable,
        ]
        rows[i, 22:] = [s.opcode_class == name for name in OPCODE_CLASSES]
    return rows


def instruction_features(schedule: Schedule, static: np.ndarray | None = None) -> np.ndarray:
    """(instructions, FEATURES) float32 rows in the schedule's current order.

    Columns: stall/15, yield, write barrier (set, index/7), read barrier (set, index/7), wait mask
    bits, reuse, global, shared, store, width/16, pinned, movable, legal up, legal down, position
    in block, opcode class one-hot.
    """
    a = schedule.analysis
    if static is None:
        static = _static_features(a)
    order = np.asarray(schedule.order)
    rows = static[order].copy()
    rows[:, _STALL] = [schedule.stall(int(i)) / 15.0 for i in order]
    mask = schedule.legal_mask()
    if len(a.movable):
        movable = np.asarray(a.movable)
        positions = schedule.position[movable]
        rows[positions, _UP] = mask[0::2]
        rows[positions, _DOWN] = mask[1::2]
    for block in a.blocks:
        rows[block.start : block.end, _POSITION] = np.linspace(0.0, 1.0, block.end - block.start)
    return rows


class AssemblyGame(gym.Env):
    """Reorder one kernel's memory instructions; reward is the measured speed-up per move."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        analysis: KernelAnalysis,
        log: MeasurementLog,
        max_steps: int = 32,
        failure_reward: float = -10.0,
        strides: tuple[int, ...] = STRIDES,
        block_actions: bool = True,
    ) -> None:
        if not analysis.movable:
            raise ValueError(f"kernel {analysis.name!r} has no movable memory instructions")
        if not strides or strides[0] != 1 or any(b <= a for a, b in zip(strides, strides[1:])):
            raise ValueError(f"strides must start at 1 and increase, not {strides!r}")
        self.analysis = analysis
        self.strides = tuple(strides)
        self.log = log
        self.max_steps = max_steps
        self.failure_reward = failure_reward
        self.original = Schedule.original(analysis)
        self.t0 = log.measure(self.original)
        n = len(analysis.instructions)
        self.observation_space = gym.spaces.Box(-1.0, 2.0, shape=(n, FEATURES), dtype=np.float32)
        self.blocks = run_blocks(self.original) if block_actions else []
        self._walks = 2 * len(analysis.movable) * len(self.strides)
        self.action_space = gym.spaces.Discrete(self._walks + 2 * len(self.blocks))
        self.schedule = self.original
        self.t_prev = self.t0
        self.steps = 0
        self._static = _static_features(analysis)

    def _decode(self, action: int) -> tuple[int | None, int, int]:
        """(block, direction, 0) for a block action; (None, direction, stride index) for a walk,
        the movable instruction's index in place of the block."""
        action = int(action)
        direction = UP if action % 2 == 0 else DOWN
        if action >= self._walks:
            return self.blocks[(action - self._walks) // 2], direction, -1
        stride, rest = divmod(action, 2 * len(self.analysis.movable))
        return self.analysis.movable[rest // 2], direction, stride

    def describe(self, action: int) -> str:
        """What `action` does, in words."""
        target, direction, stride = self._decode(action)
        word = "up" if direction == UP else "down"
        if stride < 0:
            return f"block {target}: every {'load' if direction == UP else 'store'} as far {word} as legal"
        return f"{Move(target, direction).describe(self.analysis)} by up to {self.strides[stride]} slots"

    def play(self, action: int) -> Schedule:
        """The schedule `action` leads to from the current one (the current one when illegal)."""
        target, direction, stride = self._decode(action)
        if stride < 0:
            return block_run(self.schedule, target, direction)
        return walk(self.schedule, target, direction, self.strides[stride])

    def action_masks(self) -> np.ndarray:
        single = self.schedule.legal_mask()
        masks = [np.tile(single, len(self.strides))]
        if self.blocks:
            movable = self.analysis.movable
            block_of = self.analysis.block_of
            runs = np.zeros(2 * len(self.blocks), dtype=bool)
            where = {block: n for n, block in enumerate(self.blocks)}
            for k in np.nonzero(single)[0]:
                instruction, direction = movable[k // 2], UP if k % 2 == 0 else DOWN
                n = where.get(block_of[instruction])
                if n is not None and is_expert(self.schedule, instruction, direction):
                    runs[2 * n + k % 2] = True
            masks.append(runs)
        return np.concatenate(masks)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.schedule = self.original
        self.t_prev = self.t0
        self.steps = 0
        return instruction_features(self.schedule, self._static), {"time": self.t0}

    def step(self, action):
        self.steps += 1
        if not self.action_masks()[int(action)]:
            raise ValueError(f"action {action} ({self.describe(action)}) is illegal; pass action_masks() to the agent")
        moved = self.play(action)
        try:
            t = self.log.measure(moved)
        except MeasurementFailed:
            obs = instruction_features(self.schedule, self._static)
            return obs, self.failure_reward, True, False, {"time": None, "failed": True}
        reward = (self.t_prev - t) / self.t0 * 100.0
        self.schedule, self.t_prev = moved, t
        terminated = not self.schedule.legal_mask().any()
        truncated = self.steps >= self.max_steps or self.log.exhausted
        return instruction_features(self.schedule, self._static), reward, terminated, truncated, {"time": t}
