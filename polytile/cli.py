"""The ``polytile`` command: run and time operators, list them, tune them, optimize SASS."""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import PolytileError


def parse_shape(op_name: str, text: str | None) -> dict[str, int]:
    """``"M=512,N=256,K=128"`` or positional ``"512,256,128"`` in the operator's argument order."""
    from . import ops
    if op_name not in ops.OPS:
        raise PolytileError(f"unknown operator {op_name!r}; known: {', '.join(sorted(ops.OPS))}")
    if not text:
        return {}
    params = [p for p in inspect.signature(ops.OPS[op_name]).parameters.values()
              if p.annotation in (int, "int")]
    out: dict[str, int] = {}
    for k, part in enumerate(text.split(",")):
        part = part.strip()
        if "=" in part:
            key, val = (x.strip() for x in part.split("=", 1))
            if key == "dtype":  # as `polytile tune` takes it
                out[key] = val  # type: ignore[assignment]
                continue
            try:
                out[key] = int(val)
            except ValueError:
                raise PolytileError(f"--shape {text!r}: {key} must be an integer, got {val!r}") from None
        else:
            if k >= len(params):
                raise PolytileError(f"operator {op_name} takes {len(params)} sizes "
                                    f"({', '.join(p.name for p in params)}); got more")
            out[params[k].name] = int(part)
    return out


DEFAULT_SHAPES: dict[str, dict[str, int]] = {
    "matmul": {"M": 1024, "N": 1024, "K": 1024},
    "batch_matmul": {"batch": 8, "M": 256, "N": 256, "K": 256},
    "dense": {"M": 512, "N": 1000, "K": 2048},
    "conv2d": {"N": 1, "C": 64, "H": 56, "W": 56, "K": 64, "R": 3, "S": 3, "padding": 1},
    "conv2d_nhwc": {"N": 1, "H": 56, "W": 56, "C": 64, "K": 64, "R": 3, "S": 3, "padding": 1},
    "softmax": {"M": 4096, "N": 1024},
    "layernorm": {"M": 4096, "N": 1024},
    "segment_sum": {"rows": 10000, "nnz": 1000000},
    "spmm": {"rows": 4096, "cols": 4096, "n": 128, "nnz": 100000},
}


def time_call(fn, args: Sequence[object], repeat: int = 10, warmup: int = 2,  # noqa: ANN001
              min_time: float = 0.0) -> float:
    """Median wall time in seconds of ``fn(*args)`` after ``warmup`` calls: at least ``repeat`` runs
    or ``min_time`` seconds (the protocol of ``CPUKernel.benchmark``)."""
    for _ in range(warmup):
        fn(*args)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeat or (time.perf_counter() - start < min_time and len(times) < 10000):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


@dataclass
class Comparison:
    """An operator's kernel checked on random inputs and timed beside the library a user would call
    instead (the baseline: NumPy/torch on the CPU, cuBLAS/cuDNN/torch on the GPU), in one process."""

    op: Any
    error: float
    seconds: float
    baseline: str | None = None
    baseline_seconds: float | None = None
    baseline_error: float = 0.0  # the baseline's own error; above the tolerance it is not timed

    @property
    def ok(self) -> bool:
        return self.error <= self.op.tolerance

    def lines(self) -> list[str]:
        """The verdict and one line of speed per library."""
        out = [f"  relative error {self.error:.1e} ({'ok' if self.ok else 'WRONG'})",
               _speed_row("polytile", self.seconds, self.op)]
        if self.baseline is None:
            out.append("  (no baseline library for this operator here)")
        elif self.baseline_seconds is None:
            out.append(f"  {self.baseline}: its result differs from the reference (relative error "
                       f"{self.baseline_error:.1e}); not timed")
        else:
            out.append(_speed_row(self.baseline, self.baseline_seconds, self.op)
                       + f"   (polytile is {self.baseline_seconds / self.seconds:.2f}x its speed)")
        return out


def _speed_row(label: str, seconds: float, op: Any) -> str:
    return (f"  {label:14s} {seconds * 1e3:10.3f} ms  {op.flops / seconds / 1e9:9.1f} GFLOP/s"
            f"  {op.bytes_moved / seconds / 1e9:7.1f} GB/s")


def compare_cpu(op: Any, kern: Any, repeat: int = 10) -> Comparison:
    """Check and time a CPU kernel of ``op`` beside ``op.baseline`` on the same random inputs."""
    from . import ops
    inputs = op.make_inputs(np.random.default_rng(0))
    err = ops.rel_error(kern(*inputs), op.reference(*inputs))
    out = Comparison(op, err, kern.benchmark(*inputs, repeat=repeat))
    if op.baseline is not None:
        out.baseline = op.baseline_name
        out.baseline_seconds = time_call(op.baseline, inputs, repeat=repeat)
    return out


