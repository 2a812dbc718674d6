"""Split reductions of implicit-GEMM convolutions on the GPU (issue 15): for convolutions whose output
tiles leave most SMs idle (ResNet-50's late layers at batch 1), the default (``conv_choice.igemm_choice``'s
choice) beside every split it considers — one chunk per filter row and/or equal channel chunks —
and torch (cuDNN), in the same process; each checked against a float64 torch reference and timed
with CUDA events after an L2 flush. The measurements calibrate the choice.

    python benchmarks/conv_split_variants.py [--only NAME,...] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import polytile as pt  # noqa: E402
from polytile import ops  # noqa: E402
from polytile.ops.conv_choice import channel_chunk, igemm_choice, igemm_kernel, igemm_splits  # noqa: E402
from polytile.ops.gpu_schedules import igemm_split_schedule  # noqa: E402
from polytile.ops.igemm import conv2d_igemm_split_func  # noqa: E402
from polytile.target import as_target  # noqa: E402

CONVS = {"resnet50.l4.3x3.n1": (1, 7, 7, 512, 512, 3, 3, 1, 1),
         "resnet50.l4.3x3.n32": (32, 7, 7, 512, 512, 3, 3, 1, 1),
         "resnet50.l2.3x3.n1": (1, 28, 28, 128, 128, 3, 3, 1, 1),
         "resnet50.l3.reduce.n1": (1, 14, 14, 1024, 256, 1, 1, 1, 0),
         "resnet50.l1.3x3.n1": (1, 56, 56, 64, 64, 3, 3, 1, 1),
         "mobilenetv2.head.n1": (1, 7, 7, 320, 1280, 1, 1, 1, 0)}


def variants(target: object, dims: tuple[int, ...]) -> list[tuple[bool, int]]:
    N, H, W, C, K, R, S, stride, pad = dims
    P, Q = (H + 2 * pad - R) // stride + 1, (W + 2 * pad - S) // stride + 1
    _, params = igemm_kernel(target, N * P * Q, C, K, R * S)  # type: ignore[arg-type]
    return igemm_splits(C, R, S, params["bk"])[1:]


def main() -> int:
    import torch

    from polytile.runtime.timing import rel_error, time_gpu
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated workload names")
    parser.add_argument("--out", help="a JSON record of the rows")
    args = parser.parse_args()
    target = as_target("cuda")
    rows = []
    for name, dims in CONVS.items():
        if args.only and not any(o in name for o in args.only.split(",")):
            continue
        N, H, W, C, K, R, S, stride, pad = dims
        P, Q = (H + 2 * pad - R) // stride + 1, (W + 2 * pad - S) // stride + 1
        op = ops.conv2d_igemm(*dims)
        kernel, params = igemm_kernel(target, N * P * Q, C, K, R * S)
        chosen = igemm_choice(target, N * P * Q, C, K, R, S, 2)
        choice = (chosen.rows, chosen.chunks)
        g = torch.Generator(device="cuda").manual_seed(len(rows) + 1)
        x = torch.rand((N, H, W, C), device="cuda", generator=g).half() - 0.5
        w = torch.rand((R, S, C, K), device="cuda", generator=g).half() - 0.5
        ref = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(3, 2, 0, 1),
                                         stride=stride, padding=pad).permute(0, 2, 3, 1).reshape(-1, K)
        xn, wn = x.permute(0, 3, 1, 2).contiguous(), w.permute(3, 2, 0, 1).contiguous()

        def cudnn(xn=xn, wn=wn, stride=stride, pad=pad):  # noqa: ANN001, ANN202
            return torch.nn.functional.conv2d(xn, wn, stride=stride, padding=pad)
        t_torch = statistics.median(time_gpu(cudnn) for _ in range(3))
        kerns = [(f"default {choice}", op.build("cuda"))]
        if choice != (False, 1):
            unsplit = pt.Schedule(op.func)
            from polytile.ops.gpu_schedules import _igemm
            _igemm(unsplit, target, ["r", "s"], N * P * Q, C, K, R * S)
            kerns.append(("unsplit", pt.build(unsplit, "cuda")))
        for v in variants(target, dims):
            if v != choice:
                func = conv2d_igemm_split_func(*dims, rows=v[0], channel_chunks=v[1],
                                               channel_chunk=channel_chunk(C, v[1], params["bk"]))
                kerns.append((f"split {v}", pt.build(igemm_split_schedule(func, kernel, params, v[0]), "cuda")))
        for label, kern in kerns:
            out = kern(x, w)
            err = rel_error(out, ref)
            t = statistics.median(kern.benchmark(x, w, repeat=20) for _ in range(3))
            rows.append(dict(name=name, variant=label, us=t * 1e6, torch_us=t_torch * 1e6, ok=err <= op.tolerance))
            print(f"{name:24s} {label:22s} {t * 1e6:8.1f} us  torch {t_torch * 1e6:7.1f} us  ratio {t_torch / t:5.2f}  "
                  f"{'ok' if err <= op.tolerance else 'WRONG'}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
