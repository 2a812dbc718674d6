"""``polytile fuzz``: run a fuzzing campaign, or replay (and minimize) one case."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from .execute import generate_case
from .runner import Result, Summary, campaign, case_job, run_one
from .spec import case_source


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
    p.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds one case may take (default 60)")
    p.add_argument("--target", default="cpu", choices=["cpu"], help="target to build for (cpu)")
    p.add_argument("--json", help="write the summary and every finding to this file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def fuzz_main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    if args.minimize and args.case is None:
        parser().error("--minimize needs --case")
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

    summary = campaign(args.seed, cases, args.budget, args.first, args.jobs, args.timeout, on_result)
    if bar is not None:
        bar.close()
    print(summary.line())
    print_findings(summary)
    if args.json:
        Path(args.json).write_text(json.dumps({"seed": args.seed, "first": args.first, **summary.to_json()}, indent=1))
    return 1 if summary.findings else 0


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
    r = run_one(case_job(args.seed, args.case), (args.seed, args.case), args.timeout)
    case = generate_case(args.seed, args.case).with_calls(r.calls)
    print(case_source(case, f"polytile fuzz --seed {args.seed} --case {args.case}: {r.kind}"))
    print(f"# outcome: {r.kind}" + (f" at {r.phase}" if r.phase else "") + (f": {r.detail}" if r.detail else ""))
    if not args.minimize:
        return 1 if r.is_finding else 0
    if not r.is_finding:
        print("# nothing to minimize: the case does not fail")
        return 0
    from .minimize import isolated, minimize, pytest_source
    small, result = minimize(case, r, isolated(args.timeout), log=lambda msg: print(f"# {msg}", file=sys.stderr))
    title = f"polytile fuzz --seed {args.seed} --case {args.case} (minimized): {result.kind}"
    print(case_source(small, title))
    print(f"# outcome: {result.kind} at {result.phase}: {result.detail}")
    path = Path(args.test_dir) / f"test_fuzz_seed{args.seed}_case{args.case}.py"
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
