"""Work spread over GPUs, one process per GPU, resumable through files of rows (``shapes.py --tune``,
``tlm.py --devices``).

A benchmark splits its workloads among the devices by expected cost (``spread``), writes each
device's share to a file and starts one process per device that sees only its GPU
(``start``/``finish``); each process appends a JSON row per finished workload to a shared file
(``append_row``, locked), so a call cut by ``--max-seconds`` or killed resumes from what the rows
and the tuning records hold: the same command hands out only what is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

RESUME = 3
"""The exit status of a call that stopped before the end: the same command resumes it."""


TRIAL_SECONDS = {"gemv": 3.0, "wgmma": 3.5, "cuda": 5.0, "igemm": 5.0, "conv2d": 10.0, "rows": 1.5}
"""Builder seconds of one trial (lowering and nvcc) by template family on the 2× H200 host's Xeon
(the lead's probe, 2026-11-28: median build_s 2.4–5.0 s per trial of GEMMs and convolutions;
here, on 2 loaded cores, 4–10 s): what ``expected_seconds`` balances the devices with."""
RUN_SECONDS = 0.3
"""The runner's seconds per trial (load, check against the reference, time): the bound when the
builders keep ahead of it."""


def expected_seconds(trials: int, family: str, builders: int) -> float:
    """The wall time of ``trials`` trials of a template ``family`` with ``builders`` build processes: the
    builds or the runner bound the trials, whichever is slower."""
    return trials * max(TRIAL_SECONDS[family] / max(1, builders), RUN_SECONDS)


def parse_devices(text: str) -> list[int]:
    """``"0,1"`` → [0, 1]."""
    return [int(d) for d in text.split(",") if d.strip()]


def builders_per_device(devices: Sequence[int], builders: int = 0) -> int:
    """Build processes per device: ``builders``, or the cores shared among the devices, one left to each
    (its tuner and runner)."""
    return builders or max(1, (os.cpu_count() or 2) // len(devices) - 1)


def deadline_after(max_seconds: float) -> float:
    """The wall-clock time (``time.time``) ``max_seconds`` from now; 0: none."""
    return time.time() + max_seconds if max_seconds else 0.0


def spread(items: Sequence[T], cost: Callable[[T], float], devices: Sequence[int]) -> dict[int, list[T]]:
    """The items of each device, balanced by expected cost (longest first to the least loaded device);
    each device's list keeps the items' order."""
    load = {d: 0.0 for d in devices}
    owner: dict[int, int] = {}
    for k in sorted(range(len(items)), key=lambda k: -cost(items[k])):
        d = min(devices, key=lambda d: (load[d], list(devices).index(d)))
        owner[k] = d
        load[d] += cost(items[k])
    return {d: [item for k, item in enumerate(items) if owner[k] == d] for d in devices}


def start(commands: dict[int, list[str]]) -> list[tuple[int, subprocess.Popen]]:
    """One process per device, each seeing only its GPU (``CUDA_VISIBLE_DEVICES``)."""
    return [(d, subprocess.Popen(cmd, env={**os.environ, "CUDA_VISIBLE_DEVICES": str(d)}))
            for d, cmd in commands.items()]


def finish(procs: list[tuple[int, subprocess.Popen]], what: str = "process") -> dict[int, int]:
    """Wait for the processes of ``start``; their exit statuses by device (a failure is said)."""
    status = {}
    for d, proc in procs:
        status[d] = proc.wait()
        if status[d]:
            print(f"the {what} of GPU {d} ended with status {status[d]}", flush=True)
    return status


def read_rows(path: Path) -> list[dict]:
    """The JSON rows of ``path`` in order (none when it is absent; a line cut by a kill is skipped)."""
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def append_row(path: Path, row: dict) -> None:
    """Append one row, locked (the devices' processes share the file) and synced; a line cut by a killed
    writer is ended first (as the tuning records are appended)."""
    from polytile.tune.records import append_line
    append_line(path, json.dumps(row, default=str))
