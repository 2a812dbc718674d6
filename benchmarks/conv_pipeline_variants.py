"""Warpgroup-MMA implicit-GEMM variants of one convolution on the GPU (issue 15): block tiles, splits,
pipeline stages and MMA groups in flight (``gpu_schedules.igemm_wgmma``), each checked against a
float64 torch reference and timed beside torch (cuDNN) in the same process (CUDA events, L2 flushed
before each launch, medians of interleaved rounds); then torch's profiler over the default, the
fastest variant and cuDNN: per-kernel times (a split's partial products and their sum) and cuDNN's
kernel names (its tile and algorithm).

    python benchmarks/conv_pipeline_variants.py OUT.json [--conv N,H,W,C,K,R,S,stride,pad]
        [--variants BMxBNxBK:SPLIT:STAGES:INFLIGHT,...] [--workers 14] [--target cuda]

SPLIT is ``none``, ``rows``, ``c2``, ``rows+c2`` ... (as the conv2d_igemm_choices template writes it).
With ``--target cuda:sm_90a`` the variants are only built (no GPU needed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# ResNet-50 l4 3x3 at batch 32: 128×128 tiles in 2 channel chunks (the default), deeper pipelines,
# other MMA groups in flight, wide 64-row tiles (the tuning space's), narrower tiles
DEFAULT_VARIANTS = ",".join([
    "128x128x64:c2:5:1", "128x128x64:c2:6:1", "128x128x64:c2:6:2", "128x128x64:c2:4:0", "128x128x64:c2:6:0",
    "128x128x64:none:6:1", "64x256x64:c2:4:1", "64x256x64:c2:5:1", "64x256x64:c2:5:2", "64x256x64:none:5:1",
    "64x256x64:c4:5:1", "64x128x64:c2:6:1", "64x128x64:none:6:1", "64x64x64:none:6:2", "128x64x64:c2:6:1",
])


def parse(spec: str) -> tuple[dict[str, int], bool, int]:
    tile, split, stages, inflight = spec.split(":")
    bm, bn, bk = map(int, tile.split("x"))
    parts = split.split("+")
    rows = "rows" in parts
    chunks = next((int(p[1:]) for p in parts if p.startswith("c")), 1)
    return dict(bm=bm, bn=bn, bk=bk, stages=int(stages), inflight=int(inflight)), rows, chunks


def build(job: tuple[tuple[int, ...], str, str]) -> tuple[object | None, str]:
    dims, spec, target = job
    import polytile as pt
    from polytile import ops
    from polytile.ops.conv_choice import IgemmChoice
    from polytile.ops.gpu_schedules import igemm_schedule
    from polytile.target import as_target
    try:
        op = ops.conv2d_igemm(*dims, out_dtype="float16")
        if spec == "default":
            return op.build(target), ""
        params, rows, chunks = parse(spec)
        sched = pt.Schedule(op.func)
        split = igemm_schedule(sched, as_target(target), IgemmChoice("wgmma", params, rows, chunks), *dims)
        return pt.build(split or sched, target), ""
    except Exception as e:  # noqa: BLE001 - a variant that does not build is reported, not fatal
        return None, f"{type(e).__name__}: {e}"[:300]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the JSON record of the rows")
    parser.add_argument("--conv", default="32,7,7,512,512,3,3,1,1", help="N,H,W,C,K,R,S,stride,padding")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--target", default="cuda")
    args = parser.parse_args()
    dims = tuple(int(v) for v in args.conv.split(","))
    specs = ["default", *args.variants.split(",")]
    with ProcessPoolExecutor(args.workers) as pool:
        built = list(pool.map(build, [(dims, s, args.target) for s in specs], chunksize=1))
    if args.target != "cuda":
        for s, (kern, err) in zip(specs, built):
            print(f"{s:28s} " + (", ".join(f"{n}: {r.registers} registers, {r.spill_stores} spill stores"
                                           for n, r in kern.resources.items())  # type: ignore[attr-defined]
                                 if kern is not None else err))
        return 0 if all(k is not None for k, _ in built) else 1
    import torch
    from torch.profiler import ProfilerActivity, profile

    from polytile.runtime.timing import rel_error, time_gpu
    N, H, W, C, K, R, S, stride, pad = dims
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.rand((N, H, W, C), device="cuda", generator=g).half() - 0.5
    w = torch.rand((R, S, C, K), device="cuda", generator=g).half() - 0.5
    ref = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(3, 2, 0, 1),
                                     stride=stride, padding=pad).permute(0, 2, 3, 1).reshape(-1, K)
    xn = x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    wn = w.permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)

    def cudnn() -> object:
        return torch.nn.functional.conv2d(xn, wn, stride=stride, padding=pad)
    rows = []
    for spec, (kern, err) in zip(specs, built):
        row: dict[str, object] = dict(variant=spec, error=err)
        if kern is not None:
            rel = rel_error(kern(x, w).reshape(-1, K), ref)
            row.update(rel_error=rel, ok=bool(rel < 5e-3))
            row["kernels"] = [dict(name=k.name, grid=list(k.grid), block=list(k.block), shared=k.dynamic_shared)
                              for k in kern.kernels]  # type: ignore[attr-defined]
            row["registers"] = {n: r.registers for n, r in kern.resources.items()}  # type: ignore[attr-defined]
        rows.append(row)
    times: dict[str, list[float]] = {r["variant"]: [] for r in rows if r.get("ok")}  # type: ignore[misc]
    theirs = []
    for _ in range(5):
        theirs.append(time_gpu(cudnn, repeat=20))
        for spec, (kern, _) in zip(specs, built):
            if spec in times:
                times[spec].append(kern.benchmark(x, w, repeat=20))  # type: ignore[attr-defined]
    t_torch = statistics.median(theirs)
    for row in rows:
        if row["variant"] in times:
            t = statistics.median(times[row["variant"]])  # type: ignore[index]
            row.update(us=t * 1e6, torch_us=t_torch * 1e6, ratio=t_torch / t)
        print(f"{row['variant']:24s} " + (f"{row['us']:7.1f} us  ratio {row['ratio']:5.2f}  regs {row['registers']}"
                                          if "us" in row else f"{row['error'] or 'WRONG'}"), flush=True)
    print(f"torch {t_torch * 1e6:.1f} us")
    timed = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])  # type: ignore[arg-type, return-value]
    profiled = {"default": built[0][0]}
    if timed:
        profiled[str(timed[0]["variant"])] = built[specs.index(str(timed[0]["variant"]))][0]
    for label, kern in profiled.items():
        for _ in range(3):
            kern(x, w)  # type: ignore[operator]
            cudnn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                kern(x, w)  # type: ignore[operator]
                cudnn()
            torch.cuda.synchronize()
        print(f"== profile: {label} and cuDNN")
        per = []
        for ev in sorted(prof.key_averages(), key=lambda e: -e.device_time_total):
            if ev.device_time_total > 0:
                per.append(dict(kernel=ev.key, us=ev.device_time_total / max(1, ev.count), count=ev.count))
                print(f"   {ev.key[:110]:110s} {per[-1]['us']:8.1f} us x{ev.count}")
        rows.append(dict(variant=f"profile:{label}", kernels=per))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "conv": dims, "rows": rows},
                                         indent=1, default=str))  # launch sizes may be expressions
    return 0


if __name__ == "__main__":
    sys.exit(main())
