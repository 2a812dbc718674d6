"""The winner: the best configurations are timed again in a fresh process before one is declared; a
tie within the noise band goes to the configuration whose decisions come first in the template's order,
so two runs that measure the same near-ties in another order, with other noise, pick the same one."""

from __future__ import annotations

import numpy as np

from polytile.tune import Record, RecordLog, make_task
from polytile.tune.api import pick_winner


def _record(task, digits, cost):  # noqa: ANN001, ANN202
    values = task.space.config(digits).values
    return Record(task.key, task.target.key, task.template.name, task.space.config(digits).to_json(), "ok",
                  [cost]), values


def test_near_ties_go_to_the_same_configuration_whatever_the_order_and_noise(rng):
    task = make_task("softmax", "cpu", M=64, N=96)
    configs = task.space.sample_valid(np.random.default_rng(7), 4)
    first = min(configs[:3])  # of the three near-tied configurations, the one first in the template's order
    winners = set()
    for _ in range(20):
        noisy = [(d, 1e-3 * (1 + rng.uniform(0, 0.015))) for d in configs[:3]]  # within a 2% band
        noisy.append((configs[3], 1.2e-3))  # clearly slower
        order = rng.permutation(len(noisy))
        timed = [(_record(task, noisy[k][0], noisy[k][1])[0], noisy[k][1]) for k in order]
        winner, _ = pick_winner(task, timed, band=0.02)
        winners.add(task.space.from_values(winner.config).digits)
    assert winners == {first}


def test_a_faster_configuration_outside_the_band_wins():
    task = make_task("softmax", "cpu", M=64, N=96)
    a, b = sorted(task.space.sample_valid(np.random.default_rng(3), 2))
    timed = [(_record(task, a, 1.1e-3)[0], 1.1e-3), (_record(task, b, 1.0e-3)[0], 1.0e-3)]
    assert task.space.from_values(pick_winner(task, timed, band=0.02)[0].config).digits == b


def test_the_declared_winner_is_the_records_best_until_a_later_trial(tmp_path):
    task = make_task("softmax", "cpu", M=64, N=96)
    a, b, c = task.space.sample_valid(np.random.default_rng(5), 3)
    log = RecordLog(tmp_path / "r.jsonl")
    log.append(_record(task, a, 1.00e-3)[0])
    log.append(_record(task, b, 1.01e-3)[0])
    declared = _record(task, b, 1.005e-3)[0]
    declared.role = "winner"
    log.append(declared)
    assert log.best(task.key, task.target.key).config == declared.config  # not the fastest first timing
    assert len(log.select(task.key, task.target.key)) == 2  # the declaration is not a trial
    log.append(_record(task, c, 0.5e-3)[0])  # a later run found a faster one and has not declared yet
    assert log.best(task.key, task.target.key).config == task.space.config(c).to_json()


def test_without_retiming_the_fastest_checked_trial_wins_and_nothing_is_declared(tmp_path):
    from polytile.tune import MeasureOptions, tune_task
    path = tmp_path / "r.jsonl"
    result = tune_task(make_task("softmax", "cpu", M=24, N=40), 3, path, tuner="grid", batch_size=3,
                       progress=False, measure=MeasureOptions(repeat=3, min_time=0.0, retime=0, result_cache=False))
    assert result.verified and result.best.role == "trial"
    assert result.best.cost == min(r.cost for r in result.records)
    assert "winner" not in path.read_text()
