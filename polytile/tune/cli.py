"""``polytile tune``: tune an operator from the command line, with a progress bar, a final table
beside the vendor library, and optionally a plot of the best latency against trials."""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..cli import ArgumentParser, interrupted, parse_shape, positive_int
from .space import TuneError


def build_parser() -> argparse.ArgumentParser:
    from .search import TUNERS
    p = ArgumentParser(prog="polytile tune", description="Tune the schedule of an operator by measurement.")
    p.add_argument("op", help="an operator of polytile.ops (matmul, conv2d, dense, softmax, …)")
    p.add_argument("--shape", required=True, help="sizes, e.g. M=512,N=512,K=512 or 512,512,512")
    p.add_argument("--target", default="cpu", help="cpu, cuda or cuda:sm_XX (default cpu)")
    p.add_argument("--trials", type=positive_int, default=64, help="trials the records should hold (default 64)")
    p.add_argument("--records", help="JSON-lines records file (resumes a killed run; default: none)")
    p.add_argument("--plot", help="write a plot of best latency against trials to this image (.png, .pdf, .svg)")
    p.add_argument("--tuner", default="xgb", choices=list(TUNERS),
                   help="search strategy (the analytical ones need a template with a model: tensor cores)")
    p.add_argument("--feature", default="knob", choices=["knob", "itervar"], help="cost-model features")
    p.add_argument("--objective", default="rank", choices=["rank", "reg"], help="cost-model objective")
    p.add_argument("--batch", type=positive_int, default=8, help="candidates built in parallel per batch")
    p.add_argument("--template", help="template name (default: the operator's first)")
    p.add_argument("--flush-cache", action="store_true", help="flush the CPU caches before every timed run")
    p.add_argument("--no-verify", action="store_true", help="skip checking the best at odd sizes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def tune_main(argv: list[str]) -> int:
    """Entry point of ``polytile tune``; returns the exit status (130 after Ctrl-C, saying what the
    records kept)."""
    args = build_parser().parse_args(argv)
    measured: list[object] = []
    try:
        return _tune(args, measured.append)
    except KeyboardInterrupt:
        if args.records:
            saved = (f"{len(measured)} new trial(s) are saved in {args.records} (records are append-only); "
                     "run the same command again to resume")
        else:
            saved = (f"the {len(measured)} trial(s) measured were not kept; pass --records FILE to make a "
                     "run resumable")
        return interrupted("polytile tune", saved)


def _tune(args: argparse.Namespace, on_trial: Any) -> int:
    from ..errors import PolytileError
    from .api import no_kernel_report, tune_task
    from .measure import MeasureOptions
    from .task import make_task
    try:
        if args.plot:
            check_plot_path(args.plot, args.records)
        shape = parse_shape(args.op, args.shape)
        task = make_task(args.op, args.target, args.template, **shape)
        model_tuner = args.tuner in ("xgb", "analytical+xgboost")
        opts = {"feature": args.feature, "objective": args.objective} if model_tuner else {}
        with warnings.catch_warnings(record=True) as caught:  # printed below, one line each
            warnings.simplefilter("always")
            result = tune_task(task, args.trials, args.records, tuner=args.tuner, batch_size=args.batch,
                               measure=MeasureOptions(flush_cache=args.flush_cache), seed=args.seed,
                               progress=not args.quiet, verify=not args.no_verify, tuner_options=opts,
                               on_trial=on_trial)
    except PolytileError as err:
        print(f"polytile tune: {err}", file=sys.stderr)
        return 2
    except ImportError as err:  # a missing optional dependency or backend (xgboost, CUDA)
        print(f"polytile tune: {err}; install polytile[tune] (and polytile[cuda] for GPUs)", file=sys.stderr)
        return 2
    for w in caught:
        print(f"polytile tune: warning: {w.message}", file=sys.stderr)
    if result.kernel is None:
        print(f"polytile tune: {no_kernel_report(result, args.records)}", file=sys.stderr)
        return 1
    vendor = _report(result)
    if args.plot:
        plot_curve(result.curve(), args.plot, f"{task.workload.key} on {task.target.key}", vendor)
        print(f"plot written to {args.plot}")
    return 0


def _report(result: Any) -> float | None:
    """Print the final table: tuned kernel, default schedule and vendor library, timed in this process."""
    from rich.console import Console
    from rich.table import Table

    from .vendor import gpu_vendor_baseline, time_call, vendor_baseline
    task, op = result.task, result.task.op
    inputs = op.make_inputs(np.random.default_rng(0))
    rows: list[tuple[str, float]] = [("polytile tuned", result.kernel.benchmark(*inputs))]
    if task.target.kind in op.schedules:
        try:
            rows.append(("polytile default schedule", op.build(task.target).benchmark(*inputs)))
        except Exception as err:  # noqa: BLE001 - the table still shows the rest
            print(f"(default schedule unavailable: {err})", file=sys.stderr)
    vendor_time = None
    if not task.target.has("gpu"):
        base = vendor_baseline(op)
        if base is not None:
            vendor_time = time_call(base[1], inputs)
            rows.append((base[0], vendor_time))
    else:
        try:
            from ..runtime.timing import time_gpu
            gpu = gpu_vendor_baseline(op, inputs)
            if gpu is not None:
                vendor_time = time_gpu(gpu[1])
                rows.append((gpu[0], vendor_time))
        except Exception as err:  # noqa: BLE001 - the table still shows polytile's rows
            print(f"(vendor baseline unavailable: {err})", file=sys.stderr)
    table = Table(title=f"{task.workload.key} on {task.target.key} — {len(result.records)} trials, "
                        f"{result.failures} failed, best of them {result.best.cost * 1e3:.3f} ms")
    for col in ("kernel", "time (ms)", "GFLOP/s", "× vendor time"):
        table.add_column(col, justify="left" if col == "kernel" else "right")
    for name, t in rows:
        gflops = f"{op.flops / t / 1e9:.1f}" if op.flops else "-"
        ratio = f"{t / vendor_time:.2f}" if vendor_time else "-"
        table.add_row(name, f"{t * 1e3:.3f}", gflops, ratio)
    Console().print(table)
    print(f"best configuration: {result.best.config}")
    return vendor_time


def check_plot_path(path: str | Path, records: str | Path | None = None) -> None:
    """Raise ``TuneError`` before tuning when the plot could not be written to ``path``: an image type
    matplotlib does not write, a missing or read-only folder, a directory, or the records file."""
    from matplotlib.backend_bases import FigureCanvasBase
    out = Path(path)
    kinds = FigureCanvasBase.get_supported_filetypes()
    suffix = out.suffix.lower().lstrip(".")
    if suffix not in kinds:
        raise TuneError(f"--plot {path}: {'.' + suffix if suffix else 'no extension'} is not an image type "
                        f"matplotlib writes; end the name with one of {', '.join('.' + k for k in sorted(kinds))}")
    if out.is_dir():
        raise TuneError(f"--plot {path} is a directory; give a file name such as {out / 'curve.png'}")
    folder = out.parent
    if not folder.is_dir():
        raise TuneError(f"--plot {path}: folder {folder} does not exist; create it or give another path")
    if not os.access(folder, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise TuneError(f"--plot {path} cannot be written (folder {folder} or the file is read-only)")
    if records is not None and out.resolve() == Path(records).resolve():
        raise TuneError(f"--plot {path} is the records file; give the plot another name")


def plot_curve(curve: list[float], path: str | Path, title: str, vendor: float | None = None,
               more: dict[str, list[float]] | None = None, label: str = "tuned") -> None:
    """Save a plot of best latency (ms) against trials (several curves via ``more``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, c in {label: curve, **(more or {})}.items():
        xs = [k + 1 for k, v in enumerate(c) if math.isfinite(v)]
        ax.step(xs, [v * 1e3 for v in c if math.isfinite(v)], where="post", label=name)
    if vendor:
        ax.axhline(vendor * 1e3, color="gray", linestyle="--", label="vendor")
    ax.set_xlabel("trials")
    ax.set_ylabel("best latency (ms)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
