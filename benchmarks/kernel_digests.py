"""Digests of the generated code of tuning candidates: the source's and, for CUDA, the cubin's SHA-256 of
random valid configurations of several templates (both throughput workloads, off-tile sizes, a GEMV),
one line per candidate. A change meant to leave every kernel as it was (a cheaper build or check) is
checked by running this at both commits and comparing the outputs:

    python benchmarks/kernel_digests.py --out before.txt      # at the old commit
    python benchmarks/kernel_digests.py --out after.txt       # at the new one; then: diff before.txt after.txt

CUDA candidates need nvcc (no GPU): they are compiled for sm_90a. The build cache is this run's own
(``POLYTILE_CACHE_DIR`` unless set: a fresh temporary folder), so every cubin is compiled again.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from pathlib import Path

WORKLOADS = [("cpu", "matmul", dict(M=512, N=512, K=512)), ("cpu", "dense", dict(M=8, N=512, K=768)),
             ("cpu", "batch_matmul", dict(batch=3, M=33, N=65, K=17)),
             ("cuda", "matmul", dict(M=512, N=768, K=3072, dtype="float16")),
             ("cuda", "matmul", dict(M=97, N=130, K=61, dtype="float16")),
             ("cuda", "matmul", dict(M=4, N=1000, K=512, dtype="float16")),
             ("cuda", "matmul", dict(M=100, N=80, K=60))]


def digests(kinds: list[str], per_workload: int, seed: int) -> list[str]:
    import numpy as np

    from polytile.build import build
    from polytile.tune import make_task
    lines = []
    for kind, op, shape in WORKLOADS:
        if kind not in kinds:
            continue
        task = make_task(op, kind, **shape)
        for digits in task.space.sample_valid(np.random.default_rng(seed), per_workload):
            head = f"{task.workload.key} {task.template.name} {list(digits)}"
            try:
                kern = build(task.schedule(task.space.config(digits).values), task.target)
            except Exception as err:  # noqa: BLE001 - a candidate that does not build is a line too
                lines.append(f"{head} error {type(err).__name__}")
                continue
            binary = getattr(kern, "cubin", None)
            lines.append(f"{head} source {hashlib.sha256(kern.source.encode()).hexdigest()[:16]}"
                         + (f" cubin {hashlib.sha256(binary).hexdigest()[:16]}" if isinstance(binary, bytes) else ""))
            print(lines[-1], flush=True)
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="all", choices=["cpu", "cuda", "all"])
    p.add_argument("--candidates", type=int, default=3, help="candidates per workload (default 3)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", help="the digests, one line per candidate")
    args = p.parse_args(argv)
    os.environ.setdefault("POLYTILE_CACHE_DIR", tempfile.mkdtemp(prefix="pt-kernel-digests-"))
    kinds = ["cpu", "cuda"] if args.target == "all" else [args.target]
    lines = digests(kinds, args.candidates, args.seed)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
