"""`polytile sass-opt`: inspect a cubin's schedule, or optimize one of its kernels on the GPU.

polytile sass-opt k.cubin --list [--kernel NAME]          analysed schedule and legal moves (no GPU)
polytile sass-opt k.cubin --launch launch.json -o out.cubin [--budget N] [--method ppo|greedy|random]

It takes cubins with a JSON launch description. A polytile CUDA function (pt.build(..., "cuda")) or
a @triton.jit kernel goes through the Python API, which describes the launch itself:
    result = pt.sass.optimize(kern, [a, b], budget=100); result.kernel(a, b); print(result.report.format())
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from polytile.sass.agent import METHODS
from polytile.sass.analysis import KernelAnalysis
from polytile.sass.cubin import Cubin, CubinError
from polytile.sass.disasm import DisassemblyError, disassemble
from polytile.sass.launch import LaunchError, launch_from_spec
from polytile.sass.runner import RunnerSettings, WorkerError
from polytile.sass.schedule import DOWN, UP, Move, Schedule


def format_listing(analysis: KernelAnalysis) -> str:
    """Every instruction with its control fields, block, pin reason or legal moves."""
    schedule = Schedule.original(analysis)
    lines = [
        f"kernel {analysis.name}: {len(analysis.instructions)} instructions, {len(analysis.blocks)} blocks, "
        f"{len(analysis.movable)} movable, {len(analysis.pinned)} pinned",
        "latency table (cycles, producer -> consumer kind, register file, access): "
        + ", ".join(
            f"{p}->{kind} {file} {access}={v}"
            for (p, kind, file, access), v in sorted(analysis.latency.items())
        ),
    ]
    lines += [f"note: {n}" for n in analysis.kernel.notes]
    for block in analysis.blocks:
        lines.append(f"-- block {block.index} [{block.start}, {block.end}) -> {list(block.successors)}")
        for i in range(block.start, block.end):
            ins = analysis.instructions[i]
            tail = ""
            if i in analysis.pinned:
                tail = f"pinned: {analysis.pinned[i]}"
            elif i in analysis.movable:
                verdicts = []
                for name, direction in (("up", UP), ("down", DOWN)):
                    reason = schedule.check(Move(i, direction))[1]
                    verdicts.append(f"{name}: {reason or 'legal'}")
                tail = "; ".join(verdicts)
            lines.append(f"  {ins.offset:05x} {analysis.controls[i]} {ins.text:<48} {tail}".rstrip())
    return "\n".join(lines)


def sass_opt_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="polytile sass-opt", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("cubin", type=Path)
    parser.add_argument("--kernel", help="kernel name (default: every kernel for --list)")
    parser.add_argument("--list", action="store_true", help="print the analysed schedule and legal moves")
    parser.add_argument("--launch", type=Path, help="JSON launch description (see polytile.sass.launch)")
    parser.add_argument("-o", "--output", type=Path, help="where to write the optimized cubin")
    parser.add_argument("--budget", type=int, default=100, help="GPU measurements to spend (default 100)")
    parser.add_argument("--method", choices=METHODS, default="ppo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reps", type=int, default=30, help="timed launches per measurement (median)")
    parser.add_argument("--report", type=Path, help="write the report as JSON here")
    args = parser.parse_args(argv)
    try:
        cubin = Cubin.from_file(args.cubin)
        if args.list:
            instructions = disassemble(cubin)
            names = [args.kernel] if args.kernel else sorted(cubin.kernels)
            for name in names:
                print(format_listing(KernelAnalysis(cubin.kernel(name), instructions[name])))
            return 0
        if not args.launch or not args.output:
            parser.error("optimizing needs --launch FILE.json and -o OUT.cubin (or use --list)")
        from polytile.sass.api import optimize

        launch = launch_from_spec(cubin.data, json.loads(args.launch.read_text()))
        result = optimize(
            launch,
            budget=args.budget,
            method=args.method,
            seed=args.seed,
            settings=RunnerSettings(reps=args.reps),
        )
        args.output.write_bytes(result.cubin)
        print(result.report.format())
        if args.report:
            args.report.write_text(json.dumps(result.report.__dict__, indent=2, default=str))
        return 0
    except (CubinError, DisassemblyError, LaunchError, WorkerError, OSError, ValueError) as exc:
        print(f"polytile sass-opt: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(sass_opt_main())
