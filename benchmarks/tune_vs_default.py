"""Does tuning start from the default? ``pt.tune`` on workloads no benchmark uses (CPU), or on the
GPU's row operators (``--target cuda``: softmax and layernorm of the shape suite's and odd widths),
then the default kernel and the tuned one timed again side by side (interleaved rounds, one process).

The tuner proposes the operator's default schedule (the template's first choices) first, so it is among
the measured trials and the tuned kernel is never slower than the default as measured during tuning;
the re-timing here checks it afterwards, with the machine's load in the record.

    python benchmarks/tune_vs_default.py [--target cuda] [--threads 1] [--trials 16] [--tuner xgb] [--rounds 5]
        [--workloads "layernorm:M=2048,N=4096;softmax:M=32,N=128256"] [--records R.jsonl] [--out FILE.json]
"""

from __future__ import annotations

import _threads  # noqa: F401 - sets the thread variables before NumPy loads its BLAS

# isort: split
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import polytile as pt  # noqa: E402
from polytile import ops  # noqa: E402
from polytile.runtime.cuda_device import cuda_target  # noqa: E402
from polytile.target import cpu_target  # noqa: E402
from polytile.tune.records import RecordLog  # noqa: E402

WORKLOADS = [("matmul", dict(M=5, N=1000, K=999)), ("softmax", dict(M=37, N=5001)),
             ("dense", dict(M=3, N=1531, K=777))]
GPU_WORKLOADS = [("softmax", dict(M=3000, N=1000)), ("softmax", dict(M=512, N=30522)),
                 ("layernorm", dict(M=3001, N=5003))]


def _workload(text: str) -> tuple[str, dict[str, object]]:
    """``op:M=3,N=5,dtype=float16`` as (op, its arguments)."""
    name, _, args = text.strip().partition(":")
    pairs = (a.split("=", 1) for a in args.split(",") if a)
    return name, {k: int(v) if v.isdigit() else v for k, v in pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--tuner", default="xgb")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="", help="comma-separated operator names")
    parser.add_argument("--target", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--workloads", help="op:M=..,N=..;... instead of the built-in list of the target")
    parser.add_argument("--records", help="the tuning records (default: a temporary file)")
    parser.add_argument("--out")
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = []
    records = Path(args.records or Path(tempfile.mkdtemp()) / "tune.jsonl")
    listed = [_workload(w) for w in args.workloads.split(";")] if args.workloads else None
    for name, shape in listed or (GPU_WORKLOADS if args.target == "cuda" else WORKLOADS):
        if args.only and name not in args.only.split(","):
            continue
        tuned = pt.tune(name, target=args.target, trials=args.trials, tuner=args.tuner, records=str(records),
                        progress=False, **shape)
        result = tuned.tune_result
        op = ops.get(name, **shape)
        default = op.build(result.task.target)
        trials = RecordLog(records).select(result.task.key, result.task.target.key)
        wanted = result.task.space.default.to_json()
        measured = [r for r in trials if r.config == wanted]  # records come in the order builds finished
        inputs = op.make_inputs(np.random.default_rng(1))
        times: dict[str, list[float]] = {"default": [], "tuned": []}
        for _ in range(args.rounds):
            times["default"].append(default.benchmark(*inputs, repeat=5, min_time=0.1))
            times["tuned"].append(tuned.benchmark(*inputs, repeat=5, min_time=0.1))
        t = {k: statistics.median(v) for k, v in times.items()}
        row = {"workload": result.task.workload.key, "template": result.task.template.name,
               "default_measured": bool(measured),
               "default_during_tuning_s": measured[0].cost if measured else None,
               "best_during_tuning_s": result.best.cost, "best_config": result.best.config,
               "best_is_default": result.best.config == wanted,
               "default_s": t["default"], "tuned_s": t["tuned"], "tuned_vs_default": t["default"] / t["tuned"],
               "trials": len(result.records)}
        results.append(row)
        print(json.dumps(row), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    target = cuda_target() if args.target == "cuda" else cpu_target()
    cores = (os.cpu_count() or 1) if args.target == "cuda" else target.cores
    record = {"benchmark": "tune_vs_default",
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "command": " ".join(["python", *sys.argv]), "polytile_commit": commit.strip() or "unknown",
              "device": target.name if args.target == "cuda" else target.model.replace("_", " "),
              "cores": cores, "threads": int(os.environ.get("OMP_NUM_THREADS", cores)),
              "target": args.target, "tuner": args.tuner,
              "trials": args.trials, "python": platform.python_version(), "load_average_before": load_before,
              "load_average_after": os.getloadavg(),
              "timing": "default and tuned kernels on prepared arguments, medians of interleaved rounds (each the "
                        "median of repeated runs after warm-up); *_during_tuning_s: the tuning run's own measurements",
              "results": results}
    out = Path(args.out or ROOT / "benchmarks" / "results" /
               f"tune_vs_default-{datetime.date.today():%Y%m%d}{'-gpu' if args.target == 'cuda' else ''}.json")
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
