"""Search: simulated annealing on the cost model (PLANT Algorithm 4.1) and the tuners that propose
batches of configurations — model-guided, random, grid, and ALCOP's analytical and
analytical+XGBoost tuners (which need the template's analytical model, ``predict``).

A tuner sees configurations as digit vectors of its ``ConfigSpace``. ``propose(n)`` proposes up
to ``n`` valid configurations never proposed before (``next_batch``), the first batch led by the
space's default configuration (the first choice of every decision: the templates put the
operator's default schedule there), so that a tuned kernel is measured against the default;
``update`` feeds back measured costs (seconds, ``inf`` for failed trials). No configuration is
proposed twice: the visited set includes every configuration already in the records of a resumed
run.
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

    def offer(rows: list[Digits], vals: np.ndarray) -> bool:
        changed = False
        for d, v in zip(rows, vals.tolist(), strict=False):
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

    offer(start, scores)
    t, cool = temperature, temperature / max(1, steps)
    quiet = 0
    for _ in range(steps):
        new = space.neighbor(points, rng)
        rows = [tuple(r) for r in new.tolist()]  # Python ints: the keys of the space's checks and of the sets
        valid = np.array([space.is_valid(d) for d in rows])
        new_scores = np.full(len(new), -np.inf)
        if valid.any():
            new_scores[valid] = score(new[valid])
        gain = (new_scores - scores) / scale
        accept = valid & (rng.random(len(new)) < np.exp(np.minimum(gain / max(t, 1e-5), 0.0)))
        points[accept] = new[accept]
        scores[accept] = new_scores[accept]
        quiet = 0 if offer([d for d, ok in zip(rows, valid.tolist(), strict=True) if ok], new_scores[valid]) \
            else quiet + 1
        if quiet >= early_stop:
            break
        t = max(0.0, t - cool)
    return [d for _, d in sorted(best, reverse=True)]


class Tuner:
    """Proposes configurations of ``space``; remembers every one it proposed or was told about."""

    name = "tuner"
    needs_model = False  # whether it takes ``predict``, the template's analytical model
    needs_task = False  # whether it takes ``task`` (the tensor language model writes the task's prompt)
    starts_at_default = True  # whether the first batch leads with the space's default configuration

    def __init__(self, space: ConfigSpace, seed: int = 0):
        self.space = space
        self.rng = np.random.default_rng(seed)
        self.visited: set[Digits] = set()
        self.history: list[tuple[Digits, float]] = []
        self.started = False

    def propose(self, n: int) -> list[Digits]:
        """Up to ``n`` new valid configurations (``next_batch``); the first call puts the space's
        default configuration first when it is valid and was not measured before (replayed records)."""
        first: list[Digits] = []
        if not self.started and self.starts_at_default and n > 0:
            first = self._take([self.space.default.digits], 1)
        self.started = True
        return first + (self.next_batch(n - len(first)) if n > len(first) else [])

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
    exist, batches are random, led by the default configuration while it is unmeasured.

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

    def _prior(self, features: np.ndarray) -> np.ndarray | None:
        """Scores the model starts from (its base margin); none here."""
        return None

    def _refit(self) -> None:
        rows = np.array([d for d, _ in self.history], dtype=np.int64).reshape(-1, len(self.space.decisions))
        costs = np.array([c for _, c in self.history])
        features = self.space.knob_features(rows)
        self.model.fit(features, costs, self._prior(features))
        if self.iter_model is not None:
            have = [k for k, (d, _) in enumerate(self.history) if d in self.iter_features]
            if len(have) >= 2:
                feats = np.stack([self.iter_features[self.history[k][0]] for k in have])
                self.iter_model.fit(feats, costs[have])
        self._dirty = False

    def _score(self, rows: np.ndarray) -> np.ndarray:
        features = self.space.knob_features(rows)
        return self.model.predict(features, self._prior(features))

    def _replan(self) -> None:
        self._refit()
        self.plan = anneal(self.space, self._score, self.plan_size, self.visited, self.rng,
                           chains=self.chains, steps=self.steps)

    def next_batch(self, n: int) -> list[Digits]:
        if sum(1 for _, c in self.history if np.isfinite(c)) < self.min_train:
            return self._take([self.space.default.digits, *self.space.sample_valid(self.rng, n, self.visited)], n)
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


class AnalyticalTuner(Tuner):
    """ALCOP's analytical search: configurations in the order of the analytical model's predicted
    time, fastest first (ties in index order), each measured once.

    ``predict(digit rows) -> seconds`` is the template's model (inf: the model rules it out; those
    come last). A space of at most ``exhaustive_limit`` configurations is ranked whole (a model
    evaluation costs tens of microseconds); a larger one by annealing on the model (best
    ``plan_size`` unmeasured per plan).
    """

    name = "analytical"
    needs_model = True
    starts_at_default = False  # ALCOP's order: the model's ranking from the first trial

    def __init__(self, space: ConfigSpace, seed: int = 0, *,
                 predict: Callable[[Sequence[Digits]], np.ndarray], exhaustive_limit: int = 100_000,
                 plan_size: int = 64, chains: int = 128, steps: int = 300):
        super().__init__(space, seed)
        self.predict = predict
        self.exhaustive_limit, self.plan_size = exhaustive_limit, plan_size
        self.chains, self.steps = chains, steps
        self._ranking: list[Digits] | None = None
        self._cursor = 0

    def ranking(self) -> list[Digits]:
        """Every valid configuration, predicted fastest first (spaces up to ``exhaustive_limit``)."""
        if self._ranking is None:
            valid = [d for d in (self.space.config_at(i).digits for i in range(self.space.size))
                     if self.space.is_valid(d)]
            times = np.asarray(self.predict(valid), dtype=np.float64) if valid else np.zeros(0)
            self._ranking = [valid[k] for k in np.argsort(times, kind="stable")]
        return self._ranking

    def next_batch(self, n: int) -> list[Digits]:
        if self.space.size > self.exhaustive_limit:
            def score(rows: np.ndarray) -> np.ndarray:
                times = self.predict([tuple(int(x) for x in r) for r in rows])
                return -np.log(np.asarray(times, dtype=np.float64))
            plan = anneal(self.space, score, max(n, self.plan_size), self.visited, self.rng,
                          chains=self.chains, steps=self.steps)
            return self._take(plan, n)
        ranked = self.ranking()
        out: list[Digits] = []
        while len(out) < n and self._cursor < len(ranked):
            out += self._take([ranked[self._cursor]], 1)
            self._cursor += 1
        return out


class AnalyticalXGBTuner(ModelTuner):
    """ALCOP's model-assisted search: the XGBoost cost model pre-trained on the analytical model's
    predictions, then refined with measurements.

    Before the first batch, a base model (same features and objective) is fit on the predicted times
    of ``pretrain_size`` random valid configurations. The tuning model is then fit on the
    measurements with the base model's scores as its base margin, discounted by 2^(-n/64) after n
    measurements and dropped below 0.05 — the transfer mechanism of AutoTVM's
    ``XGBoostCostModel`` (``fit``, ``_base_model_discount``) that the ALCOP artifact tunes with
    (``python/tvm/autotvm/tuner/xgboost_cost_model.py``). Unlike ``xgb``, the first batches already
    follow the model (no random warm-up): the pre-trained model knows the space from the start.
    """

    name = "analytical+xgboost"
    needs_model = True
    starts_at_default = False  # the pre-trained model's choices from the first batch

    def __init__(self, space: ConfigSpace, seed: int = 0, *,
                 predict: Callable[[Sequence[Digits]], np.ndarray], pretrain_size: int = 2048,
                 min_train: int = 0, **options: object):
        super().__init__(space, seed, min_train=min_train, **options)  # type: ignore[arg-type]
        self.predict = predict
        self.pretrain_size = pretrain_size
        self.base: XGBModel | None = None
        self._pretrained = False

    def _pretrain(self) -> None:
        self._pretrained = True
        sample = self.space.sample_valid(self.rng, self.pretrain_size)
        if len(sample) < 2:
            return
        self.base = XGBModel(self.model.objective, seed=self.model.seed)
        self.base.fit(self.space.knob_features(np.array(sample, dtype=np.int64)), self.predict(sample))

    def discount(self) -> float:
        """The weight of the pre-trained model's scores after the measurements so far."""
        return 2.0 ** (-len(self.history) / 64.0)

    def _prior(self, features: np.ndarray) -> np.ndarray | None:
        if not self._pretrained:
            self._pretrain()
        if self.base is not None and self.discount() < 0.05:
            self.base = None  # enough measurements: the prior is dropped, as AutoTVM does
        if self.base is None:
            return None
        return self.discount() * self.base.predict(features)


TUNERS: dict[str, type[Tuner]] = {"xgb": ModelTuner, "random": RandomTuner, "grid": GridTuner,
                                  "analytical": AnalyticalTuner, "analytical+xgboost": AnalyticalXGBTuner}


def make_tuner(kind: str, space: ConfigSpace, seed: int = 0, **options: object) -> Tuner:
    """A tuner by name: "xgb" (model-guided annealing), "random", "grid", "analytical" (the analytical
    model's ranking), "analytical+xgboost" (XGBoost pre-trained on the analytical model) — these two
    take ``predict`` (digit rows -> predicted seconds) — or "tlm" (the tensor language model, registered
    by ``polytile.tune.tlm``; takes ``task`` and ``model``)."""
    if kind not in TUNERS:
        raise TuneError(f"unknown tuner {kind!r}; use one of {', '.join(TUNERS)}")
    if TUNERS[kind].needs_model and options.get("predict") is None:
        raise TuneError(f"tuner {kind!r} needs the template's analytical model (predict=...)")
    return TUNERS[kind](space, seed, **options)  # type: ignore[arg-type]
