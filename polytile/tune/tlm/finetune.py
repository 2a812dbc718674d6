"""Fine-tuning on measurements: the best configurations of each workload in tuning records, written as
tensor sentences, and a model trained on them.

As TLM's ``gen/make_dataset.py`` (``for_gen_best``) keeps the fastest programs of every measured
workload and ``gen/run_train_clm_best_*.py`` trains the pretrained model on them (10 epochs, constant
rate). A record names its template, workload and target by key; the task is rebuilt from them (a
plain Func's records cannot be: its algorithm is not in the file). Records of a configuration the
template's current space no longer holds are skipped, as a resumed tuning run skips them.

Without measurements, ``analytical_sentences`` gives the configurations a template's analytical model
ranks fastest (the tensor-core templates), for a GPU model built where no GPU is.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...errors import PolytileError
from ...target import DATASHEETS, CPUTarget, CUDATarget, cpu_target
from ..records import Record, RecordLog
from ..space import TuneError
from ..task import Task, Workload, find_template
from .model import TLM, resolve
from .sentence import sentence
from .train import FINETUNE, TrainOptions, fit


@dataclass
class Report:
    """What a set of records gave: workloads and sentences used, and why others were skipped."""

    workloads: int = 0
    sentences: int = 0
    skipped: list[str] = field(default_factory=list)


def target_of(key: str) -> CPUTarget | CUDATarget:
    """The target a records key names (``cpu:MODEL:2c:512b``, ``cuda:NAME:sm_90a``): this machine's
    when the key is its own, else the facts the key gives (a GPU's by the datasheet of its arch)."""
    here = cpu_target()
    if key == here.key:
        return here
    parts = key.split(":")
    if parts[0] == "cpu" and len(parts) >= 4 and re.fullmatch(r"\d+c", parts[-2]) and re.fullmatch(r"\d+b",
                                                                                                    parts[-1]):
        return CPUTarget(cores=int(parts[-2][:-1]), vector_bits=int(parts[-1][:-1]), model=":".join(parts[1:-2]))
    if parts[0] == "cuda" and len(parts) >= 3:
        arch = parts[-1]
        if arch in DATASHEETS:
            return CUDATarget(arch=arch, name=":".join(parts[1:-1]))  # the other facts: the datasheet's
    raise TuneError(f"target key {key!r} names no target polytile knows")


def task_of(record: Record) -> Task:
    """The task of a record (TuneError when it cannot be rebuilt)."""
    template_name, _, rest = record.workload.partition("/")
    workload_key = rest.rsplit("/", 1)[0]
    m = re.fullmatch(r"(\w+)\((.*)\)", workload_key)
    if m is None:
        raise TuneError(f"workload {workload_key!r} is not a library operator (a plain Func's records "
                        "cannot be replayed without the Func)")
    shape: dict[str, object] = {}
    for item in filter(None, m.group(2).split(",")):
        key, _, text = item.partition("=")
        shape[key] = _number(text)
    target = target_of(record.target)
    template = find_template(m.group(1), target.kind, template_name)
    return Task(template, Workload.of(m.group(1), **shape), target)


def _number(text: str) -> object:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def best_sentences(records: Iterable[Record], best: int = 4) -> tuple[list[str], Report]:
    """The sentences of the ``best`` fastest distinct configurations of every workload and target."""
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        if r.ok and math.isfinite(r.cost):
            groups.setdefault((r.workload, r.target), []).append(r)
    texts: list[str] = []
    report = Report()
    for (workload, target), recs in groups.items():
        try:
            task = task_of(recs[0])
            seen: set[str] = set()
            chosen = []
            for r in sorted(recs, key=lambda r: r.cost):
                if r.config_key not in seen and len(chosen) < best:
                    seen.add(r.config_key)
                    chosen.append(sentence(task, r.config))
        except PolytileError as err:
            report.skipped.append(f"{workload} on {target}: {err}")
            continue
        texts += chosen
        report.workloads += 1
    report.sentences = len(texts)
    return texts, report


def analytical_sentences(tasks: Iterable[Task], top: int = 4, pool: int = 512, seed: int = 0) -> list[str]:
    """The sentences of the ``top`` configurations a template's analytical model predicts fastest among
    ``pool`` uniformly drawn valid ones, for each task whose template has a model (the tensor-core
    templates; the others are passed over). Fine-tuning on them teaches a model what fast schedules
    look like on a GPU without measuring one, as ALCOP pre-trains its XGBoost model on the analytical
    model; TLM itself had only measurements."""
    rng = np.random.default_rng(seed)
    texts: list[str] = []
    for task in tasks:
        if task.template.model is None:
            continue
        drawn = task.space.sample_valid(rng, pool)
        predicted = task.predict([task.space.config(d).values for d in drawn])
        texts += [sentence(task, task.space.config(drawn[k])) for k in np.argsort(predicted, kind="stable")[:top]]
    return texts


def finetune(model: object, records: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str] | None,
             best: int = 4, options: TrainOptions = FINETUNE, *, half: bool = False, progress: bool = True,
             device: str | None = None, extra: Sequence[str] = ()) -> tuple[TLM, Report]:
    """Fine-tune ``model`` (a directory, "default" or a TLM) on the best configurations of the records
    files and the sentences ``extra`` (e.g. ``analytical_sentences``); saved to ``out`` when given.
    TuneError when the records give nothing for this model's kind."""
    tlm = resolve(model, device=device)
    loaded: list[Record] = []
    for path in records:
        log = RecordLog(path)
        log.check()
        if not log.path.exists():
            raise TuneError(f"records file {path} does not exist")
        loaded += [r for r in log if r.target.split(":", 1)[0] == tlm.kind]
    texts, report = best_sentences(loaded, best)
    if not texts:
        raise TuneError(f"the records hold no successful trial of a {tlm.kind} workload to fine-tune on"
                        + (f" ({len(report.skipped)} skipped: {report.skipped[0]})" if report.skipped else ""))
    fit(tlm, [*texts, *extra], options, stage="finetune", progress=progress)
    tlm.meta.setdefault("finetuned_on", []).append({"records": [str(p) for p in records], "best": best,
                                                    "workloads": report.workloads, "sentences": report.sentences,
                                                    "extra_sentences": len(extra)})
    if out is not None:
        tlm.save(out, half=half)
    return tlm, report
