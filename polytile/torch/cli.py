"""``polytile tune-model``: tune the distinct workloads of a model of ``polytile.torch.zoo`` into one
records file that the "polytile" backend reads (``polytile.torch.tune``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..cli import ArgumentParser, interrupted, positive_int
from ..errors import PolytileError


def tune_model_main(argv: Sequence[str]) -> int:
    from ..tune.search import TUNERS
    from .zoo import MODELS
    parser = ArgumentParser(prog="polytile tune-model",
                            description="Tune a model's distinct workloads (Ansor's gradient task scheduler) "
                                        "into one records file for the torch.compile backend 'polytile'")
    parser.add_argument("model", choices=sorted(MODELS), help="the model (random weights)")
    parser.add_argument("--records", help="the JSON-lines records file (appended to; a run resumes from it)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--trials", type=positive_int, help="trials over all workloads (the global budget)")
    budget.add_argument("--trials-per-task", type=positive_int, default=None,
                        help="trials per distinct workload (default 20 when --trials is not given)")
    parser.add_argument("--batch", type=positive_int, default=1, help="batch size (default 1)")
    parser.add_argument("--size", choices=("full", "tiny"), default="full",
                        help="the published size (default) or a tiny one with the same structure")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="cpu (default) or cuda: where the model runs and is tuned")
    parser.add_argument("--tuner", default="xgb", choices=list(TUNERS),
                        help="the search (as `polytile tune`; default xgb)")
    parser.add_argument("--list", action="store_true", help="list the distinct workloads; tune nothing")
    args = parser.parse_args(argv)
    if not args.list and not args.records:
        parser.error("--records is required to tune (or give --list)")
    from . import extract_tasks, tune, zoo
    try:
        model, inputs = zoo.model(args.model, batch=args.batch, size=args.size, device=args.device)
        if args.list:
            tasks = extract_tasks(model, inputs)
            print(f"{args.model}: {len(tasks)} distinct workload(s), {sum(t.weight for t in tasks)} group(s)")
            for t in tasks:
                print(f"  ×{t.weight:<3} {t.kind:<11} {' + '.join(t.ops)}  {t.task.workload.key}")
            return 0
        per_task = args.trials_per_task or (None if args.trials else 20)
        report = tune(model, inputs, trials=args.trials, trials_per_task=per_task, records=args.records,
                      tuner=args.tuner)
    except KeyboardInterrupt:
        return interrupted("polytile tune-model", f"the trials so far are in {args.records}; the same command "
                                                  "resumes")
    except PolytileError as err:
        print(f"polytile tune-model: {err}", file=sys.stderr)
        return 2
    print(report)
    return 0
