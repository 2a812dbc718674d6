"""Audit the SASS legality rules on a GPU with the workloads of benchmarks/sass.py.

For each named workload: verify every single legal move from the compiler's order, every block run
(`polytile.sass.moves.block_runs`: a block's loads all hoisted or its stores all sunk, and every
block's at once), every multi-slot run greedy search tries first (`polytile.sass.moves.far_moves`)
and WALKS random
40-move legal schedules (`polytile.sass.schedule.random_legal`), then bisect each failing schedule
to its first failing move and print the instructions around it.

Run on the GPU host from the repo root (wheels in .whl installed to /tmp/site, CUDA C cubins built
with `python benchmarks/sass.py --build-only`):
    PYTHONPATH=$PWD:/tmp/site python3 scripts/sass_audit.py triton-layernorm,polytile-matmul [WALKS] [KINDS]
KINDS (default singles,blocks,runs,walks) picks the candidates: single moves, block runs, greedy's
runs, random walks; the single moves and runs of a kernel with hundreds of movable instructions take
minutes.
(2026-11-22, H100: it found the unguarded-load moves of Triton's layernorm; after the rule that keeps
them in place, 0 failures on Triton's matmul, softmax, layernorm and polytile's matmul.)
"""

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import sass as bench  # noqa: E402 - benchmarks/sass.py

from polytile.sass.api import analyse  # noqa: E402
from polytile.sass.cubin import Cubin  # noqa: E402
from polytile.sass.game import MeasurementFailed  # noqa: E402
from polytile.sass.moves import block_run, block_runs, far_moves, run_blocks  # noqa: E402
from polytile.sass.runner import Runner, RunnerSettings  # noqa: E402
from polytile.sass.schedule import DOWN, UP, Move, Schedule, random_legal  # noqa: E402

WALK_MOVES = 40


def failure(runner: Runner, launch, cubin: Cubin, schedule: Schedule) -> str | None:
    """Why `schedule` of `launch` is wrong on the GPU (two fresh inputs), or None."""
    try:
        return runner.verify(cubin.with_words(launch.kernel, schedule.words()), seeds=(1, 2))
    except MeasurementFailed as exc:
        return f"failed: {exc}"


def bisect(runner: Runner, launch, cubin: Cubin, schedule: Schedule) -> None:
    """Print the first move of `schedule` whose prefix fails, with the instructions around it."""
    a = schedule.analysis
    prefix = Schedule.original(a)
    for move in schedule.path:
        prefix = prefix.apply(move)
        why = failure(runner, launch, cubin, prefix)
        if why is None:
            continue
        print(f"   first failing move: {move.describe(a)} :: {why[:120]}")
        at = int(prefix.position[move.instruction])
        for q in range(max(0, at - 6), min(len(prefix.order), at + 7)):
            i = prefix.order[q]
            print(f"     {q * 16:#06x} <- {a.instructions[i].offset:#06x} stall {prefix.stall(i):2d} "
                  f"(+{prefix.extra.get(i, 0)}) {a.controls[i]} {a.instructions[i].text}")
        return


def audit(workload: bench.Workload, walks: int, kinds: set[str]) -> None:
    launch = workload.launch
    a, cubin = analyse(launch), Cubin(launch.cubin)
    start = time.monotonic()
    with Runner(launch, RunnerSettings(reps=3, warmup=1)) as runner:
        original = Schedule.original(a)
        singles, blocks, runs, walk_schedules = [], [], [], []
        if "singles" in kinds:
            singles = [s for i in a.movable for d in (UP, DOWN) if (s := original.check(Move(i, d))[0])]
        if "blocks" in kinds:
            everything = original
            for direction in (UP, DOWN):
                for block in run_blocks(original):
                    everything = block_run(everything, block, direction)
            blocks = block_runs(original) + [everything]
        if "runs" in kinds:
            runs = far_moves(original)
        if "walks" in kinds:
            walk_schedules = [random_legal(a, WALK_MOVES, seed) for seed in range(walks)]
        candidates = (
            [("single", s) for s in singles]
            + [(f"block run of {len(s.path)}", s) for s in blocks]
            + [(f"run of {len(s.path)}", s) for s in runs]
            + [(f"walk {seed}", s) for seed, s in enumerate(walk_schedules)]
        )
        bad = [(tag, s, why) for tag, s in candidates if (why := failure(runner, launch, cubin, s))]
        print(f"AUDIT {workload.name}: {len(a.movable)} movable, {len(singles)} single moves, "
              f"{len(blocks)} block runs, {len(runs)} runs, {len(walk_schedules)} walks: "
              f"{len(bad)} failing ({time.monotonic() - start:.0f} s)", flush=True)
        for tag, schedule, why in bad[:3]:
            print(f"  FAILING {tag}: {why[:160]}")
            bisect(runner, launch, cubin, schedule)


def main() -> None:
    names = sys.argv[1].split(",")
    walks = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    known = {"singles", "blocks", "runs", "walks"}
    kinds = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else known
    if kinds - known:
        sys.exit(f"unknown KINDS {', '.join(sorted(kinds - known))}; choose among {', '.join(sorted(known))}")
    families = {"triton-": bench.triton_workloads, "polytile-": bench.polytile_workloads, "cuda-": bench.cuda_workloads}
    workloads = [w for prefix, build in families.items() if any(n.startswith(prefix) for n in names) for w in build()]
    for workload in workloads:
        if workload.name in names:
            audit(workload, walks, kinds)


if __name__ == "__main__":
    main()
