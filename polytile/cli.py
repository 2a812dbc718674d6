"""The ``polytile`` command: run and time operators, list them, tune them, optimize SASS."""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from collections.abc import Sequence

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
            key, val = part.split("=", 1)
            out[key.strip()] = int(val)
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


def time_call(fn, args: Sequence[np.ndarray], repeat: int = 10, warmup: int = 2) -> float:  # noqa: ANN001
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def run_op(name: str, shape: dict[str, int], target: str, show_source: bool, repeat: int) -> int:
    from . import ops
    op = ops.get(name, **(shape or DEFAULT_SHAPES.get(name, {})))
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    kern = op.build(target)
    build_s = time.perf_counter() - t0
    if show_source:
        print(kern.source)
    inputs = op.make_inputs(rng)
    out = kern(*inputs)
    err = ops.rel_error(out, op.reference(*inputs))
    ok = err <= op.tolerance
    t = kern.benchmark(*inputs, repeat=repeat)
    print(f"{op.key} on {target}: build {build_s:.2f} s, relative error {err:.1e} ({'ok' if ok else 'WRONG'})")
    print(f"  polytile      {t * 1e3:10.3f} ms  {op.flops / t / 1e9:9.1f} GFLOP/s")
    if op.baseline is not None and target == "cpu":
        tb = time_call(op.baseline, inputs, repeat=repeat)
        print(f"  {op.baseline_name:12s}  {tb * 1e3:10.3f} ms  {op.flops / tb / 1e9:9.1f} GFLOP/s"
              f"   (polytile is {tb / t:.2f}x its speed)")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="polytile", description="The polytile tensor compiler")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="build, check and time an operator beside NumPy/torch")
    run.add_argument("op", help="operator name (see `polytile ops`)")
    run.add_argument("--shape", help='sizes, "M=512,N=512,K=512" or "512,512,512"')
    run.add_argument("--target", default="cpu", help="cpu (default), cuda, or cuda:sm_80")
    run.add_argument("--show-source", action="store_true", help="print the generated source")
    run.add_argument("--repeat", type=int, default=10, help="timed repetitions (median reported)")
    sub.add_parser("ops", help="list the operators and their default sizes")
    sub.add_parser("tune", help="tune an operator (see `polytile tune --help`)", add_help=False)
    sub.add_parser("sass-opt", help="optimize the SASS of a CUDA kernel (see `polytile sass-opt --help`)",
                   add_help=False)
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
            return run_op(args.op, parse_shape(args.op, args.shape), args.target, args.show_source, args.repeat)
        if args.command == "tune":
            from .tune.cli import tune_main
            return tune_main(rest)
        if args.command == "sass-opt":
            from .sass.cli import sass_opt_main
            return sass_opt_main(rest)
    except PolytileError as err:
        print(f"polytile: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
