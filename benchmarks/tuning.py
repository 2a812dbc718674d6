"""Tuning benchmark: best latency after 16/32/64/128 trials for XGBoost-guided annealing, random
search and grid search, in the same run, beside the vendor library (NumPy/OpenBLAS, torch where
installed).

    python benchmarks/tuning.py                        # fp32 matmul 512³, 1024³, two ResNet-50 convs, CPU
    python benchmarks/tuning.py --trials 32 --workloads mm512
    python benchmarks/tuning.py --target cuda          # the GPU templates (or: -m gpu)

The tuners advance in turns, one batch each, so that they meet the same machine conditions (a
shared machine drifts). Records of every trial go to ``--records-dir`` (one file per workload and
tuner), so a killed run resumes where it stopped. At the end, each tuner's best kernel is timed
again, interleaved with the vendor library, and a JSON record is written under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _threads  # noqa: E402, F401 - sets the thread variables before NumPy loads its BLAS

# isort: split
import numpy as np  # noqa: E402

from polytile import build, ops  # noqa: E402
from polytile.target import as_target  # noqa: E402
from polytile.tune import MeasureOptions, Measurer, RecordLog, make_task, tune_task  # noqa: E402
from polytile.tune.vendor import time_call, vendor_baseline  # noqa: E402

WORKLOADS = {
    "mm512": ("matmul", dict(M=512, N=512, K=512)),
    "mm1024": ("matmul", dict(M=1024, N=1024, K=1024)),
    # ResNet-50: conv2_x 3×3 (56×56, 64→64) and conv4_x 3×3 (14×14, 256→256), batch 1, padding 1
    "res2_3x3": ("conv2d", dict(N=1, C=64, H=56, W=56, K=64, R=3, S=3, stride=1, padding=1)),
    "res4_3x3": ("conv2d", dict(N=1, C=256, H=14, W=14, K=256, R=3, S=3, stride=1, padding=1)),
}
TUNERS = ("xgb", "random", "grid")


def curve_of(path: Path, task) -> list[float]:  # noqa: ANN001
    best, out = math.inf, []
    for r in RecordLog(path).select(task.key, task.target.key):
        best = min(best, r.cost)
        out.append(best)
    return out


def at(curve: list[float], n: int) -> float | None:
    if len(curve) < n:
        return None
    v = curve[n - 1]
    return v if math.isfinite(v) else None


def trials_to_reach(curve: list[float], goal: float) -> int | None:
    for k, v in enumerate(curve):
        if v <= goal:
            return k + 1
    return None


def retime(kernels: dict[str, object], vendor, inputs, rounds: int = 5) -> dict[str, float]:  # noqa: ANN001
    """Median over interleaved rounds of every kernel's time (and the vendor's), in one process."""
    times: dict[str, list[float]] = {k: [] for k in kernels}
    times["vendor"] = []
    for _ in range(rounds):
        for name, kern in kernels.items():
            times[name].append(kern.benchmark(*inputs, repeat=10, min_time=0.1))
        if vendor is not None:
            times["vendor"].append(time_call(vendor[1], inputs, repeat=10, min_time=0.1))
    return {k: statistics.median(v) for k, v in times.items() if v}


def device_info(target) -> str:  # noqa: ANN001
    if target.has("gpu"):
        try:
            return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=20).stdout.strip()
        except OSError:
            return target.key
    return f"{target.model}, {target.cores} threads, {target.vector_bits}-bit SIMD"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="cpu")
    p.add_argument("-m", dest="marker", help="'gpu' is short for --target cuda")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"subset of {', '.join(WORKLOADS)}")
    p.add_argument("--tuners", default=",".join(TUNERS))
    p.add_argument("--trials", type=int, default=128, help="trials per tuner and workload")
    p.add_argument("--checkpoints", default="16,32,64,128")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--records-dir", default="benchmarks/results/tuning-records")
    p.add_argument("--out", help="result JSON (default benchmarks/results/tuning-<date>.json)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads for our kernels and the vendor library (default: all cores)")
    args = p.parse_args(argv)
    target = as_target("cuda" if args.marker == "gpu" else args.target)
    checkpoints = [int(c) for c in args.checkpoints.split(",") if int(c) <= args.trials]
    records_dir = Path(args.records_dir)
    records_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = {
        "benchmark": "tuning", "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *argv]), "device": device_info(target),
        "target": target.key, "host": platform.node(), "trials": args.trials,
        "threads": args.threads or getattr(target, "cores", None), "workloads": {},
    }
    for wl in args.workloads.split(","):
        op_name, shape = WORKLOADS[wl]
        op = ops.get(op_name, **shape)
        entry: dict[str, object] = {"op": op_name, "shape": shape, "flops": op.flops, "tuners": {}}
        kernels = {}
        tuners = args.tuners.split(",")
        task = make_task(op_name, target, **shape)
        paths = {tuner: records_dir / f"{wl}-{tuner}.jsonl" for tuner in tuners}
        seconds = dict.fromkeys(tuners, 0.0)
        results = {}
        with Measurer(MeasureOptions(repeat=10, min_time=0.05, threads=args.threads)) as measurer:
            for n in range(args.batch, args.trials + args.batch, args.batch):
                for tuner in tuners:
                    t0 = time.perf_counter()
                    results[tuner] = tune_task(task, min(n, args.trials), paths[tuner], tuner=tuner,
                                               batch_size=args.batch, seed=args.seed + n, verify=False,
                                               build_best=False, progress=False, measurer=measurer)
                    seconds[tuner] += time.perf_counter() - t0
                bests = {t: min((r.cost for r in results[t].records), default=math.inf) * 1e3 for t in tuners}
                print(f"{wl} {min(n, args.trials):4d} trials: "
                      + "  ".join(f"{t} {b:.3f} ms" for t, b in bests.items()), flush=True)
        for tuner in tuners:
            res = results[tuner]
            curve = curve_of(paths[tuner], task)
            entry["tuners"][tuner] = {  # type: ignore[index]
                "best_after": {str(n): at(curve, n) for n in checkpoints},
                "failures": sum(1 for r in res.records if not r.ok),
                "seconds": round(seconds[tuner], 1),
                "best_config": res.best.config if res.best else None, "curve": curve,
            }
            if res.best is not None:
                kernels[tuner] = build(task.schedule(res.best.config), target)
        inputs = op.make_inputs(np.random.default_rng(args.seed))
        vendor = None if target.has("gpu") else vendor_baseline(op)
        final = retime(kernels, vendor, inputs)
        entry["retimed_seconds"] = final
        entry["vendor"] = vendor[0] if vendor else None
        if "vendor" in final:
            entry["ratio_to_vendor"] = {k: v / final["vendor"] for k, v in final.items() if k != "vendor"}
        done = entry["tuners"]
        if "xgb" in done and "random" in done:  # type: ignore[operator]
            goal = done["random"]["curve"][-1] if done["random"]["curve"] else math.inf  # type: ignore[index]
            entry["xgb_trials_to_random_final"] = trials_to_reach(done["xgb"]["curve"], goal)  # type: ignore[index]
        result["workloads"][wl] = entry  # type: ignore[index]
        _print(wl, entry, checkpoints)
    out = Path(args.out or f"benchmarks/results/tuning-{datetime.date.today().isoformat()}.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


def _print(wl: str, entry: dict, checkpoints: list[int]) -> None:
    print(f"\n{wl}: {entry['op']} {entry['shape']}")
    print("  tuner    " + "".join(f"{'@' + str(n):>10}" for n in checkpoints) + "   retimed   ×vendor")
    for tuner, t in entry["tuners"].items():
        cells = "".join(f"{(v * 1e3 if v else float('nan')):>9.3f} " for v in t["best_after"].values())
        ratio = entry.get("ratio_to_vendor", {}).get(tuner)
        retimed = entry["retimed_seconds"].get(tuner)
        print(f"  {tuner:<8}{cells}{(retimed or float('nan')) * 1e3:>9.3f} {ratio or float('nan'):>8.2f}")
    if entry.get("vendor"):
        print(f"  {entry['vendor']}: {entry['retimed_seconds']['vendor'] * 1e3:.3f} ms")
    if "xgb_trials_to_random_final" in entry:
        print(f"  xgb reaches random's final best after {entry['xgb_trials_to_random_final']} trials")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
