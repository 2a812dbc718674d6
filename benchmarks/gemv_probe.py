"""Launch one matmul kernel a few times for a profiler (issue 15, GEMVs of 2–16 rows): the default
schedule of ``ops.matmul(M, N, K, dtype)`` (``POLYTILE_GEMV_MMA=1``: the tensor-core GEMV's opt-in), or a
configuration of a template (``matmul_gemv '{"kernel": "mma", ...}'``).

    ncu --clock-control none --kernel-name regex:matmul_kernel0 --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats python benchmarks/gemv_probe.py 8 6144 4096 bfloat16
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    if len(sys.argv) < 5:
        sys.exit("usage: python benchmarks/gemv_probe.py M N K DTYPE [TEMPLATE CONFIG-JSON]")
    M, N, K = (int(x) for x in sys.argv[1:4])
    dtype = sys.argv[4]
    import torch

    from polytile import ops
    from polytile.build import build
    from polytile.target import as_target
    from polytile.tune.task import Task, Workload, find_template
    if len(sys.argv) > 6:
        target = as_target("cuda")
        task = Task(find_template("matmul", "cuda", sys.argv[5]), Workload.of("matmul", M=M, N=N, K=K, dtype=dtype),
                    target)
        kern = build(task.schedule(json.loads(sys.argv[6])), target)
    else:
        kern = ops.matmul(M, N, K, dtype).build("cuda")
    tdt = getattr(torch, dtype)
    a = torch.randn(M, K, device="cuda", dtype=tdt)
    b = torch.randn(K, N, device="cuda", dtype=tdt)
    for _ in range(5):
        c = kern(a, b)
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    print(f"{M}x{N}x{K} {dtype}: relative error {float((c.double() - ref).norm() / ref.norm()):.3g}")


if __name__ == "__main__":
    main()
