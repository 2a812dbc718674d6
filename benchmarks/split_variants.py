"""Issue 15's off-suite GEMMs below 0.5× torch: variants of the default beside it, checked against
float64 and timed after an L2 flush, torch in the same process (CUDA events, random non-zero inputs).

- ``before``: the default of the tree at $SV_BEFORE (the commit before, e.g. from ``git archive``),
  built in its own process; ``default``: this tree's.
- Tensor-core GEMMs over a K without a good divisor (61×61×8191): fixed splits into chunks of whole
  K tiles besides (``S<chunks>x<length>/bk<K tile>``).
- GEMVs of 8–16 rows (16×3002×1536, 12×2222×3333): ``default`` beside given splits (``split``) and
  the tensor-core kernels the model would pick for them (``wgmma``, ``mma``: the GEMV's row limit
  lifted), and mma.sync in 16-row tiles (``mma16``: one m16n8k16 row of tiles, K split to fill the SMs).
- Other shapes of the suite and off it (a batched GEMV: decoding attention), to catch regressions.

Usage: python benchmarks/split_variants.py OUT.json [--only 61x61] (SV_TARGET=cuda:sm_90a: builds
only, no GPU)."""

import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, ".")
import numpy as np

# (batch or 0 for matmul, M, N, K, dtype)
SPLIT = [(0, 61, 61, 8191, "bfloat16"), (0, 37, 70, 5003, "bfloat16"), (0, 127, 255, 4096, "bfloat16"),
         (0, 2500, 96, 1536, "float16"), (0, 300, 5003, 640, "bfloat16"), (0, 128, 6144, 4096, "bfloat16")]
GEMV = [(0, 16, 3002, 1536, "bfloat16"), (0, 12, 2222, 3333, "bfloat16"), (0, 16, 4096, 4096, "bfloat16"),
        (0, 8, 4098, 4096, "bfloat16"), (0, 1, 4097, 4093, "bfloat16"), (0, 4, 1000, 1999, "float16"),
        (0, 1, 4096, 14336, "bfloat16"), (0, 3, 5000, 777, "bfloat16"), (32, 1, 128, 2048, "bfloat16"),
        (20, 1, 1500, 80, "float16")]
FIXED = {(0, 61, 61, 8191, "bfloat16"): [(16, 512, 128), (32, 256, 128), (64, 128, 64), (43, 192, 64),
                                         (22, 384, 128)],
         (0, 37, 70, 5003, "bfloat16"): [(20, 256, 128), (40, 128, 64)]}
TARGET = os.environ.get("SV_TARGET", "cuda")


def jobs(only: str) -> list[tuple]:
    out = []
    for sh in SPLIT:
        out += [(sh, "before", None), (sh, "default", None)]
        out += [(sh, "fixed", f) for f in FIXED.get(sh, [])]
        if sh[0] == 0 and sh[1] < 100:
            out += [(sh, "mma", None)]
    for sh in GEMV:
        out += [(sh, "before", None), (sh, "default", None)]
        if sh[1] >= 8:
            out += [(sh, "split", s) for s in (16, 24, 32, 64)]
        if sh[1] == 16:
            out += [(sh, "wgmma", None), (sh, "mma", None), (sh, "mma16", None)]
    return [j for j in out if not only or any(p in _name(j[0]) for p in only.split(","))]


def _name(shape: tuple) -> str:
    batch, M, N, K, _ = shape
    return f"{batch}x" * bool(batch) + f"{M}x{N}x{K}"


