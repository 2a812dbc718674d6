"""Search for a faster schedule under a fixed number of measurements: PPO, greedy, random.

`ppo` trains sb3-contrib's MaskablePPO (a small MLP on the CPU; the environment steps are the
measurements) on the assembly game — one-slot moves, walks of 4, 16 and 64 slots, and whole
blocks' loads hoisted or stores sunk — and keeps the best schedule any episode reached. `greedy`
is first-improvement hill climbing: from the current schedule it first tries the expert's moves
(`polytile.sass.moves`) — each block's loads as early as legal, its stores as late, then each load
2, 4, 8, ... slots earlier and as early as its dependences allow, each store as late (runs of
legal one-slot moves, measured once) — then the other runs and every single legal move,
and takes the first that is faster by more than `min_gain` (timing noise otherwise leads it
astray); on a plateau it steps to a random neighbour within the noise (iterated local search).
`random` measures the ends of random legal walks. All three spend the same budget through one
`MeasurementLog`, so their results compare directly; the best schedule found by any of them is
whatever the log saw fastest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polytile.sass.analysis import KernelAnalysis
from polytile.sass.game import AssemblyGame, MeasurementFailed, MeasurementLog, Measurer
from polytile.sass.moves import block_runs, far_groups
from polytile.sass.schedule import DOWN, UP, Move, Schedule

METHODS = ("ppo", "greedy", "random")


@dataclass
class SearchResult:
    method: str
    baseline_time: float
    best: Schedule
    best_time: float
    measurements: int
    failures: int
    history: list[float]
    timed: list[tuple[float, Schedule]]  # every schedule measured, with its time

    @property
    def speedup(self) -> float:
        return self.baseline_time / self.best_time


def search(
    analysis: KernelAnalysis,
    measurer: Measurer,
    budget: int,
    method: str = "ppo",
    seed: int = 0,
    max_steps: int = 32,
    min_gain: float = 0.002,
) -> SearchResult:
    """Spend `budget` measurements of `measurer` looking for a faster schedule of `analysis`.

    `min_gain` is the relative gain greedy search needs to take a step (0.002: 0.2 %)."""
    if method not in METHODS:
        raise ValueError(f"unknown search method {method!r}; choose one of {', '.join(METHODS)}")
    if budget < 2:
        raise ValueError(f"a budget of {budget} measurements is too small; give at least 2")
    log = MeasurementLog(measurer, budget)
    baseline = log.measure(Schedule.original(analysis))
    if analysis.movable:
        if method == "greedy":
            _greedy(analysis, log, seed, min_gain)
        else:
            {"ppo": _ppo, "random": _random}[method](analysis, log, seed, max_steps)
    timed = [(t, log.schedules[key]) for key, t in log.times.items()]
    return SearchResult(
        method, baseline, log.best, log.best_time, log.used, len(log.failed), log.history, timed
    )


def _ppo(analysis: KernelAnalysis, log: MeasurementLog, seed: int, max_steps: int) -> None:
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger

    class StopWhenSpent(BaseCallback):
        def _on_step(self) -> bool:
            return not log.exhausted

    game = AssemblyGame(analysis, log, max_steps=max_steps)
    n_steps = int(min(64, max(8, log.budget // 4)))
    model = MaskablePPO(
        "MlpPolicy",
        game,
        n_steps=n_steps,
        batch_size=min(32, n_steps),
        n_epochs=4,
        learning_rate=3e-4,
        gamma=0.95,
        ent_coef=0.01,
        policy_kwargs={"net_arch": [64, 64], "ortho_init": False},
        seed=seed,
        device="cpu",
        verbose=0,
    )
    # A logger of no outputs: SB3's default makes an empty /tmp/SB3-<date> folder on every learn().
    model.set_logger(Logger(folder=None, output_formats=[]))
    # Steps that hit the measurement cache are free, so allow many more steps than the budget.
    model.learn(total_timesteps=10 * log.budget + n_steps, callback=StopWhenSpent())


def _legal_moves(schedule: Schedule) -> list[Move]:
    mask = schedule.legal_mask()
    movable = schedule.analysis.movable
    return [Move(movable[k // 2], UP if k % 2 == 0 else DOWN) for k in np.nonzero(mask)[0]]


def _greedy(analysis: KernelAnalysis, log: MeasurementLog, seed: int, min_gain: float) -> None:
    """First-improvement hill climbing over the block runs, then `far_moves`, then single moves
    (`polytile.sass.moves`); on a plateau (no
    candidate faster by `min_gain`) it takes a random candidate within the noise and goes on, as
    iterated local search does, until the budget is spent or nothing new can be measured."""
    rng = np.random.default_rng(seed)
    current = Schedule.original(analysis)
    current_time = log.measure(current)
    while not log.exhausted:
        # whole blocks' loads up / stores down, the expert's runs, the other runs, then single
        # moves, each kind in random order
        blocks = block_runs(current)
        preferred, others = far_groups(current)
        singles = [current.apply(move) for move in _legal_moves(current)]
        for group in (blocks, preferred, others, singles):
            rng.shuffle(group)
        plateau: list[tuple[float, Schedule]] = []
        used, improved = log.used, False
        for candidate in blocks + preferred + others + singles:
            if log.exhausted:
                return
            try:
                t = log.measure(candidate)
            except MeasurementFailed:
                continue
            if t < current_time * (1.0 - min_gain):
                current, current_time, improved = candidate, t, True
                break
            if t <= current_time * (1.0 + min_gain):
                plateau.append((t, candidate))
        if improved:
            continue
        if log.used == used or not plateau:
            return  # every neighbour measured before and none better: nothing new to learn here
        t, current = plateau[int(rng.integers(len(plateau)))]
        current_time = t


def _random(analysis: KernelAnalysis, log: MeasurementLog, seed: int, max_steps: int) -> None:
    rng = np.random.default_rng(seed)
    stale = 0
    while not log.exhausted and stale < 20 * log.budget:
        schedule = Schedule.original(analysis)
        for _ in range(int(rng.integers(1, max_steps + 1))):
            moves = _legal_moves(schedule)
            if not moves:
                break
            schedule = schedule.apply(moves[int(rng.integers(len(moves)))])
        used = log.used
        try:
            log.measure(schedule)
        except MeasurementFailed:
            pass
        stale = stale + 1 if log.used == used else 0
