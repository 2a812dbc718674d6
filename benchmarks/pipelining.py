"""Tensor cores and load–compute pipelining (issue 5, ALCOP's evaluation set), in one run.

For each workload — fp16/bf16 GEMM 4096³, BERT-base's GEMMs (512×768×768, 512×3072×768,
512×768×3072), a fully connected layer (64×1000×2048), attention's batched GEMM (96×128×128×64),
ResNet-50's 3×3 convolutions (N=32, NHWC) and a 3-D convolution as implicit GEMMs —
polytile's tensor-core kernel is built with the same tiles in four pipelining variants:

  none        no pipelining (load, sync, compute)
  shared2     double buffering in shared memory (2 stages)
  shared      multi-stage shared memory (the workload's stage count, 3 or 4)
  multilevel  multi-stage shared memory + double-buffered register fragments, fused (ALCOP)
  wgmma       (sm_90a) Hopper's warpgroup MMA with its default configuration
              (``wgmma_gemm_config`` / ``wgmma_igemm_config``: swizzled shared tiles, 4 stages,
              one MMA group in flight) — what the operators build on an H100

beside cuBLAS/cuDNN (torch; TF32 off) and Triton (a tutorial GEMM with float32 output, best of a
few tile/stage configurations) on the same random inputs. Every kernel is checked against a float32
torch reference (relative error norm). Writes a JSON record to benchmarks/results/ and prints a
table last.

    python benchmarks/pipelining.py [--quick] [--only matmul4096,bert_ffn1] [--dtypes float16,bfloat16]
                                    [--repeat 30] [--workers 12] [--no-triton]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import polytile as pt  # noqa: E402
from polytile import ops  # noqa: E402
from polytile.ops.conv_choice import wgmma_igemm_config  # noqa: E402
from polytile.ops.gpu_schedules import (  # noqa: E402
    gemm_tensorcore,
    gemm_wgmma,
    igemm_tensorcore,
    igemm_wgmma,
    wgmma_gemm_config,
)
from polytile.target import as_target  # noqa: E402

VARIANTS = ("none", "shared2", "shared", "multilevel", "wgmma")
MMA_VARIANTS = VARIANTS[:4]  # the mma.sync pipelining variants (ALCOP's comparison)


def workloads(quick: bool) -> dict[str, dict]:
    """name -> kind, sizes, tiles (the same for every variant) and the multi-stage stage count."""
    big = dict(bm=128, bn=256, wm=64, wn=64, bk=64)
    small = dict(bm=64, bn=64, wm=32, wn=32, bk=64)
    n = 8 if quick else 32
    w = {
        "matmul4096": dict(kind="matmul", dims=(1024, 1024, 1024) if quick else (4096, 4096, 4096), tiles=big,
                           stages=3),
        "bert_qkv": dict(kind="matmul", dims=(512, 768, 768), tiles=small, stages=3),
        "bert_ffn1": dict(kind="matmul", dims=(512, 3072, 768), tiles=dict(small, bn=128, wn=64), stages=3),
        "bert_ffn2": dict(kind="matmul", dims=(512, 768, 3072), tiles=small, stages=4),
        "fc": dict(kind="matmul", dims=(64, 1000, 2048), tiles=dict(small, bk=64), stages=4),
        "bmm_attn": dict(kind="batch_matmul", dims=(96, 128, 128, 64), tiles=dict(small, bk=32), stages=2),
        # ResNet-50's 3×3 layers (stride 1, padding 1) at batch 32
        "r50_conv2": dict(kind="conv2d_igemm", dims=(n, 56, 56, 64, 64, 3, 3, 1, 1),
                          tiles=dict(bm=128, bn=64, wm=64, wn=32, bk=32), stages=3),
        "r50_conv3": dict(kind="conv2d_igemm", dims=(n, 28, 28, 128, 128, 3, 3, 1, 1),
                          tiles=dict(bm=128, bn=128, wm=64, wn=64, bk=32), stages=3),
        "r50_conv4": dict(kind="conv2d_igemm", dims=(n, 14, 14, 256, 256, 3, 3, 1, 1),
                          tiles=dict(bm=128, bn=128, wm=64, wn=64, bk=32), stages=3),
        "r50_conv5": dict(kind="conv2d_igemm", dims=(n, 7, 7, 512, 512, 3, 3, 1, 1),
                          tiles=dict(small, bk=32), stages=3),
        "conv3d": dict(kind="conv3d_igemm", dims=(2, 8 if quick else 16, 28, 28, 64, 64, 3, 3, 3, 1, 1),
                       tiles=dict(small, bk=32), stages=3),
    }
    return w


def variant_cfg(spec: dict, variant: str) -> dict:
    if variant == "wgmma" and spec["kind"].endswith("igemm"):
        op = make_op(spec, "float16")
        rows = int(op.func.outputs[0].shape[0].value)
        return wgmma_igemm_config(rows, op.shape["K"], sms=as_target("cuda").sms)
    if variant == "wgmma":
        d = spec["dims"]
        rows, cols, k = (d[0] * d[1], d[2], d[3]) if spec["kind"] == "batch_matmul" else d
        cfg = wgmma_gemm_config(rows, cols, k, target=as_target("cuda"))
        if spec["kind"] == "batch_matmul" and (cfg["bm"] > d[1] or cfg["bn"] > d[2]):
            cfg.update(bm=64, bn=64)
        return cfg
    stages = {"none": 1, "shared2": 2, "shared": spec["stages"], "multilevel": spec["stages"]}[variant]
    return dict(spec["tiles"], stages=stages, reg_stages=2 if variant == "multilevel" else 1)


def make_op(spec: dict, dtype: str) -> ops.Op:
    kind, d = spec["kind"], spec["dims"]
    if kind == "matmul":
        return ops.matmul(*d, dtype)
    if kind == "batch_matmul":
        return ops.batch_matmul(*d, dtype)
    if kind == "conv2d_igemm":
        return ops.conv2d_igemm(*d, dtype=dtype)
    return ops.conv3d_igemm(*d, dtype=dtype)


def build_variant(job: tuple[str, dict, str, str]):  # noqa: ANN201 - (key, kernel or error, seconds)
    """Build one variant (in a worker process); kernels are pickled back to the parent."""
    name, spec, dtype, variant = job
    t0 = time.perf_counter()
    try:
        op = make_op(spec, dtype)
        sched = pt.Schedule(op.func)
        cfg = variant_cfg(spec, variant)
        if spec["kind"] in ("matmul", "batch_matmul"):
            batch = "bb" if spec["kind"] == "batch_matmul" else None
            (gemm_wgmma if variant == "wgmma" else gemm_tensorcore)(sched, "C", "A", "B", batch=batch, **cfg)
        else:
            taps = ["r", "s"] if spec["kind"] == "conv2d_igemm" else ["t", "r", "s"]
            (igemm_wgmma if variant == "wgmma" else igemm_tensorcore)(sched, "O", "col", "Wt", taps, **cfg)
        kern = pt.build(sched, "cuda")
        return (name, dtype, variant), kern, time.perf_counter() - t0
    except Exception as err:  # noqa: BLE001 - a failed build is recorded, the run goes on
        return (name, dtype, variant), f"{type(err).__name__}: {err}"[:1500], time.perf_counter() - t0


# --- peers ---------------------------------------------------------------------------------------------

def torch_inputs(spec: dict, dtype: str, seed: int):  # noqa: ANN201 - torch tensors
    import torch
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(seed)
    op = make_op(spec, dtype)
    shapes = [tuple(int(d.value) for d in t.shape) for t in op.func.inputs]
    return [(torch.rand(s, device="cuda", generator=g) * 2 - 1).to(tdt) for s in shapes]


def vendor(spec: dict, inputs):  # noqa: ANN001, ANN201 - (name, fn, reference fn, rows)
    """The library call a user would make (cuBLAS / cuDNN through torch), a float32 reference in
    polytile's output layout, and the map from the library's output to that layout."""
    import torch
    import torch.nn.functional as F
    kind, d = spec["kind"], spec["dims"]
    if kind in ("matmul", "batch_matmul"):
        a, b = inputs
        return "cuBLAS", (lambda: a @ b), (lambda: a.float() @ b.float()), (lambda y: y)
    if kind == "conv2d_igemm":
        N, H, W, C, K, R, S, stride, pad = d
        x = inputs[0].permute(0, 3, 1, 2)  # NCHW view of NHWC memory: channels_last
        w = inputs[1].permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
        out = lambda y: y.permute(0, 2, 3, 1).reshape(-1, K)  # noqa: E731
        return ("cuDNN", lambda: F.conv2d(x, w, stride=stride, padding=pad),
                lambda: out(F.conv2d(x.float(), w.float(), stride=stride, padding=pad)), out)
    N, D, H, W, C, K, T, R, S, stride, pad = d
    x = inputs[0].permute(0, 4, 1, 2, 3)
    w = inputs[1].permute(4, 3, 0, 1, 2).contiguous(memory_format=torch.channels_last_3d)
    out = lambda y: y.permute(0, 2, 3, 4, 1).reshape(-1, K)  # noqa: E731
    return ("cuDNN", lambda: F.conv3d(x, w, stride=stride, padding=pad),
            lambda: out(F.conv3d(x.float(), w.float(), stride=stride, padding=pad)), out)


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), from Triton's tutorial autotune list
TRITON_CONFIGS = [(128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (128, 128, 32, 4, 4), (64, 64, 64, 4, 4),
                  (64, 128, 32, 4, 4), (64, 64, 32, 2, 5)]


def triton_gemm():  # noqa: ANN201 - the jitted kernel, or None without Triton
    """Triton's tutorial GEMM (benchmarks/triton_kernels.py), storing in the output's type."""
    try:
        from triton_kernels import matmul_kernel
    except ImportError:
        return None
    return matmul_kernel


def time_triton(gemm, a, b, ref, repeat: int) -> dict | None:  # noqa: ANN001
    """Triton's best configuration (float32 output like polytile's), checked against ``ref``."""
    import torch

    from polytile.runtime.timing import time_gpu
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, device="cuda", dtype=torch.float32)
    best = None
    for bm, bn, bk, warps, stages in TRITON_CONFIGS:
        grid = (((M + bm - 1) // bm) * ((N + bn - 1) // bn),)

        def launch(bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, grid=grid):  # noqa: ANN001, ANN202
            gemm[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                       c.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps,
                       num_stages=stages)
        try:
            launch()
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 - a configuration Triton cannot compile (shared memory)
            continue
        err = float((c - ref).norm() / ref.norm())
        t = time_gpu(launch, repeat=repeat)
        if best is None or t < best["s"]:
            best = {"s": t, "config": [bm, bn, bk, warps, stages], "rel_error": err}
    return best


def main() -> int:
    import torch

    from polytile.runtime.timing import time_gpu
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_ops import device_record
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--only", default="", help="comma-separated workload names")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--no-triton", action="store_true")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    only = [w for w in args.only.split(",") if w]
    dtypes = [d for d in args.dtypes.split(",") if d]
    work = {k: v for k, v in workloads(args.quick).items() if not only or k in only}
    jobs = []
    hopper = as_target("cuda").has("wgmma")
    for name, spec in work.items():
        # bf16: the GEMMs (the convolutions' bf16 path is the same code as fp16)
        for dtype in dtypes if spec["kind"] in ("matmul", "batch_matmul") else dtypes[:1]:
            jobs += [(name, spec, dtype, v) for v in VARIANTS if v != "wgmma" or hopper]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as ex:
        built = {key: (k, s) for key, k, s in ex.map(build_variant, jobs)}
    print(f"built {len(jobs)} kernels in {time.perf_counter() - t0:.0f} s", flush=True)
    gemm = None if args.no_triton else triton_gemm()
    results = []
    for name, spec in work.items():
        for dtype in sorted({d for (n, d, _) in built if n == name}, key=dtypes.index):
            inputs = torch_inputs(spec, dtype, seed=len(results) + 1)
            lib, fn, ref_fn, rows = vendor(spec, inputs)
            ref = ref_fn()
            lib_out = fn()
            row = {"workload": name, "kind": spec["kind"], "dims": list(spec["dims"]), "dtype": dtype,
                   "flops": make_op(spec, dtype).flops, "tiles": spec["tiles"], "library": lib,
                   "library_rel_error": float((rows(lib_out).float() - ref).norm() / ref.norm()),
                   "variants": {}}
            out = torch.empty(ref.shape, device="cuda", dtype=torch.float32)
            for v in VARIANTS:
                if (name, dtype, v) not in built:
                    continue
                kern, build_s = built[(name, dtype, v)]
                if isinstance(kern, str):
                    row["variants"][v] = {"error": kern}
                    continue
                try:
                    got = kern(*inputs)
                    err = float((got.reshape(ref.shape) - ref).norm() / ref.norm())
                    t = float(np.median([kern.benchmark(*inputs, out.reshape(got.shape), repeat=args.repeat)
                                         for _ in range(2)]))
                except pt.PolytileError as e:
                    row["variants"][v] = {"error": str(e)[:1500]}
                    continue
                res = next(iter(kern.resources.values()))
                row["variants"][v] = {"s": t, "tflops": row["flops"] / t / 1e12, "rel_error": err,
                                      "build_s": build_s, "config": variant_cfg(spec, v),
                                      "registers": res.registers, "spills": res.spill_stores}
            row["library_s"] = float(np.median([time_gpu(fn, repeat=args.repeat) for _ in range(2)]))
            if gemm is not None and spec["kind"] == "matmul":
                row["triton"] = time_triton(gemm, inputs[0], inputs[1], ref, args.repeat)
            ok = {v: r["s"] for v, r in row["variants"].items() if "s" in r and r["rel_error"] < 1e-2}
            if ok:
                best = min(ok, key=ok.get)
                row["best_variant"] = best
                row["speed_vs_library"] = row["library_s"] / ok[best]
                if row.get("triton"):
                    row["speed_vs_triton"] = row["triton"]["s"] / ok[best]
                mma = {v: t for v, t in ok.items() if v in MMA_VARIANTS}
                if "none" in mma:
                    row["pipelining_speedup"] = mma["none"] / min(mma.values())
                if "multilevel" in ok and "none" in ok:
                    row["multilevel_speedup"] = ok["none"] / ok["multilevel"]
                if "wgmma" in ok:
                    row["wgmma_vs_library"] = row["library_s"] / ok["wgmma"]
            results.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "variants"}), flush=True)
    record = {"benchmark": "pipelining", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": " ".join(sys.argv), **device_record(),
              "timing": "median of CUDA-event times of single launches (L2 flushed before each), launch "
                        "overhead included for every contender; polytile and Triton write float32 results, "
                        "cuBLAS/cuDNN the input dtype", "results": results}
    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"pipelining-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(record, indent=2))
    print(f"\nTensor cores and pipelining on {record['device']} ({record['date']}); record {path.name}")
    print("time in ms; ratio = library time / polytile's best (higher is better)")
    print(f"{'workload':12s} {'dtype':8s} " + " ".join(f"{v:>10s}" for v in VARIANTS)
          + f" {'library':>9s} {'triton':>8s} {'vs lib':>7s} {'vs tri':>7s} {'TFLOP/s':>8s}")
    for r in results:
        cells = []
        for v in VARIANTS:
            x = r["variants"].get(v)
            cells.append(f"{'-':>10s}" if x is None else f"{x['s'] * 1e3:10.3f}" if "s" in x else f"{'FAIL':>10s}")
        tri = r.get("triton")
        best = r["variants"].get(r.get("best_variant", ""), {})
        print(f"{r['workload']:12s} {r['dtype']:8s} " + " ".join(cells)
              + f" {r['library_s'] * 1e3:9.3f} " + (f"{tri['s'] * 1e3:8.3f}" if tri else f"{'-':>8s}")
              + f" {r.get('speed_vs_library', 0):6.2f}x "
              + (f"{r['speed_vs_triton']:6.2f}x" if tri else f"{'-':>7s}")
              + f" {best.get('tflops', 0):8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
