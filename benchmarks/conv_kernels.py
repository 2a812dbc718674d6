"""Per-kernel GPU time of multi-kernel convolutions (issue 15): the padded-input copy, the filter copy
and the implicit GEMM of the few-channel stems, a split's partial products and their sum — from
torch's profiler (CUPTI sees polytile's launches), averaged over 20 calls, beside the whole call
and torch (cuDNN).

    python benchmarks/conv_kernels.py [--only NAME,...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polytile import ops  # noqa: E402

CONVS = {"resnet50.conv1.n32": (32, 224, 224, 3, 64, 7, 7, 2, 3),
         "mobilenetv2.stem.n32": (32, 224, 224, 3, 32, 3, 3, 2, 1),
         "resnet50.conv1.n1": (1, 224, 224, 3, 64, 7, 7, 2, 3),
         "resnet50.l1.expand.n32": (32, 56, 56, 64, 256, 1, 1, 1, 0),
         "resnet50.l4.3x3.n1": (1, 7, 7, 512, 512, 3, 3, 1, 1)}


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated workload names (substrings)")
    args = parser.parse_args()
    for name, dims in CONVS.items():
        if args.only and not any(o in name for o in args.only.split(",")):
            continue
        N, H, W, C, K, R, S, stride, pad = dims
        kern = ops.conv2d_igemm(*dims).build("cuda")
        x = torch.rand((N, H, W, C), device="cuda").half()
        w = torch.rand((R, S, C, K), device="cuda").half()
        xn, wn = x.permute(0, 3, 1, 2).contiguous(), w.permute(3, 2, 0, 1).contiguous()
        for _ in range(3):
            kern(x, w)
            torch.nn.functional.conv2d(xn, wn, stride=stride, padding=pad)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                kern(x, w)
                torch.nn.functional.conv2d(xn, wn, stride=stride, padding=pad)
            torch.cuda.synchronize()
        print(f"== {name} {dims}")
        for ev in sorted(prof.key_averages(), key=lambda e: -e.device_time_total):
            if ev.device_time_total > 0:
                print(f"   {ev.key[:70]:70s} {ev.device_time_total / max(1, ev.count):9.1f} us x{ev.count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
