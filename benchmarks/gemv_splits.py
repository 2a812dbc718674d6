"""GEMV time against the split of K (issue 15; 1x4097x4093 at 0.30x): ops.matmul with split_k fixed
(gemm_choice picks the rest), checked against float64, timed after an L2 flush, torch beside.
Usage: python benchmarks/gemv_splits.py OUT.json (GV_TARGET=cuda:sm_90a builds only)."""

import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, ".")
import numpy as np

SHAPES = [
    (1, 4097, 4093, "bfloat16"),
    (1, 4096, 4096, "bfloat16"),
    (1, 50257, 768, "float16"),
    (1, 768, 3072, "float16"),
    (1, 1024, 4096, "float32"),
    (8, 4096, 4096, "bfloat16"),
    (1, 28672, 4096, "bfloat16"),
    (4, 1000, 1999, "float16"),
    (1, 14336, 4096, "bfloat16"),
    (1, 4096, 14336, "bfloat16"),
    (1, 3001, 2999, "float16"),
]
SPLITS = [0, 1, 4, 8, 12, 16, 24, 32, 48, 64]
TARGET = os.environ.get("GV_TARGET", "cuda")


def build(job):
    M, N, K, dt, s = job
    from polytile import ops

    try:
        op = ops.matmul(M, N, K, dt, split_k=s) if s else ops.matmul(M, N, K, dt)
        return op.build(TARGET), ""
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"[:200]


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: python benchmarks/gemv_splits.py OUT.json (the JSON record of the rows)")
    jobs = [(*sh, s) for sh in SHAPES for s in SPLITS]
    with ProcessPoolExecutor(int(os.environ.get("GV_WORKERS", "14"))) as pool:
        built = list(pool.map(build, jobs, chunksize=1))
    if TARGET != "cuda":
        for j, (k, e) in zip(jobs, built):
            print(j, "ok" if k else e)
        return
    import torch

    from polytile.runtime.timing import time_gpu

    rng = np.random.default_rng(0)
    rows = []
    for (M, N, K, dt, s), (kern, err) in zip(jobs, built):
        row = dict(M=M, N=N, K=K, dtype=dt, split=s or "default", error=err)
        if kern is not None:
            tdt = getattr(torch, dt)
            a = torch.from_numpy(rng.uniform(-1, 1, (M, K))).to("cuda", tdt)
            b = torch.from_numpy(rng.uniform(-1, 1, (K, N))).to("cuda", tdt)
            c = kern(a, b)
            torch.cuda.synchronize()
            ref = a.double() @ b.double()
            rel = float((c.double() - ref).norm() / ref.norm())
            row["rel"] = rel
            if rel > (1e-2 if dt != "float32" else 1e-4):
                row["error"] = f"wrong {rel}"
            else:
                row["us"] = kern.benchmark(a, b, repeat=30, flush_cache=True) * 1e6
        rows.append(row)
    torch.backends.cuda.matmul.allow_tf32 = False
    for M, N, K, dt in SHAPES:
        tdt = getattr(torch, dt)
        a = torch.randn(M, K, device="cuda", dtype=tdt)
        b = torch.randn(K, N, device="cuda", dtype=tdt)
        t = time_gpu(lambda: a @ b, repeat=30) * 1e6  # noqa: B023 - timed here, in this iteration
        mine = [r for r in rows if (r["M"], r["N"], r["K"], r["dtype"]) == (M, N, K, dt)]
        cells = [f"{r['split']}:{r.get('us', float('nan')):.1f}" + ("!" if r["error"] else "") for r in mine]
        print(f"{M}x{N}x{K} {dt}: torch {t:.1f} | " + " ".join(cells), flush=True)
        rows.append(dict(M=M, N=N, K=K, dtype=dt, split="torch", us=t))
    errs = [r for r in rows if r.get("error")]
    for r in errs:
        print("ERR", r)
    json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
