"""The statistical cost model: gradient-boosted trees (XGBoost) over candidate features.

Targets are normalized throughputs (best cost / cost; failed trials score 0), so larger is better.
Two objectives: ``"rank"`` (pairwise ranking, AutoTVM's choice: only the order matters to the search)
and ``"reg"`` (squared-error regression). The model is refit from scratch on all measurements each
time new ones arrive — small data, fast trees.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .space import TuneError

OBJECTIVES = {"rank": "rank:pairwise", "reg": "reg:squarederror"}


@dataclass
class XGBModel:
    """``fit(features, costs)`` then ``predict(features)`` (higher = faster)."""

    objective: str = "rank"
    rounds: int = 120
    max_depth: int = 4
    eta: float = 0.2
    seed: int = 0
    threads: int = 1
    _booster: object | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise TuneError(f"unknown cost-model objective {self.objective!r}; use 'rank' or 'reg'")

    @property
    def fitted(self) -> bool:
        return self._booster is not None

    def fit(self, features: np.ndarray, costs: np.ndarray, base_margin: np.ndarray | None = None) -> None:
        """Fit on rows of features and their measured costs (seconds; inf for failed trials).
        ``base_margin``: a prior score per row the trees add to (AutoTVM's transfer of a base model)."""
        import xgboost as xgb
        costs = np.asarray(costs, dtype=np.float64)
        ok = np.isfinite(costs) & (costs > 0)
        if ok.sum() < 2:
            return
        y = np.zeros(len(costs))
        y[ok] = costs[ok].min() / costs[ok]
        dtrain = xgb.DMatrix(np.asarray(features, dtype=np.float32), label=y)
        if base_margin is not None:
            dtrain.set_base_margin(np.asarray(base_margin, dtype=np.float32))
        if self.objective == "rank":
            dtrain.set_group([len(y)])
        params = {"objective": OBJECTIVES[self.objective], "max_depth": self.max_depth, "eta": self.eta,
                  "gamma": 1e-4, "min_child_weight": 1, "subsample": 1.0, "lambda": 1.0,
                  "nthread": self.threads, "seed": self.seed, "verbosity": 0}
        self._booster = xgb.train(params, dtrain, num_boost_round=self.rounds)

    def predict(self, features: np.ndarray, base_margin: np.ndarray | None = None) -> np.ndarray:
        """Scores of rows of features (higher is better; the raw margin, plus ``base_margin`` when the
        model was fit with one); zeros (or the base margin) before the first fit."""
        features = np.asarray(features, dtype=np.float32)
        if self._booster is None:
            return np.zeros(len(features)) if base_margin is None else np.asarray(base_margin, np.float64)
        if base_margin is None:
            return self._booster.inplace_predict(features)  # type: ignore[attr-defined]
        return self._booster.inplace_predict(features, base_margin=np.asarray(base_margin, dtype=np.float32))  # type: ignore[attr-defined]


def pairwise_accuracy(scores: np.ndarray, costs: np.ndarray) -> float:
    """The share of pairs with different costs that ``scores`` order correctly (0.5 = chance)."""
    scores, costs = np.asarray(scores), np.asarray(costs)
    ds = scores[:, None] - scores[None, :]
    dc = costs[None, :] - costs[:, None]  # positive where row i is faster (smaller cost) than column j
    mask = dc != 0
    if not mask.any():
        return 0.5
    right = (np.sign(ds) == np.sign(dc)) & mask
    ties = (ds == 0) & mask
    return float((right.sum() + 0.5 * ties.sum()) / mask.sum())
