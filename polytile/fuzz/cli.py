"""``polytile fuzz``: run a fuzzing campaign, or replay (and minimize) one case."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from .execute import TARGETS, generate_case
from .runner import Result, Summary, campaign, case_job, run_one
from .spec import CUDA_TARGET, case_source


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="polytile fuzz",
        description="Differential fuzzing: random programs under random schedules, each built and run in "
                    "its own process and checked against an independent NumPy reference. Case K of seed S "
                    "depends on (S, K) alone; --case replays one and prints it as a runnable script.")
    p.add_argument("--seed", type=int, default=0, help="seed of the campaign (default 0)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--cases", type=int, help="number of cases (default 100 without --budget)")
    size.add_argument("--budget", type=float, help="seconds to keep starting cases")
    p.add_argument("--first", type=int, default=0, help="index of the first case (default 0)")
    p.add_argument("--case", type=int, help="replay case K of the seed: print it as a script and its outcome")
    p.add_argument("--minimize", action="store_true",
                   help="with --case: shrink a failing case and write it as a pytest file (see --test-dir)")
    p.add_argument("--test-dir", default=".", help="where --minimize writes test_fuzz_seed<S>_case<K>.py")
    p.add_argument("--jobs", type=int, default=default_jobs(),
                   help=f"cases run at once (default: the CPUs this process may use, {default_jobs()} here)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds one case may take (default 60)")
    p.add_argument("--target", default="cpu", choices=list(TARGETS),
                   help="cpu: build and run the kernels (default); cuda: GPU schedules (loops bound to blocks and "
                        "threads, shared and local caches, cross-thread reductions) lowered for "
                        f"{CUDA_TARGET}, run on the CPU by the block emulator, compiled with nvcc where found")
    p.add_argument("--no-nvcc", action="store_true",
                   help="with --target cuda: do not compile the CUDA source with nvcc (about 2 s a case)")
    p.add_argument("--json", help="write the campaign's record (summary, every finding) to this file")
    p.add_argument("--record", action="store_true",
                   help="also write the record to benchmarks/results/fuzz-<date>-<time>.json (under the current "
                        "directory: run from the repository root)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def fuzz_main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    args.argv = list(argv)
    if args.minimize and args.case is None:
        parser().error("--minimize needs --case")
    for name in ("cases", "jobs", "first"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "first" else 1):
            parser().error(f"--{name} must be {'0 or more' if name == 'first' else 'at least 1'}, not {value}")
    for name in ("budget", "timeout"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            parser().error(f"--{name} must be a positive number of seconds")
    from . import execute
    execute.NVCC = not args.no_nvcc
    if args.case is not None:
        return replay(args)
    return run_campaign(args)


def run_campaign(args: argparse.Namespace) -> int:
    cases = args.cases if args.cases is not None or args.budget is not None else 100
    bar = _progress(cases, args.no_progress)
    kinds: Counter = Counter()

    def on_result(r: Result) -> None:
        kinds[r.kind] += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(", ".join(f"{k} {v}" for k, v in sorted(kinds.items())), refresh=False)

    started = datetime.datetime.now(datetime.UTC)
    summary = campaign(args.seed, cases, args.budget, args.first, args.jobs, args.timeout, on_result, args.target)
    if bar is not None:
        bar.close()
    print(summary.line())
    print(f"{summary.rate_per_core(args.jobs):.1f} cases/min/core ({args.jobs} jobs on {os.cpu_count()} CPUs)")
    if summary.not_emulated:
        print("not emulated: " + ", ".join(f"{what} ({n})" for what, n in summary.not_emulated.most_common()))
    print_findings(summary)
    record = campaign_record(args, summary, started)
    paths = [Path(args.json)] if args.json else []
    if args.record:
        paths.append(Path("benchmarks") / "results" / f"fuzz-{started:%Y%m%d-%H%M%S}.json")
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"record written to {path}")
    return 1 if summary.findings else 0


def default_jobs() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def campaign_record(args: argparse.Namespace, summary: Summary, started: datetime.datetime) -> dict:
    """What a campaign ran (seed and case range, options), where (host, CPU, commit) and what it
    found (counts per outcome, the rate, every finding and late refusal)."""
    from ..target import cpu_target
    cpu = cpu_target()
    return {
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join(["polytile fuzz", *args.argv]),
        "seed": args.seed, "first": args.first, "last": args.first + summary.cases - 1,
        "jobs": args.jobs, "timeout": args.timeout, "target": args.target,
        **({"nvcc": not args.no_nvcc} if args.target == "cuda" else {}),
        "commit": _commit(), "host": platform.node(), "cpu": cpu.model, "cpus": os.cpu_count(),
        "load_average_after": list(os.getloadavg()),
        "cases_per_min_per_core": round(summary.rate_per_core(args.jobs), 2),
        **summary.to_json(),
    }


def _commit() -> str:
    """The commit of the polytile being fuzzed, with "+dirty" when its work tree has changes."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def print_findings(summary: Summary) -> None:
    """The findings grouped by kind and phase, each group with its replay commands."""
    groups: dict[tuple[str, str, str], list[Result]] = {}
    for f in sorted(summary.findings, key=lambda r: r.index):
        groups.setdefault((f.kind, f.phase, _gist(f.detail)), []).append(f)
    for (kind, phase, gist), rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"{kind} at {phase} ({len(rs)}): {gist}")
        for r in rs[:3]:
            print(f"    {r.replay_command()}")


def _gist(detail: str) -> str:
    """The part of a finding's detail that groups alike findings (numbers and element values dropped)."""
    import re
    head = detail.split(" (")[0].split(";")[0]
    return re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "#", head)[:120]


def replay(args: argparse.Namespace) -> int:
    r = run_one(case_job(args.seed, args.case, args.target), (args.seed, args.case), args.timeout)
    r.target = args.target
    case = generate_case(args.seed, args.case, args.target).with_calls(r.calls)
    print(case_source(case, f"{r.replay_command()}: {r.kind}"))
    print(f"# outcome: {r.kind}" + (f" at {r.phase}" if r.phase else "") + (f": {r.detail}" if r.detail else ""))
    if not args.minimize:
        return 1 if r.is_finding else 0
    if not r.is_finding:
        print("# nothing to minimize: the case does not fail")
        return 0
    from .minimize import isolated, minimize, pytest_source
    small, result = minimize(case, r, isolated(args.timeout), log=lambda msg: print(f"# {msg}", file=sys.stderr))
    title = f"{r.replay_command()} (minimized): {result.kind}"
    print(case_source(small, title))
    print(f"# outcome: {result.kind} at {result.phase}: {result.detail}")
    cuda = "_cuda" if args.target == "cuda" else ""
    path = Path(args.test_dir) / f"test_fuzz{cuda}_seed{args.seed}_case{args.case}.py"
    path.write_text(pytest_source(small, result))
    print(f"# wrote {path}")
    return 1


def _progress(total: int | None, disabled: bool):  # noqa: ANN202 - a tqdm bar or None
    if disabled or not sys.stderr.isatty():
        return None
    try:
        import tqdm
    except ImportError:
        return None
    tqdm.tqdm.monitor_interval = 0  # no monitor thread: the process forks
    return tqdm.tqdm(total=total, unit="case", dynamic_ncols=True)
