"""A measurer that builds nothing: a deterministic cost per configuration (within one process), for
tests of a tuner's own logic (which configurations it proposes, resumes, seeds)."""

import json

from polytile.tune.measure import MeasureResult


class HashMeasurer:
    """Costs from a hash of the configuration; ``seen`` lists every configuration measured."""

    def __init__(self) -> None:
        self.seen: list[dict[str, object]] = []

    @property
    def calls(self) -> int:
        return len(self.seen)

    def measure(self, task, batch, on_result=None):  # noqa: ANN001, ANN201
        out = []
        for k, values in enumerate(batch):
            self.seen.append(values)
            res = MeasureResult("ok", [1e-3 * (1 + abs(hash(json.dumps(values, sort_keys=True, default=str))) % 97)])
            out.append(res)
            if on_result is not None:
                on_result(k, res)
        return out

    def close(self) -> None:
        pass
