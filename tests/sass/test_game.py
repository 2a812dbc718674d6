"""The assembly game and the search agents, on the synthetic issue-time measurer."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest

from polytile.sass.agent import search
from polytile.sass.analysis import KernelAnalysis
from polytile.sass.costmodel import IssueModel
from polytile.sass.cubin import Cubin
from polytile.sass.disasm import disassemble
from polytile.sass.game import AssemblyGame, MeasurementFailed, MeasurementLog
from polytile.sass.moves import block_run, block_runs, far_moves, is_expert, run_blocks
from polytile.sass.schedule import DOWN, UP, Move, Schedule


@pytest.fixture(scope="module")
def matmul(sample_cubins) -> KernelAnalysis:
    cubin = Cubin.from_file(sample_cubins["sm_90a"])
    return KernelAnalysis(cubin.kernel("matmul"), disassemble(cubin)["matmul"])


def test_episode_follows_the_masks_and_rewards_telescope(matmul):
    log = MeasurementLog(IssueModel(), budget=100)
    game = AssemblyGame(matmul, log, max_steps=12)
    obs, info = game.reset(seed=0)
    assert game.observation_space.contains(obs) and info["time"] == game.t0
    rng = np.random.default_rng(0)
    total, done, steps = 0.0, False, 0
    while not done:
        mask = game.action_masks()
        assert mask.shape == (game.action_space.n,) and mask.any()
        obs, reward, terminated, truncated, info = game.step(int(rng.choice(np.nonzero(mask)[0])))
        assert game.observation_space.contains(obs)
        total += reward
        steps += 1
        done = terminated or truncated
    assert steps == 12
    assert total == pytest.approx((game.t0 - info["time"]) / game.t0 * 100)
    assert len(game.schedule.path) >= 12  # walks and block actions make several one-slot moves


def test_illegal_action_is_refused(matmul):
    game = AssemblyGame(matmul, MeasurementLog(IssueModel(), budget=10))
    game.reset()
    illegal = int(np.nonzero(~game.action_masks())[0][0])
    with pytest.raises(ValueError, match="illegal"):
        game.step(illegal)


class FailsAfterMoves:
    """Times the original; every other variant 'faults'."""

    def measure(self, schedule: Schedule) -> float:
        if schedule.is_original():
            return 1.0
        raise MeasurementFailed("fault")


def test_failed_variant_ends_the_episode_with_a_penalty(matmul):
    log = MeasurementLog(FailsAfterMoves(), budget=10)
    game = AssemblyGame(matmul, log, failure_reward=-5.0)
    game.reset()
    _, reward, terminated, _, info = game.step(int(np.nonzero(game.action_masks())[0][0]))
    assert (reward, terminated, info["failed"]) == (-5.0, True, True)
    assert len(log.failed) == 1 and log.best.is_original()


@pytest.mark.parametrize("method", ["greedy", "random", pytest.param("ppo", marks=pytest.mark.slow)])
def test_search_improves_the_synthetic_objective_within_budget(matmul, method, tmp_path, monkeypatch):
    if method == "ppo":
        pytest.importorskip("sb3_contrib", reason="PPO needs sb3-contrib (and torch)")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where SB3's default logger would write
    model = IssueModel()
    # greedy tries the multi-slot runs first (53 here); the synthetic model's one gain is a
    # single move of one cycle (0.08%), so it needs the budget to reach it and no noise margin
    budget = 120 if method == "greedy" else 40
    result = search(matmul, model, budget=budget, method=method, seed=0, max_steps=8, min_gain=0.0)
    assert result.measurements <= budget and model.calls == result.measurements
    assert result.best_time <= result.baseline_time
    if method == "greedy":
        assert result.best_time < result.baseline_time
    replay = Schedule.original(matmul)
    for move in result.best.path:
        replay = replay.apply(move)
    assert replay.key == result.best.key
    assert not list(tmp_path.glob("SB3-*")), "the search left a logger folder in the temporary directory"


def test_unknown_method_is_named():
    with pytest.raises(ValueError, match="greedy"):
        search(None, IssueModel(), budget=4, method="anneal")


def test_far_moves_take_instructions_2_4_8_and_all_legal_slots_loads_up_first(matmul):
    original = Schedule.original(matmul)
    far = far_moves(original)
    assert far, "the sample matmul has loads that can rise several slots"
    farthest: dict[tuple[int, int], int] = {}
    for schedule in far:
        moved = {move.instruction for move in schedule.path}
        directions = {move.direction for move in schedule.path}
        assert len(moved) == 1 and len(directions) == 1 and len(schedule.path) >= 2
        (instruction,), (direction,) = moved, directions
        key = (instruction, direction)
        farthest[key] = max(farthest.get(key, 0), len(schedule.path))
        replay = original
        for move in schedule.path:
            replay = replay.apply(move)
        assert replay.key == schedule.key
    for (instruction, direction), steps in farthest.items():
        stop = original
        for _ in range(steps):
            stop = stop.apply(Move(instruction, direction))
        following, reason = stop.check(Move(instruction, direction))
        assert following is None or steps == 64, reason  # as far as legal, or the limit
    # loads going up and stores going down come before the other runs
    expert = [
        (lambda m: bool(m.reads) if s.path[0].direction == UP else bool(m.writes))(
            matmul.semantics[s.path[0].instruction].memory
        )
        for s in far
    ]
    assert any(expert) and expert == sorted(expert, reverse=True)


def _replayed(schedule: Schedule) -> Schedule:
    replay = Schedule.original(schedule.analysis)
    for move in schedule.path:
        replay = replay.apply(move)
    assert replay.key == schedule.key
    return replay


def test_walk_actions_move_one_instruction_up_to_their_stride(matmul):
    game = AssemblyGame(matmul, MeasurementLog(IssueModel(), budget=10))
    game.reset()
    m = 2 * len(matmul.movable)
    mask = game.action_masks()
    assert mask.shape == (game.action_space.n,) == (m * len(game.strides) + 2 * len(game.blocks),)
    single = game.schedule.legal_mask()
    for j, stride in enumerate(game.strides):
        assert (mask[j * m : (j + 1) * m] == single).all()  # a walk is legal when its first move is
        for action in np.nonzero(single)[0]:
            moved = game.play(j * m + int(action))
            instruction, direction = matmul.movable[action // 2], UP if action % 2 == 0 else DOWN
            assert 1 <= len(moved.path) <= stride
            assert {(mv.instruction, mv.direction) for mv in moved.path} == {(instruction, direction)}
            if len(moved.path) < stride:  # stopped early: the next move is illegal
                assert moved.check(Move(instruction, direction))[0] is None
            _replayed(moved)


def test_block_actions_hoist_every_load_and_sink_every_store(matmul):
    game = AssemblyGame(matmul, MeasurementLog(IssueModel(), budget=10))
    game.reset()
    assert game.blocks == run_blocks(game.original) and game.blocks, "the sample matmul has blocks of loads"
    m = 2 * len(matmul.movable) * len(game.strides)
    mask = game.action_masks()
    played = 0
    for n, block in enumerate(game.blocks):
        for direction in (UP, DOWN):
            action = m + 2 * n + (direction == DOWN)
            moved = game.play(action)
            assert mask[action] == (moved.key != game.original.key)
            if not mask[action]:
                continue
            played += 1
            _replayed(moved)
            members = {
                i for i in matmul.movable if matmul.block_of[i] == block and is_expert(moved, i, direction)
            }
            assert {mv.instruction for mv in moved.path} <= members
            for i in members:  # each as far as legal, or stopped behind another of the run
                following, _ = moved.check(Move(i, direction))
                if following is not None:
                    neighbour = moved.order[int(moved.position[i]) + direction]
                    assert neighbour in members, matmul.instructions[i].text
    assert played
    assert {s.key for s in block_runs(game.original)} == {
        block_run(game.original, b, d).key for b in game.blocks for d in (UP, DOWN)
    } - {game.original.key}


def test_cuasmrl_game_has_one_slot_moves_only(matmul):
    game = AssemblyGame(matmul, MeasurementLog(IssueModel(), budget=10), strides=(1,), block_actions=False)
    game.reset()
    assert game.action_space.n == 2 * len(matmul.movable)
    assert (game.action_masks() == game.schedule.legal_mask()).all()
    with pytest.raises(ValueError, match="strides"):
        AssemblyGame(matmul, MeasurementLog(IssueModel(), budget=10), strides=(4, 16))


class Recorder(IssueModel):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.seen: list[tuple] = []

    def measure(self, schedule: Schedule) -> float:
        self.seen.append(schedule.key)
        return super().measure(schedule)


def test_greedy_measures_the_block_runs_first(matmul):
    model = Recorder()
    search(matmul, model, budget=8, method="greedy", seed=1)
    runs = {s.key for s in block_runs(Schedule.original(matmul))}
    assert runs and set(model.seen[1 : 1 + len(runs)]) == runs
