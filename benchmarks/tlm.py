"""TLM benchmark (issue 16): the tensor language model against XGBoost, random and (tensor-core
templates) analytical search on workloads of held-out networks, never seen in pretraining or
fine-tuning.

    python benchmarks/tlm.py --target cpu          # held-out CPU workloads, measured on this machine
    python benchmarks/tlm.py --tables              # the H100 exhaustive tables, table-backed (no GPU)
    python benchmarks/tlm.py --target cuda --devices 0,1 --max-seconds 540 --records-dir R
                                                   # on GPUs: held-out GPU workloads, measured; exit
                                                   # status 3: the same command resumes

Measured runs (``--target``), as TLM's loop (``gen/run.py``):
  1. the model: ``--model DIR``, else the one shipped (CPU), else a corpus of the training networks
     (``--corpus-size``, drawn in a process per core) and a pretraining run here (GPU,
     ``--pretrain-minutes``), with the held-out workloads excluded;
  2. fine-tuning data: the training workloads (layers of ``networks.TRAIN``, ``--train-workloads``)
     tuned by the tlm tuner, ``--train-trials`` each;
  3. the model fine-tuned on the ``--best`` fastest configurations of every training workload and, on
     the GPU, on the ``--analytical-top`` configurations the analytical model ranks fastest for each
     tensor-core layer of the training networks (``--finetune-epochs``, ``--finetune-lr``);
  4. each held-out workload (layers of ``networks.HELD_OUT``, ``--heldout``; checked absent from the
     corpus and the fine-tuning records) tuned by tlm@32, random@32, xgb@200 (whose first 32 trials
     are xgb@32) and, where the template has an analytical model, analytical@32 (``--trials``,
     ``--reference-trials``); a configuration proposed by several tuners is measured once.
Stages 2 and 4 spread their workloads over ``--devices`` by expected cost (``_devices``, as
``shapes.py --tune``): a worker process per GPU, seeing only it, with its builder pool
(``--builders``, default the cores shared among the GPUs) and its GPU's runner, running ``--jobs``
tunings at once (each still batch after batch, ``--batch``: its curve is as if it ran alone; the
model runs on the CPU there, so that the GPU times kernels undisturbed). A workload's curves are a
row of ``R/<stage>.rows.jsonl`` once all its tunings ended, its trials in ``R/<stage>/<tuner>.jsonl``;
the corpus and the models are written under other names and renamed when whole. ``--max-seconds``
stops the tunings at the first trial after it (less 30 s for the last stage) and the call exits with
status 3; the same command hands out only what is left (a tuning resumes from its records, whose
results every tuner reuses). Each call adds its stages' seconds to ``R/timings.json``.
Reported: best latency after 1, 4, 10 and 32 trials; per workload xgb@200 / tlm@10 (the share of
xgb@200's speed TLM reaches in 10 trials; the issue's target: ≥ 0.95 on the GPU, ≥ 0.9 on the CPU,
geometric mean), the same for random@10 and xgb@10; the time to generate 100 candidates; each
stage's trials with their median build and run seconds.

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
import dataclasses
import datetime
import json
import lzma
import math
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import _devices  # noqa: E402
import numpy as np  # noqa: E402

from polytile.target import as_target, cpu_target  # noqa: E402
from polytile.tune import MeasureOptions, Measurer, MeasureResult, Record, make_task  # noqa: E402
from polytile.tune.records import RecordLog  # noqa: E402
from polytile.tune.space import Config  # noqa: E402
from polytile.tune.task import Workload  # noqa: E402
from polytile.tune.tlm import corpus  # noqa: E402
from polytile.tune.tlm.decode import Completions, generate  # noqa: E402
from polytile.tune.tlm.evaluate import Case, evaluate, parse_tuner, print_table  # noqa: E402
from polytile.tune.tlm.finetune import analytical_sentences, best_sentences, finetune, target_of  # noqa: E402
from polytile.tune.tlm.model import TLM, resolve  # noqa: E402
from polytile.tune.tlm.networks import HELD_OUT, TRAIN  # noqa: E402
from polytile.tune.tlm.train import FINETUNE, TrainOptions, fit  # noqa: E402
from polytile.tune.workers import pin_process  # noqa: E402

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


def built_model(args: argparse.Namespace, records: Path, exclude: list[str], timings: Timings) -> str:
    """The GPU model of this run: a corpus of the training networks without the ``exclude``d workloads,
    pretrained here (on the GPU when present); a run resumed in the same records directory reuses both
    (each is written under another name and renamed when whole: a killed call leaves no half of one)."""
    from polytile.tune.tlm.train import pretrain
    corpus_file, model = records / "corpus.txt", records / "model"
    if not corpus_file.exists():
        start = time.perf_counter()
        part = records / "corpus.txt.part"
        corpus.write_corpus(part, "cuda", args.corpus_size, TRAIN, exclude, progress=not args.quiet,
                            workers=max(1, (os.cpu_count() or 1) - 1))
        os.replace(part, corpus_file)
        timings.add("corpus_s", time.perf_counter() - start)
    if not (model / "tlm.json").exists():
        start = time.perf_counter()
        part = records / "model.part"
        pretrain(corpus_file, part, TrainOptions(max_minutes=args.pretrain_minutes, threads=args.torch_threads),
                 progress=not args.quiet)
        replace_dir(part, model)
        timings.add("pretrain_s", time.perf_counter() - start)
    return str(model)


def replace_dir(part: Path, final: Path) -> None:
    """Move a directory written whole into its place (what was there before goes)."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(part, final)


