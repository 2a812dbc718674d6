"""CPU seconds of a tuning candidate's build, split into Python (schedule, legality checks, lowering,
code generation) and the compiler's processes, for ``tuning_throughput.py``'s templates. The builds
run in this process into a fresh build cache, as a tuner's builder builds them; the CPU times are
the process's and its children's, so the machine's load moves them less than wall time.

    python benchmarks/build_cost.py --target cuda --candidates 8                # nvcc (sm_90a, no GPU)
    POLYTILE_CUDA_COMPILER=nvrtc python benchmarks/build_cost.py --target cuda   # NVRTC in the process

Two versions are compared by running this from each checkout in turn (interleaved rounds), e.g.
``for r in 1 2; do for v in old new; do (cd $v && python benchmarks/build_cost.py ...); done; done``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import _threads  # noqa: F401 - sets the thread variables before NumPy loads its BLAS

# isort: split
import numpy as np  # noqa: E402
from tuning_throughput import WORKLOADS  # noqa: E402


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--candidates", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="", help="a name for this run in the output line")
    args = p.parse_args(argv)
    os.environ["POLYTILE_CACHE_DIR"] = tempfile.mkdtemp(prefix="pt-build-cost-")
    from polytile.build import build
    from polytile.tune import make_task
    (op, shape), = WORKLOADS[args.target].values()
    task = make_task(op, "cuda:sm_90a" if args.target == "cuda" else "cpu", **shape)
    rows = []
    for digits in task.space.sample_valid(np.random.default_rng(args.seed), args.candidates):
        t0, w0 = os.times(), time.perf_counter()
        build(task.schedule(task.space.config(digits).values), task.target)
        t1 = os.times()
        rows.append({"python_s": t1.user + t1.system - t0.user - t0.system,
                     "compiler_s": t1.children_user + t1.children_system - t0.children_user - t0.children_system,
                     "wall_s": time.perf_counter() - w0})
    total = {k: round(sum(r[k] for r in rows), 3) for k in rows[0]}
    line = {"label": args.label, "target": args.target, "candidates": len(rows),
            "cuda_compiler": os.environ.get("POLYTILE_CUDA_COMPILER", "nvcc"), "total": total,
            "per_candidate_cpu_s": round((total["python_s"] + total["compiler_s"]) / len(rows), 3),
            "median_python_s": round(statistics.median(r["python_s"] for r in rows), 3),
            "load": round(os.getloadavg()[0], 2)}
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
