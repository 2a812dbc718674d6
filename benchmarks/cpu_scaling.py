"""How this machine's parallel CPU kernels scale with the runner's cores: the default schedules of a few
layers of the TLM benchmark's training networks, each timed by a runner on 1, 2, 4, … of its own cores
(``MeasureOptions.runner_cores``, the builders on the others) and by one that shares every core
(``runner_cores=0``, the builders stopped while it times), the target's core count that of the runner.
A check before a long ``tlm.py --target cpu`` run: on a machine whose parallel kernels do not scale,
serial schedules win and the tuners' comparison says little.

    python benchmarks/cpu_scaling.py [--cores 1,8,32,0] [--out FILE.json]

Prints a table (ms, and the speed over one core) and the CPU time the host took from this machine
meanwhile (``steal`` in /proc/stat, a virtual machine's share its host gave to others).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polytile.target import cpu_target  # noqa: E402
from polytile.tune import MeasureOptions, Measurer, make_task  # noqa: E402

LAYERS = [  # layers of networks.TRAIN (benchmarks/tlm.py's CPU_TRAIN)
    ("bert-base:softmax", "softmax", dict(M=1536, N=128)),
    ("bert-base:proj", "matmul", dict(M=128, N=768, K=768)),
    ("resnet-50:3x3-c4", "conv2d", dict(N=1, C=256, H=14, W=14, K=256, R=3, S=3, stride=1, padding=1)),
]


def steal_ticks() -> int:
    """Ticks the host took from this (virtual) machine since boot (0 where /proc/stat does not say)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return 0
    return int(fields[8]) if len(fields) > 8 else 0


def time_defaults(runner_cores: int) -> dict[str, float]:
    """Each layer's default schedule for a CPU of the runner's cores (all of them for 0), timed there."""
    cores = runner_cores or len(os.sched_getaffinity(0))
    target = dataclasses.replace(cpu_target(), cores=cores)
    options = MeasureOptions(runner_cores=runner_cores, repeat=20, warmup=3, min_time=0.1, retime=0,
                             result_cache=False)
    out = {}
    with Measurer(options) as measurer:
        for name, op, shape in LAYERS:
            task = make_task(op, target, **shape)
            (res,) = measurer.measure(task, [task.space.default.values])
            out[name] = res.cost if res.ok else float("nan")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mine = len(os.sched_getaffinity(0))
    counts = [c for c in (1, 2, 4, 8, 16, 32, 64) if c < mine] + [0]
    p.add_argument("--cores", default=",".join(map(str, counts)), help="runner core counts (0: share every core)")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    start, steal = time.time(), steal_ticks()
    rows = {int(c): time_defaults(int(c)) for c in args.cores.split(",")}
    hz = os.sysconf("SC_CLK_TCK")
    stolen = (steal_ticks() - steal) / hz / max(time.time() - start, 1e-9) / mine
    base = rows.get(1)
    print(f"{cpu_target().model}, {mine} cores; default schedules, ms (speed over one core)")
    for c, times in rows.items():
        label = f"{c} cores" if c else f"all {mine}, shared"
        cells = [f"{name} {t * 1e3:.3f}" + (f" ({base[name] / t:.1f}x)" if base else "") for name, t in times.items()]
        print(f"  {label:>14}: " + "; ".join(cells))
    print(f"steal: {100 * stolen:.1f}% of the cores' time during the probe; load average {os.getloadavg()}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "cores": mine,
            "target": cpu_target().key, "seconds": {str(c): t for c, t in rows.items()},
            "steal_share": stolen}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
