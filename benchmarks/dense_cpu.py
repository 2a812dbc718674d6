"""``dense`` (a linear layer: W stored N × K, + bias + ReLU) at few rows on the CPU: the default
schedule (dot products over K for few rows, W read in place) against the BLIS form with W's panels
packed (the default before) and NumPy (``np.maximum(x @ w.T + b, 0)``), interleaved in rounds.

    python benchmarks/dense_cpu.py [--threads 1] [--rounds 3] [--only 1x3072x768,...] [--out FILE.json]
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
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polytile import ops  # noqa: E402
from polytile.build import build  # noqa: E402
from polytile.cli import time_call  # noqa: E402
from polytile.ops.matmul import GEMM_FORM, cpu_gemm_tiles  # noqa: E402
from polytile.schedule.state import Schedule  # noqa: E402
from polytile.target import cpu_target  # noqa: E402

# the linear layers of GPT-2 and BERT-large at 1, 3 and 8 tokens, and off-suite sizes (odd, prime)
SHAPES = [(1, 3072, 768), (8, 3072, 768), (1, 1024, 1024), (8, 1024, 1024), (1, 1024, 4096), (3, 4096, 1024),
          (1, 1531, 777), (5, 1000, 999), (13, 257, 1031)]


def packed(op: ops.Op, target: object) -> object:
    """The BLIS form with W's panels packed: the default schedule of ``dense`` before dot products."""
    M, N, K = (op.shape[k] for k in ("M", "N", "K"))
    form = {"kernel": "gemm", **GEMM_FORM, **cpu_gemm_tiles(M, N, K, target), "parallel": "ic"}
    sched = Schedule(op.func)
    return build(op.schedules["cpu"](sched, target, form) or sched, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=0.1)
    parser.add_argument("--only", default="", help="comma-separated MxNxK")
    parser.add_argument("--out")
    args = parser.parse_args()
    shapes = [s for s in SHAPES if not args.only or "x".join(map(str, s)) in args.only.split(",")]
    target = cpu_target()
    load_before = os.getloadavg()
    results = []
    for n, (M, N, K) in enumerate(shapes):
        op = ops.dense(M, N, K)
        kern, old = op.build(target), packed(op, target)
        inputs = op.make_inputs(np.random.default_rng(n + 1))
        ref = op.reference(*inputs)
        errs = [ops.rel_error(k(*inputs), ref) for k in (kern, old)]
        times: dict[str, list[float]] = {"dot": [], "packed": [], "numpy": []}
        for _ in range(args.rounds):
            times["dot"].append(kern.benchmark(*inputs, repeat=5, min_time=args.min_time))
            times["packed"].append(old.benchmark(*inputs, repeat=5, min_time=args.min_time))
            times["numpy"].append(time_call(op.baseline, inputs, repeat=5, min_time=args.min_time))
        t = {k: statistics.median(v) for k, v in times.items()}
        row = {"shape": [M, N, K], "correct": all(e <= op.tolerance for e in errs), "dot_s": t["dot"],
               "packed_s": t["packed"], "numpy_s": t["numpy"], "dot_vs_numpy": t["numpy"] / t["dot"],
               "packed_vs_numpy": t["numpy"] / t["packed"], "dot_vs_packed": t["packed"] / t["dot"]}
        results.append(row)
        print(json.dumps(row), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    now = datetime.datetime.now(datetime.UTC)
    record = {"benchmark": "dense_cpu", "date": now.isoformat(timespec="seconds"),
              "command": " ".join(["python", *sys.argv]), "polytile_commit": commit.strip() or "unknown",
              "device": target.model.replace("_", " "), "cores": target.cores,
              "threads": int(os.environ.get("OMP_NUM_THREADS", target.cores)), "numpy": np.__version__,
              "python": platform.python_version(), "load_average_before": load_before,
              "load_average_after": os.getloadavg(),
              "timing": "medians of interleaved rounds (each the median of repeated runs after warm-up); kernels on "
                        "prepared arguments, NumPy called from Python", "results": results}
    out = Path(args.out or ROOT / "benchmarks" / "results" /
               f"dense_cpu-{datetime.date.today():%Y%m%d}.json")
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
