"""The XGBoost cost model orders held-out configurations better than chance."""

from __future__ import annotations

import numpy as np
import pytest
from test_search import _cost, _space

from polytile.tune import XGBModel, pairwise_accuracy


def test_pairwise_accuracy_measures_order():
    costs = np.array([1.0, 2.0, 3.0, 4.0])
    assert pairwise_accuracy(-costs, costs) == 1.0
    assert pairwise_accuracy(costs, costs) == 0.0
    assert pairwise_accuracy(np.zeros(4), costs) == 0.5


@pytest.mark.parametrize("objective", ["rank", "reg"])
def test_model_ranks_held_out_configurations(objective):
    space = _space()
    rng = np.random.default_rng(0)
    rows = np.array(space.sample_valid(rng, 400))
    costs = np.array([_cost(space, r) for r in rows])
    feats = space.knob_features(rows)
    model = XGBModel(objective)
    model.fit(feats[:150], costs[:150])
    acc = pairwise_accuracy(model.predict(feats[150:]), costs[150:])
    assert acc > 0.8, acc
    untrained = pairwise_accuracy(XGBModel(objective).predict(feats[150:]), costs[150:])
    assert untrained == 0.5


def test_failed_trials_count_as_slowest():
    space = _space()
    rows = np.array(space.sample_valid(np.random.default_rng(2), 120))
    costs = np.array([_cost(space, r) for r in rows])
    costs[rows[:, 3] == 2] = np.inf  # every "vectorize" configuration failed
    model = XGBModel("rank")
    model.fit(space.knob_features(rows), costs)
    pred = model.predict(space.knob_features(rows))
    failed = rows[:, 3] == 2
    assert pred[failed].mean() < pred[~failed].mean()
