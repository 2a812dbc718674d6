"""Warpgroup-MMA GEMM configurations side by side: the default schedule (``gemm_choice``) and chosen
block tiles, stages, block orders and producers, each checked against torch on fresh random inputs,
then timed (CUDA events, L2 flushed, median) in the same run as torch (cuBLAS) on one GPU.

    PYTHONPATH=. python benchmarks/gemm_configs.py --case 2048x2304x768 --case 32x2048x2048x128 \\
        --configs default,128x256x64/4/1,128x128x64/3/1/g8,128x128x64/2/0/threads [--dtype bfloat16]

A case is MxNxK or BATCHxMxNxK. A configuration is ``default`` or bm x bn x bk / stages / inflight,
then optionally ``/gG`` (blocks launched in groups of G rows: ``Stage.raster``), ``/sS`` (K split in
S chunks, unbatched products), ``/pP`` (P persistent blocks per multiprocessor), ``/tmastore`` (the
results written by a TMA store), ``/rows128`` (``/rows128A``, ``/rows128B``: the operands, or the one
named, whose rows are not whole 128-byte lines copied into rows that are, each copy a kernel of its own)
and ``/threads`` or ``/tma`` (the producer; default: TMA where
``tma_fits`` allows, cp.async otherwise). Results are
written in float32 (as ``benchmarks/shapes.py`` does by default); torch writes the input dtype.
"""

from __future__ import annotations

import argparse
import json
import time

import polytile as pt
from polytile import ops
from polytile.dtypes import as_dtype
from polytile.ops.gpu_schedules import align_operands, gemm_choice, gemm_wgmma, sum_partials, tma_fits
from polytile.runtime.cuda_device import cuda_target
from polytile.runtime.timing import time_gpu


def parse_config(text: str) -> dict[str, object]:
    """``128x256x64/4/1/g8/tma`` as gemm_wgmma's parameters."""
    parts = text.split("/")
    bm, bn, bk = (int(x) for x in parts[0].split("x"))
    cfg: dict[str, object] = dict(bm=bm, bn=bn, bk=bk, stages=int(parts[1]), inflight=int(parts[2]))
    for extra in parts[3:]:
        if extra.startswith("g"):
            cfg["group"] = int(extra[1:])
        elif extra.startswith("s"):
            cfg["split"] = int(extra[1:])
        elif extra in ("threads", "tma"):
            cfg["producer"] = extra
        elif extra.startswith("p") and extra[1:].isdigit():
            cfg["persistent"] = int(extra[1:])
        elif extra == "tmastore":
            cfg["store"] = "tma"
        elif extra.startswith("rows128"):
            cfg["rows128"] = extra[len("rows128"):] or "AB"
        else:
            raise SystemExit(f"unknown configuration part {extra!r} in {text!r}")
    return cfg


def build(dims: tuple[int, ...], dtype: str, config: str, target: object):  # noqa: ANN201 - a kernel
    *lead, M, N, K = dims
    batch = lead[0] if lead else 1
    if config == "default":
        op = ops.batch_matmul(batch, M, N, K, dtype) if lead else ops.matmul(M, N, K, dtype)
        choice = gemm_choice(target, M, N, K, as_dtype(dtype), batch=batch)
        return op.build(target), dict(choice.params, split=choice.split)
    cfg = parse_config(config)
    split = int(cfg.pop("split", 1))  # type: ignore[call-overload]
    rows128 = str(cfg.pop("rows128", ""))
    if "producer" not in cfg:
        cfg["producer"] = "tma" if tma_fits(cfg, M, N, K, as_dtype(dtype).itemsize, batch, split) else "threads"
    if lead:
        op = ops.batch_matmul(batch, M, N, K, dtype, split_k=split if split > 1 else None)
    else:
        op = ops.matmul(M, N, K, dtype, split_k=split if split > 1 else None)
    s = pt.Schedule(op.func)
    out = "P" if split > 1 else "C"  # a split reduction: partial products P over the chunks, then their sum
    if rows128:  # operands whose rows are not whole 128-byte lines copied into rows that are
        align_operands(s, out, tuple(rows128), granule=128)
    align_operands(s, out, ("A", "B"), granule=16 if cfg["producer"] == "tma" else 4)
    loops = tuple(x for x in ("bb" if lead else None, "s" if split > 1 else None) if x)
    gemm_wgmma(s, out, "A", "B", batch=(loops[0] if len(loops) == 1 else None), **cfg)
    if split > 1:
        sum_partials(s, "C", batch="bb" if lead else None)
    return pt.build(s, target), dict(cfg, split=split)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", action="append", required=True, help="MxNxK or BATCHxMxNxK (repeatable)")
    p.add_argument("--configs", default="default")
    p.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--out", help="write the rows as JSON here")
    p.add_argument("--build-only", action="store_true", help="build for sm_90a without a GPU: registers, spills")
    args = p.parse_args()
    if args.build_only:
        from polytile.target import CUDATarget
        for case in args.case:
            for config in args.configs.split(","):
                kern, cfg = build(tuple(int(x) for x in case.split("x")), args.dtype, config, CUDATarget(arch="sm_90a"))
                print(case, config, cfg, {k: (r.registers, r.spill_stores) for k, r in kern.resources.items()})
        return
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[args.dtype]
    target = cuda_target()
    rows = []
    for case in args.case:
        dims = tuple(int(x) for x in case.split("x"))
        *lead, M, N, K = dims
        g = torch.Generator(device="cuda").manual_seed(sum(dims))
        a = (torch.rand((*lead, M, K), device="cuda", generator=g) * 2 - 1).to(tdt)
        b = (torch.rand((*lead, K, N), device="cuda", generator=g) * 2 - 1).to(tdt)
        ref = torch.matmul(a.double(), b.double())
        torch_s = time_gpu(lambda a=a, b=b: torch.matmul(a, b), repeat=args.repeat)
        for config in args.configs.split(","):
            t0 = time.perf_counter()
            row: dict[str, object] = {"case": case, "dtype": args.dtype, "config": config,
                                      "torch_us": torch_s * 1e6}
            try:
                kern, cfg = build(dims, args.dtype, config, target)
                out = torch.full((*lead, M, N), float("nan"), device="cuda", dtype=torch.float32)
                kern(a, b, out)
                err = float((out.double() - ref).norm() / ref.norm())
                secs = kern.benchmark(a, b, out, repeat=args.repeat)
                row.update(cfg=cfg, us=secs * 1e6, vs_torch=torch_s / secs, rel_err=err, ok=err < 1e-4,
                           registers={k: r.registers for k, r in kern.resources.items()},
                           spills=sum(r.spill_stores for r in kern.resources.values()),
                           build_s=round(time.perf_counter() - t0, 1))
            except Exception as e:  # noqa: BLE001 - a failing configuration is recorded, the others run
                row.update(error=f"{type(e).__name__}: {str(e)[:300]}")
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print(f"{'case':>20} {'config':>24} {'torch us':>9} {'us':>9} {'x torch':>7} {'err':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:>20} {r['config']:>24} ERROR {r['error'][:90]}")
        else:
            print(f"{r['case']:>20} {r['config']:>24} {r['torch_us']:9.1f} {r['us']:9.1f} {r['vs_torch']:7.2f} "
                  f"{r['rel_err']:8.1e}")


if __name__ == "__main__":
    main()
