"""The pretraining corpus: random valid tensor sentences of real networks' layers on several targets,
made without measuring anything (as TLM's ``gen/make_dataset.py`` writes the programs Ansor samples).

Every layer of the chosen networks (``networks``) becomes a workload for each target of the kind:
CPUs of several core counts and vector widths, GPUs of several architectures (their datasheet facts,
no GPU needed); each workload is tuned by every registered template that applies to it (found from
the template registry, so a new template joins the corpus by itself), and on the CPU also by the
templates of plain Funcs (the layer's algorithm as a Func). Each task contributes uniformly
drawn valid configurations, as many as the corpus size allows per task (all of a small space; a
template of plain Funcs a quarter share).

A corpus file is one sentence per line after a header line ``# polytile-tlm-corpus {json}`` (target
kind, networks, targets, counts, seed, and the words of every choice of every decision of its tasks,
drawn or not, which the vocabulary includes).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import PolytileError
from ...target import DATASHEETS, CPUTarget, CUDATarget
from ..space import TuneError
from ..task import Task, list_templates, make_task
from .networks import TRAIN, layers
from .sentence import config_words, decision_words, prompt_words, split_sentence

HEADER = "# polytile-tlm-corpus "
CPU_SHAPES = ((2, 512), (8, 256), (32, 512), (4, 128))  # (cores, vector bits) of the corpus's CPUs
GPU_ARCHS = ("sm_80", "sm_90a")


def targets(kind: str) -> list[CPUTarget | CUDATarget]:
    """The targets a corpus for ``kind`` ("cpu" or "cuda") covers."""
    if kind == "cpu":
        return [CPUTarget(cores=c, vector_bits=b, model=f"corpus-{c}c-{b}b") for c, b in CPU_SHAPES]
    if kind == "cuda":
        return [CUDATarget(arch=a, name=str(DATASHEETS[a]["name"])) for a in GPU_ARCHS]
    raise TuneError(f"unknown target kind {kind!r}; use 'cpu' or 'cuda'")


def workloads(kind: str, names: Sequence[str] = TRAIN) -> list[tuple[str, str, dict[str, object]]]:
    """(network, operator, arguments) of the layers of ``names`` as tuned on targets of ``kind``: on the
    GPU, matrix products in float16 (tensor cores) and float32, convolutions as float16 implicit GEMMs
    at batch 32 and float32 direct convolutions at batch 1."""
    out = []
    for network, op, args in layers(names):
        if kind == "cpu":
            out.append((network, op, args))
        elif op == "conv2d":
            nhwc = {k: v for k, v in args.items() if k != "dilation"}
            out += [(network, "conv2d_igemm", {**nhwc, "N": 32}), (network, op, args)]
        elif op in ("matmul", "batch_matmul", "dense"):
            out += [(network, op, {**args, "dtype": "float16"}), (network, op, args)]
        else:
            out.append((network, op, args))
    return out


def tasks(kind: str, names: Sequence[str] = TRAIN, exclude: frozenset[str] = frozenset(),
          ) -> Iterator[tuple[str, Task]]:
    """(network, task) for every layer, target and applicable template; workloads whose key is in
    ``exclude`` (held out) are left out."""
    templates = [t for t in list_templates() if t.kind == kind]
    generic = [t for t in templates if t.op == "func"]  # the templates of plain Funcs
    for target in targets(kind):
        for network, op_name, args in workloads(kind, names):
            candidates = [t for t in templates if t.op == op_name]
            if not candidates:
                continue
            try:
                first = make_task(op_name, target, candidates[0], **args)
                op = first.op
            except PolytileError:
                continue
            if first.workload.key in exclude:
                continue
            for t in candidates:
                if t.applies is None or t.applies(op, target):
                    yield network, Task(t, first.workload, target, op)
            for t in generic:
                task = make_task(op.func, target, t)
                if t.applies is None or t.applies(task.op, target):  # e.g. not torch's imported groups
                    yield network, task


def write_corpus(path: str | os.PathLike[str], kind: str = "cpu", size: int = 100_000,
                 names: Sequence[str] = TRAIN, exclude: Sequence[str] = (), seed: int = 0,
                 progress: bool = True, workers: int = 1) -> dict[str, Any]:
    """Write about ``size`` random valid sentences to ``path``; returns the header written first.
    ``workers`` > 1: the tasks' configurations are drawn in that many processes, each task from a
    generator seeded by the seed and the task's place (another corpus than one process draws, as
    reproducible)."""
    if size < 1:
        raise TuneError(f"a corpus needs a positive size, got {size}")
    start = time.perf_counter()
    out = Path(path)
    if out.is_dir():
        raise TuneError(f"corpus path {out} is a directory; give a file name such as {out / 'corpus.txt'}")
    found = list(tasks(kind, names, frozenset(exclude)))
    if not found:
        raise TuneError(f"no template applies to the layers of {', '.join(names)} on {kind} targets")
    spaces: list[tuple[str, Task]] = []
    skipped: list[str] = []
    for network, task in found:
        try:
            task.space  # noqa: B018 - defines it; a template failing on a workload is skipped
            spaces.append((network, task))
        except PolytileError as err:
            skipped.append(f"{task.template.name} on {task.workload.key}: {err}")
    # a template of plain Funcs gets a quarter share: it is the fallback, not the usual case
    weight = [0.25 if t.template.op == "func" else 1.0 for _, t in spaces]
    per_share = size / sum(weight)
    rng = np.random.default_rng(seed)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(spaces), desc=f"corpus ({kind})", unit="task", dynamic_ncols=True)
    counts = [math.ceil(w * per_share) for w in weight]
    if workers > 1:
        drawn = _draw_in_processes([t for _, t in spaces], counts, seed, workers, bar)
    else:
        drawn = []
        for (_, task), n in zip(spaces, counts, strict=True):
            drawn.append(set(task.space.sample_valid(rng, n)))
            if bar is not None:
                bar.update(1)
    # small spaces hold fewer valid configurations than their share: the larger ones make up for them,
    # in rounds, until the size is reached or every space that could give more has given all it has
    large = [k for k, (_, t) in enumerate(spaces) if len(drawn[k]) >= weight[k] * per_share
             and t.template.op != "func"]
    deficit = size - sum(len(d) for d in drawn)
    while deficit > 0 and large:
        share = math.ceil(deficit / len(large))
        full = []
        for k in large:
            more = spaces[k][1].space.sample_valid(rng, share, drawn[k])
            drawn[k].update(more)
            if len(more) == share:
                full.append(k)
        deficit = size - sum(len(d) for d in drawn)
        large = full
    lines: list[str] = []
    words: set[str] = set()  # every choice of every decision, drawn or not: the vocabulary covers them
    for (_, task), configs in zip(spaces, drawn, strict=True):
        words.update(w for dw in decision_words(task.space) for w in dw.words)
        prompt = " ".join(prompt_words(task))
        for digits in sorted(configs):
            lines.append(f"{prompt} [SEP] {' '.join(config_words(task.space, task.space.config(digits)))}")
    if bar is not None:
        bar.close()
    order = rng.permutation(len(lines))
    header = {"target_kind": kind, "networks": list(names), "targets": [t.key for t in targets(kind)],
              "tasks": len(spaces), "sentences": len(lines), "seed": seed,
              "templates": sorted({t.template.name for _, t in spaces}),
              "workloads": sorted({t.workload.key for _, t in spaces}), "excluded": sorted(exclude),
              "skipped": skipped, "seconds": round(time.perf_counter() - start, 1), "words": sorted(words)}
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        f.write(HEADER + json.dumps(header, separators=(",", ":")) + "\n")
        for k in order:
            f.write(lines[k] + "\n")
    return header


def _draw(task: Task, n: int, seed: tuple[int, int]) -> list[tuple[int, ...]]:
    """``n`` valid configurations of ``task`` drawn with a generator of its own (in a worker process)."""
    return task.space.sample_valid(np.random.default_rng(seed), n)


def _draw_in_processes(tasks: list[Task], counts: list[int], seed: int, workers: int,
                       bar: Any) -> list[set[tuple[int, ...]]]:
    from ..workers import Returned, WorkerPool
    pool = WorkerPool(workers, {"OMP_NUM_THREADS": "1"})
    try:
        outcomes = pool.map(_draw, [(t, n, (seed, k)) for k, (t, n) in enumerate(zip(tasks, counts, strict=True))],
                            timeout=600.0, on_done=lambda k, _: bar.update(1) if bar is not None else None)
    finally:
        pool.close()
    drawn = []
    for task, outcome in zip(tasks, outcomes, strict=True):
        if not isinstance(outcome, Returned):
            raise TuneError(f"drawing configurations of {task.template.name} on {task.workload.key} failed: "
                            f"{outcome}")
        drawn.append(set(outcome.value))
    return drawn


def read_corpus(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[str]]:
    """The header and sentences of a corpus file; TuneError when it is not one."""
    src = Path(path)
    if not src.is_file():
        raise TuneError(f"corpus {src} does not exist or is not a file; write one with `polytile tlm corpus`")
    with open(src, encoding="utf-8", errors="replace") as f:
        first = f.readline()
        if not first.startswith(HEADER):
            raise TuneError(f"{src} is not a TLM corpus (its first line is not '{HEADER.strip()} {{...}}'); "
                            "write one with `polytile tlm corpus`")
        try:
            header = json.loads(first[len(HEADER):])
        except json.JSONDecodeError as err:
            raise TuneError(f"{src}: the corpus header is damaged ({err})") from None
        texts = []
        for lineno, line in enumerate(f, 2):
            line = line.strip()
            if not line:
                continue
            try:
                split_sentence(line)
            except TuneError as err:
                raise TuneError(f"{src}:{lineno}: {err}") from None
            texts.append(line)
    if not texts:
        raise TuneError(f"corpus {src} holds no sentence")
    return header, texts
