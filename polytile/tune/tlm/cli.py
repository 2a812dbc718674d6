"""``polytile tlm``: build a corpus of tensor sentences, pretrain a model on it, fine-tune it on
tuning records, and evaluate it by tuning workloads (each with a progress bar)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ...cli import ArgumentParser, interrupted, parse_shape, positive_int
from ..space import TuneError


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def build_parser() -> argparse.ArgumentParser:
    from .networks import HELD_OUT, NETWORKS, TRAIN
    p = ArgumentParser(prog="polytile tlm", description="The tensor language model: corpus, pretraining, "
                       "fine-tuning, evaluation (docs/tuning.md, \"Tensor language model\").")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("corpus", help="write random valid tensor sentences of real networks' layers")
    c.add_argument("--out", required=True, help="the corpus file to write")
    c.add_argument("--target", default="cpu", choices=["cpu", "cuda"], help="target kind (default cpu)")
    c.add_argument("--size", type=positive_int, default=100_000, help="sentences (default 100000)")
    c.add_argument("--networks", type=_names, default=list(TRAIN),
                   help=f"comma-separated networks (default {','.join(TRAIN)}; known: {', '.join(NETWORKS)}; "
                        f"{','.join(HELD_OUT)} are kept for evaluation)")
    c.add_argument("--exclude", action="append", default=[], metavar="WORKLOAD",
                   help="leave out a workload by key, e.g. 'matmul(K=3072,M=512,N=768,dtype=float16)'")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--workers", type=positive_int, default=1,
                   help="processes drawing the configurations (default 1; more: another corpus, as reproducible)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")

    t = sub.add_parser("pretrain", help="train a new model on a corpus")
    t.add_argument("corpus", help="a corpus file written by `polytile tlm corpus`")
    t.add_argument("--out", required=True, help="the model directory to write")
    t.add_argument("--epochs", type=_positive_float, default=1.0, help="passes over the corpus (default 1)")
    t.add_argument("--batch", type=positive_int, default=128, help="sentences per step (default 128)")
    t.add_argument("--lr", type=_positive_float, default=1e-3, help="peak learning rate (default 1e-3)")
    t.add_argument("--max-minutes", type=_positive_float, help="stop training after this long")
    t.add_argument("--layers", type=positive_int, default=4)
    t.add_argument("--width", type=positive_int, default=256)
    t.add_argument("--heads", type=positive_int, default=4)
    t.add_argument("--half", action="store_true", help="save float16 weights (half the size on disk)")
    t.add_argument("--device", help="cpu or cuda (default: cuda when present)")
    t.add_argument("--threads", type=positive_int, help="torch's CPU threads (default: torch's choice; 1 is "
                   "faster on a machine busy with other work)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--quiet", action="store_true", help="no progress bar")

    f = sub.add_parser("finetune", help="fine-tune a model on the best configurations of tuning records")
    f.add_argument("model", help="a model directory, or 'default'")
    f.add_argument("--records", required=True, action="append", help="a records file (repeat for several)")
    f.add_argument("--out", required=True, help="the model directory to write")
    f.add_argument("--best", type=positive_int, default=4, help="best configurations per workload (default 4)")
    f.add_argument("--epochs", type=_positive_float, default=10.0, help="passes (default 10)")
    f.add_argument("--lr", type=_positive_float, default=3e-4, help="learning rate, constant (default 3e-4)")
    f.add_argument("--half", action="store_true", help="save float16 weights")
    f.add_argument("--device", help="cpu or cuda (default: cuda when present)")
    f.add_argument("--quiet", action="store_true", help="no progress bar")

    e = sub.add_parser("evaluate", help="tune workloads with the model (and other tuners) and compare")
    e.add_argument("model", help="a model directory, or 'default'")
    e.add_argument("op", nargs="?", help="an operator to tune (with --shape), instead of --network")
    e.add_argument("--shape", help="the operator's sizes, e.g. M=197,N=768,K=768")
    e.add_argument("--network", type=_names, help=f"tune every layer of these networks ({', '.join(NETWORKS)})")
    e.add_argument("--target", default="cpu", help="cpu, cuda or cuda:sm_XX (default cpu)")
    e.add_argument("--trials", type=positive_int, default=32, help="trials per workload and tuner (default 32)")
    e.add_argument("--batch", type=positive_int, default=8, help="candidates per batch (default 8)")
    e.add_argument("--tuners", type=_names, default=["tlm"], help="comma-separated, e.g. tlm,xgb,random")
    e.add_argument("--records-dir", help="keep the records here (one file per tuner; resumes)")
    e.add_argument("--corpus", help="also report the model's loss on this corpus's sentences")
    e.add_argument("--temperature", type=_positive_float, default=1.0)
    e.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest words (0: all)")
    e.add_argument("--out", help="write the results as JSON here")
    e.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def tlm_main(argv: list[str]) -> int:
    """Entry point of ``polytile tlm``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return {"corpus": _corpus, "pretrain": _pretrain, "finetune": _finetune, "evaluate": _evaluate}[
            args.command](args)
    except KeyboardInterrupt:
        return interrupted(f"polytile tlm {args.command}", "nothing was saved" if args.command != "evaluate"
                           else "the trials measured so far are in the records directory (when given)")
    except TuneError as err:
        print(f"polytile tlm {args.command}: {err}", file=sys.stderr)
        return 2
    except ImportError as err:
        print(f"polytile tlm {args.command}: {err}; install polytile[tlm]", file=sys.stderr)
        return 2