def compare_cuda(op: Any, kern: Any, repeat: int = 20) -> Comparison:
    """Check and time a CUDA kernel of ``op`` (a GPU must be present) beside torch's counterpart,
    both timed with CUDA events and an L2 flush before each run, on the same random inputs."""
    from .ops.baselines import torch_cuda_baseline, torch_cuda_inputs
    from .runtime.timing import rel_error, time_gpu
    host = op.make_inputs(np.random.default_rng(0))
    ref = op.reference(*host)
    inputs = torch_cuda_inputs(host) or host  # NumPy arrays are copied to the GPU
    out = Comparison(op, rel_error(kern(*inputs), ref), kern.benchmark(*inputs, repeat=repeat))
    base = torch_cuda_baseline(op) if inputs is not host else None
    if base is not None:
        fn, out.baseline = base
        out.baseline_error = rel_error(fn(*inputs).reshape(np.shape(ref)), ref)
        if out.baseline_error <= max(op.tolerance, 1e-2):
            out.baseline_seconds = time_gpu(lambda: fn(*inputs), repeat=repeat)
    return out


def run_op(name: str, shape: dict[str, int], target: str, show_source: bool, repeat: int,
           dtype: str | None = None) -> int:
    """Build ``name`` at ``shape`` for ``target`` ("cpu", "cuda", "cuda:sm_80"), check it on random
    inputs and time it beside the library a user would call instead; 1 when the result is wrong."""
    from . import ops
    sizes = dict(shape or DEFAULT_SHAPES.get(name, {}))
    op = ops.get(name, **sizes, **({"dtype": dtype} if dtype else {}))
    t0 = time.perf_counter()
    kern = op.build(target)
    build_s = time.perf_counter() - t0
    if show_source:
        print(kern.source)
    if kern.target == "cpu":
        print(f"{op.key} on cpu: built in {build_s:.2f} s")
        result = compare_cpu(op, kern, repeat)
    else:
        from .runtime.cuda_device import gpu_available
        tgt = kern.target
        print(f"{op.key} on {tgt.name} ({tgt.arch}): built in {build_s:.2f} s")
        print("\n".join(kernel_lines(kern)))
        if not gpu_available():
            print(f"no GPU found: the kernel was compiled for {tgt.arch} but not run "
                  "(--show-source prints it)")
            return 0
        result = compare_cuda(op, kern, repeat)
    print("\n".join(result.lines()))
    return 0 if result.ok else 1


def kernel_lines(kern: Any) -> list[str]:
    """One line per kernel of a CUDA function: launch shape and ptxas resources."""
    from .lowering.loopir import expr_text
    out = []
    for k in kern.kernels:
        r = kern.resources.get(k.name)
        grid = ", ".join(expr_text(g) for g in k.grid)
        use = "no ptxas report" if r is None else (
            f"{r.registers} registers, {r.shared_bytes + k.dynamic_shared} B shared memory, "
            f"{r.stack_bytes} B stack, {r.spill_stores + r.spill_loads} B spilled")
        out.append(f"  kernel {k.name}: grid ({grid}), block {k.block}; {use}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="polytile", description="The polytile tensor compiler")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="build, check and time an operator beside NumPy/torch")
    run.add_argument("op", help="operator name (see `polytile ops`)")
    run.add_argument("--shape", help='sizes, "M=512,N=512,K=512" or "512,512,512"')
    run.add_argument("--target", default="cpu", help="cpu (default), cuda, or cuda:sm_80")
    run.add_argument("--show-source", "--source", action="store_true", help="print the generated source")
    run.add_argument("--dtype", help="element type, where the operator takes one (float16: tensor cores)")
    run.add_argument("--repeat", type=int, default=10, help="timed repetitions (median reported)")
    sub.add_parser("ops", help="list the operators and their default sizes")
    sub.add_parser("tune", help="tune an operator (see `polytile tune --help`)", add_help=False)
    sub.add_parser("sass-opt", help="optimize the SASS of a CUDA kernel (see `polytile sass-opt --help`)",
                   add_help=False)
    sub.add_parser("fuzz", help="differential fuzzing of the compiler (see `polytile fuzz --help`)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command == "ops":
            from . import ops
            for name in sorted(ops.OPS):
                sizes = ", ".join(f"{k}={v}" for k, v in DEFAULT_SHAPES.get(name, {}).items())
                print(f"{name:14s} {sizes}")
            return 0
        if args.command == "run":
            if rest:
                parser.error(f"unrecognized arguments: {' '.join(rest)}")
            shape = parse_shape(args.op, args.shape)
            dtype = shape.pop("dtype", None) or args.dtype
            return run_op(args.op, shape, args.target, args.show_source, args.repeat, dtype)  # type: ignore[arg-type]
        if args.command == "tune":
            from .tune.cli import tune_main
            return tune_main(rest)
        if args.command == "sass-opt":
            from .sass.cli import sass_opt_main
            return sass_opt_main(rest)
        if args.command == "fuzz":
            from .fuzz.cli import fuzz_main
            return fuzz_main(rest)
    except PolytileError as err:
        print(f"polytile: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
