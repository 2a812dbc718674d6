"""The default schedules of random shapes below 0.5× torch (seed 52817 on an H200, issue 15), and their
neighbours, beside alternative schedules and torch in the same process: each variant checked against a
float64 torch reference, then CUDA events with the L2 flushed before each launch, medians of
interleaved rounds (``benchmarks/_variants.py``, as ``split_tails.py``).

- convolutions whose filters are 2-byte aligned rows (an odd number of 16-bit filters): the default
  (an aligned copy of the filter: ``gpu_schedules.aligned_filter``) against the filter read in place
  ("in place", the default before), and 8-byte aligned filters read in place against the copy;
- a tiny float32 GEMM (2×30×63) and its neighbours: the default GEMV (B staged in shared memory by
  few threads) against the direct GEMV of one K step (``gpu_schedules.one_step_gemv``: B straight
  into registers, every load in flight at once; K > 64: steps of 64), steps of 16 and a split;
- an fp16 GEMM of 2-byte aligned K and N (1001×10781×71: A and B copied aligned, then the product):
  the default against the same product on aligned sizes (72 and/or 10784: which part costs), other
  tiles, and the product into padded rows copied out (``gpu_schedules.padded_output``);
- implicit-GEMM splits whose last channel chunk has fewer K tiles than the others where the taps and
  channel tiles form one K loop (``conv_choice.igemm_splits``' ``uneven``), where they change the
  choice, against the default;
- 16-bit results in rows only 2-byte aligned (an odd N, or an odd number of filters) on the tensor
  cores: the default (each thread stores its accumulators, a warp's store over 8 rows) against the
  tile staged in shared memory and copied out row by row ("staged stores": ``gpu_schedules.
  STAGED_ODD_STORES``; "staged overlaid": the tile in the operand tiles' shared memory, the
  pipeline's stages as the default's), also on GPT-2's vocabulary projection and odd-N neighbours;
- float32 GEMVs of a short K and 1.6 to 8 MB of B (1×8424×48: 0.385× torch, the staged GEMV in 132
  blocks of one warp): the default against the direct GEMV of one K step in blocks of as few threads
  as leave one on every SM ("wide one step": ``gpu_schedules.wide_one_step``), in 128-thread blocks,
  and the staged GEMV ("staged GEMV": the default before, ``WIDE_ONE_STEP`` off);
- the defaults before both rules ("threads' stores": ``STAGED_ODD_STORES`` off) beside the default.

    python benchmarks/worst_shapes.py OUT.json [--only PART,...] [--workers 14] [--build-only]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import shapes  # noqa: E402
from _variants import build_all, time_interleaved  # noqa: E402

import polytile as pt  # noqa: E402
from polytile.ops.conv_choice import igemm_choice  # noqa: E402
from polytile.ops.gpu_schedules import (  # noqa: E402
    FILTER_GRANULE,
    ONE_STEP_ROWS,
    WIDE_ONE_STEP_BYTES,
    GemmChoice,
    gemm_as,
    gemm_choice,
    igemm_rows,
    igemm_schedule,
    one_step_gemv,
    padded_output,
    staged_stores_choice,
)
from polytile.ops.igemm import pads_channels  # noqa: E402
from polytile.target import as_target  # noqa: E402

CONVS = [  # (N, H, W, C, K, R, S, stride, padding)
    (1, 102, 102, 304, 33, 3, 3, 1, 1),   # seed 52817: 0.058x
    (1, 102, 102, 304, 17, 3, 3, 1, 1),
    (1, 102, 102, 304, 65, 3, 3, 1, 1),
    (1, 102, 102, 304, 100, 3, 3, 1, 1),  # 8-byte aligned rows: read in place in 8-byte pieces
    (1, 16, 16, 64, 33, 3, 3, 1, 1),      # a small one: the copy's launch against the in-place loads
    (8, 28, 28, 128, 75, 3, 3, 1, 1),
    (1, 8, 8, 264, 461, 7, 7, 2, 3),      # a large filter (12 MB) over few pixels
    (1, 64, 64, 3, 33, 3, 3, 1, 1),       # 3 channels: the channel-padded filter, padded to 40 filters
    (16, 70, 70, 14, 161, 1, 1, 1, 0),    # seed 27183: 0.35x, channel-padded, 161 filters
]
UNEVEN = [  # where the channel chunks of fewer K tiles in the last (igemm_splits' uneven) change the choice
    (1, 8, 8, 200, 24, 3, 3, 1, 1), (1, 8, 8, 264, 461, 7, 7, 2, 3), (1, 15, 15, 112, 48, 3, 3, 1, 1),
    (2, 12, 12, 280, 112, 7, 7, 1, 3), (16, 8, 8, 144, 48, 7, 7, 1, 3), (16, 8, 8, 256, 63, 5, 5, 2, 2),
]
GEMMS = [  # (M, N, K, dtype)
    (2, 30, 63, "float32"),               # seed 52817: 0.25x
    (1, 5044, 24, "float32"),             # seed 52817: 0.58x
    (4, 100, 50, "float32"),
    (3, 257, 129, "float32"),
    (1, 88, 72, "bfloat16"),              # seed 52817: 0.69x
    (1001, 10781, 71, "float16"),         # seed 52817: 0.47x, three kernels
    (1001, 10784, 72, "float16"),         # the same, aligned: one kernel
    (1001, 10781, 72, "float16"),         # K aligned (B copied; odd rows of C)
    (1001, 10782, 72, "float16"),         # rows of C 4-byte aligned: paired stores over 8 rows
    (1001, 10784, 71, "float16"),         # N aligned (A copied)
    (2085, 3175, 113, "bfloat16"),        # seed 52817: 0.58x, three kernels
    (128, 50257, 768, "float16"),         # GPT-2's vocabulary projection, 128 tokens (odd N)
    (2048, 50257, 768, "float16"),        # the same, 2048 tokens
    (77, 30523, 512, "float16"),          # odd N, few rows
    (2048, 4097, 1023, "bfloat16"),       # odd N and K
    (16, 4097, 512, "float16"),           # 16 rows: mma.sync's tile
    (1, 8424, 48, "float32"),             # seed 424242: 0.385x (17.2 us, torch 6.6), 132 one-warp blocks
    (1, 5000, 16, "float32"),
    (1, 12000, 32, "float32"),
    (1, 20000, 64, "float32"),
    (4, 8424, 48, "float32"),
    (1, 8424, 48, "float16"),
    (1, 8424, 48, "bfloat16"),
]
STAGED = ("staged stores",)  # the variant of 16-bit results in rows only 2-byte aligned
OVERLAID = "staged overlaid"  # the same, the staging tile in the storage of the operand tiles
BEFORE = "threads' stores"  # the default before staged stores (STAGED_ODD_STORES off)


def _conv_name(d: tuple[int, ...]) -> str:
    N, H, W, C, K, R, S, st, _ = d
    return f"conv.{N}x{H}x{W}x{C}x{K}x{R}x{S}s{st}"


def workloads(only: str) -> list[shapes.Workload]:
    out = [shapes._w(_conv_name(d), "conv2d_igemm", "float16", "conv",
                     **dict(zip(("N", "H", "W", "C", "K", "R", "S", "stride", "padding"), d, strict=True)))
           for d in CONVS + [u for u in UNEVEN if u not in CONVS]]
    out += [shapes._w(f"gemm.{M}x{N}x{K}.{dt}", "matmul", dt, "awkward", M=M, N=N, K=K) for M, N, K, dt in GEMMS]
    return [w for w in out if not only or any(o in w.name for o in only.split(","))]


def variants(w: shapes.Workload) -> list[str]:
    d = dict(w.dims)
    if w.kind == "conv2d_igemm":
        geometry = tuple(d[k] for k in ("N", "H", "W", "C", "K", "R", "S", "stride", "padding"))
        other = ["in place"] if d["K"] * 2 % 4 or pads_channels(d["C"], 2) else \
            ["aligned copy"] if d["K"] * 2 % 16 else []
        staged = [*STAGED, BEFORE] if d["K"] % 2 else []
        return ["default", *other, *staged] + (["uneven chunks"] if geometry in UNEVEN else [])
    M, N, K = d["M"], d["N"], d["K"]
    staged = list(STAGED) if N % 8 and w.dtype != "float32" and M >= 16 else []
    staged += [OVERLAID, BEFORE] if staged and M > 16 else [BEFORE] if staged else []  # OVERLAID: wgmma's tiles
    if M <= 16 and K <= ONE_STEP_ROWS and N * K * (4 if w.dtype == "float32" else 2) > 512 * 1024:
        return ["default", "wide one step", "direct one step", "staged GEMV"]
    if M < 16:
        return ["default", "direct one step", "direct steps of 16", "direct split 4"]
    if (M, N, K) in ((1001, 10781, 71), (2085, 3175, 113)):
        return ["default", "mma.sync", "wgmma 128x128", "padded output", *staged]
    return ["default", *staged]


def schedule(w: shapes.Workload, label: str) -> pt.Schedule | None:
    """``w``'s schedule as variant ``label`` (None: the default)."""
    target = as_target("cuda")
    op = w.op()
    sched = pt.Schedule(op.func)
    d = dict(w.dims)
    if label == "default":
        return None
    if w.kind == "conv2d_igemm":
        geometry = [d[k] for k in ("N", "H", "W", "C", "K", "R", "S", "stride", "padding")]
        N, H, W, C, K, R, S, st, pad = geometry
        M = N * ((H + 2 * pad - R) // st + 1) * ((W + 2 * pad - S) // st + 1)
        staged = True if label in STAGED else False if label in ("in place", "aligned copy", BEFORE) else None
        if pads_channels(C, 2):  # the channel-padded filter's rows K filters long, as before
            return igemm_rows(target, *geometry, "float16", "float16", aligned_filter=label != "in place",
                              staged_stores=staged)
        choice = igemm_choice(target, M, C, K, R, S, 2, N * H * W, 2, uneven=label == "uneven chunks")
        granule = None if label == "in place" else 16 if label == "aligned copy" else FILTER_GRANULE
        return igemm_schedule(sched, target, choice, *geometry, filter_granule=granule, staged_stores=staged) or sched
    M, N, K = d["M"], d["N"], d["K"]
    it = 2 if w.dtype != "float32" else 4
    if label in (BEFORE, "staged GEMV"):  # the default before its rule
        choice = gemm_choice(target, M, N, K, sched.func.tensor("A").dtype,  # type: ignore[arg-type]
                             out_bytes=sched.func.tensor("C").dtype.itemsize, staged_stores=False, wide_gemv=False)
        return gemm_as(sched, choice, M, N, K) or sched
    if label == "wide one step":  # gpu_schedules.wide_one_step's choice
        one = one_step_gemv(M, N, K, it, WIDE_ONE_STEP_BYTES, target.sms)
        return gemm_as(sched, GemmChoice("gemv", one, 1, 0.0), M, N, K) or sched  # type: ignore[arg-type]
    if label == OVERLAID:  # the default's tiles and stages, the staging tile overlaid
        choice = gemm_choice(target, M, N, K, sched.func.tensor("A").dtype, out_bytes=2)  # type: ignore[arg-type]
        choice = replace(choice, params={**choice.params, "store": "staged overlaid"})
        return gemm_as(sched, choice, M, N, K) or sched
    if label in STAGED:  # gpu_schedules.STAGED_ODD_STORES's choice (also for rows 4-byte aligned)
        choice = gemm_choice(target, M, N, K, sched.func.tensor("A").dtype, out_bytes=2)  # type: ignore[arg-type]
        choice = staged_stores_choice(target, choice, N, K, it, 2, granule=16)
        return gemm_as(sched, choice, M, N, K) or sched
    if label.startswith("direct"):
        # the direct GEMV of one_step_gemv (8 bytes of B's columns a thread), its K in one step (at
        # most ONE_STEP_ROWS), in steps of 16, or split in 4 chunks of steps of 16
        one = one_step_gemv(M, N, min(K, ONE_STEP_ROWS), it, most=N * K * it)
        split = 4 if "split" in label else 1
        bk = one["bk"] if label == "direct one step" else 16  # type: ignore[index]
        choice = GemmChoice("gemv", {**one, "bk": bk, "whole": split == 1}, split, 0.0)  # type: ignore[dict-item]
        return gemm_as(sched, choice, M, N, K) or sched
    if label == "mma.sync":
        choice = GemmChoice("mma", dict(bm=128, bn=128, wm=64, wn=64, bk=64, stages=3, reg_stages=2), 1, 0.0)
        return gemm_as(sched, choice, M, N, K) or sched
    if label == "wgmma 128x128":
        choice = GemmChoice("wgmma", dict(bm=128, bn=128, bk=64, stages=4, inflight=1), 1, 0.0)
        return gemm_as(sched, choice, M, N, K) or sched
    if label == "padded output":
        choice = gemm_choice(target, M, N, K, sched.func.tensor("A").dtype, out_bytes=2)  # type: ignore[arg-type]
        return padded_output(choice, M, N, K, w.dtype, w.dtype)
    raise ValueError(label)


def build(job: tuple[shapes.Workload, str]) -> tuple[object | None, str]:
    w, label = job
    try:
        sched = schedule(w, label)
        return (w.op().build("cuda") if sched is None else pt.build(sched, "cuda")), ""
    except Exception as e:  # noqa: BLE001 - a variant that does not build is reported, not fatal
        return None, f"{type(e).__name__}: {e}"[:300]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the JSON record of the rows")
    parser.add_argument("--only", default="", help="comma-separated parts of workload names")
    parser.add_argument("--workers", type=int, default=14, help="parallel builds")
    parser.add_argument("--build-only", action="store_true", help="build the variants and stop (no GPU needed)")
    args = parser.parse_args()
    ws = workloads(args.only)
    jobs = [(w, label) for w in ws for label in variants(w)]
    built = build_all(build, jobs, args.workers)
    if args.build_only:
        for (w, label), (kern, err) in zip(jobs, built):
            print(f"{w.name:34s} {label:20s} {'built ' + str(len(kern.kernels)) if kern is not None else err}",
                  flush=True)
        return 0 if all(kern is not None for kern, _ in built) else 1
    import torch

    from polytile.runtime.timing import rel_error
    rows = []
    for w in ws:
        op = w.op()
        inputs, fn, ref_fn = shapes.torch_case(w, op, 7)
        ref = ref_fn()
        mine = [(label, kern, err) for (jw, label), (kern, err) in zip(jobs, built) if jw.name == w.name]
        t_torch, ours = time_interleaved(fn, inputs, {label: kern for label, kern, _ in mine if kern is not None})
        for label, kern, err in mine:
            row = dict(name=w.name, variant=label, error=err, torch_us=t_torch * 1e6)
            if kern is not None:
                rel = rel_error(kern(*inputs).reshape(ref.shape), ref)
                t = ours[label]
                row.update(rel_error=rel, ok=bool(rel <= op.tolerance), us=t * 1e6, ratio=t_torch / t,
                           launches=[[k.name, [str(g) for g in k.grid], list(k.block)]  # type: ignore[attr-defined]
                                     for k in kern.kernels])  # type: ignore[attr-defined]
            rows.append(row)
            timed = f"{row['us']:8.1f} us  ratio {row['ratio']:5.2f}" if "us" in row else row["error"]
            print(f"{w.name:34s} {label:20s} {timed}  torch {t_torch * 1e6:7.1f}  "
                  f"{'ok' if row.get('ok') else 'WRONG/failed'}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
