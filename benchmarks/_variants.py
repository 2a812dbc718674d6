"""Shared by the benchmarks that compare schedule variants of one workload beside torch
(``conv_choices.py``, ``split_tails.py``): the variants built in spawned processes, and the
variants and torch timed interleaved round by round (medians)."""

from __future__ import annotations

import multiprocessing
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any


def build_all(build: Callable[[Any], tuple[object | None, str]], jobs: Sequence[Any], workers: int) -> list:
    """``build(job)`` -> (kernel or None, error) for every job, in parallel; spawned, not forked: the
    parent may have initialized CUDA (the target's facts)."""
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(build, jobs, chunksize=1))


def time_interleaved(fn: Callable[..., object], inputs: Sequence[object], kernels: dict[str, Any],
                     rounds: int = 3, repeat: int = 20) -> tuple[float, dict[str, float]]:
    """Seconds of torch's ``fn(*inputs)`` and of each of ``kernels`` (by label), each the median of
    ``rounds`` rounds in which torch and every kernel are timed once (``repeat`` launches)."""
    from polytile.runtime.timing import time_gpu
    ours: dict[str, list[float]] = {label: [] for label in kernels}
    theirs = []
    for _ in range(rounds):
        theirs.append(time_gpu(lambda: fn(*inputs), repeat=repeat))
        for label, kern in kernels.items():
            ours[label].append(kern.benchmark(*inputs, repeat=repeat))
    return statistics.median(theirs), {label: statistics.median(t) for label, t in ours.items()}
