"""Search: annealing on a known cost finds its optimum; the tuners never propose a configuration twice;
the cost-model-guided tuner beats random search on a synthetic cost."""

from __future__ import annotations

import numpy as np

from polytile.target import CPUTarget
from polytile.tune import ConfigSpace, GridTuner, ModelTuner, RandomTuner, TemplateConfig, anneal


def _space() -> ConfigSpace:
    cfg = TemplateConfig("define", CPUTarget(cores=2))
    cfg.split("a", 1024, 3, policy="pow2")
    cfg.split("b", 512, 2, policy="pow2")
    cfg.knob("c", [1, 2, 3, 4, 5, 6])
    cfg.tag("t", "x", ["serial", "unroll", "vectorize"])
    return ConfigSpace(cfg.decisions)


def _cost(space: ConfigSpace, d) -> float:  # noqa: ANN001
    v = space.config(d).values
    a, b = v["a"], v["b"]
    return float((np.log2(a[1]) - 5) ** 2 + (np.log2(a[2]) - 3) ** 2 + (np.log2(b[1]) - 6) ** 2
                 + (v["c"] - 4) ** 2 + (0 if v["t"] == "unroll" else 3) + 1)


def test_annealing_on_the_true_cost_finds_the_optimum():
    space = _space()
    costs = np.array([_cost(space, space.config_at(i).digits) for i in range(space.size)])
    best = space.config_at(int(costs.argmin())).digits
    found = anneal(space, lambda rows: -np.array([_cost(space, r) for r in rows]), 8, set(),
                   np.random.default_rng(0), chains=32, steps=200)
    assert found[0] == best


def _run(tuner, space, trials: int, batch: int = 8) -> list[float]:  # noqa: ANN001
    seen, curve = set(), []
    while len(seen) < trials:
        ds = tuner.next_batch(batch)
        assert ds and not (set(ds) & seen), "a configuration was proposed twice"
        seen |= set(ds)
        costs = [_cost(space, d) for d in ds]
        tuner.update(ds, costs)
        curve.append(min(c for _, c in tuner.history))
    return curve


def test_model_guided_search_reaches_the_optimum_and_beats_random():
    space = _space()
    guided = [_run(ModelTuner(space, seed=s), space, 48)[-1] for s in range(3)]
    random = [_run(RandomTuner(space, seed=s), space, 48)[-1] for s in range(3)]
    assert min(guided) == 1.0  # the optimum (one configuration among 11880)
    assert np.mean(guided) < np.mean(random)


def test_tuners_skip_configurations_already_measured_and_grid_goes_in_order():
    space = _space()
    done = [space.config_at(i).digits for i in range(5)]
    for kind in (ModelTuner, RandomTuner, GridTuner):
        t = kind(space, seed=0)
        t.update(done, [1.0] * 5)
        assert not set(t.next_batch(16)) & set(done)
    grid = GridTuner(space)
    assert grid.next_batch(3) == [space.config_at(i).digits for i in range(3)]


def test_epsilon_greedy_mixes_random_configurations():
    space = _space()
    t = ModelTuner(space, seed=0, epsilon=1.0, min_train=1)
    first = t.next_batch(8)
    t.update(first, [_cost(space, d) for d in first])
    batch = t.next_batch(8)
    assert len(batch) == 8 and not set(batch) & set(first)


def test_itervar_reranking_lowers_only_a_few_candidates_per_batch():
    space = _space()
    asked: list[int] = []

    def features_of(ds):  # noqa: ANN001, ANN202 - stands in for lowering in the build processes
        asked.append(len(ds))
        return [space.knob_features(np.array([d]))[0] * 2.0 for d in ds]

    t = ModelTuner(space, seed=0, feature="itervar", features_of=features_of, rerank=3)
    curve = []
    for _ in range(6):
        ds = t.next_batch(8)
        costs = [_cost(space, d) for d in ds]
        t.update(ds, costs, [features_of([d])[0] for d in ds])
        curve.append(min(c for _, c in t.history))
    reranks = [n for n in asked if n > 1]
    assert reranks and max(reranks) <= 24
    assert curve[-1] < curve[0]
