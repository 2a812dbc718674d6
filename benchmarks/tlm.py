"""TLM benchmark (issue 16): the tensor language model against XGBoost, random and (tensor-core
templates) analytical search on workloads of held-out networks, never seen in pretraining or
fine-tuning.

    python benchmarks/tlm.py --target cpu          # held-out CPU workloads, measured on this machine
    python benchmarks/tlm.py --tables              # the H100 exhaustive tables, table-backed (no GPU)
    python benchmarks/tlm.py --target cuda         # on a GPU: held-out GPU workloads, measured

Measured runs (``--target``), as TLM's loop (``gen/run.py``):
  1. the model: ``--model DIR``, else the one shipped (CPU), else a corpus of the training networks
     and a pretraining run here (GPU), with the held-out workloads excluded (a run resumed in the same
     --records-dir reuses them; the measurements resume from its records);
  2. fine-tuning data: the training workloads (layers of ``networks.TRAIN``) tuned by the tlm tuner,
     ``--train-trials`` each (records in ``--records-dir``; a killed run resumes);
  3. the model fine-tuned on the ``--best`` fastest configurations of every training workload
     (``--finetune-epochs``, ``--finetune-lr``);
  4. each held-out workload (layers of ``networks.HELD_OUT``; checked absent from the corpus and the
     fine-tuning records) tuned by tlm@32, random@32, xgb@200 (whose first 32 trials are xgb@32) and,
     where the template has an analytical model, analytical@32; one shared measurer, so a
     configuration proposed by several tuners is measured once.
Reported: best latency after 1, 4, 10 and 32 trials; per workload xgb@200 / tlm@10 (the share of
xgb@200's speed TLM reaches in 10 trials; the issue's target: ≥ 0.95 on the GPU, ≥ 0.9 on the CPU,
geometric mean), the same for random@10 and xgb@10; the time to generate 100 candidates.

Tables (``--tables``): the exhaustively measured tables of ``benchmarks/results/alcop_search-exhaustive-*``
(every valid configuration of BERT's 512×768×3072 fp16 GEMM and ResNet-50's 3×3 convolution at batch
32, ``matmul_tensorcore``/``conv2d_igemm_tensorcore`` on an H100) stand in for the GPU: a configuration's
"measurement" is its row (a configuration valid now but absent from the table is a failed trial).
Each table workload is held out in turn: the GPU model (``--model``, or a corpus of the training
networks without either table workload, pretrained here) is fine-tuned on the other table's best
configurations and, as no GPU measured the training networks' layers here, on the ``--analytical-top``
configurations the analytical model predicts fastest for each of their tensor-core tasks
(``finetune.analytical_sentences``; 0: the other table alone, TLM's protocol); then the tuners search
the held-out table. Reported as above, plus TLM's best after 10 trials over the exhaustive best.

Writes ``benchmarks/results/tlm-<target>-<date>.json`` (machine, date, command, per-workload curves,
summary) and prints a table.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import lzma
import math
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from polytile.target import cpu_target  # noqa: E402
from polytile.tune import MeasureOptions, Measurer, MeasureResult, Record, make_task  # noqa: E402
from polytile.tune.space import Config  # noqa: E402
from polytile.tune.task import Workload  # noqa: E402
from polytile.tune.tlm import corpus  # noqa: E402
from polytile.tune.tlm.decode import Completions, generate  # noqa: E402
from polytile.tune.tlm.evaluate import Case, evaluate, print_table  # noqa: E402
from polytile.tune.tlm.finetune import analytical_sentences, best_sentences, finetune, target_of  # noqa: E402
from polytile.tune.tlm.model import TLM, resolve  # noqa: E402
from polytile.tune.tlm.networks import HELD_OUT, TRAIN  # noqa: E402
from polytile.tune.tlm.train import FINETUNE, TrainOptions, fit  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
# held-out CPU workloads: layers of ViT-B/16, Whisper-tiny, DenseNet-121 and SqueezeNet-1.1 small enough
# to measure hundreds of times on a 2-core machine
CPU_HELD_OUT = [
    Case("vit-b16:proj", "matmul", dict(M=197, N=768, K=768)),
    Case("vit-b16:scores", "batch_matmul", dict(batch=12, M=197, N=197, K=64)),
    Case("vit-b16:softmax", "softmax", dict(M=2364, N=197)),
    Case("whisper-tiny:layernorm", "layernorm", dict(M=1500, N=384)),
    Case("densenet-121:3x3", "conv2d", dict(N=1, C=128, H=28, W=28, K=32, R=3, S=3, stride=1, padding=1)),
    Case("squeezenet-1.1:expand3x3", "conv2d", dict(N=1, C=32, H=27, W=27, K=128, R=3, S=3, stride=1, padding=1)),
]
# training CPU workloads for fine-tuning: layers of the training networks of similar cost
CPU_TRAIN = [
    Case("bert-base:proj", "matmul", dict(M=128, N=768, K=768)),
    Case("bert-base:scores", "batch_matmul", dict(batch=12, M=128, N=128, K=64)),
    Case("bert-base:softmax", "softmax", dict(M=1536, N=128)),
    Case("bert-base:layernorm", "layernorm", dict(M=128, N=768)),
    Case("gpt2:context", "batch_matmul", dict(batch=12, M=256, N=64, K=256)),
    Case("resnet-50:3x3", "conv2d", dict(N=1, C=64, H=56, W=56, K=64, R=3, S=3, stride=1, padding=1)),
    Case("resnet-50:3x3-c4", "conv2d", dict(N=1, C=256, H=14, W=14, K=256, R=3, S=3, stride=1, padding=1)),
    Case("mobilenet-v2:1x1", "conv2d", dict(N=1, C=144, H=28, W=28, K=32, R=1, S=1, stride=1, padding=0)),
]
TABLES = {
    "bert_ffn2": ("alcop_search-exhaustive-20261122-h100-table.jsonl.xz", "matmul_tensorcore", "matmul",
                  dict(M=512, N=768, K=3072, dtype="float16")),
    "conv2d_r50": ("alcop_search-exhaustive-conv2d-20261122-h100-table.jsonl.xz", "conv2d_igemm_tensorcore",
                   "conv2d_igemm", dict(N=32, H=14, W=14, C=256, K=256, R=3, S=3, stride=1, padding=1)),
}
TABLE_TARGET = "cuda:NVIDIA_H100_80GB_HBM3:sm_90a"  # the tables' records key


def gpu_cases(names: tuple[str, ...], limit: int) -> list[Case]:
    """Tensor-core workloads (float16 products, implicit-GEMM convolutions) of networks, on the GPU: their
    templates have an analytical model, so the analytical tuner runs beside the others."""
    out = []
    for network, op, args in corpus.workloads("cuda", names):
        if op == "conv2d_igemm" or (op in ("matmul", "batch_matmul") and args.get("dtype") == "float16"):
            out.append(Case(f"{network}:{op}:{len(out)}", op, args))
    return out[:limit]


def key_of(case: Case) -> str:
    return Workload.of(case.op, **case.shape).key


def corpus_keys(kind: str, names: list[str]) -> set[str]:
    return {Workload.of(op, **args).key for _, op, args in corpus.workloads(kind, names)}


def geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


def summarize(report: dict, reference: str = "xgb@200", exhaustive: dict[str, float] | None = None) -> dict:
    """Per workload: the reference's best over each tuner's best after 10 trials (1.0: as fast)."""
    rows, ratios = {}, {}
    for name, w in report["workloads"].items():
        ref = w["tuners"].get(reference, {}).get("best_after", {})
        best_ref = ref.get(reference.split("@")[1]) if "@" in reference else None
        row = {}
        for tuner, t in w["tuners"].items():  # xgb@10 from xgb@200's first 10 trials
            at10 = t["best_after"].get("10")
            row[f"{tuner.split('@')[0]}@10"] = best_ref / at10 if best_ref and at10 else None
        if exhaustive and name in exhaustive:
            at10 = w["tuners"].get("tlm", {}).get("best_after", {}).get("10")
            row["tlm@10 over exhaustive best"] = exhaustive[name] / at10 if at10 else None
        rows[name] = row
        for k, v in row.items():
            ratios.setdefault(k, []).append(v)
    return {"per_workload": rows, "geomean": {k: geomean(v) for k, v in ratios.items()},
            "meaning": f"{reference}'s best latency over the tuner's best latency after 10 trials (≥ 1: as fast)"}


def generation_seconds(tlm: TLM, cases: list[Case], target: object, n: int = 100) -> dict[str, float]:
    out = {}
    for case in cases:
        task = case.task(target)
        rng = np.random.default_rng(0)
        start = time.perf_counter()
        generate(tlm, task, n, Completions(task.space, set(), rng), rng)
        out[case.name] = round(time.perf_counter() - start, 2)
    return out


def machine(kind: str) -> dict:
    if kind == "cpu":
        t = cpu_target()
        return {"device": f"{t.model}, {t.cores} cores, {t.vector_bits}-bit SIMD", "target": t.key,
                "load_average": os.getloadavg()}
    import subprocess
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except OSError:
        gpu = "unknown"
    return {"device": gpu, "host_cpu": platform.processor() or platform.machine()}


def built_model(args: argparse.Namespace, records: Path, exclude: list[str], timings: dict[str, object]) -> str:
    """The GPU model of this run: a corpus of the training networks without the ``exclude``d workloads,
    pretrained here (on the GPU when present); a run resumed in the same records directory reuses both."""
    from polytile.tune.tlm.train import pretrain
    start = time.perf_counter()
    if not (records / "corpus.txt").exists():
        corpus.write_corpus(records / "corpus.txt", "cuda", args.corpus_size, TRAIN, exclude,
                            progress=not args.quiet)
        timings["corpus_s"] = round(time.perf_counter() - start, 1)
    if not (records / "model" / "tlm.json").exists():
        start = time.perf_counter()
        pretrain(records / "corpus.txt", records / "model",
                 TrainOptions(max_minutes=args.pretrain_minutes, threads=args.torch_threads),
                 progress=not args.quiet)
        timings["pretrain_s"] = round(time.perf_counter() - start, 1)
    return str(records / "model")


# --- measured runs ---------------------------------------------------------------------------------------


def measured(args: argparse.Namespace) -> dict:
    kind = "cpu" if args.target == "cpu" else "cuda"
    held = CPU_HELD_OUT if kind == "cpu" else gpu_cases(HELD_OUT, args.heldout)
    train = CPU_TRAIN if kind == "cpu" else gpu_cases(TRAIN, args.train_workloads)
    held, train = held[:args.heldout], train[:args.train_workloads]
    records = Path(args.records_dir)
    records.mkdir(parents=True, exist_ok=True)
    timings: dict[str, object] = {}
    base = args.model or ("default" if kind == "cpu" else None)
    if base is None:  # build the GPU model here, the held-out workloads excluded
        base = built_model(args, records, [key_of(c) for c in held], timings)
    tlm = resolve(base, kind)
    seen = corpus_keys(kind, tlm.meta.get("corpus", {}).get("networks", list(TRAIN)))
    overlap = [c.name for c in held if key_of(c) in seen or key_of(c) in {key_of(t) for t in train}]
    if overlap:
        raise SystemExit(f"held-out workloads seen in pretraining or fine-tuning: {overlap}")
    # three timed runs after one warm-up: hundreds of trials must fit the time of a shared machine
    measure = MeasureOptions(repeat=3, warmup=1, min_time=0.0)
    start = time.perf_counter()
    with Measurer(measure) as measurer:
        evaluate(tlm, train, args.target, ["tlm"], args.train_trials, args.batch, records_dir=records / "train",
                 measurer=measurer, progress=not args.quiet)
        timings["train_measure_s"] = round(time.perf_counter() - start, 1)
        start = time.perf_counter()
        tuned, report = finetune(tlm, [records / "train" / "tlm.jsonl"], records / "model-ft", best=args.best,
                                 options=finetune_options(args), progress=not args.quiet)
        timings["finetune_s"] = round(time.perf_counter() - start, 1)
        start = time.perf_counter()
        tuners = ["tlm", f"random@{args.trials}", f"xgb@{args.reference_trials}"]
        if kind == "cuda":
            tuners.append(f"analytical@{args.trials}")
        result = evaluate(tuned, held, args.target, tuners, args.trials, args.batch, records_dir=records / "heldout",
                          measurer=measurer, temperature=args.temperature, progress=not args.quiet)
        timings["heldout_s"] = round(time.perf_counter() - start, 1)
    result["fine_tuning"] = {"workloads": [c.name for c in train], "trials_each": args.train_trials,
                             "best": args.best, "sentences": report.sentences, "skipped": report.skipped}
    result["generation_s_per_100"] = generation_seconds(tuned, held, args.target)
    result["summary"] = summarize(result, f"xgb@{args.reference_trials}")
    result["timings"] = timings
    return result


# --- table-backed runs -----------------------------------------------------------------------------------


class TableMeasurer:
    """Answers each configuration with its row of an exhaustively measured table."""

    def __init__(self, rows: dict[str, MeasureResult]):
        self.rows = rows
        self.missing = 0

    def measure(self, task, batch, on_result=None):  # noqa: ANN001, ANN201 - Measurer.measure
        out = []
        for k, values in enumerate(batch):
            res = self.rows.get(Config(dict(values)).key)
            if res is None:
                self.missing += 1
                res = MeasureResult("build_error", [], "not in the exhaustive table")
            out.append(res)
            if on_result is not None:
                on_result(k, res)
        return out

    def close(self) -> None:
        pass


def load_table(name: str) -> dict[str, MeasureResult]:
    path = RESULTS / TABLES[name][0]
    rows = {}
    with lzma.open(path, "rt") as f:
        for line in f:
            row = json.loads(line)
            rows[Config(row["config"]).key] = MeasureResult(row["status"], row["costs"], row["error"])
    return rows


def table_records(name: str, rows: dict[str, MeasureResult]) -> list[Record]:
    """The table as tuning records (what measuring it would have written)."""
    _, template, op, shape = TABLES[name]
    task = make_task(op, target_of(TABLE_TARGET), template, **shape)
    return [Record(task.key, TABLE_TARGET, template, json.loads(key), r.status, r.costs)
            for key, r in rows.items()]


def analytical_prior(args: argparse.Namespace, target: object, exclude: list[str]) -> list[str]:
    """Fine-tuning sentences without measurements: the ``--analytical-top`` configurations the analytical
    model predicts fastest for every tensor-core template of the training networks' layers on the
    target's architecture (the held-out workloads excluded)."""
    if args.analytical_top == 0:
        return []
    tasks = [task for _, task in corpus.tasks("cuda", TRAIN, frozenset(exclude))
             if task.template.model is not None and task.target.arch == target.arch]
    return analytical_sentences(tasks, args.analytical_top, seed=args.seed)


