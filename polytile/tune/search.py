"""Search: simulated annealing on the cost model (PLANT Algorithm 4.1) and the tuners that propose
batches of configurations — model-guided, random and grid.

A tuner sees configurations as digit vectors of its ``ConfigSpace``. ``next_batch(n)`` proposes up
to ``n`` valid configurations never proposed before; ``update`` feeds back measured costs (seconds,
``inf`` for failed trials). No configuration is proposed twice: the visited set includes every
configuration already in the records of a resumed run.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import numpy as np

from .model import XGBModel
from .space import ConfigSpace, TuneError

Digits = tuple[int, ...]


def anneal(space: ConfigSpace, score: Callable[[np.ndarray], np.ndarray], n_keep: int,
           exclude: set[Digits], rng: np.random.Generator, *, chains: int = 128, steps: int = 300,
           early_stop: int = 50, temperature: float = 1.0) -> list[Digits]:
    """The ``n_keep`` best-scoring valid configurations not in ``exclude`` met by ``chains`` parallel
    annealing walks of up to ``steps`` moves (one decision changed per move), best first.

    A move to a lower score is accepted with probability exp(Δ / T) (scores normalized by their
    spread), T falling linearly to zero; the walk stops early when the kept set has not improved for
    ``early_stop`` steps.
    """
    start = space.sample_valid(rng, chains)
    if not start:
        return []
    points = np.array(start, dtype=np.int64)
    scores = np.asarray(score(points), dtype=np.float64)
    scale = float(np.std(scores)) or 1.0
    best: list[tuple[float, Digits]] = []  # min-heap of the kept (score, digits)
    kept: set[Digits] = set()

    def offer(rows: np.ndarray, vals: np.ndarray) -> bool:
        changed = False
        for row, v in zip(rows, vals, strict=False):
            d = tuple(int(x) for x in row)
            if d in kept or d in exclude or not np.isfinite(v):
                continue
            if len(best) < n_keep:
                heapq.heappush(best, (float(v), d))
            elif v > best[0][0]:
                _, out = heapq.heapreplace(best, (float(v), d))
                kept.discard(out)
            else:
                continue
            kept.add(d)
            changed = True
        return changed

    offer(points, scores)
    t, cool = temperature, temperature / max(1, steps)
    quiet = 0
    for _ in range(steps):
        new = space.neighbor(points, rng)
        valid = np.array([space.is_valid(row) for row in new])
        new_scores = np.full(len(new), -np.inf)
        if valid.any():
            new_scores[valid] = score(new[valid])
        gain = (new_scores - scores) / scale
        accept = valid & (rng.random(len(new)) < np.exp(np.minimum(gain / max(t, 1e-5), 0.0)))
        points[accept] = new[accept]
        scores[accept] = new_scores[accept]
        quiet = 0 if offer(new[valid], new_scores[valid]) else quiet + 1
        if quiet >= early_stop:
            break
        t = max(0.0, t - cool)
    return [d for _, d in sorted(best, reverse=True)]


class Tuner:
    """Proposes configurations of ``space``; remembers every one it proposed or was told about."""

    name = "tuner"

    def __init__(self, space: ConfigSpace, seed: int = 0):
        self.space = space
        self.rng = np.random.default_rng(seed)
        self.visited: set[Digits] = set()
        self.history: list[tuple[Digits, float]] = []

    def next_batch(self, n: int) -> list[Digits]:
        raise NotImplementedError

    def update(self, digits: Sequence[Digits], costs: Sequence[float],
               features: Sequence[np.ndarray | None] | None = None) -> None:
        """Measured results (seconds; inf for a failed trial), with iter features where known."""
        for d, c in zip(digits, costs, strict=False):
            self.visited.add(tuple(d))
            self.history.append((tuple(d), float(c)))

    def _take(self, candidates: Sequence[Digits], n: int) -> list[Digits]:
        out: list[Digits] = []
        for d in candidates:
            if len(out) == n:
                break
            if d not in self.visited and self.space.is_valid(d):
                out.append(d)
                self.visited.add(d)
        return out


class RandomTuner(Tuner):
    """Uniformly random valid configurations, without repetition."""

    name = "random"

    def next_batch(self, n: int) -> list[Digits]:
        return self._take(self.space.sample_valid(self.rng, n, self.visited), n)


class GridTuner(Tuner):
    """Configurations in index order (the last decision varies fastest), skipping invalid ones."""

    name = "grid"

    def __init__(self, space: ConfigSpace, seed: int = 0):
        super().__init__(space, seed)
        self.cursor = 0

    def next_batch(self, n: int) -> list[Digits]:
        out: list[Digits] = []
        while len(out) < n and self.cursor < self.space.size:
            d = self.space.config_at(self.cursor).digits
            self.cursor += 1
            out += self._take([d], 1)
        return out


class ModelTuner(Tuner):
    """XGBoost-guided simulated annealing with ε-greedy exploration (PLANT Algorithm 4.1).

    After each update the model is refit on every measurement and annealing plans the ``plan_size``
    best unmeasured configurations by predicted speed. A batch takes from the plan greedily by
    predicted rank plus ``diversity`` times the share of decision values not yet in the batch (so a
    batch does not spend itself on near-copies of one guess), each slot replaced with probability
    ``epsilon`` by a random unmeasured configuration. Until ``min_train`` successful measurements
    exist, batches are random, led by the template's default configuration (the first choice of
    every decision) when it is valid.

    ``feature="knob"`` scores configurations by their decisions. ``feature="itervar"`` also trains a
    second model on iter features (from the lowered IR, which the builders return for every measured
    candidate): annealing on the knob model proposes ``rerank`` times as many candidates as a batch
    needs, ``features_of`` lowers them, and the iter model picks the batch.
    """

    name = "xgb"

    def __init__(self, space: ConfigSpace, seed: int = 0, *, objective: str = "rank", feature: str = "knob",
                 plan_size: int = 64, epsilon: float = 0.05, min_train: int = 16, rerank: int = 3,
                 diversity: float = 0.5,
                 features_of: Callable[[Sequence[Digits]], list[np.ndarray | None]] | None = None,
                 chains: int = 128, steps: int = 300):
        super().__init__(space, seed)
        if feature not in ("knob", "itervar"):
            raise TuneError(f"unknown feature kind {feature!r}; use 'knob' or 'itervar'")
        if feature == "itervar" and features_of is None:
            raise TuneError("feature='itervar' needs features_of (a function lowering configurations)")
        self.feature = feature
        self.model = XGBModel(objective, seed=seed)
        self.iter_model = XGBModel(objective, seed=seed) if feature == "itervar" else None
        self.features_of = features_of
        self.iter_features: dict[Digits, np.ndarray] = {}
        self.plan_size, self.epsilon, self.min_train, self.rerank = plan_size, epsilon, min_train, rerank
        self.diversity = diversity
        self.chains, self.steps = chains, steps
        self.plan: list[Digits] = []
        self._dirty = False

    def update(self, digits: Sequence[Digits], costs: Sequence[float],
               features: Sequence[np.ndarray | None] | None = None) -> None:
        super().update(digits, costs)
        for d, f in zip(digits, features or [None] * len(digits), strict=False):
            if f is not None:
                self.iter_features[tuple(d)] = np.asarray(f, dtype=np.float32)
        self._dirty = True

    def _refit(self) -> None:
        rows = np.array([d for d, _ in self.history], dtype=np.int64)
        costs = np.array([c for _, c in self.history])
        self.model.fit(self.space.knob_features(rows), costs)
        if self.iter_model is not None:
            have = [k for k, (d, _) in enumerate(self.history) if d in self.iter_features]
            if len(have) >= 2:
                feats = np.stack([self.iter_features[self.history[k][0]] for k in have])
                self.iter_model.fit(feats, costs[have])
        self._dirty = False

    def _score(self, rows: np.ndarray) -> np.ndarray:
        return self.model.predict(self.space.knob_features(rows))

    def _replan(self) -> None:
        self._refit()
        self.plan = anneal(self.space, self._score, self.plan_size, self.visited, self.rng,
                           chains=self.chains, steps=self.steps)

    def next_batch(self, n: int) -> list[Digits]:
        if sum(1 for _, c in self.history if np.isfinite(c)) < self.min_train:
            default = (0,) * len(self.space.decisions)
            return self._take([default, *self.space.sample_valid(self.rng, n, self.visited)], n)
        if self._dirty or not self.plan:
            self._replan()
        plan = [d for d in self.plan if d not in self.visited]
        if self.iter_model is not None and self.iter_model.fitted and plan:
            plan = self._rerank(plan[:self.rerank * n])
        plan = self._diverse(plan, n)
        out: list[Digits] = []
        for d in plan:
            if len(out) == n:
                break
            if self.rng.random() < self.epsilon:
                out += self._take(self.space.sample_valid(self.rng, 1, self.visited), 1)
            else:
                out += self._take([d], 1)
        if len(out) < n:
            out += self._take(self.space.sample_valid(self.rng, n - len(out), self.visited), n - len(out))
        return out

    def _diverse(self, plan: list[Digits], n: int) -> list[Digits]:
        """Reorder a ranked plan so its first ``n`` trade predicted rank for new decision values."""
        if self.diversity <= 0 or len(plan) <= n:
            return plan
        left = list(range(len(plan)))
        covered: set[tuple[int, int]] = set()
        order: list[int] = []
        width = len(self.space.decisions)
        for _ in range(n):
            def gain(k: int) -> float:
                new = sum((i, v) not in covered for i, v in enumerate(plan[k]))
                return (1.0 - k / len(plan)) + self.diversity * new / width
            best = max(left, key=gain)
            left.remove(best)
            order.append(best)
            covered.update(enumerate(plan[best]))
        return [plan[k] for k in order] + [plan[k] for k in left]

    def _rerank(self, candidates: list[Digits]) -> list[Digits]:
        feats = self.features_of(candidates)  # type: ignore[misc]
        known = [(d, f) for d, f in zip(candidates, feats, strict=False) if f is not None]
        if not known:
            return candidates
        for d, f in known:
            self.iter_features[d] = np.asarray(f, dtype=np.float32)
        scores = self.iter_model.predict(np.stack([f for _, f in known]))  # type: ignore[union-attr]
        order = [known[k][0] for k in np.argsort(-scores)]
        return order + [d for d in candidates if d not in set(order)]


TUNERS: dict[str, type[Tuner]] = {"xgb": ModelTuner, "random": RandomTuner, "grid": GridTuner}


def make_tuner(kind: str, space: ConfigSpace, seed: int = 0, **options: object) -> Tuner:
    """A tuner by name: "xgb" (model-guided annealing), "random" or "grid"."""
    if kind not in TUNERS:
        raise TuneError(f"unknown tuner {kind!r}; use one of {', '.join(TUNERS)}")
    return TUNERS[kind](space, seed, **options)  # type: ignore[arg-type]
