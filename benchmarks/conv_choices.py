"""Implicit-GEMM convolution defaults on the GPU (issue 15): for each 16-bit convolution of the shape
suite and the off-suite list (``benchmarks/shapes.py``; at least 16 input channels), the default
(``conv_choice.igemm_choice``), the analytical model's runners-up (``igemm_options``) and the choice
of the model without the gather rate (``Hardware.gather_bytes_per_cycle`` 0: the defaults before it),
each checked against a float64 torch reference and timed beside torch (cuDNN) in the same process:
CUDA events, L2 flushed before each launch, medians of interleaved rounds. The measurements check
the model's ranking.

    python benchmarks/conv_choices.py OUT.json [--only NAME,...] [--top 3] [--workers 14] [--build-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import shapes  # noqa: E402
from _variants import build_all, time_interleaved  # noqa: E402

import polytile as pt  # noqa: E402
from polytile.ops.conv_choice import IgemmChoice, igemm_choice, igemm_options  # noqa: E402
from polytile.ops.gpu_schedules import igemm_schedule  # noqa: E402
from polytile.target import as_target  # noqa: E402


def workloads(only: str) -> list[shapes.Workload]:
    out = [w for w in shapes.gpu_suite() + shapes.offsuite()
           if w.kind == "conv2d_igemm" and dict(w.dims)["C"] >= 16 and w.dtype in ("float16", "bfloat16")]
    return [w for w in out if not only or any(o in w.name for o in only.split(","))]


def geometry(w: shapes.Workload) -> tuple[int, ...]:
    d = dict(w.dims)
    return tuple(d[k] for k in ("N", "H", "W", "C", "K", "R", "S", "stride", "padding"))


def candidates(target: object, w: shapes.Workload, top: int) -> list[tuple[str, IgemmChoice]]:
    """(label, choice): the default (``igemm_choice``), the model's best ``top`` − 1 others, and the choice
    without the gather rate."""
    N, H, W, C, K, R, S, st, pad = geometry(w)
    M = N * ((H + 2 * pad - R) // st + 1) * ((W + 2 * pad - S) // st + 1)
    out_bytes = 2 if w.half_out else 4
    default = igemm_choice(target, M, C, K, R, S, 2, N * H * W, out_bytes)  # type: ignore[arg-type]
    ranked = [default] + [c for c in igemm_options(target, M, C, K, R, S, 2, N * H * W, out_bytes)  # type: ignore[arg-type]
                          if c != default]
    before = dataclasses.replace(target, extra={**target.extra, "gather_bytes_per_cycle": 0})  # type: ignore[type-var]
    old = igemm_options(before, M, C, K, R, S, 2)[0]
    out = [("default", ranked[0])] + [(f"model#{i + 1}", c) for i, c in enumerate(ranked[1:top])]
    same = [lab for lab, c in out if (c.kernel, c.params, c.rows, c.chunks) == (old.kernel, old.params, old.rows,
                                                                                 old.chunks)]
    out.append(("before=" + same[0] if same else "before", old))
    return out


def describe(c: IgemmChoice) -> str:
    p = c.params
    return f"{c.kernel} {p['bm']}x{p['bn']}x{p['bk']} split={'rows×' if c.rows else ''}{c.chunks}"


def build(job: tuple[shapes.Workload, str, IgemmChoice]) -> tuple[object | None, str]:
    w, label, c = job
    try:
        op = w.op()
        if label == "default":
            return op.build("cuda"), ""
        sched = pt.Schedule(op.func)
        split = igemm_schedule(sched, as_target("cuda"), c, *geometry(w))  # type: ignore[arg-type]
        return pt.build(split or sched, "cuda"), ""
    except Exception as e:  # noqa: BLE001 - a variant that does not build is reported, not fatal
        return None, f"{type(e).__name__}: {e}"[:200]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the JSON record of the rows")
    parser.add_argument("--only", default="", help="comma-separated parts of workload names")
    parser.add_argument("--top", type=int, default=3, help="the model's best this many, the default first")
    parser.add_argument("--workers", type=int, default=14, help="parallel builds")
    parser.add_argument("--build-only", action="store_true", help="build the variants and stop (no GPU needed)")
    args = parser.parse_args()
    target = as_target("cuda")
    jobs = []
    for w in workloads(args.only):
        seen = set()
        for label, c in candidates(target, w, args.top):
            key = (c.kernel, tuple(sorted(c.params.items())), c.rows, c.chunks)
            if key not in seen:
                seen.add(key)
                jobs.append((w, label, c))
    built = build_all(build, jobs, args.workers)
    if args.build_only:
        for (w, label, c), (kern, err) in zip(jobs, built):
            print(f"{w.name:34s} {label:16s} {describe(c):30s} {'built' if kern is not None else err}")
        return 0 if all(kern is not None for kern, _ in built) else 1
    import torch

    from polytile.runtime.timing import rel_error
    rows = []
    for w in workloads(args.only):
        op = w.op()
        inputs, fn, ref_fn = shapes.torch_case(w, op, 7)
        ref = ref_fn()
        mine = [(label, c, kern, err) for (jw, label, c), (kern, err) in zip(jobs, built) if jw.name == w.name]
        for label, c, kern, err in mine:
            row = dict(name=w.name, variant=label, choice=describe(c), predicted_us=c.seconds * 1e6, error=err)
            if kern is not None:
                rel = rel_error(kern(*inputs).reshape(ref.shape), ref)
                row.update(rel_error=rel, ok=bool(rel <= op.tolerance))
            rows.append(row)
        t_torch, ours = time_interleaved(fn, inputs, {label: kern for label, _, kern, _ in mine if kern is not None})
        for row in rows:
            if row["name"] == w.name and row["variant"] in ours:
                t = ours[row["variant"]]
                row.update(us=t * 1e6, torch_us=t_torch * 1e6, ratio=t_torch / t)
        for row in (r for r in rows if r["name"] == w.name):
            timed = f"{row['us']:7.1f} us  ratio {row['ratio']:5.2f}" if "us" in row else row["error"]
            print(f"{w.name:34s} {row['variant']:16s} {row['choice']:30s} predicted {row['predicted_us']:6.1f}  "
                  f"{timed}  torch {t_torch * 1e6:6.1f}  {'ok' if row.get('ok') else 'WRONG/failed'}", flush=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
