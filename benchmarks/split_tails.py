"""The defaults that changed for random shapes (issue 15, shape15): implicit-GEMM convolutions split over
channel tails (``conv_choice.igemm_splits``: one chunk per filter row over all the channels, channel
chunks of whole K tiles, the last ending at C), the channel-padded convolution's split reduction
(``igemm_rows_choice``) and small batched products on mma.sync's tiles (``gemm_choice``'s
``batched_tiles``), each beside the schedule the default took before (the unsplit kernel; the GEMV)
and torch in the same process: checked against a float64 torch reference, then CUDA events with the L2
flushed before each launch, medians of interleaved rounds (``benchmarks/conv_choices.py``'s method).
The workloads are random shapes (``shapes.py --random 40``) of seeds 97052, 99391, 31337 and 1–8
whose default changed.

    python benchmarks/split_tails.py OUT.json [--only PART,...] [--workers 14] [--build-only]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import shapes  # noqa: E402
from _variants import build_all, time_interleaved  # noqa: E402

import polytile as pt  # noqa: E402
from polytile.ops.conv_choice import igemm_choice  # noqa: E402
from polytile.ops.gpu_schedules import gemm_as, gemm_choice, igemm_rows, igemm_schedule  # noqa: E402
from polytile.ops.igemm import pads_channels  # noqa: E402
from polytile.target import as_target  # noqa: E402

CONVS = ["1x14x14x313x22x5x5s2", "2x12x12x280x112x7x7s1", "2x8x8x376x96x3x3s1", "8x9x9x88x32x3x3s2",
         "1x8x8x264x461x7x7s2", "32x34x34x440x140x3x3s2", "1x18x18x24x328x7x7s2", "1x27x27x152x77x3x3s1",
         "1x25x25x352x101x3x3s2", "8x9x9x224x300x7x7s2", "1x8x8x200x24x3x3s1",
         # channel-padded (igemm_rows), split
         "32x19x19x81x12x5x5s2", "8x8x8x119x8x7x7s1", "1x12x12x274x43x5x5s1", "16x8x8x85x154x3x3s2",
         "1x28x28x79x33x5x5s1", "2x10x10x57x14x7x7s2"]
BMMS = [(3, 12, 104, 40, "float16"), (2, 5, 16, 85, "float16"), (15, 15, 43, 192, "float16"),
        (9, 14, 1914, 56, "float16"), (32, 8, 190, 94, "float16"), (3, 8, 1209, 99, "bfloat16"),
        (24, 7, 600, 58, "float16"), (6, 3, 77, 211, "float16"),
        (16, 2, 60, 144, "float16")]


def workloads(only: str) -> list[shapes.Workload]:
    out = []
    for name in CONVS:
        dims, stride = name.split("s")
        N, H, W, C, K, R, S = map(int, dims.split("x"))
        out.append(shapes._w(f"rand.conv.{name}", "conv2d_igemm", "float16", "conv", N=N, H=H, W=W, C=C, K=K, R=R,
                             S=S, stride=int(stride), padding=R // 2))
    out += [shapes._w(f"rand.bmm.{b}x{M}x{N}x{K}.{dt}", "batch_matmul", dt, "attention", batch=b, M=M, N=N, K=K)
            for b, M, N, K, dt in BMMS]
    return [w for w in out if not only or any(o in w.name for o in only.split(","))]


def before(w: shapes.Workload, sched: pt.Schedule) -> pt.Schedule:
    """``w``'s schedule as the default built it before: unsplit, or the GEMV for a batched product."""
    target = as_target("cuda")
    d = dict(w.dims)
    if w.kind == "batch_matmul":
        dtype = sched.func.tensor("A").dtype
        choice = gemm_choice(target, d["M"], d["N"], d["K"], dtype, batch=d["batch"], out_bytes=2, batched_tiles=False)
        return gemm_as(sched, choice, d["M"], d["N"], d["K"], None, d["batch"]) or sched
    geometry = [d[k] for k in ("N", "H", "W", "C", "K", "R", "S", "stride", "padding")]
    if pads_channels(d["C"], 2):
        return igemm_rows(target, *geometry, "float16", "float16", split=(False, 1))
    N, H, W, C, K, R, S, st, pad = geometry
    M = N * ((H + 2 * pad - R) // st + 1) * ((W + 2 * pad - S) // st + 1)
    choice = igemm_choice(target, M, C, K, R, S, 2, N * H * W, 2, split=False)
    return igemm_schedule(sched, target, choice, *geometry) or sched


def build(job: tuple[shapes.Workload, str]) -> tuple[object | None, str]:
    w, label = job
    try:
        op = w.op()
        if label == "default":
            return op.build("cuda"), ""
        return pt.build(before(w, pt.Schedule(op.func)), "cuda"), ""
    except Exception as e:  # noqa: BLE001 - a variant that does not build is reported, not fatal
        return None, f"{type(e).__name__}: {e}"[:300]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the JSON record of the rows")
    parser.add_argument("--only", default="", help="comma-separated parts of workload names")
    parser.add_argument("--workers", type=int, default=14, help="parallel builds")
    parser.add_argument("--build-only", action="store_true", help="build the variants and stop (no GPU needed)")
    args = parser.parse_args()
    jobs = [(w, label) for w in workloads(args.only) for label in ("default", "before")]
    built = build_all(build, jobs, args.workers)
    if args.build_only:
        for (w, label), (kern, err) in zip(jobs, built):
            print(f"{w.name:40s} {label:8s} {'built' if kern is not None else err}", flush=True)
        return 0 if all(kern is not None for kern, _ in built) else 1
    import torch

    from polytile.runtime.timing import rel_error
    rows = []
    for w in workloads(args.only):
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
                           launches=[[k.name, [str(g) for g in k.grid]] for k in kern.kernels])  # type: ignore[attr-defined]
            rows.append(row)
            timed = f"{row['us']:7.1f} us  ratio {row['ratio']:5.2f}" if "us" in row else row["error"]
            print(f"{w.name:40s} {label:8s} {timed}  torch {t_torch * 1e6:6.1f}  "
                  f"{'ok' if row.get('ok') else 'WRONG/failed'}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
