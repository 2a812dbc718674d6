"""Where one tuning trial's time goes: the candidates of ``tuning_throughput.py``'s template built and
then checked and timed in this process, each under cProfile, with the seconds of named phases per
candidate (the template's schedule, lowering, isl's AST generation, the compiler; the runner's check
inputs and reference, its checked call, the timing) and the functions that took the most.

    python benchmarks/trial_profile.py --target cuda --candidates 6     # the wgmma GEMM on this GPU
    python benchmarks/trial_profile.py --target cpu --candidates 6      # the 512³ matmul template

The candidates are the first valid draws of the space with seed 0 (the tuner's first proposals are
such draws). Builds draw the check's inputs as the tuner's builders do on this target
(``MeasureOptions.inputs_in_builders``), on a thread beside the build that cProfile does not follow
(a build's ``check_inputs`` reads 0; their time overlaps the build's); ``--runner-inputs`` leaves them
to the runner. The build cache is this run's own (``POLYTILE_CACHE_DIR`` unless set: a fresh temporary
folder).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import _threads  # noqa: F401 - sets the thread variables before NumPy loads its BLAS

# isort: split
import numpy as np  # noqa: E402
from tuning_throughput import WORKLOADS  # noqa: E402

PHASES = {  # phase -> (file suffix, function name) whose cumulative time it is
    "schedule": ("polytile/tune/task.py", "schedule"),
    "lower": ("polytile/lowering/pipeline.py", "lower"),
    "ast_generation": ("polytile/poly/astgen.py", "generate"),
    "compiler": ("subprocess.py", "run"),
    "check_inputs": ("polytile/tune/measure.py", "_reference"),
    "checked_call": ("polytile/tune/measure.py", "_check"),
    "timing": ("", "benchmark"),  # the kernel's benchmark method, whichever runtime it is
}


def phase_seconds(prof: cProfile.Profile) -> dict[str, float]:
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    out = dict.fromkeys(PHASES, 0.0)
    for (path, _line, name), (_cc, _nc, _tt, ct, _callers) in stats.items():
        for phase, (suffix, fn) in PHASES.items():
            if name == fn and path.endswith(suffix) and ("polytile/runtime/" in path or suffix):
                out[phase] += ct
    return {k: round(v, 3) for k, v in out.items()}


def top(profs: list[cProfile.Profile], n: int) -> list[dict[str, object]]:
    stats = pstats.Stats(*profs).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:n]
    return [{"function": f"{Path(p).name}:{line}({name})", "own_s": round(tt, 3), "cumulative_s": round(ct, 3),
             "calls": nc} for (p, line, name), (_cc, nc, tt, ct, _callers) in rows]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--candidates", type=int, default=6)
    p.add_argument("--top", type=int, default=25, help="functions listed by their own time (default 25)")
    p.add_argument("--runner-inputs", action="store_true", help="the runner draws the check's inputs")
    p.add_argument("--out", help="result JSON")
    args = p.parse_args(argv)
    os.environ.setdefault("POLYTILE_CACHE_DIR", tempfile.mkdtemp(prefix="pt-trial-profile-"))
    from polytile.tune import MeasureOptions, make_task
    from polytile.tune import measure as m
    (op, shape), = WORKLOADS[args.target].values()
    task = make_task(op, args.target, **shape)
    opts = MeasureOptions(inputs_in_builders=False) if args.runner_inputs else MeasureOptions()
    rows = []
    builds: list[cProfile.Profile] = []
    runs: list[cProfile.Profile] = []
    for digits in task.space.sample_valid(np.random.default_rng(0), args.candidates):
        values = task.space.config(digits).values
        one_build, one_run = cProfile.Profile(), cProfile.Profile()
        t0 = time.perf_counter()
        one_build.enable()
        art, _feats, odd, _s = m.build_candidate(task, values, False, True, opts.builders_draw_inputs(task))
        one_build.disable()
        t1 = time.perf_counter()
        one_run.enable()
        status, costs, error, _cond = m.run_candidate(task, values, art, odd, opts)
        one_run.disable()
        t2 = time.perf_counter()
        builds.append(one_build)
        runs.append(one_run)
        row = {"values": values, "status": status, "cost_ms": round(costs[0] * 1e3, 4) if costs else None,
               "error": error[:200], "build_s": round(t1 - t0, 3), "run_s": round(t2 - t1, 3),
               "build_phases": phase_seconds(one_build), "run_phases": phase_seconds(one_run)}
        rows.append(row)
        print(f"build {row['build_s']:.2f} s {row['build_phases']}\n  run {row['run_s']:.3f} s "
              f"{row['run_phases']} {status} {values}", flush=True)
    result = {"benchmark": "trial_profile", "target": args.target, "workload": {"op": op, **shape},
              "runner_inputs": args.runner_inputs, "candidates": rows,
              "top_build": top(builds, args.top), "top_run": top(runs, args.top)}
    for what in ("top_build", "top_run"):
        print(what)
        for r in result[what]:
            print(f"  {r['own_s']:7.3f} own {r['cumulative_s']:7.3f} cum {r['calls']:6d} {r['function']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
