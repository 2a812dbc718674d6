"""GEMV variants on the GPU (issue 15): B staged through shared memory (``gemv_cuda``'s pipeline) or
loaded straight into registers (``direct``), or on mma.sync (``gemv_mma``: B's columns as the
instruction's 16 rows, A's rows as its 8 columns), over threads per block, K tile and split of K, beside
the default schedule and torch, at decoding shapes (M ≤ 16) — the data the default choice is set from.

Every configuration is built from the ``matmul_gemv`` tuning template (the same kernels ``pt.tune``
measures), checked against a float64 reference on fresh random inputs, and timed with CUDA events
after an L2 flush (``kern.benchmark(..., flush_cache=True)``), torch in the same process.

    python benchmarks/gemv_variants.py [--shapes M,N,K,dtype;...] [--kernels cuda,mma] [--splits 1,4,16]
        [--workers 16] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = "1,4096,4096,bfloat16;8,4096,4096,bfloat16;1,28672,4096,bfloat16;8,768,3072,float16;" \
         "1,768,3072,float16;8,2304,768,float16;1,30522,768,bfloat16;4,1000,1999,float16;3,2048,5120,bfloat16;" \
         "1,1024,4096,float32;8,4096,1024,float32"


def _configs(K: int, kernels: str, splits_wanted: str) -> list[dict[str, object]]:
    from polytile.tune.templates.cuda import SPLITS
    splits = [s for s in SPLITS if (s - 1) * -(-K // s) < K]
    if splits_wanted:
        splits = [s for s in splits if str(s) in splits_wanted.split(",")]
    out = []
    if "cuda" in kernels:
        for direct, threads, bk, split in itertools.product((False, True), (64, 128, 256), (8, 16, 32), splits):
            if direct and bk > 16:
                continue
            out.append(dict(kernel="cuda", threads=threads, columns=32, vector=16 if direct else 8, bk=bk,
                            stages=3 if direct else 4, direct=direct, split=split))
    if "mma" in kernels:  # gemv_mma: warps of 16, 32 or 64 columns of B, K tiles of 64 or 128
        for threads, columns, bk, split in itertools.product((128, 256), (16, 32, 64), (64, 128), splits):
            out.append(dict(kernel="mma", threads=threads, columns=columns, vector=8, bk=bk, stages=4, direct=False,
                            split=split))
    return out


def _kind(cfg: dict[str, object]) -> str:
    return "mma" if cfg["kernel"] == "mma" else "direct" if cfg["direct"] else "staged"


def _build(job: tuple[int, int, int, str, dict[str, object] | str | None]) -> tuple[object, str]:
    from polytile import ops
    from polytile.build import build
    from polytile.target import as_target
    from polytile.tune.task import Task, Workload, find_template
    M, N, K, dtype, cfg = job
    target = as_target("cuda")
    try:
        if cfg is None:
            return ops.matmul(M, N, K, dtype).build("cuda"), ""
        if cfg == "mma-default":  # the default's opt-in (POLYTILE_GEMV_MMA=1): gemv_mma, its tiles by the model
            import polytile as pt
            from polytile.ops.gpu_schedules import gemm_as, gemm_choice
            op = ops.matmul(M, N, K, dtype)
            choice = gemm_choice(target, M, N, K, op.func.tensor("A").dtype, tensor_core_gemv=True)
            sched = pt.Schedule(op.func)
            return build(gemm_as(sched, choice, M, N, K) or sched, target), ""
        task = Task(find_template("matmul", "cuda", "matmul_gemv"), Workload.of("matmul", M=M, N=N, K=K, dtype=dtype),
                    target)
        why = task._check(cfg)
        if why:
            return None, f"invalid: {why}"
        return build(task.schedule(cfg), target), ""
    except Exception as err:  # noqa: BLE001 - reported per configuration
        return None, f"{type(err).__name__}: {err}"[:300]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--kernels", default="cuda,mma",
                        help="the GEMV kernels swept: cuda (gemv_cuda), mma (gemv_mma)")
    parser.add_argument("--splits", default="", help="only these splits of K (comma-separated; default: all)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" /
                                             f"gemv_variants-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"))
    args = parser.parse_args()
    import torch
    shapes = []
    for part in args.shapes.split(";"):
        try:
            m, n, k, dt = part.split(",")
            shapes.append((int(m), int(n), int(k), dt))
        except ValueError:
            parser.error(f"--shapes: {part!r} is not M,N,K,dtype (e.g. 1,4096,4096,bfloat16)")
        if dt not in ("float16", "bfloat16", "float32") or min(shapes[-1][:3]) < 1 or shapes[-1][0] > 16:
            parser.error(f"--shapes: {part!r}: M from 1 to 16 (a GEMV), positive N and K, dtype float16, "
                         "bfloat16 or float32")
    jobs = [(*s, None) for s in shapes] + [(*s, "mma-default") for s in shapes] + \
        [(*s, c) for s in shapes for c in _configs(s[2], args.kernels, args.splits)]
    with ProcessPoolExecutor(args.workers) as pool:
        built = list(pool.map(_build, jobs, chunksize=1))
    rng = np.random.default_rng(0)
    results = []
    for (M, N, K, dt, cfg), (kern, err) in zip(jobs, built, strict=True):
        row = dict(M=M, N=N, K=K, dtype=dt, config=cfg or "default", error=err)
        if kern is not None:
            tdt = getattr(torch, dt)
            a = torch.from_numpy(rng.uniform(-1, 1, (M, K))).to("cuda", tdt)
            b = torch.from_numpy(rng.uniform(-1, 1, (K, N))).to("cuda", tdt)
            try:
                c = kern(a, b)
                ref = (a.double() @ b.double())
                rel = float((c.double() - ref).norm() / ref.norm())
                row["rel_error"] = rel
                if rel > (1e-2 if dt != "float32" else 1e-4):
                    row["error"] = f"wrong: relative error {rel:.3g}"
                else:
                    row["seconds"] = kern.benchmark(a, b, repeat=30, flush_cache=True)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"[:300]
        results.append(row)
    for M, N, K, dt in shapes:
        tdt = getattr(torch, dt)
        a = torch.randn(M, K, device="cuda", dtype=tdt)
        b = torch.randn(K, N, device="cuda", dtype=tdt)
        from polytile.runtime.timing import time_gpu
        torch.backends.cuda.matmul.allow_tf32 = False
        t = time_gpu(lambda: a @ b, repeat=30)  # noqa: B023
        rows = [r for r in results if (r["M"], r["N"], r["K"], r["dtype"]) == (M, N, K, dt) and "seconds" in r]
        default = next((r["seconds"] for r in rows if r["config"] == "default"), float("nan"))
        opted = next((r["seconds"] for r in rows if r["config"] == "mma-default"), float("nan"))
        best = {}
        for kind in ("staged", "direct", "mma"):
            cand = [r for r in rows if isinstance(r["config"], dict) and _kind(r["config"]) == kind]
            if cand:
                best[kind] = min(cand, key=lambda r: r["seconds"])
        results.append(dict(M=M, N=N, K=K, dtype=dt, config="torch", seconds=t))
        print(f"{M}x{N}x{K} {dt}: torch {t*1e6:.1f} us, default {default*1e6:.1f} us, "
              f"mma-default {opted*1e6:.1f} us" +
              "".join(f", best {kind} {r['seconds']*1e6:.1f} us {r['config']}" for kind, r in best.items()), flush=True)
    bad = [r for r in results if r.get("error") and r["error"].startswith("wrong")]
    print(f"{len(results)} rows, {sum('seconds' in r for r in results)} timed, {len(bad)} wrong", flush=True)
    query = ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,power.draw", "--format=csv,noheader"]
    smi = subprocess.run(query, capture_output=True, text=True).stdout.strip()
    Path(args.out).write_text(json.dumps(dict(benchmark="gemv_variants", device=torch.cuda.get_device_name(),
                                              nvidia_smi=smi, date=datetime.datetime.now(datetime.UTC).isoformat(),

                                              command=" ".join(sys.argv), results=results), indent=1))


if __name__ == "__main__":
    main()
