"""Few wide rows (issue 15): softmax and layernorm over 1 to 64 rows of 12K to 128K elements, one block
a row (the template's default where ``gpu_schedules.row_cluster`` keeps it, and with
``POLYTILE_ROW_CLUSTERS=0``) beside each row split over the blocks of a thread-block cluster (the rule's
blocks, 2 at least, and their neighbours, 4- or 8-element reads where the rows are 16-byte aligned) and
torch, each checked against a float64 reference and timed kernel-only in the same process: what decided
that the split is the default (``ROW_CLUSTERS_DEFAULT``).

Timing as ``shapes.py``'s kernel column: CUDA-event medians of single launches, L2 flushed before
each, prepared arguments, interleaved with torch in rounds (medians of the rounds).

    python benchmarks/row_clusters.py [--only PATTERN] [--rounds 3] [--out FILE.json]
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
             for kind, M, N, dt in [("softmax", 32, 128256, "float32"), ("softmax", 1, 128256, "float32"),
                                    ("softmax", 8, 50257, "float32"), ("layernorm", 16, 128256, "float32"),
                                    ("softmax", 4, 128257, "float32"), ("softmax", 16, 128256, "bfloat16"),
                                    ("layernorm", 1, 50257, "float32"), ("softmax", 64, 32000, "float32"),
                                    ("layernorm", 3, 12345, "float32")]]
"""The suite's few wide rows (softmax.vocab.llama 32x/1x128256, softmax.vocab.gpt2.8x50257,
layernorm.wide.16x128256), then shapes off the suite (odd widths, bfloat16, LLaMA-2's 32000)."""


def variants(w: shapes.Workload) -> list[dict]:
    """The default, one block a row (as before the split), the rule's split (2 blocks at least), with
    16-byte reads where the rows are aligned, half and twice its blocks, one block a row with 16-byte
    reads (valid configurations of the template only)."""
    from polytile.ops.gpu_schedules import row_cluster, row_plan
    from polytile.tune import make_task
    task = make_task(w.kind, "cuda", **w.arguments())
    d = task.space.default.values
    M, N = dict(w.dims)["M"], dict(w.dims)["N"]
    itemsize = task.op.func.inputs[0].dtype.itemsize
    blocks = max(2, row_cluster(task.target, M, N, itemsize))  # 2 at least: a split to time
    widest = 16 // itemsize
    split = {**d, "shared_row": False, "rows": 1, "threads": 1024, "vec": 1, "cluster": blocks}
    one = row_plan(task.target, w.kind, N, itemsize, M=M, cluster=1)  # one block a row, as before
    before = {"threads": one.threads, "rows": one.rows, "shared_row": one.shared_row, "vec": 1, "cluster": 1}
    wanted = [d, before, split, {**split, "vec": widest}, {**split, "cluster": blocks // 2},
              {**split, "cluster": 2 * blocks}, {**split, "cluster": blocks // 2, "vec": widest},
              {**split, "cluster": 2 * blocks, "vec": widest}, {**before, "vec": widest, "shared_row": False}]
    return _row_configs.offered(task, wanted)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="workload name patterns, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    ws = shapes.select(WORKLOADS, args.only)
    rows = _row_configs.measure([(w, c) for w in ws for c in variants(w)], args.rounds, args.repeat)
    summary = {"all_correct": all(r.get("correct") for r in rows)}
    for kind in ("default", "before", "split"):  # the default; one block a row; the rule's split (2 at least)
        picked = [r for r in rows if "speed" in r and (
            r["default"] if kind == "default" else r["cluster"] == 1 and r["config"]["vec"] == 1 if kind == "before"
            else r["cluster"] > 1 and r["config"]["vec"] == 1 and r["config"]["cluster"] == _rule(r))]
        summary[f"{kind}_geomean_speed"] = statistics.geometric_mean([r["speed"] for r in picked]) if picked else None
    _row_configs.write(args.out, summary, rows)
    return 0


def _rule(row: dict) -> int:
    from polytile.ops.gpu_schedules import row_cluster
    from polytile.target import as_target
    M, N = (int(x) for x in row["name"].split(".")[1].split("x"))
    itemsize = {"float16": 2, "bfloat16": 2}.get(row["name"].split(".")[-1], 4)
    return max(2, row_cluster(as_target("cuda"), M, N, itemsize))


if __name__ == "__main__":
    sys.exit(main())
