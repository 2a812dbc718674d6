"""The warpgroup-MMA GEMM defaults that the calibrated model changed (``gemm_choice``'s
``calibrated``: tiles ranked by ``tune.analytical.predict``, 256×128 tiles among them) beside the
tiles the wave model chose before and torch, in the same process: every GEMM of the GPU suite, the
off-suite shapes and ``shapes.py --random 40`` of the given seeds whose default changed, checked
against a float64 torch reference, then CUDA events with the L2 flushed before each launch, medians
of interleaved rounds (``benchmarks/_variants.py``).

    PYTHONPATH=. python benchmarks/wgmma_defaults.py out.json [--seeds 1,2,3] [--only NAME,...] [--list]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shapes  # noqa: E402
from _variants import build_all, time_interleaved  # noqa: E402

import polytile as pt  # noqa: E402
from polytile.ops.gpu_schedules import gemm_as, gemm_choice  # noqa: E402
from polytile.target import as_target  # noqa: E402

SEEDS = "27183,80803,52817,99391,31337,70411,97052,1,2,3,4,5,6,7,8,11,12,13"


def choice(w: shapes.Workload, calibrated: bool):  # noqa: ANN201 - a GemmChoice
    d = dict(w.dims)
    op = w.op()
    dtype, out = op.func.tensor("A").dtype, op.func.tensor("C").dtype
    return gemm_choice(as_target("cuda:sm_90a"), d["M"], d["N"], d["K"], dtype, batch=d.get("batch", 1),
                       out_bytes=out.itemsize, calibrated=calibrated)


def seed_list(text: str) -> list[int]:
    """``--seeds``: comma-separated non-negative integers."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes comma-separated integers, got {text!r}") from None
    if any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"--seeds takes non-negative integers, got {text!r}")
    return seeds


def changed(seeds: list[int], only: str) -> list[shapes.Workload]:
    """The GEMM workloads whose default differs with and without the calibrated model."""
    ws = shapes.gpu_suite() + shapes.offsuite()
    for seed in seeds:
        ws += shapes.random_shapes(40, seed)
    out = []
    for w in shapes._unique(ws):
        if w.kind not in ("matmul", "batch_matmul") or (only and not any(o in w.name for o in only.split(","))):
            continue
        new, old = choice(w, True), choice(w, False)
        if new.kernel == "wgmma" and (new.params, new.split, new.chunk) != (old.params, old.split, old.chunk):
            out.append(w)
    return out


def build(job: tuple[shapes.Workload, str]) -> tuple[object | None, str]:
    w, label = job
    try:
        op = w.op()
        if label == "default":
            return op.build("cuda"), ""
        d = dict(w.dims)
        sched = pt.Schedule(op.func)
        batch = d["batch"] if "batch" in d else None
        sched = gemm_as(sched, choice(w, False), d["M"], d["N"], d["K"], None, batch) or sched
        return pt.build(sched, "cuda"), ""
    except Exception as e:  # noqa: BLE001 - a variant that does not build is reported, not fatal
        return None, f"{type(e).__name__}: {e}"[:300]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the JSON record of the rows")
    parser.add_argument("--seeds", type=seed_list, default=seed_list(SEEDS),
                        help="seeds of shapes.py --random 40 (comma-separated)")
    parser.add_argument("--only", default="", help="comma-separated parts of workload names")
    parser.add_argument("--workers", type=int, default=14, help="parallel builds")
    parser.add_argument("--list", action="store_true", help="print the changed defaults and stop (no GPU needed)")
    parser.add_argument("--build-only", action="store_true", help="build the variants and stop (no GPU needed)")
    args = parser.parse_args()
    ws = changed(args.seeds, args.only)
    if args.list:
        for w in ws:
            new, old = choice(w, True), choice(w, False)
            print(f"{w.name:40s} {old.params} s{old.split} -> {new.params} s{new.split}")
        print(f"{len(ws)} changed")
        return 0
    jobs = [(w, label) for w in ws for label in ("default", "before")]
    built = build_all(build, jobs, args.workers)
    if args.build_only:
        for (w, label), (kern, err) in zip(jobs, built):
            print(f"{w.name:40s} {label:8s} {'built' if kern is not None else err}", flush=True)
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
            c = choice(w, label == "default")
            row = dict(name=w.name, variant=label, params=c.params, split=c.split, error=err, torch_us=t_torch * 1e6)
            if kern is not None:
                rel = rel_error(kern(*inputs).reshape(ref.shape), ref)
                t = ours[label]
                row.update(rel_error=rel, ok=bool(rel <= op.tolerance), us=t * 1e6, ratio=t_torch / t)
            rows.append(row)
            timed = f"{row['us']:7.1f} us  ratio {row['ratio']:5.2f}" if "us" in row else row["error"]
            print(f"{w.name:40s} {label:8s} {timed}  torch {t_torch * 1e6:6.1f}  "
                  f"{'ok' if row.get('ok') else 'WRONG/failed'}", flush=True)
    pairs = [(a["us"], b["us"]) for a, b in zip(rows[::2], rows[1::2]) if "us" in a and "us" in b]
    if pairs:
        gain = math.exp(sum(math.log(old / new) for new, old in pairs) / len(pairs))
        print(f"{len(pairs)} workloads: default over before, geometric mean {gain:.3f}x; "
              f"faster {sum(new < old for new, old in pairs)}, slower {sum(new > old for new, old in pairs)}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "seeds": args.seeds,
                                          "rows": rows}, indent=1))
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
