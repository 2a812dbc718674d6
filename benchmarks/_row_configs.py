"""What ``narrow_rows.py`` and ``row_clusters.py`` share: the row templates' configurations a benchmark
asks for (those the space offers), their builds in parallel, and their check and timing beside torch
(CUDA-event medians of single launches, L2 flushed, prepared arguments; every configuration and torch
interleaved round by round, medians of the rounds)."""

from __future__ import annotations

import json
import os
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import shapes


def offered(task: Any, wanted: list[dict]) -> list[dict]:
    """The values of ``wanted`` that ``task``'s space offers and finds valid, each once, in order."""
    out: list[dict] = []
    for v in wanted:
        try:
            config = task.space.from_values(v)
        except Exception:  # noqa: BLE001 - a value the space does not offer
            continue
        if task.space.is_valid(config.digits) and config.values not in out:
            out.append(config.values)
    return out


def _build(job: tuple[shapes.Workload, dict]):  # noqa: ANN202
    w, config = job
    name, kern, seconds = shapes.build_config(w, config)
    return name, json.dumps(config, sort_keys=True), kern, seconds


def measure(jobs: list[tuple[shapes.Workload, dict]], rounds: int, repeat: int) -> list[dict]:
    """Build every (workload, configuration) of ``jobs`` in parallel, then per workload check each
    kernel against the float64 reference and time the correct-or-not ones beside torch, interleaved:
    a row per configuration (an error where it did not build), printed as it comes. The first
    configuration of a workload is its default."""
    import torch

    from polytile.runtime.timing import rel_error, time_gpu
    with ProcessPoolExecutor(max(1, min(16, (os.cpu_count() or 2) - 1))) as ex:
        built = list(ex.map(_build, jobs))
    rows: list[dict] = []
    for w in dict.fromkeys(w for w, _ in jobs):
        op = w.op()
        inputs, fn, ref_fn = shapes.torch_case(w, op, seed=1)
        ref = ref_fn()
        torch_err = rel_error(fn(*inputs).reshape(ref.shape), ref)
        mine = [(json.loads(c), k, s) for n, c, k, s in built if n == w.name]
        ready = []
        for config, kern, build_s in mine:
            row = {"name": w.name, "config": config, "default": config == mine[0][0], "build_s": build_s}
            if isinstance(kern, str):
                rows.append({**row, "error": kern})
                print(json.dumps(rows[-1]), flush=True)
                continue
            out = kern(*inputs)
            err = rel_error(out.reshape(ref.shape), ref)
            (k,) = kern.kernels
            row.update(rel_error=err, torch_rel_error=torch_err, tolerance=op.tolerance,
                       correct=bool(err <= op.tolerance), grid=[str(g) for g in k.grid], block=list(k.block),
                       cluster=k.cluster,
                       registers=kern.resources[k.name].registers if k.name in kern.resources else None)
            ready.append((row, kern, out, [], []))
        for _ in range(rounds):  # the configurations and torch interleaved, round by round
            for _row, kern, out, ours, theirs in ready:
                ours.append(kern.benchmark(*inputs, torch.empty_like(out), repeat=repeat))
                theirs.append(time_gpu(lambda fn=fn, inputs=inputs: fn(*inputs), repeat=repeat))
        for row, _, _, ours, theirs in ready:
            t, tb = statistics.median(ours), statistics.median(theirs)
            row.update(polytile_us=t * 1e6, torch_us=tb * 1e6, speed=tb / t, polytile_gbs=op.bytes_moved / t / 1e9)
            rows.append(row)
            print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    return rows


def write(path: str, summary: dict, rows: list[dict]) -> None:
    """Print ``summary``; with ``path``, the JSON record (device, commit, summary, rows) there."""
    print(json.dumps(summary), flush=True)
    if path:
        Path(path).write_text(json.dumps({"gpu": shapes.gpu_record(), "commit": shapes.git_commit(),
                                          "summary": summary, "rows": rows}, indent=1))
