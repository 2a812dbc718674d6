"""TMA-pipelined warpgroup-MMA GEMMs (``gemm_wgmma(..., producer="tma")``, issued by one thread or by a
producer warpgroup: ``specialize=True``; blocks ordered down the columns of tiles: ``raster="columns"``;
row by row or in groups of rows: ``group``; persistent blocks, one per SM looping over the tiles:
``persistent=True``; results written by TMA stores: ``store="tma"``) against the same tiles with
cp.async copies and against torch.matmul (cuBLAS),
in one run on one GPU: each kernel is checked against torch on fresh random inputs first, then
timed (CUDA events, L2 flushed, median). Every variant keeps the default configuration's tiles and
stages; the ones named after a group (``-rows``: 1, ``-g8``: 8) replace its group.

    PYTHONPATH=. python benchmarks/tma_gemm.py [--shapes 4096x4096x4096,2048x6144x4096] [--dtype bfloat16]
        [--variants tma,tma-persist,...] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import time

import polytile as pt
from polytile import ops
from polytile.ops.gpu_schedules import align_operands, gemm_wgmma, wgmma_gemm_config
from polytile.runtime.cuda_device import cuda_target
from polytile.runtime.timing import time_gpu

VARIANTS = {"cp.async": dict(producer="threads"), "tma": dict(producer="tma"),
            "tma-ws": dict(producer="tma", specialize=True), "tma-cols": dict(producer="tma", raster="columns"),
            "tma-rows": dict(producer="tma", group=1), "tma-g8": dict(producer="tma", group=8),
            "tma-persist": dict(producer="tma", persistent=True),
            "tma-persist-rows": dict(producer="tma", persistent=True, group=1),
            "tma-persist-g8": dict(producer="tma", persistent=True, group=8),
            "tma-store": dict(producer="tma", store="tma"),
            "tma-persist-store": dict(producer="tma", persistent=True, store="tma")}
DEFAULT_VARIANTS = "cp.async,tma,tma-ws,tma-cols"


def variant_config(variant: str, cfg: dict[str, int], out_bytes: int, shared: int) -> dict[str, object]:
    """``cfg`` with the variant's options; a TMA store's staging tile beside the stages within
    ``shared`` bytes (fewer stages where they would not fit: a float32 128×256 tile is 128 KiB)."""
    how = {**cfg, **VARIANTS[variant]}
    if how.get("store") == "tma":
        per_stage = (how["bm"] + how["bn"]) * how["bk"] * 2
        fit = (shared - how["bm"] * how["bn"] * out_bytes) // per_stage
        how["stages"] = max(2, min(how["stages"], fit))
        how["inflight"] = min(how.get("inflight", 0), how["stages"] - 2)
    return how


def build(M: int, N: int, K: int, dtype: str, how: dict[str, object], out_dtype: str = "float32"):  # noqa: ANN201
    s = pt.Schedule(ops.matmul(M, N, K, dtype, **({} if out_dtype == "float32" else {"out_dtype": out_dtype})).func)
    align_operands(s, "C", ("A", "B"), granule=16 if how["producer"] == "tma" else 4)
    gemm_wgmma(s, "C", "A", "B", **how)
    return pt.build(s, "cuda")


def main() -> None:
    import torch
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="4096x4096x4096,2048x6144x4096,2048x28672x4096")
    p.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--stages", type=int, default=0, help="pipeline stages (0: the default config's)")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--out", help="write the rows as JSON to this file too")
    p.add_argument("--out-dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                   help="the results' type (16-bit: the shape suite's default)")
    args = p.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[args.dtype]
    target = cuda_target()
    rows = []
    for shape in args.shapes.split(","):
        M, N, K = (int(x) for x in shape.split("x"))
        cfg = {k: v for k, v in wgmma_gemm_config(M, N, K, target=target).items() if k != "producer"}
        if args.stages:
            cfg["stages"] = args.stages
        g = torch.Generator(device="cuda").manual_seed(M + N + K)
        a = (torch.rand((M, K), device="cuda", generator=g) * 2 - 1).to(tdt)
        b = (torch.rand((K, N), device="cuda", generator=g) * 2 - 1).to(tdt)
        ref = a.float() @ b.float()
        # torch writes its results in the operands' type: against 16-bit results (--out-dtype) like for like
        torch_s = time_gpu(lambda a=a, b=b: torch.matmul(a, b), repeat=args.repeat)
        row = {"shape": shape, "dtype": args.dtype, "out_dtype": args.out_dtype, "cfg": cfg, "torch_ms": torch_s * 1e3}
        out_bytes = 4 if args.out_dtype == "float32" else 2
        for variant in variants:
            t0 = time.perf_counter()
            how = variant_config(variant, cfg, out_bytes, target.shared_per_block)
            kern = build(M, N, K, args.dtype, how, args.out_dtype)
            out = kern(a, b)
            err = float((out.float() - ref).norm() / ref.norm())
            secs = kern.benchmark(a, b, repeat=args.repeat)
            row[variant] = {"ms": secs * 1e3, "vs_torch": torch_s / secs, "rel_err": err, "options": how,
                             "registers": {k: r.registers for k, r in kern.resources.items()},
                             "spills": sum(r.spill_stores for r in kern.resources.values()),
                             "build_s": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{'shape':>18} {'torch ms':>9}" + "".join(f" {v + ' ms':>16} {'x torch':>7}" for v in variants))
    for r in rows:
        print(f"{r['shape']:>18} {r['torch_ms']:9.3f}" +
              "".join(f" {r[v]['ms']:16.3f} {r[v]['vs_torch']:7.2f}" for v in variants))


if __name__ == "__main__":
    main()