def build(job):
    (batch, M, N, K, dt), mode, fixed = job
    if mode == "before":
        if not os.environ.get("SV_BEFORE"):
            return None, mode, "no SV_BEFORE tree"
        sys.path.insert(0, os.environ["SV_BEFORE"])
    import polytile as pt
    import polytile.ops.gpu_schedules as g
    from polytile import ops
    from polytile.target import as_target

    target = as_target(TARGET)
    try:
        if mode in ("wgmma", "mma"):
            g.GEMV_ROWS = 0
            if mode == "mma":
                g._wgmma = lambda t: False
        if mode in ("fixed", "mma16"):
            if mode == "fixed":
                S, chunk, bk = fixed
                params = dict(bm=64, bn=64, bk=bk, stages=5 if bk == 128 else 4, inflight=1)
                choice = g.GemmChoice("wgmma", params, S, 0.0, chunk)
            else:
                T, tiles = -(-K // 64), -(-N // 128)
                per = max(2, -(-T // max(1, min(16, -(-2 * 132 // tiles)))))
                S, chunk = -(-T // per), per * 64
                choice = g.GemmChoice("mma", dict(bm=16, bn=128, wm=16, wn=32, bk=64, stages=3, reg_stages=2), S, 0.0,
                                      chunk)
            sched = pt.Schedule(ops.matmul_func(M, N, K, dt, S, dt, chunk=chunk) if S > 1
                                else ops.matmul_func(M, N, K, dt, 1, dt))
            g._gemm_schedule(choice, sched, "P" if S > 1 else "C", "s" if S > 1 else None)
            if S > 1:
                g.sum_partials(sched, "C")
            name = f"S{S}x{chunk}/bk{choice.params['bk']}"
            return pt.build(sched, target), name, ""
        split = fixed if mode == "split" else None
        op = (ops.batch_matmul(batch, M, N, K, dt, out_dtype=dt) if batch else
              ops.matmul(M, N, K, dt, out_dtype=dt, split_k=split))
        choice = g.gemm_choice(target, M, N, K, op.func.inputs[0].dtype, batch=max(1, batch), split_k=split,
                               out_bytes=2)
        name = f"{choice.kernel}:S{choice.split}" + (f"x{choice.chunk}" if getattr(choice, "chunk", 0) else "") + \
            f" {','.join(f'{k}={v}' for k, v in choice.params.items())}"
        return op.build(target), name, ""
    except Exception as e:  # noqa: BLE001 — a variant that does not build is a row of the record
        return None, mode, f"{type(e).__name__}: {e}"[:300]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    if only:
        args.remove(only)
    if len(args) != 1:
        sys.exit("usage: python benchmarks/split_variants.py OUT.json [--only 61x61,16x3002]")
    js = jobs(only)
    with ProcessPoolExecutor(int(os.environ.get("SV_WORKERS", "14")), max_tasks_per_child=1) as pool:
        built = list(pool.map(build, js, chunksize=1))
    if TARGET != "cuda":
        for j, (k, name, e) in zip(js, built):
            print(j[0], j[1], name, "ok" if k else e, flush=True)
        return
    import torch

    from polytile.runtime.timing import time_gpu

    rng = np.random.default_rng(0)
    rows = []
    inputs = {}
    for (shape, mode, _), (kern, name, err) in zip(js, built):
        batch, M, N, K, dt = shape
        row = dict(shape=_name(shape), dtype=dt, mode=mode, variant=name, error=err)
        if shape not in inputs:
            tdt = getattr(torch, dt)
            lead = (batch,) if batch else ()

            def rand(*dims, tdt=tdt):
                return torch.from_numpy(rng.uniform(0.5, 1.5, dims) * rng.choice([-1, 1], dims)).to("cuda", tdt)
            a, b = rand(*lead, M, K), rand(*lead, K, N)
            inputs[shape] = (a, b, a.double() @ b.double())
        a, b, ref = inputs[shape]
        if kern is not None:
            c = kern(a, b)
            torch.cuda.synchronize()
            rel = float((c.double() - ref).norm() / ref.norm())
            row["rel"] = rel
            if rel > 1e-2 or c.shape != ref.shape:
                row["error"] = f"wrong {rel}"
            else:
                row["us"] = kern.benchmark(a, b, repeat=30, flush_cache=True) * 1e6
        rows.append(row)
    for shape in dict.fromkeys(j[0] for j in js):
        a, b, _ = inputs[shape]
        t = time_gpu(lambda a=a, b=b: a @ b, repeat=30) * 1e6
        mine = [r for r in rows if r["shape"] == _name(shape) and r["dtype"] == shape[-1]]
        print(f"{_name(shape)} {shape[-1]}: torch {t:.1f} µs", flush=True)
        for r in mine:
            us = r.get("us")
            ratio = f"{t / us:.2f}x" if us else "-"
            print(f"   {r['mode']:8s} {us or float('nan'):8.1f} µs {ratio:>6s}  {r['variant']}"
                  + (f"  ERROR {r['error']}" if r["error"] else ""), flush=True)
        rows.append(dict(shape=_name(shape), dtype=shape[-1], mode="torch", us=t))
    json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), open(args[0], "w"), indent=1)


if __name__ == "__main__":
    main()
