"""``make demo``: build, check and time scheduled kernels beside the libraries users would call.

With an NVIDIA GPU (and the CUDA driver bindings): fp16 matmul on tensor cores, fp32 matmul on CUDA
cores, a ResNet-50 convolution (fp16, implicit GEMM on tensor cores) and softmax, each beside torch
(cuBLAS / cuDNN) in the same run. Without one, on the CPU: fp32 matmul and a ResNet-50 convolution
beside NumPy (OpenBLAS) and PyTorch (when installed).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from . import ops
from .cli import Comparison, compare_cpu, compare_cuda
from .errors import PolytileError
from .target import cpu_target


def cpu_cases(size: int) -> list[ops.Op]:
    return [ops.matmul(size, size, size), ops.conv2d(1, 64, 56, 56, 64, 3, 3, padding=1)]


def gpu_cases(size: int) -> list[ops.Op]:
    return [ops.matmul(size, size, size, "float16"), ops.matmul(size, size, size),
            ops.conv2d_igemm(32, 56, 56, 64, 64, 3, 3, padding=1), ops.softmax(16384, 1024)]


def run_cases(cases: list[ops.Op], target: str, compare: Callable[[ops.Op, object], Comparison]) -> bool:
    """Build, check and time every case; True when every kernel was built and is correct."""
    ok = True
    for op in cases:
        t0 = time.perf_counter()
        try:
            kern = op.build(target)
            build_s = time.perf_counter() - t0
            result = compare(op, kern)
        except PolytileError as err:
            print(f"{op.key} {op.func.inputs[0].dtype}: FAILED: {type(err).__name__}: {str(err)[:300]}")
            ok = False
            continue
        print(f"{op.key} {op.func.inputs[0].dtype}  (built in {build_s:.1f} s)")
        print("\n".join(result.lines()))
        ok = ok and result.ok
    return ok


def cpu_demo(size: int) -> bool:
    tgt = cpu_target()
    print(f"CPU: {tgt.model.replace('_', ' ')}, {tgt.cores} cores, {tgt.vector_bits}-bit vectors")
    return run_cases(cpu_cases(size), "cpu", compare_cpu)


def gpu_demo(size: int) -> bool:
    from .runtime.cuda_device import cuda_target
    tgt = cuda_target()
    print(f"GPU: {tgt.name.replace('_', ' ')} ({tgt.arch}, {tgt.sms} multiprocessors)")
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        print("  (torch with CUDA is not installed here: no cuBLAS/cuDNN columns; install a CUDA build of "
              "torch to see them)")
    else:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 against fp32, as polytile computes it
        torch.backends.cudnn.allow_tf32 = False
    return run_cases(gpu_cases(size), "cuda", compare_cuda)


def gpu_present() -> bool:
    try:
        from .runtime.cuda_device import gpu_available
    except ImportError:
        return False
    return gpu_available()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polytile.demo")
    parser.add_argument("--target", choices=["auto", "cpu", "cuda"], default="auto",
                        help="auto (default): the GPU when one is present, else the CPU")
    parser.add_argument("--size", type=int, help="matmul size (default 1024 on the CPU, 4096 on a GPU)")
    args = parser.parse_args(argv)
    target = args.target
    if target == "auto":
        target = "cuda" if gpu_present() else "cpu"
        if target == "cpu":
            print("No usable NVIDIA GPU here (or no CUDA driver bindings): the CPU demo.\n")
    if target == "cuda":
        ok = gpu_demo(args.size or 4096)
    else:
        ok = cpu_demo(args.size or 1024)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