class Timings:
    """Seconds of each stage, kept in the records directory across the calls of a resumed run."""

    def __init__(self, path: Path):
        self.path = path
        self.values: dict[str, float] = json.loads(path.read_text()) if path.exists() else {}

    def add(self, name: str, seconds: float) -> None:
        self.values[name] = round(self.values.get(name, 0.0) + seconds, 1)
        self.path.write_text(json.dumps(self.values, indent=1) + "\n")


# --- measured runs: workloads spread over devices, resumable ---------------------------------------------

FAMILIES = {"conv2d_igemm": "igemm", "conv2d": "conv2d", "softmax": "rows", "layernorm": "rows"}


def expected_seconds(case: Case, trials: int, builders: int) -> float:
    """The wall time of ``trials`` trials of ``case`` (for balancing the devices only)."""
    family = FAMILIES.get(case.op)
    if family is None:  # a matrix product: GEMV, CUDA-core or tensor-core GEMM
        rows = int(case.shape.get("M", 1))
        family = "gemv" if rows <= 16 else "wgmma" if case.shape.get("dtype") in ("float16", "bfloat16") else "cuda"
    return _devices.expected_seconds(trials, family, builders)


def measure_options(kind: str, builders: int, runner_cores: int = 0) -> MeasureOptions:
    """How the workers measure. CPU: the runner on ``runner_cores`` cores of its own, the builders and
    the tuners on the others (``MeasureOptions.runner_cores``), the median of at least 10 runs or 20 ms
    after two warm-ups. GPU: every candidate checked and timed on one set of inputs, whose reference is
    computed once; at least 10 ms of launches (tens of the 10–500 µs kernels). No re-timing of winners
    (the curves are what is compared)."""
    if kind == "cpu":
        return MeasureOptions(builders=builders, runner_cores=runner_cores, repeat=10, warmup=2, min_time=0.02,
                              retime=0)
    return MeasureOptions(builders=builders, same_inputs=True, repeat=10, warmup=1, min_time=0.01, retime=0)


def runner_cores(args: argparse.Namespace) -> int:
    """The cores of the CPU runner (``--runner-cores``; default half of this process's, 0 on a GPU)."""
    if args.target != "cpu":
        return 0
    if args.runner_cores is not None:
        return args.runner_cores
    return len(os.sched_getaffinity(0)) // 2


def builders_per_device(args: argparse.Namespace) -> int:
    """``--builders``, or the cores shared among the devices, one left to each (its tuners and runner); on
    the CPU with a runner of its own, the cores that are not the runner's, one left to the tuners."""
    cores = runner_cores(args)
    if args.builders or not cores:
        return _devices.builders_per_device(_devices.parse_devices(args.devices), args.builders)
    return max(1, len(os.sched_getaffinity(0)) - cores - 1)


def measured_target(target: str, cores: int) -> object:
    """The target the kernels are measured on: with a CPU runner of its own, this CPU with the runner's
    cores (what its kernels' threads get, and what the prompt and the records say)."""
    if target == "cpu" and cores:
        return dataclasses.replace(cpu_target(), cores=cores)
    return as_target(target)


