"""Where a model's GPU time goes with the polytile backend: compile a zoo model (``benchmarks/models.py``'s
names), print the backend's report (groups taken, left and why), then torch.profiler's table of the
kernels of ``--calls`` forwards (time per kernel, calls), beside the forward's CUDA-event time and eager's.

    python benchmarks/profile_model.py --model bert-b1 [--cuda-graphs on|off] [--channels-last default|on|off]
        [--calls 10] [--rows 25]
    python benchmarks/profile_model.py --model resnet50-b1 --backend inductor-cudagraphs   # a peer's kernels
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import LAYOUTS, MODELS  # noqa: E402

import polytile.torch as ptt  # noqa: E402
from polytile.torch import zoo  # noqa: E402


def _ms(fn: object, inputs: list[object], calls: int) -> float:
    ts = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*inputs)  # type: ignore[operator]
        end.record()
        end.synchronize()
        ts.append(start.elapsed_time(end))
    return statistics.median(ts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="bert-b1", choices=list(MODELS))
    p.add_argument("--cuda-graphs", choices=["on", "off"], default="on",
                   help="the backend's cuda_graphs option (on: its default for inference)")
    p.add_argument("--channels-last", choices=["default", "on", "off"], default="default",
                   help="the backend's channels_last option (default: on, on a GPU)")
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--backend", choices=["polytile", "inductor", "inductor-cudagraphs"], default="polytile",
                   help="profile a peer instead (inductor's default mode, or reduce-overhead: CUDA graphs)")
    args = p.parse_args()
    name, kwargs = MODELS[args.model]
    model, inputs = zoo.model(name, device="cuda", **kwargs)
    report = ptt.Report()
    if args.backend == "polytile":
        backend = ptt.backend(report=report, cuda_graphs=args.cuda_graphs == "on",
                              channels_last=LAYOUTS[args.channels_last])
        compiled = torch.compile(model, backend=backend, dynamic=False)
    else:
        mode = "reduce-overhead" if args.backend == "inductor-cudagraphs" else "default"
        compiled = torch.compile(model, mode=mode, dynamic=False)
    with torch.no_grad():
        t0 = time.perf_counter()
        got = compiled(*inputs)
        torch.cuda.synchronize()
        print(f"compile {time.perf_counter() - t0:.1f} s")
        want = model(*inputs)
        err = float(torch.linalg.vector_norm(got.double() - want.double()) / torch.linalg.vector_norm(want.double()))
        print(f"relative error vs eager {err:.2e}")
        if args.backend == "polytile":
            print(report)
            print("operations taken:", dict(report.taken_ops))
        for _ in range(3):
            compiled(*inputs)
        print(f"{torch.cuda.get_device_name()}: {args.backend} {_ms(compiled, inputs, 20):.3f} ms, "
              f"eager {_ms(model, inputs, 20):.3f} ms per forward (median of 20, CUDA events)")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.calls):
                compiled(*inputs)
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=70))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
