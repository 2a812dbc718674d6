"""Tuning throughput: trials per minute of the batch-synchronous path with the builds of before (each
batch built whole, then run one by one: ``MeasureOptions(overlap=False, quick_build=False,
inputs_in_builders=False)``, what `polytile tune` did before the streaming measurer and the quick
builds) against today's path (builds
feeding a measurement queue, quick builds: a precompiled header of the generated C++'s includes, no
second legality check of an unchanged schedule state, legality checks that compare each
dependence's pairs in the schedule space; the same kernels; on a GPU the builders draw each
check's inputs and reference, ``MeasureOptions.inputs_in_builders``), on the same machine, in
interleaved rounds of one process session (a shared machine drifts; interleaving meets both paths
with it). ``--paths batch,stream,batch_quick`` adds the batch path with quick builds, which tells
the two gains apart; ``stream_runner_inputs`` is today's path with the runner drawing the inputs.

    python benchmarks/tuning_throughput.py                      # CPU matmul 512³ (the BLIS template)
    python benchmarks/tuning_throughput.py --target cuda        # the wgmma GEMM (fp16 512×768×3072)
    python benchmarks/tuning_throughput.py --target cuda --devices 0,1   # + one GPU against two
    python benchmarks/tuning_throughput.py --target cuda --devices 0,1 --paths "" --trials 64   # GPUs only
    python benchmarks/tuning_throughput.py --target all         # both templates

Each run starts cold: a fresh build cache (``POLYTILE_CACHE_DIR``) and no result cache, the same tuner
(XGBoost-guided annealing) and seed, no winner declaration (``build_best=False``): trials per minute is
trials / wall seconds of ``tune_task``. ``--devices`` adds a measurement-bound comparison of one GPU
against several: the candidates are built once into a shared build cache first, then the same trials
are measured (grid tuner: the same candidates in both) with one runner per GPU. The load average and
each record's timing conditions are written with the results under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _threads  # noqa: F401 - sets the thread variables before NumPy loads its BLAS

# isort: split
from polytile.toolchain import find_nvrtc  # noqa: E402
from polytile.tune import MeasureOptions, make_task, tune_task  # noqa: E402

WORKLOADS = {
    "cpu": {"matmul512": ("matmul", dict(M=512, N=512, K=512))},
    "cuda": {"wgmma_gemm": ("matmul", dict(M=512, N=768, K=3072, dtype="float16"))},
}
PATHS = {  # the baseline: as before (the runner draws each check's inputs); today's path; the baseline's builds quick
    "batch": dict(overlap=False, result_cache=False, retime=0, quick_build=False, inputs_in_builders=False),
    "stream": dict(overlap=True, result_cache=False, retime=0, quick_build=True),
    "batch_quick": dict(overlap=False, result_cache=False, retime=0, quick_build=True, inputs_in_builders=False),
    "stream_runner_inputs": dict(overlap=True, result_cache=False, retime=0, quick_build=True,
                                 inputs_in_builders=False),
    "stream_nvrtc": dict(overlap=True, result_cache=False, retime=0, quick_build=True, cuda_compiler="nvrtc"),
}


def run_once(op: str, shape: dict, target: str, trials: int, batch: int, opts: dict, cache: str,
             devices: list[int] | None = None, tuner: str = "xgb") -> dict:
    """One cold tuning run: trials, wall seconds, trials per minute, failures, mean build/run seconds, and
    the seconds until the first trial's result (the workers' start and the first build: the runner's
    wait before it measures anything)."""
    os.environ["POLYTILE_CACHE_DIR"] = cache  # workers started by this run build into it
    opts = dict(opts)
    compiler = opts.pop("cuda_compiler", "nvcc")
    os.environ["POLYTILE_CUDA_COMPILER"] = compiler  # so do its workers' CUDA compilers
    task = make_task(op, target, **shape)
    heard: list[float] = []
    start = time.perf_counter()
    try:
        res = tune_task(task, trials, None, tuner=tuner, batch_size=batch, measure=MeasureOptions(**opts), seed=0,
                        progress=False, verify=False, build_best=False, devices=devices,
                        on_trial=lambda rec: heard.append(time.perf_counter()))
    finally:
        os.environ.pop("POLYTILE_CUDA_COMPILER")
    wall = time.perf_counter() - start
    n = len(res.records)
    return {"trials": n, "seconds": round(wall, 2), "trials_per_minute": round(60 * n / wall, 2),
            "failures": res.failures, "load_before": round(os.getloadavg()[0], 2),
            "first_trial_s": round(heard[0] - start, 2) if heard else None,
            "mean_build_s": round(statistics.mean(r.build_s for r in res.records), 3) if n else None,
            "mean_run_s": round(statistics.mean(r.run_s for r in res.records), 3) if n else None,
            "best_ms": round(min((r.cost for r in res.records), default=float("inf")) * 1e3, 4),
            "cuda_compiler": _compiler_used(compiler)}


def _compiler_used(asked: str) -> str:
    if asked == "nvcc":
        return "nvcc"
    found = find_nvrtc()
    return f"nvrtc ({found})" if found else "nvcc (NVRTC asked for, not found)"


def compare_paths(name: str, op: str, shape: dict, target: str, args: argparse.Namespace) -> dict:
    paths = args.paths.split(",")
    runs: dict[str, list[dict]] = {p: [] for p in paths}
    for rnd in range(args.rounds):
        order = paths if rnd % 2 == 0 else list(reversed(paths))  # neither path always goes first
        for path in order:
            with tempfile.TemporaryDirectory(prefix="pt-throughput-") as cache:
                opts = {**PATHS[path], "builders": args.builders}
                run = run_once(op, shape, target, args.trials, args.batch, opts, cache, tuner=args.tuner)
            runs[path].append(run)
            print(f"{name} round {rnd + 1} {path:6s}: {run['trials']} trials in {run['seconds']:.1f} s = "
                  f"{run['trials_per_minute']:.1f}/min (load {run['load_before']})", flush=True)
    rates = {p: statistics.median(r["trials_per_minute"] for r in rs) for p, rs in runs.items()}
    ratio = rates["stream"] / rates["batch"]
    print(f"{name}: stream / batch = {ratio:.2f}x (median trials/min {rates['stream']:.1f} vs {rates['batch']:.1f})")
    entry = {"op": op, "shape": shape, "paths": {p: PATHS[p] for p in paths}, "runs": runs,
             "median_trials_per_minute": rates, "speedup": round(ratio, 3)}
    if "batch_quick" in rates:
        entry["speedup_of_quick_builds"] = round(rates["batch_quick"] / rates["batch"], 3)
        print(f"{name}: batch_quick / batch = {entry['speedup_of_quick_builds']:.2f}x")
    if "stream_nvrtc" in rates:
        entry["speedup_of_nvrtc"] = round(rates["stream_nvrtc"] / rates["batch"], 3)
        print(f"{name}: stream_nvrtc / batch = {entry['speedup_of_nvrtc']:.2f}x")
    if "stream_runner_inputs" in rates:
        entry["speedup_of_runner_inputs"] = round(rates["stream_runner_inputs"] / rates["batch"], 3)
        print(f"{name}: stream_runner_inputs / batch = {entry['speedup_of_runner_inputs']:.2f}x")
    return entry


def compare_devices(name: str, op: str, shape: dict, target: str, devices: list[int], args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="pt-throughput-") as cache:
        opts = {**PATHS["stream"], "builders": args.builders}
        warm = run_once(op, shape, target, args.trials, args.batch, opts, cache, devices[:1], tuner="grid")
        print(f"{name} builds warmed: {warm['seconds']:.1f} s", flush=True)
        runs: dict[str, list[dict]] = {"one": [], "all": []}
        for rnd in range(args.rounds):
            for label in (("one", "all") if rnd % 2 == 0 else ("all", "one")):
                devs = devices[:1] if label == "one" else devices
                run = run_once(op, shape, target, args.trials, args.batch, opts, cache, devs, tuner="grid")
                runs[label].append(run)
                print(f"{name} {len(devs)} GPU(s): {run['trials_per_minute']:.1f} trials/min", flush=True)
    rates = {k: statistics.median(r["trials_per_minute"] for r in rs) for k, rs in runs.items()}
    return {"devices": devices, "runs": runs, "median_trials_per_minute": rates,
            "speedup": round(rates["all"] / rates["one"], 3)}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="cpu", choices=["cpu", "cuda", "all"])
    p.add_argument("--trials", type=int, default=24, help="trials per run (default 24)")
    p.add_argument("--batch", type=int, default=8, help="batch size (the tuner's proposals per round)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of both paths (default 2)")
    p.add_argument("--builders", type=int, default=0, help="build processes (default: the cores)")
    p.add_argument("--paths", default="batch,stream",
                   help="paths compared, of " + ", ".join(PATHS) + " (default batch,stream; batch and stream needed; "
                        "'' for none: --devices alone)")
    p.add_argument("--devices", help="GPUs for the one-against-several comparison, e.g. 0,1")
    p.add_argument("--threads", type=int, default=0, help="threads of the timed CPU kernels and BLAS")
    p.add_argument("--tuner", default="xgb", help="the paths' tuner (default xgb, which follows the measured "
                   "costs; random: the same candidates in every run, for paths whose kernels differ)")
    p.add_argument("--out", help="result JSON (default benchmarks/results/tuning_throughput-<time>-<target>.json)")
    args = p.parse_args(argv)
    result = {"benchmark": "tuning_throughput", "date": datetime.datetime.now(datetime.UTC).isoformat(),
              "command": " ".join(["tuning_throughput.py", *argv]), "host": platform.node(),
              "cores": len(os.sched_getaffinity(0)), "load_at_start": os.getloadavg(), "workloads": {}}
    kinds = ["cpu", "cuda"] if args.target == "all" else [args.target]
    for kind in kinds:
        for name, (op, shape) in WORKLOADS[kind].items():
            entry = compare_paths(name, op, shape, kind, args) if args.paths else {"op": op, "shape": shape}
            if kind == "cuda" and args.devices:
                devices = [int(d) for d in args.devices.split(",")]
                entry["devices"] = compare_devices(name, op, shape, kind, devices, args)
            result["workloads"][name] = entry
    result["load_at_end"] = os.getloadavg()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or f"benchmarks/results/tuning_throughput-{stamp}-{args.target}.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