@dataclass
class Stage:
    """Workloads tuned by tuners on the devices, one worker process each (``run_stage``); a workload's
    entry is a row of ``records/<name>.rows.jsonl`` once all its tunings have ended, and its trials are
    in ``records/<name>/<tuner>.jsonl``."""

    name: str
    cases: list[Case]
    tuners: list[str]
    trials: int
    model: str | None

    def rows_file(self, records: Path) -> Path:
        return records / f"{self.name}.rows.jsonl"

    def entries(self, records: Path) -> dict[str, dict]:
        """The finished workloads' entries, in the order of ``cases``."""
        rows = {r["name"]: r for r in _devices.read_rows(self.rows_file(records))}
        return {c.name: {k: v for k, v in rows[c.name].items() if k != "name"} for c in self.cases if c.name in rows}


def run_stage(stage: Stage, args: argparse.Namespace, records: Path, deadline: float,
              meanwhile: Callable[[], None] | None = None) -> bool:
    """Tune the workloads of ``stage`` not yet finished, spread over ``--devices`` (a worker process each,
    stopping at ``deadline``); ``meanwhile`` runs here while they work. True when every workload is done."""
    devices = _devices.parse_devices(args.devices)
    cores = runner_cores(args)
    builders = builders_per_device(args)
    done = stage.entries(records)
    todo = [c for c in stage.cases if c.name not in done]
    if todo and deadline and time.time() > deadline:
        print(f"{stage.name}: {len(todo)} workloads left, no time left (run the same command again)", flush=True)
        return False
    counts = [parse_tuner(t, stage.trials)[1] for t in stage.tuners]
    costs = {c.name: expected_seconds(c, sum(counts), builders) for c in todo}
    shares = _devices.spread(todo, lambda c: costs[c.name], devices)
    if todo:
        print(f"{stage.name}: {len(done)} of {len(stage.cases)} workloads done; expected per device: "
              + ", ".join(f"device {d} {sum(costs[c.name] for c in share):.0f} s ({len(share)} workloads)"
                          for d, share in shares.items()), flush=True)
    commands = {}
    for d, share in shares.items():
        if not share:
            continue
        job = {"stage": stage.name, "model": stage.model, "target": args.target, "tuners": stage.tuners,
               "trials": stage.trials, "batch": args.batch, "temperature": args.temperature, "seed": args.seed,
               "cases": [dataclasses.asdict(c) for c in share], "records_dir": str(records / stage.name),
               "rows": str(stage.rows_file(records)), "builders": builders, "runner_cores": cores,
               "deadline": deadline,
               "jobs": args.jobs or max(1, builders // args.batch + 1)}
        path = records / f"{stage.name}.gpu{d}.job.json"
        path.write_text(json.dumps(job, indent=1) + "\n")
        commands[d] = [sys.executable, str(Path(__file__).resolve()), "--worker", str(path)]
    procs = _devices.start(commands)
    try:
        if meanwhile is not None:
            meanwhile()
    finally:
        _devices.finish(procs, f"{stage.name} worker")
    missing = [c.name for c in stage.cases if c.name not in stage.entries(records)]
    if missing:
        print(f"{stage.name}: {len(missing)} of {len(stage.cases)} workloads not yet done (run the same command "
              f"again to resume): {', '.join(missing[:10])}", flush=True)
    return not missing


def worker(job_file: str) -> int:
    """One device's share of a stage (this process sees only that GPU): its workloads tuned by the
    stage's tuners, ``--jobs`` tunings at a time through one measurer (a builder pool and the device's
    runner), each workload's entry appended to the stage's rows as its tunings end. The model runs on
    the CPU here: the GPU times kernels, undisturbed. On the CPU with ``runner_cores``, this process
    keeps to the cores that are not the runner's, as the builders do."""
    job = json.loads(Path(job_file).read_text())
    kind = "cpu" if job["target"] == "cpu" else "cuda"
    cores = job.get("runner_cores", 0)
    target = measured_target(job["target"], cores)
    rows = Path(job["rows"])
    done = {r["name"] for r in _devices.read_rows(rows)}
    cases = [c for c in (Case(**c) for c in job["cases"]) if c.name not in done]
    with Measurer(measure_options(kind, job["builders"], cores)) as measurer:
        if cores:  # before torch starts its threads (each keeps the cores it started on)
            pin_process(measurer.partition.others)
        import torch
        torch.set_num_threads(2)  # the cores are the builders'
        model = resolve(job["model"], kind, device="cpu") if job["model"] is not None else None
        evaluate(model, cases, target, job["tuners"], job["trials"], job["batch"],
                 records_dir=job["records_dir"], measurer=measurer, temperature=job["temperature"],
                 seed=job["seed"], progress=False, jobs=job["jobs"], deadline=job["deadline"],
                 on_workload=lambda name, entry: _devices.append_row(rows, {"name": name, **entry}))
    return 0


def measured(args: argparse.Namespace) -> dict | None:
    """The measured evaluation (``--target``), as TLM's loop; None when it stopped before the end (at
    ``--max-seconds``: the same command resumes it)."""
    kind = "cpu" if args.target == "cpu" else "cuda"
    held = CPU_HELD_OUT if kind == "cpu" else gpu_cases(HELD_OUT, args.heldout)
    train = CPU_TRAIN if kind == "cpu" else gpu_cases(TRAIN, args.train_workloads)
    held, train = held[:args.heldout], train[:args.train_workloads]
    records = Path(args.records_dir).resolve()
    records.mkdir(parents=True, exist_ok=True)
    deadline = _devices.deadline_after(args.max_seconds)
    timings = Timings(records / "timings.json")
    base = args.model or ("default" if kind == "cpu" else None)
    if base is None:  # build the GPU model here, the held-out workloads excluded
        base = built_model(args, records, [key_of(c) for c in held], timings)
    tlm = resolve(base, kind)
    seen = corpus_keys(kind, tlm.meta.get("corpus", {}).get("networks", list(TRAIN)))
    overlap = [c.name for c in held if key_of(c) in seen or key_of(c) in {key_of(t) for t in train}]
    if overlap:
        raise SystemExit(f"held-out workloads seen in pretraining or fine-tuning: {overlap}")
    worker_deadline = deadline - FINISH_SECONDS if deadline else 0.0
    # 1. fine-tuning data: the training workloads tuned by the model
    prior: list[str] = []
    start = time.perf_counter()
    done = run_stage(Stage("train", train, ["tlm"], args.train_trials, base), args, records, worker_deadline,
                     meanwhile=lambda: prior.extend(cached_prior(args, records, kind, [key_of(c) for c in held])))
    timings.add("train_measure_s", time.perf_counter() - start)
    if not done:
        return None
    # 2. the model fine-tuned on their best configurations (and the analytical model's, on the GPU)
    tuned_dir = records / "model-ft"
    if not (tuned_dir / "tlm.json").exists():
        start = time.perf_counter()
        part = records / "model-ft.part"
        finetune(tlm, [records / "train" / "tlm.jsonl"], part, best=args.best, options=finetune_options(args),
                 progress=not args.quiet, extra=prior)
        replace_dir(part, tuned_dir)
        timings.add("finetune_s", time.perf_counter() - start)
    # 3. the held-out workloads, every tuner
    tuners = ["tlm", f"random@{args.trials}", f"xgb@{args.reference_trials}"]
    if kind == "cuda":
        tuners.append(f"analytical@{args.trials}")
    stage = Stage("heldout", held, tuners, args.trials, str(tuned_dir))
    start = time.perf_counter()
    done = run_stage(stage, args, records, worker_deadline)
    timings.add("heldout_s", time.perf_counter() - start)
    if not done:
        return None
    tuned = resolve(str(tuned_dir), kind)
    target = measured_target(args.target, runner_cores(args))
    result: dict = {"target": held[0].task(target).target.key, "trials": args.trials, "tuners": tuners,
                    "workloads": stage.entries(records),
                    "model": {"path": str(tuned_dir), "parameters": tuned.parameters, "meta": tuned.meta}}
    result["fine_tuning"] = {"workloads": [c.name for c in train], "trials_each": args.train_trials,
                             "best": args.best, "analytical_sentences": len(prior),
                             "finetuned_on": tuned.meta.get("finetuned_on", [{}])[-1]}
    result["generation_s_per_100"] = generation_seconds(tuned, held, target)
    result["summary"] = summarize(result, f"xgb@{args.reference_trials}")
    result["timings"] = timings.values
    result["parallel"] = {"devices": args.devices, "builders_per_device": builders_per_device(args),
                          "runner_cores": runner_cores(args), "jobs": args.jobs, "records": str(records),
        "trial_seconds": trial_seconds(records)}
    return result


def trial_seconds(records: Path) -> dict[str, dict[str, float]]:
    """Per stage: its trials and their median build and run seconds (what a longer run will cost)."""
    out = {}
    for stage in ("train", "heldout"):
        trials = [r for path in sorted((records / stage).glob("*.jsonl")) for r in RecordLog(path)]
        if trials:
            out[stage] = {"trials": len(trials), "build_s": round(float(np.median([r.build_s for r in trials])), 2),
                          "run_s": round(float(np.median([r.run_s for r in trials])), 3)}
    return out


FINISH_SECONDS = 30.0
"""Kept from ``--max-seconds`` for what follows the workers: fine-tuning, the generation timings, the report."""


def cached_prior(args: argparse.Namespace, records: Path, kind: str, exclude: list[str]) -> list[str]:
    """The analytical fine-tuning sentences of a GPU run (``analytical_prior``), kept in the records
    directory; none on the CPU (no template there has an analytical model)."""
    if kind == "cpu":
        return []
    path = records / "analytical.txt"
    if not path.exists():
        part = records / "analytical.txt.part"
        part.write_text("".join(f"{t}\n" for t in analytical_prior(args, as_target(args.target), exclude)))
        os.replace(part, path)
    return path.read_text().splitlines()


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
    records = Path(args.records_dir)
    records.mkdir(parents=True, exist_ok=True)
    timings = Timings(records / "timings.json")
    held_keys = [Workload.of(op, **shape).key for _, _, op, shape in TABLES.values()]
    base = args.model or built_model(args, records, held_keys, timings)
    tlm = resolve(base, "cuda")
    excluded = set(tlm.meta.get("corpus", {}).get("excluded", []))
    if not set(held_keys) <= excluded:
        raise SystemExit(f"the model's corpus does not exclude the table workloads {held_keys}")
    rows = {name: load_table(name) for name in TABLES}
    start = time.perf_counter()
    prior = analytical_prior(args, target, held_keys)
    timings.add("analytical_sentences_s", time.perf_counter() - start)
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
        timings.add(f"finetune_for_{name}_s", time.perf_counter() - start)
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
    report["timings"] = timings.values
    return report


def main() -> int:
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
                   help="tables and --target cuda: also fine-tune on the N configurations the analytical model "
                        "ranks fastest for each tensor-core layer of the training networks (default 4; 0: "
                        "measurements only)")
    p.add_argument("--finetune-epochs", type=float, default=20.0, help="fine-tuning epochs (default 20)")
    p.add_argument("--finetune-lr", type=float, default=1e-3, help="fine-tuning learning rate (default 1e-3)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--corpus-size", type=int, default=100_000, help="GPU corpus sentences (default 100000)")
    p.add_argument("--pretrain-minutes", type=float, default=30.0, help="GPU pretraining budget (default 30)")
    p.add_argument("--torch-threads", type=int, help="torch's threads for pretraining here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--out", help="the JSON record (default benchmarks/results/tlm-<target>-<date>.json)")
    p.add_argument("--devices", default="0", help="measured runs: the GPUs, one worker process each (0,1)")
    p.add_argument("--builders", type=int, default=0, help="measured runs: build processes per device "
                   "(default: the cores shared among the devices, one left to each; on the CPU the cores that "
                   "are not the runner's, one left to the tuners)")
    p.add_argument("--runner-cores", type=int, help="--target cpu: the cores of the process that times kernels "
                   "(its OpenMP threads), the builders and tuners on the others (default: half of the cores; 0: "
                   "every process on every core, the builders stopped while a kernel is timed)")
    p.add_argument("--jobs", type=int, default=0, help="measured runs: tunings at once per device, each "
                   "batch after batch (default: builders / batch + 1)")
    p.add_argument("--max-seconds", type=float, default=0, help="measured runs: stop the tunings this many "
                   "seconds after the start, less the last stage's 30 s (0: no limit); exit status 3: the same "
                   "command resumes")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # a job file: one device's share of a stage
    args = p.parse_args()
    if args.worker:
        return worker(args.worker)
    if args.tables == (args.target is not None):
        p.error("give --target cpu|cuda or --tables")
    start = time.perf_counter()
    report = tables(args) if args.tables else measured(args)
    if report is None:
        print(f"stopped after {time.perf_counter() - start:.0f} s; run the same command again to resume "
              f"(records in {args.records_dir})", flush=True)
        return _devices.RESUME
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
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
