"""The tuner's cost per proposal once its model guides the search: the XGBoost model refit and
simulated annealing on it (``ModelTuner._replan``: 128 chains × up to 300 moves, each configuration
met checked by running the template in check mode), for ``tuning_throughput.py``'s templates.

    python benchmarks/replan_cost.py                 # both templates, 6 proposals each
    python benchmarks/replan_cost.py --target cpu --proposals 10

The tuner (seed 0) is told 24 random configurations first, then proposes batches of 8, each told
synthetic costs (a smooth function of the knob features, one in ten failed; seed 1), so every
proposal replans, as in a run past the random warm-up. Seconds per proposal are the process's CPU
time and wall time; ``digest`` hashes every proposed configuration in order, so two versions of the
tuner can be checked for proposing the same ones.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import _threads  # noqa: F401 - sets the thread variables before NumPy loads its BLAS

# isort: split
import numpy as np  # noqa: E402
from tuning_throughput import WORKLOADS  # noqa: E402

from polytile.tune import make_task  # noqa: E402
from polytile.tune.search import ModelTuner  # noqa: E402


def replan_costs(target: str, proposals: int, batch: int = 8) -> dict:
    (op, shape), = WORKLOADS[target].values()
    task = make_task(op, target, **shape)
    space = task.space
    tuner = ModelTuner(space, 0)
    rng = np.random.default_rng(1)

    def costs(batch_digits: list[tuple[int, ...]]) -> list[float]:
        f = space.knob_features(np.array(batch_digits))
        c = 1e-3 * (1 + np.abs(np.sin(f.sum(axis=1))) + 0.1 * rng.random(len(batch_digits)))
        c[rng.random(len(batch_digits)) < 0.1] = np.inf
        return c.tolist()

    first = tuner.propose(24)
    tuner.update(first, costs(first))
    seen = [first]
    cpu, wall = [], []
    for _ in range(proposals):
        c0, w0 = time.process_time(), time.perf_counter()
        got = tuner.propose(batch)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
        seen.append(got)
        tuner.update(got, costs(got))
    digest = hashlib.sha256(json.dumps([[list(map(int, d)) for d in b] for b in seen]).encode()).hexdigest()[:16]
    return {"op": op, "shape": shape, "space_size": space.size, "cpu_s": [round(x, 3) for x in cpu],
            "wall_s": [round(x, 3) for x in wall], "median_cpu_s": round(statistics.median(cpu), 3),
            "median_wall_s": round(statistics.median(wall), 3), "digest": digest}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="all", choices=["cpu", "cuda", "all"])
    p.add_argument("--proposals", type=int, default=6, help="proposals timed per template (default 6)")
    p.add_argument("--out", help="result JSON (default benchmarks/results/replan_cost-<time>.json)")
    args = p.parse_args(argv)
    result = {"benchmark": "replan_cost", "date": datetime.datetime.now(datetime.UTC).isoformat(),
              "command": " ".join(["replan_cost.py", *argv]), "load_at_start": os.getloadavg(), "targets": {}}
    for kind in (["cpu", "cuda"] if args.target == "all" else [args.target]):
        r = replan_costs(kind, args.proposals)
        result["targets"][kind] = r
        print(f"{kind}: {r['median_cpu_s']:.2f} CPU s ({r['median_wall_s']:.2f} s wall) per proposal, median of "
              f"{args.proposals}; proposals digest {r['digest']}", flush=True)
    result["load_at_end"] = os.getloadavg()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or f"benchmarks/results/replan_cost-{stamp}.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