def _corpus(args: argparse.Namespace) -> int:
    from .corpus import write_corpus
    header = write_corpus(args.out, args.target, args.size, args.networks, args.exclude, args.seed,
                          progress=not args.quiet, workers=args.workers)
    print(f"{header['sentences']} sentences of {header['tasks']} tasks ({len(header['workloads'])} workloads, "
          f"{len(header['templates'])} templates, {len(header['targets'])} targets) written to {args.out} "
          f"in {header['seconds']:.0f} s")
    for line in header["skipped"]:
        print(f"  skipped {line}", file=sys.stderr)
    return 0


def _pretrain(args: argparse.Namespace) -> int:
    from .model import ModelShape
    from .train import TrainOptions, pretrain
    options = TrainOptions(epochs=args.epochs, batch_size=args.batch, lr=args.lr, max_minutes=args.max_minutes,
                           seed=args.seed, threads=args.threads)
    shape = ModelShape(args.layers, args.width, args.heads)
    start = time.perf_counter()
    tlm = pretrain(args.corpus, args.out, options, shape, half=args.half, progress=not args.quiet,
                   device=args.device)
    run = tlm.meta["training"][-1]
    print(f"model of {tlm.parameters / 1e6:.2f}M parameters ({len(tlm.ids)} words) written to {args.out}: "
          f"{run['steps']} steps, {run['sentences_seen']} sentences seen, loss {run['first_loss']:.3f} → "
          f"{run['last_loss']:.3f}, {time.perf_counter() - start:.0f} s on {run['device']}"
          + (" (stopped by --max-minutes)" if run["stopped_by_time"] else ""))
    return 0


def _finetune(args: argparse.Namespace) -> int:
    from .finetune import finetune
    from .train import FINETUNE, TrainOptions
    options = TrainOptions(**{**FINETUNE.__dict__, "epochs": args.epochs, "lr": args.lr})
    tlm, report = finetune(args.model, args.records, args.out, best=args.best, options=options, half=args.half,
                           progress=not args.quiet, device=args.device)
    run = tlm.meta["training"][-1]
    print(f"fine-tuned on {report.sentences} sentences of {report.workloads} workload(s): loss "
          f"{run['first_loss']:.3f} → {run['last_loss']:.3f}; written to {args.out}")
    for line in report.skipped:
        print(f"  skipped {line}", file=sys.stderr)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from .corpus import workloads
    from .evaluate import Case, evaluate, print_table
    if (args.op is None) == (args.network is None):
        raise TuneError("give either an operator with --shape, or --network")
    if args.op is not None:
        if args.shape is None:
            raise TuneError(f"--shape is needed with operator {args.op}")
        work = [Case(args.op, args.op, parse_shape(args.op, args.shape))]
    else:
        kind = "cpu" if args.target == "cpu" else "cuda"
        work = [Case(f"{net}:{op}", op, shape) for net, op, shape in workloads(kind, args.network)]
    report: dict[str, Any] = evaluate(args.model, work, args.target, args.tuners, args.trials, args.batch,
                                      records_dir=args.records_dir, corpus=args.corpus,
                                      temperature=args.temperature, top_k=args.top_k, progress=not args.quiet)
    print_table(report)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"results written to {args.out}")
    return 0
