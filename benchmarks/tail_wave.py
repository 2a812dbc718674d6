"""GEMMs whose output tiles leave a partial last wave (issue 17 item 4, issue 15): the default
warpgroup-MMA schedule beside its rows split for the tail (``gpu_schedules.tail_split_choice``: the
whole waves over all of K, the remaining rows as their own product split in K, then one kernel that
combines them; the model's split and forced splits of 1 to 3 chunks) and torch, in the same process,
each checked against a float64 torch reference on fresh random inputs, then timed kernel-only (CUDA
events, L2 flushed before each launch, medians of interleaved rounds: ``benchmarks/_variants.py``).

The shapes: 5096×840×4216 (fp16, bf16) and GEMMs whose M is chosen from the GPU's SM count so that
the default's tiles fill between 15% and 55% of their last wave (odd N and K among them).

    PYTHONPATH=. python benchmarks/tail_wave.py out.json [--only NAME,...] [--list] [--build-only]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shapes  # noqa: E402
from _variants import build_all, time_interleaved  # noqa: E402

import polytile as pt  # noqa: E402
from polytile.dtypes import as_dtype  # noqa: E402
from polytile.ops.gpu_schedules import GemmChoice, gemm_as, gemm_choice, tail_split_choice, wgmma_seconds  # noqa: E402
from polytile.target import CUDATarget, as_target  # noqa: E402
from polytile.tune.analytical import Hardware, WgmmaConfig, occupancy  # noqa: E402

# (N, K, dtype) of the derived shapes, and the waves their M is sized around
BASES = [(1024, 4096, "float16", 1), (768, 3072, "bfloat16", 2), (2304, 1536, "float16", 1),
         (1536, 6144, "float16", 1), (600, 3000, "float16", 2), (3072, 3072, "bfloat16", 1),
         (1001, 3001, "float16", 1), (1260, 2052, "bfloat16", 1), (4096, 1024, "float16", 2)]
FIXED = [(5096, 840, 4216, "float16"), (5096, 840, 4216, "bfloat16")]
FORCED_SPLITS = (1, 2, 3)


def target() -> CUDATarget:
    """The GPU's facts (its SM count) where there is one, else an sm_90a of the default's facts."""
    try:
        from polytile.runtime.cuda_device import cuda_target
        return cuda_target()
    except Exception:  # noqa: BLE001 - no GPU here: --list and --build-only
        return as_target("cuda:sm_90a")  # type: ignore[return-value]


def last_wave(t: CUDATarget, M: int, N: int, K: int, dtype: str) -> tuple[float, float] | None:
    """(waves, fill of the last one) of the default's unsplit warpgroup-MMA tiles, None for other kernels."""
    c = gemm_choice(t, M, N, K, as_dtype(dtype), out_bytes=as_dtype(dtype).itemsize, tail_split=False)
    if c.kernel != "wgmma" or c.split != 1:
        return None
    hw = Hardware.of(t)
    wave = hw.sms * max(1, occupancy(WgmmaConfig.of(c.params, 2), hw, 2).blocks)
    tiles = -(-M // c.params["bm"]) * -(-N // c.params["bn"])
    return tiles / wave, (tiles % wave) / wave


def derived(t: CUDATarget) -> list[tuple[int, int, int, str]]:
    """An M for each base whose default leaves its last wave 15% to 55% full, the first found from
    the base's waves of 128-row tiles upwards (an odd M for every other base)."""
    out = []
    for n, (N, K, dtype, waves) in enumerate(BASES):
        start = waves * t.sms * 128 // -(-N // 128)
        for M in range(start + (n % 2), start + 4 * 128 * 8, 32):
            found = last_wave(t, M, N, K, dtype)
            if found and 1.0 < found[0] and 0.15 <= found[1] <= 0.55:
                out.append((M, N, K, dtype))
                break
    return out


def workloads(t: CUDATarget, only: str) -> list[shapes.Workload]:
    ws = [shapes._w(f"tail_{dtype[:2]}_{M}x{N}x{K}", "matmul", dtype, "tail", M=M, N=N, K=K)
          for M, N, K, dtype in FIXED + derived(t)]
    return [w for w in ws if not only or any(o in w.name for o in only.split(","))]


def variants(t: CUDATarget, w: shapes.Workload) -> dict[str, GemmChoice]:
    """The default (no row split), the model's row split and the forced splits of the tail, by label
    (a split that repeats another's choice is left out)."""
    d = dict(w.dims)
    M, N, K, dt = d["M"], d["N"], d["K"], as_dtype(w.dtype)
    whole = gemm_choice(t, M, N, K, dt, out_bytes=dt.itemsize, tail_split=False)
    out: dict[str, GemmChoice] = {"default": whole}
    for label, split in [("tail", None)] + [(f"tail/s{s}", s) for s in FORCED_SPLITS]:
        c = tail_split_choice(t, whole, M, N, K, dt, dt.itemsize, tail_split_k=split)
        if c is not None and c not in out.values():
            out[label] = c
    return out


def parts(w: shapes.Workload, c: GemmChoice) -> list[tuple[shapes.Workload, str, GemmChoice]]:
    """The two products of a row split alone, as jobs: its head's rows unsplit (``head``) and its tail's
    rows as the split product they are (``tail part``: the partial sums summed by a kernel of their own)."""
    d = dict(w.dims)
    head, tail = c.tail.head_rows, c.tail.tail  # type: ignore[union-attr]
    sized = lambda m: replace(w, dims=(("M", m), ("N", d["N"]), ("K", d["K"])))  # noqa: E731
    return [(sized(head), "head", replace(c, tail=None)), (sized(d["M"] - head), "tail part", tail)]


def build(job: tuple[shapes.Workload, str, GemmChoice]) -> tuple[object | None, str]:
    w, _label, choice = job
    try:
        op = w.op()
        d = dict(w.dims)
        sched = pt.Schedule(op.func)
        sched = gemm_as(sched, choice, d["M"], d["N"], d["K"]) or sched
        return pt.build(sched, "cuda"), ""
    except Exception as e:  # noqa: BLE001 - a variant that does not build is reported, not fatal
        return None, f"{type(e).__name__}: {e}"[:300]


def describe(c: GemmChoice) -> dict[str, object]:
    p = {k: v for k, v in c.params.items() if k in ("bm", "bn", "bk", "stages", "group", "producer")}
    if c.tail is None:
        return dict(params=p)
    tail = c.tail.tail
    return dict(params=p, head_rows=c.tail.head_rows, tail_params={k: v for k, v in tail.params.items()
                                                                   if k in ("bm", "bn", "bk", "group", "producer")},
                tail_split=tail.split, tail_chunk=tail.chunk)


def predicted(t: CUDATarget, c: GemmChoice, w: shapes.Workload) -> float:
    d = dict(w.dims)
    if c.tail is not None:
        return c.seconds
    return wgmma_seconds(t, c.params, d["M"], d["N"], d["K"], 1, c.split, c.chunk or -(-d["K"] // c.split),
                         as_dtype(w.dtype).itemsize)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the JSON record of the rows")
    parser.add_argument("--only", default="", help="comma-separated parts of workload names")
    parser.add_argument("--workers", type=int, default=14, help="parallel builds")
    parser.add_argument("--list", action="store_true", help="print the shapes and variants and stop (no GPU needed)")
    parser.add_argument("--build-only", action="store_true", help="build the variants and stop (no GPU needed)")
    parser.add_argument("--parts", default="5096x840", help="comma-separated parts of workload names whose model's "
                        "row split is also timed as its two products alone (on the rows of A they read)")
    args = parser.parse_args()
    t = target()
    ws = workloads(t, args.only)
    jobs = [(w, label, c) for w in ws for label, c in variants(t, w).items()]
    split_parts = [(w, part) for w, label, c in jobs if label == "tail" and args.parts
                   and any(o in w.name for o in args.parts.split(",")) for part in parts(w, c)]
    jobs += [part for _, part in split_parts]
    if args.list:
        for w, label, c in jobs:
            waves = last_wave(t, *(v for _, v in w.dims), w.dtype) if label == "default" else None
            print(f"{w.name:32s} {label:8s} {predicted(t, c, w) * 1e6:7.1f} us predicted  {describe(c)}"
                  + (f"  waves {waves[0]:.2f}" if waves else ""))
        return 0
    built = build_all(build, jobs, args.workers)
    if args.build_only:
        for (w, label, _), (kern, err) in zip(jobs, built):
            print(f"{w.name:32s} {label:8s} {'built' if kern is not None else err}", flush=True)
        return 0 if all(kern is not None for kern, _ in built) else 1
    import torch

    from polytile.runtime.timing import rel_error
    rows = []
    for w in ws:
        op = w.op()
        inputs, fn, ref_fn = shapes.torch_case(w, op, 11)
        ref = ref_fn()
        mine = [(label, c, kern, err) for (jw, label, c), (kern, err) in zip(jobs, built)
                if jw.name == w.name and jw.dims == w.dims]
        t_torch, ours = time_interleaved(fn, inputs, {label: kern for label, _, kern, _ in mine if kern is not None})
        for label, c, kern, err in mine:
            row = dict(name=w.name, variant=label, **describe(c), predicted_us=predicted(t, c, w) * 1e6, error=err,
                       torch_us=t_torch * 1e6)
            if kern is not None:
                rel = rel_error(kern(*inputs).reshape(ref.shape), ref)
                us = ours[label]
                row.update(rel_error=rel, ok=bool(rel <= op.tolerance), us=us * 1e6, ratio=t_torch / us,
                           kernels=len(kern.kernels))
            rows.append(row)
            timed = f"{row['us']:7.1f} us  ratio {row['ratio']:5.2f}" if "us" in row else row["error"]
            print(f"{w.name:32s} {label:8s} {timed}  predicted {row['predicted_us']:6.1f}  torch "
                  f"{t_torch * 1e6:6.1f}  {'ok' if row.get('ok') else 'WRONG/failed'}", flush=True)
    for w, (pw, label, c) in split_parts:
        kern, err = built[jobs.index((pw, label, c))]
        row = dict(name=w.name, variant=label, rows=dict(pw.dims)["M"], **describe(c), error=err)
        if kern is not None:
            a, b = shapes.torch_case(w, w.op(), 11)[0]
            count = dict(pw.dims)["M"]
            rows_of_a = a[:count] if label == "head" else a[dict(w.dims)["M"] - count:]
            row["us"] = kern.benchmark(rows_of_a, b, repeat=20) * 1e6
        rows.append(row)
        print(f"{w.name:32s} {label:9s} {row.get('us', math.nan):7.1f} us alone ({row['rows']} rows) {err}", flush=True)
    best = {}
    for r in rows:
        if "us" in r and r["variant"] not in ("default", "head", "tail part"):
            best[r["name"]] = min(best.get(r["name"], math.inf), r["us"])
    pairs = [(best[r["name"]], r["us"]) for r in rows if r["variant"] == "default" and "us" in r and r["name"] in best]
    if pairs:
        gain = math.exp(sum(math.log(old / new) for new, old in pairs) / len(pairs))
        print(f"{len(pairs)} workloads: best row split over the default, geometric mean {gain:.3f}x; "
              f"faster {sum(new < old for new, old in pairs)}, slower {sum(new > old for new, old in pairs)}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "sms": t.sms, "rows": rows},
                                         indent=1))
    return 0 if all(r.get("ok") for r in rows if r["variant"] not in ("head", "tail part")) else 1


if __name__ == "__main__":
    sys.exit(main())
