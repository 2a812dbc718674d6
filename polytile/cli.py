"""The ``polytile`` command: run and time operators, list them, tune them (and whole models), train the
tensor language model, optimize SASS."""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from .dtypes import as_dtype
from .errors import PolytileError
from .target import as_target


class ArgumentParser(argparse.ArgumentParser):
    """A usage error is one line: what is wrong (argparse lists the valid choices) and where to look,
    not the whole usage text."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def parse_shape(op_name: str, text: str | None) -> dict[str, object]:
    """``"M=512,N=256,K=128"`` or positional ``"512,256,128"`` in the operator's argument order; text
    arguments go by name (``dtype=float16``). Every name, value and count is checked here, with the
    operator's arguments listed in the error."""
    from . import ops
    from .dtypes import as_dtype
    if op_name not in ops.OPS:
        raise PolytileError(f"unknown operator {op_name!r}; known: {', '.join(sorted(ops.OPS))}")
    signature = inspect.signature(ops.OPS[op_name]).parameters
    sizes = [p for p in signature.values() if p.annotation in (int, "int")]
    known = ", ".join(signature)
    out: dict[str, object] = {}
    parts = [p.strip() for p in text.split(",")] if text else []
    for k, part in enumerate(parts):
        if not part:
            raise PolytileError(f"--shape {text!r}: an empty entry; write sizes as 512,512,512 or "
                                "M=512,N=512,K=512")
        if "=" in part:
            key, value = (x.strip() for x in part.split("=", 1))
            if key not in signature:
                raise PolytileError(f"--shape {text!r}: {op_name} has no argument {key!r}; its arguments: {known}")
        else:
            if k >= len(sizes):
                raise PolytileError(f"--shape {text!r}: {op_name} takes {len(sizes)} sizes "
                                    f"({', '.join(p.name for p in sizes)}); got more")
            key, value = sizes[k].name, part
        if key in out:
            raise PolytileError(f"--shape {text!r}: {key} is given twice")
        param = signature[key]
        if param.annotation in (int, "int"):
            out[key] = _size(text, key, value, smallest=0 if param.default == 0 else 1)
        elif param.annotation in ("int | None", "None | int"):  # an optional count (split_k)
            out[key] = _size(text, key, value, smallest=1)
        elif key == "dtype":
            out[key] = as_dtype(value).name
        else:
            out[key] = value
    missing = [p.name for p in sizes if p.default is inspect.Parameter.empty and p.name not in out]
    if parts and missing:
        raise PolytileError(f"--shape {text!r}: {op_name} also needs {', '.join(missing)} "
                            f"(its sizes: {', '.join(p.name for p in sizes)})")
    return out


def _size(text: str | None, key: str, value: str, smallest: int) -> int:
    try:
        size = int(value)
    except ValueError:
        raise PolytileError(f"--shape {text!r}: {key} must be an integer, got {value!r}") from None
    if size < smallest:
        raise PolytileError(f"--shape {text!r}: {key} must be at least {smallest}, got {size}")
    return size


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
    from .runtime.interrupts import raise_if_interrupted, watching_ctrl_c
    times: list[float] = []
    with watching_ctrl_c():
        for _ in range(warmup):
            fn(*args)
            raise_if_interrupted()
        start = time.perf_counter()
        while len(times) < repeat or (time.perf_counter() - start < min_time and len(times) < 10000):
            t0 = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - t0)
            raise_if_interrupted()
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
    baseline_missing: str = ""  # why there is no baseline for these data types

    @property
    def ok(self) -> bool:
        return self.error <= self.op.tolerance

    def lines(self) -> list[str]:
        """The verdict and one line of speed per library."""
        tol = self.op.tolerance
        out = [f"  relative error {self.error:.1e} ({'ok' if self.ok else 'WRONG'}), "
               + (f"tolerance {tol:.1e}" if tol else "exact result required (integers)"),
               _speed_row("polytile", self.seconds, self.op)]
        if self.baseline is None:
            out.append(f"  ({self.baseline_missing or 'no baseline library for this operator here'})")
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
        fn, name = base
        try:
            result = fn(*inputs)
        except RuntimeError as err:  # torch has no kernel for these types (e.g. int8 GEMMs)
            out.baseline_missing = f"{name} does not take these types ({str(err).splitlines()[0]})"
            return out
        out.baseline = name
        out.baseline_error = rel_error(result.reshape(np.shape(ref)), ref)
        if out.baseline_error <= max(op.tolerance, 1e-2):
            out.baseline_seconds = time_gpu(lambda: fn(*inputs), repeat=repeat)
    return out