def finetune_options(args: argparse.Namespace) -> TrainOptions:
    return TrainOptions(**{**FINETUNE.__dict__, "epochs": args.finetune_epochs, "lr": args.finetune_lr})


def tables(args: argparse.Namespace) -> dict:
    target = target_of(TABLE_TARGET)
    timings: dict[str, object] = {}
    records = Path(args.records_dir)
    records.mkdir(parents=True, exist_ok=True)
    held_keys = [Workload.of(op, **shape).key for _, _, op, shape in TABLES.values()]
    base = args.model or built_model(args, records, held_keys, timings)
    tlm = resolve(base, "cuda")
    excluded = set(tlm.meta.get("corpus", {}).get("excluded", []))
    if not set(held_keys) <= excluded:
        raise SystemExit(f"the model's corpus does not exclude the table workloads {held_keys}")
    rows = {name: load_table(name) for name in TABLES}
    start = time.perf_counter()
    prior = analytical_prior(args, target, held_keys)
    timings["analytical_sentences_s"] = round(time.perf_counter() - start, 1)
    report: dict = {"target": TABLE_TARGET, "trials": args.trials, "workloads": {}, "table_backed": True,
                    "model": {"path": base, "parameters": tlm.parameters}, "analytical_sentences": len(prior),
                    "finetune_options": finetune_options(args).__dict__}
    exhaustive = {}
    for name, (_, template, op, shape) in TABLES.items():
        others = [r for other in TABLES if other != name for r in table_records(other, rows[other])]
        texts, fine = best_sentences(others, args.best)
        tuned = TLM(tlm.tokenizer, copy.deepcopy(tlm.model), copy.deepcopy(tlm.meta), tlm.path)
        start = time.perf_counter()
        fit(tuned, texts + prior, finetune_options(args), stage="finetune", progress=False)
        timings[f"finetune_for_{name}_s"] = round(time.perf_counter() - start, 1)
        table = TableMeasurer(rows[name])
        tuners = ["tlm", f"random@{args.trials}", f"analytical@{args.trials}", f"xgb@{args.reference_trials}"]
        case = Case(name, op, shape, template)
        result = evaluate(tuned, [case], target, tuners, args.trials, args.batch, measurer=table,
                          temperature=args.temperature, progress=False, seed=args.seed)
        entry = result["workloads"][name]
        entry["fine_tuned_on"] = {"tables": [o for o in TABLES if o != name], "sentences": fine.sentences}
        entry["not_in_table"] = table.missing
        ok = [r.cost for r in rows[name].values() if r.ok]
        exhaustive[name] = min(ok)
        entry["exhaustive_best_s"] = min(ok)
        entry["generation_s_per_100"] = generation_seconds(tuned, [case], target)[name]
        report["workloads"][name] = entry
    report["summary"] = summarize(report, f"xgb@{args.reference_trials}", exhaustive)
    report["timings"] = timings
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=["cpu", "cuda"], help="measure on this target")
    p.add_argument("--tables", action="store_true", help="the H100 exhaustive tables, table-backed (no GPU)")
    p.add_argument("--model", help="a pretrained model directory (default: shipped for the CPU; built for GPUs)")
    p.add_argument("--records-dir", default=".tlm-bench", help="records, corpus and models of this run")
    p.add_argument("--trials", type=int, default=32, help="trials of tlm, random and analytical (default 32)")
    p.add_argument("--reference-trials", type=int, default=200, help="trials of xgb, the reference (default 200)")
    p.add_argument("--batch", type=int, default=4, help="candidates per batch (default 4)")
    p.add_argument("--heldout", type=int, default=10, help="held-out workloads, at most (default 10)")
    p.add_argument("--train-workloads", type=int, default=12, help="training workloads, at most (default 12)")
    p.add_argument("--train-trials", type=int, default=24, help="tlm trials per training workload (default 24)")
    p.add_argument("--best", type=int, default=4, help="best configurations per workload to fine-tune on")
    p.add_argument("--analytical-top", type=int, default=4,
                   help="tables: also fine-tune on the N configurations the analytical model ranks fastest for "
                        "each tensor-core layer of the training networks (default 4; 0: measurements only)")
    p.add_argument("--finetune-epochs", type=float, default=20.0, help="fine-tuning epochs (default 20)")
    p.add_argument("--finetune-lr", type=float, default=1e-3, help="fine-tuning learning rate (default 1e-3)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--corpus-size", type=int, default=100_000, help="GPU corpus sentences (default 100000)")
    p.add_argument("--pretrain-minutes", type=float, default=30.0, help="GPU pretraining budget (default 30)")
    p.add_argument("--torch-threads", type=int, help="torch's threads for pretraining here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--out", help="the JSON record (default benchmarks/results/tlm-<target>-<date>.json)")
    args = p.parse_args()
    if args.tables == (args.target is not None):
        p.error("give --target cpu|cuda or --tables")
    start = time.perf_counter()
    report = tables(args) if args.tables else measured(args)
    kind = "tables" if args.tables else args.target
    report.update({"benchmark": "tlm", "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                   "command": "python benchmarks/tlm.py " + " ".join(sys.argv[1:]),
                   "machine": machine("cpu" if kind == "cpu" else "cuda"),
                   "seconds": round(time.perf_counter() - start, 1)})
    if args.tables:
        report["machine"] = {"measurements": "table-backed: H100 80GB HBM3 rows of benchmarks/results/"
                             "alcop_search-exhaustive-*-table.jsonl.xz", "host": machine("cpu")}
    print_table(report)
    print(json.dumps(report["summary"], indent=1))
    out = Path(args.out) if args.out else RESULTS / f"tlm-{kind}-{datetime.date.today():%Y%m%d}.json"
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
