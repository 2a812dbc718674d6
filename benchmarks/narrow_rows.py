"""Narrow rows (issue 15, item 3): softmax and layernorm over rows of 1 to 512 elements, the default
schedule (``gpu_schedules.row_plan``: several rows a block, each a part of a warp, for rows narrower
than a warp; one block a row for wider ones) beside torch, and with ``--variants`` several rows a
block at every width and its neighbours in the tuning template (lanes a row, rows a block, the rows
in shared memory, 16-byte reads where the rows are aligned), each checked against a float64
reference and timed kernel-only: what decides whether several rows a block (and 16-byte reads)
become the default up to ``NARROW_ROW``.

Timing as ``shapes.py``'s kernel column: CUDA-event medians of single launches, L2 flushed before
each, prepared arguments, interleaved with torch in rounds (medians of the rounds; every configuration of
a workload in each round).

    python benchmarks/narrow_rows.py [--variants] [--only PATTERN] [--rounds 3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _row_configs  # noqa: E402 - the configurations' builds, checks and timings
import shapes  # noqa: E402 - the suite's workloads, builders and torch cases

WORKLOADS = [shapes._w(f"{kind}.{M}x{N}.{dt}", kind, dt, "rows", M=M, N=N)
             for kind in ("softmax", "layernorm")
             for M, N, dt in [(8192, 64, "float32"), (100000, 20, "float32"), (4096, 128, "float32"),
                              (1000, 7, "float32"), (65536, 32, "float32"), (16384, 256, "float32"),
                              (16384, 512, "float32"), (8192, 64, "float16"), (100000, 20, "bfloat16"),
                              (1001, 97, "float32"), (1, 7, "float32")]]
"""The narrow shapes (none in the suite, whose rows are 768 to 128256 wide)."""

WIDER = [shapes._w("softmax.3000x1000.float32", "softmax", "float32", "rows", M=3000, N=1000),
         shapes._w("layernorm.2048x768.float32", "layernorm", "float32", "rows", M=2048, N=768),
         shapes._w("softmax.12288x1024.float32", "softmax", "float32", "rows", M=12288, N=1024)]
"""Suite widths (one row a block by default), with ``--variants`` also timed as several warps' rows a block."""


def variants(w: shapes.Workload) -> list[dict]:
    """The default configuration, then several rows a block as the defaults of rows narrower than a
    warp choose them (``_row_lanes`` lanes a row, ``_narrow_rows`` rows) and their neighbours in the
    template's space (valid ones)."""
    from polytile.ops.gpu_schedules import _narrow_rows, _row_lanes
    from polytile.tune import make_task
    task = make_task(w.kind, "cuda", **w.arguments())
    d = task.space.default.values
    M, N = dict(w.dims)["M"], dict(w.dims)["N"]
    t = _row_lanes(N)
    r = _narrow_rows(task.target, M, t)
    widest = 16 // task.op.func.inputs[0].dtype.itemsize  # elements of a 16-byte read
    several = {"threads": t, "rows": r, "shared_row": False, "vec": 1}
    wanted = [d, several, {**several, "shared_row": True}, {**several, "threads": max(1, t // 2)},
              {**several, "rows": 2 * r}, {**several, "rows": max(1, r // 2)},
              {**several, "threads": 32, "rows": 4}, {**several, "threads": 32, "rows": 8},
              {"threads": 32, "rows": 4, "shared_row": True, "vec": 1}, {"threads": 32, "rows": 1, "shared_row": True,
                                                                         "vec": 1}]
    # 16-byte reads: each thread ``widest`` elements, as many lanes as the row has reads (up to 32)
    lanes = max(x for x in (1, 2, 4, 8, 16, 32) if x <= max(1, N // widest))
    wanted += [{**several, "vec": widest, "threads": lanes, "rows": _narrow_rows(task.target, M, lanes)},
               {**d, "vec": widest, "shared_row": False}]
    return _row_configs.offered(task, wanted)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", action="store_true", help="also time the template's neighbours of the default")
    ap.add_argument("--only", default="", help="workload name patterns, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    ws = shapes.select(WORKLOADS + (WIDER if args.variants else []), args.only)
    jobs = [(w, c) for w in ws for c in (variants(w) if args.variants else [variants(w)[0]])]
    rows = _row_configs.measure(jobs, args.rounds, args.repeat)
    defaults = [r for r in rows if r["default"] and "speed" in r]
    summary = {"defaults": len(defaults), "all_correct": all(r.get("correct") for r in rows),
               "geomean_speed": statistics.geometric_mean([r["speed"] for r in defaults]) if defaults else None,
               "min_speed": min((r["speed"] for r in defaults), default=None)}
    _row_configs.write(args.out, summary, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