def run_op(name: str, shape: dict[str, int], target: object, show_source: bool, repeat: int,
           dtype: str | None = None) -> int:
    """Build ``name`` at ``shape`` for ``target`` ("cpu", "cuda", "cuda:sm_80"), check it on random
    inputs and time it beside the library a user would call instead; 1 when the result is wrong."""
    from . import ops
    from .target import as_target
    sizes = dict(shape or DEFAULT_SHAPES.get(name, {}))
    op = ops.get(name, **sizes, **({"dtype": dtype} if dtype else {}))
    tgt = as_target(target)
    t0 = time.perf_counter()
    kern = op.build(tgt)
    build_s = time.perf_counter() - t0
    if show_source:
        print(kern.source)
    if not tgt.has("gpu"):
        print(f"{op.key} on cpu: built in {build_s:.2f} s")
        result = compare_cpu(op, kern, repeat)
    else:
        from .runtime.cuda_device import gpu_available
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


def interrupted(prog: str, saved: str) -> int:
    """The end of a command stopped by Ctrl-C: one line saying what was saved; exit status 130 (as a
    shell reports SIGINT)."""
    print(f"\n{prog}: interrupted; {saved}", file=sys.stderr)
    return 130


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # the subcommands that save something say what themselves
        return interrupted("polytile", "nothing was saved")


def _main(argv: Sequence[str] | None) -> int:
    parser = ArgumentParser(prog="polytile", description="The polytile tensor compiler")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="build, check and time an operator beside NumPy/torch")
    run.add_argument("op", help="operator name (see `polytile ops`)")
    run.add_argument("--shape", help='sizes, "M=512,N=512,K=512" or "512,512,512"')
    run.add_argument("--target", default="cpu", help="cpu (default), cuda, or cuda:sm_80")
    run.add_argument("--show-source", "--source", action="store_true", help="print the generated source")
    run.add_argument("--dtype", help="element type, where the operator takes one (float16: tensor cores)")
    run.add_argument("--repeat", type=positive_int, default=10, help="timed repetitions (median reported)")
    sub.add_parser("ops", help="list the operators and their default sizes")
    sub.add_parser("tune", help="tune an operator (see `polytile tune --help`)", add_help=False)
    sub.add_parser("sass-opt", help="optimize the SASS of a CUDA kernel (see `polytile sass-opt --help`)",
                   add_help=False)
    sub.add_parser("tune-model", help="tune a model's workloads for torch.compile (see `polytile tune-model --help`)",
                   add_help=False)
    sub.add_parser("tlm", help="the tensor language model: corpus, pretrain, finetune, evaluate (see "
                   "`polytile tlm --help`)", add_help=False)
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
            dtype = shape.pop("dtype", None) or (as_dtype(args.dtype).name if args.dtype else None)
            from .runtime.interrupts import raise_if_interrupted, watching_ctrl_c
            # a Ctrl-C whose KeyboardInterrupt is lost anywhere in the run (e.g. in NumPy's lazy import
            # of numpy.random) still stops the next timing loop, or the run at its end
            with watching_ctrl_c():
                status = run_op(args.op, shape, as_target(args.target), args.show_source, args.repeat, dtype)  # type: ignore[arg-type]
                raise_if_interrupted()
            return status
        if args.command == "tune":
            from .tune.cli import tune_main
            return tune_main(rest)
        if args.command == "tlm":
            from .tune.tlm.cli import tlm_main
            return tlm_main(rest)
        if args.command == "sass-opt":
            from .sass.cli import sass_opt_main
            return sass_opt_main(rest)
        if args.command == "tune-model":
            from .torch.cli import tune_model_main
            return tune_model_main(rest)
        if args.command == "fuzz":
            from .fuzz.cli import fuzz_main
            return fuzz_main(rest)
    except PolytileError as err:
        print(f"polytile: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
