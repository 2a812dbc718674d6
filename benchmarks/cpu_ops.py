"""CPU operator benchmark (issue 2): polytile's default schedules beside NumPy (OpenBLAS) and torch, in
one run, on the same random inputs.

fp32 matmul 1024³ and 2048³ vs NumPy, ResNet-50 convolutions (batch 1, NCHW) vs torch's CPU
convolution (none when torch is not installed), softmax and layernorm vs NumPy. Every kernel and
every baseline is checked against a float64 reference; each side is timed as the median of repeated
runs after warm-up, in interleaved rounds (the median of the rounds is reported). Writes a JSON
record to benchmarks/results/ and prints a table last.

    python benchmarks/cpu_ops.py [--quick] [--only matmul1024,softmax] [--rounds 3] [--threads N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import _threads  # noqa: E402, F401 - sets the thread variables before NumPy loads its BLAS

# isort: split
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polytile import PolytileError, ops  # noqa: E402
from polytile.cli import time_call  # noqa: E402
from polytile.target import cpu_target  # noqa: E402


def workloads(quick: bool) -> dict[str, ops.Op]:
    """Name → operator. ResNet-50 layers at batch 1: conv2_x (56×56) and conv4_x (14×14)."""
    if quick:
        return {
            "matmul256": ops.matmul(256, 256, 256),
            "matmul512": ops.matmul(512, 512, 512),
            "conv3x3_64_28": ops.conv2d(1, 64, 28, 28, 64, 3, 3, padding=1),
            "conv1x1_64_256_28": ops.conv2d(1, 64, 28, 28, 256, 1, 1),
            "softmax": ops.softmax(512, 1024),
            "layernorm": ops.layernorm(512, 1024),
        }
    return {
        "matmul1024": ops.matmul(1024, 1024, 1024),
        "matmul2048": ops.matmul(2048, 2048, 2048),
        "conv3x3_64_56": ops.conv2d(1, 64, 56, 56, 64, 3, 3, padding=1),
        "conv3x3_256_14": ops.conv2d(1, 256, 14, 14, 256, 3, 3, padding=1),
        "conv1x1_64_256_56": ops.conv2d(1, 64, 56, 56, 256, 1, 1),
        "conv1x1_1024_256_14": ops.conv2d(1, 1024, 14, 14, 256, 1, 1),
        "softmax": ops.softmax(4096, 1024),
        "layernorm": ops.layernorm(4096, 1024),
    }


def _first(x: object) -> object:
    return x[0] if isinstance(x, tuple) else x


def bench_op(op: ops.Op, rounds: int, repeat: int, min_time: float) -> dict:
    """Build, check and time ``op`` beside its baseline (interleaved rounds, medians)."""
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    kern = op.build("cpu")
    build_s = time.perf_counter() - t0
    inputs = op.make_inputs(rng)
    ref = _first(op.reference(*inputs))
    err = ops.rel_error(_first(kern(*inputs)), ref)
    res: dict = {"workload": op.key, "build_s": build_s, "rel_error": err, "tolerance": op.tolerance,
                 "correct": bool(err <= op.tolerance), "flops": op.flops, "bytes": op.bytes_moved,
                 "baseline": op.baseline_name if op.baseline is not None else None}
    if op.baseline is not None:
        res["baseline_rel_error"] = ops.rel_error(np.asarray(_first(op.baseline(*inputs))), ref)
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(kern.benchmark(*inputs, repeat=repeat, min_time=min_time))
        if op.baseline is not None:
            theirs.append(time_call(op.baseline, inputs, repeat=repeat, min_time=min_time))
    t = float(np.median(ours))
    res.update(polytile_s=t, polytile_gflops=op.flops / t / 1e9, polytile_gbs=op.bytes_moved / t / 1e9,
               polytile_rounds_s=ours)
    if theirs:
        tb = float(np.median(theirs))
        res.update(baseline_s=tb, baseline_gflops=op.flops / tb / 1e9, baseline_gbs=op.bytes_moved / tb / 1e9,
                   baseline_rounds_s=theirs, speed_vs_baseline=tb / t)
    return res


def git_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def device_record() -> dict:
    tgt = cpu_target()
    try:
        import torch
        torch_info = {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    except ImportError:
        torch_info = {"torch": None}
    return {"device": tgt.model.replace("_", " "), "cores": tgt.cores, "vector_bits": tgt.vector_bits,
            "omp_threads": int(os.environ.get("OMP_NUM_THREADS", tgt.cores)),
            "openblas_threads": int(os.environ.get("OPENBLAS_NUM_THREADS", tgt.cores)), **torch_info,
            "numpy": np.__version__, "python": platform.python_version(), "host": platform.node()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--only", default="", help="comma-separated workload names")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (median)")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per round at least")
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds timed per round at least")
    parser.add_argument("--threads", type=int, default=0, help="threads for OpenMP, OpenBLAS and torch")
    parser.add_argument("--out", help="the JSON record (default benchmarks/results/cpu_ops-<date>.json)")
    args = parser.parse_args()
    if args.threads:
        try:
            import torch
            torch.set_num_threads(args.threads)
        except ImportError:
            pass
    only = [w for w in args.only.split(",") if w]
    load_before = os.getloadavg()
    results = []
    for name, op in workloads(args.quick).items():
        if only and name not in only:
            continue
        try:
            r = bench_op(op, args.rounds, args.repeat, args.min_time)
        except PolytileError as err:
            r = {"workload": op.key, "error": f"{type(err).__name__}: {str(err)[:2000]}"}
        r = {"name": name, **r}
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if not k.endswith("_rounds_s")}), flush=True)
    now = datetime.datetime.now(datetime.UTC)
    record = {"benchmark": "cpu_ops", "date": now.isoformat(timespec="seconds"),
              "command": " ".join(["python", *sys.argv]), "polytile_commit": git_commit(), **device_record(),
              "quick": args.quick, "rounds": args.rounds,
              "load_average_before": load_before, "load_average_after": os.getloadavg(), "results": results}
    if args.out:
        path = Path(args.out)
    else:
        quick = "-quick" if args.quick else ""
        path = ROOT / "benchmarks" / "results" / f"cpu_ops{quick}-{now:%Y-%m-%d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"\nCPU ops on {record['device']}, {record['cores']} cores ({record['date']}); "
          f"{record['omp_threads']} threads; load average {load_before[0]:.1f} before; record {path}")
    print(f"{'workload':20s} {'polytile':>10s} {'baseline':>16s} {'ratio':>7s} {'GFLOP/s':>8s} {'GB/s':>6s} "
          f"{'error':>8s}")
    for r in results:
        if "error" in r:
            print(f"{r['name']:20s} FAILED: {r['error'][:100]}")
            continue
        base = (f"{r['baseline_s'] * 1e3:8.3f}ms {r['baseline'][:6]:6s}" if "baseline_s" in r
                else f"{'none':>16s}")
        ratio = f"{r['speed_vs_baseline']:6.2f}x" if "speed_vs_baseline" in r else f"{'-':>7s}"
        flag = "" if r["correct"] else "  WRONG"
        print(f"{r['name']:20s} {r['polytile_s'] * 1e3:8.3f}ms {base} {ratio} {r['polytile_gflops']:8.1f} "
              f"{r['polytile_gbs']:6.1f} {r['rel_error']:8.1e}{flag}")
    print("ratio = baseline time / polytile time (above 1: polytile is faster)")
    return 0 if all(r.get("correct") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
