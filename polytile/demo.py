"""``make demo``: build, check and time scheduled kernels beside the libraries users would call.

On the CPU: fp32 matmul and a ResNet-50 convolution beside NumPy (OpenBLAS) and PyTorch (when
installed). On a machine with an NVIDIA GPU, the same on the GPU beside cuBLAS/cuDNN through torch.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import ops
from .cli import time_call
from .target import cpu_target


def _row(name: str, label: str, seconds: float, flops: float) -> str:
    return f"  {name:34s} {label:10s} {seconds * 1e3:9.2f} ms {flops / seconds / 1e9:9.1f} GFLOP/s"


def cpu_demo(size: int) -> None:
    tgt = cpu_target()
    print(f"CPU: {tgt.model.replace('_', ' ')}, {tgt.cores} cores, {tgt.vector_bits}-bit vectors")
    rng = np.random.default_rng(0)
    cases = [ops.matmul(size, size, size),
             ops.conv2d(1, 64, 56, 56, 64, 3, 3, padding=1)]
    for op in cases:
        t0 = time.perf_counter()
        kern = op.build("cpu")
        build = time.perf_counter() - t0
        inputs = op.make_inputs(rng)
        err = ops.rel_error(kern(*inputs), op.reference(*inputs))
        t = kern.benchmark(*inputs)
        status = "ok" if err <= op.tolerance else "WRONG"
        print(f"{op.key}  (built in {build:.1f} s, relative error {err:.1e}: {status})")
        print(_row("", "polytile", t, op.flops))
        if op.baseline is not None:
            tb = time_call(op.baseline, inputs)
            print(_row("", op.baseline_name, tb, op.flops) + f"   polytile/{op.baseline_name} speed {tb / t:.2f}x")


def gpu_demo() -> None:
    try:
        from .runtime.cuda_device import gpu_available
    except ImportError:
        return
    if not gpu_available():
        print("GPU: none found, skipping the GPU part")
        return
    from .benchmarks_gpu import demo_rows
    demo_rows()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polytile.demo")
    parser.add_argument("--size", type=int, default=1024, help="matmul size (default 1024)")
    args = parser.parse_args(argv)
    cpu_demo(args.size)
    gpu_demo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
