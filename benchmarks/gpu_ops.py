"""GPU operator benchmark (issue 3): polytile beside cuBLAS/cuDNN/torch, in one run, on random data.

fp32 matmul 4096³ on CUDA cores vs cuBLAS (TF32 off), a ResNet-50 conv2d vs cuDNN, softmax and
layernorm vs torch (with the measured copy bandwidth), segment sum and CSR SpMM. Every timed kernel
is checked against a float64 reference. Writes a JSON record to benchmarks/results/ and prints a
table last.

    python benchmarks/gpu_ops.py [--quick] [--only matmul,softmax] [--repeat 30]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import polytile as pt  # noqa: E402
from polytile import ops  # noqa: E402
from polytile.runtime.timing import rel_error, time_gpu  # noqa: E402


def device_record() -> dict:
    import torch
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    return {"device": torch.cuda.get_device_name(), "nvidia_smi": smi, "torch": torch.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version()}


def to_torch(x: np.ndarray):  # noqa: ANN201 - a torch tensor
    """A GPU tensor of ``x`` (bfloat16 arrays of ml_dtypes are moved bit for bit)."""
    import torch
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16).cuda()
    return torch.from_numpy(x).cuda()


def bench_op(op, torch_fn, repeat: int, rounds: int = 3) -> dict:
    """Build, check and time ``op`` on the GPU beside ``torch_fn`` (interleaved rounds, medians)."""
    import torch
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    kern = op.build("cuda")
    build_s = time.perf_counter() - t0
    host = op.make_inputs(rng)
    inputs = [to_torch(x) for x in host]
    out = kern(*inputs)
    ref = op.reference(*host)
    err = rel_error(out, ref)
    base_out = torch_fn(*inputs)
    base_err = rel_error(base_out, ref)
    outs = [torch.empty_like(o) for o in (out if isinstance(out, tuple) else (out,))]
    ours, theirs = [], []
    for _ in range(rounds):
        # kern.benchmark checks the arguments once and times the launches alone (as torch's are)
        ours.append(kern.benchmark(*inputs, *outs, repeat=repeat))
        theirs.append(time_gpu(lambda: torch_fn(*inputs), repeat=repeat))
    t, tb = float(np.median(ours)), float(np.median(theirs))
    res = {k: kern.resources[k] .__dict__ for k in kern.resources}
    return {"workload": op.key, "polytile_s": t, "baseline_s": tb, "speed_vs_baseline": tb / t,
            "polytile_tflops": op.flops / t / 1e12, "baseline_tflops": op.flops / tb / 1e12,
            "polytile_gbs": op.bytes_moved / t / 1e9, "baseline_gbs": op.bytes_moved / tb / 1e9,
            "rel_error": err, "baseline_rel_error": base_err, "build_s": build_s, "resources": res}


def copy_bandwidth() -> float:
    import torch
    x = torch.empty(512 * 1024 * 1024 // 4, device="cuda")
    y = torch.empty_like(x)
    t = time_gpu(lambda: y.copy_(x), repeat=20)
    return 2 * x.numel() * 4 / t


def main() -> int:
    import torch
    import torch.nn.functional as F
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--only", default="", help="comma-separated workload kinds")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    q = args.quick
    n = 1024 if q else 4096
    rows = 4096 if q else 16384
    work = {
        "matmul": (ops.matmul(n, n, n), lambda a, b: a @ b),
        "matmul_fp16": (ops.matmul(n, n, n, "float16"), lambda a, b: a @ b),
        "matmul_bf16": (ops.matmul(n, n, n, "bfloat16"), lambda a, b: a @ b),
        "conv2d": (ops.conv2d(8 if q else 32, 64, 56, 56, 64, 3, 3, padding=1),
                   lambda i, w: F.conv2d(i, w, padding=1)),
        "softmax": (ops.softmax(rows, 1024), lambda x: torch.softmax(x, dim=1)),
        "softmax4k": (ops.softmax(rows // 4, 4096), lambda x: torch.softmax(x, dim=1)),
        "layernorm": (ops.layernorm(rows, 1024), lambda x, g, b: F.layer_norm(x, (x.shape[1],), g, b, 1e-5)),
        "layernorm4k": (ops.layernorm(rows // 4, 4096),
                        lambda x, g, b: F.layer_norm(x, (x.shape[1],), g, b, 1e-5)),
    }
    only = [w for w in args.only.split(",") if w]
    results = []
    for name, (op, fn) in work.items():
        if only and name not in only:
            continue
        try:
            r = bench_op(op, fn, args.repeat)
        except pt.PolytileError as err:
            r = {"workload": op.key, "error": str(err)[:2000]}
        r["name"] = name
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "resources"}), flush=True)
    bw = copy_bandwidth()
    record = {"benchmark": "gpu_ops", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": " ".join(sys.argv), **device_record(), "copy_bandwidth_gbs": bw / 1e9,
              "results": results}
    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = out_dir / f"gpu_ops-{stamp}.json"
    path.write_text(json.dumps(record, indent=2))
    print(f"\nGPU ops on {record['device']} ({record['date']}); copy bandwidth {bw / 1e9:.0f} GB/s; record {path.name}")
    print(f"{'workload':14s} {'polytile':>11s} {'baseline':>11s} {'ratio':>7s} {'TFLOP/s':>8s} {'GB/s':>7s} "
          f"{'%copy':>6s} {'error':>8s}")
    for r in results:
        if "error" in r:
            print(f"{r['name']:14s} FAILED: {r['error'][:80]}")
            continue
        print(f"{r['name']:14s} {r['polytile_s'] * 1e3:9.3f}ms {r['baseline_s'] * 1e3:9.3f}ms "
              f"{r['speed_vs_baseline']:6.2f}x {r['polytile_tflops']:8.2f} {r['polytile_gbs']:7.0f} "
              f"{100 * r['polytile_gbs'] * 1e9 / bw:5.0f}% {r['rel_error']:8.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
