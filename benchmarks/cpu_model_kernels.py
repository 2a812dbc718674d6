"""The kernels of the CPU model targets (issue 18), one by one: each distinct convolution of ResNet-50
at batch 1 (with its batch norm and ReLU, as the backend fuses them) and each distinct linear layer of
BERT-base at batch 1 (128 rows, bias, GELU where the model has it), compiled through the "polytile"
backend (``polytile.torch.explain``) and timed beside torch's eager operations on the same random
inputs by the backend's own check (interleaved rounds, medians). ``--weighted`` also prints the sums
weighted by how often each kernel occurs in its model.

Writes ``benchmarks/results/cpu_model_kernels-<date>.json`` (device, load average, threads, command).

    python benchmarks/cpu_model_kernels.py [--only conv3x3_64_56,bert_qkv] [--threads 1] [--rounds 5] [--unpacked]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import _threads  # noqa: F401 - sets the thread variables before NumPy or torch load their libraries

# isort: split
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cpu_ops import device_record, git_commit  # noqa: E402

import polytile.torch as ptt  # noqa: E402

# name: (C, H, K, R, stride, occurrences in ResNet-50)
CONVS = {
    "stem7x7_3_64_224": (3, 224, 64, 7, 2, 1),
    "conv1x1_64_64_56": (64, 56, 64, 1, 1, 1),
    "conv3x3_64_56": (64, 56, 64, 3, 1, 3),
    "conv1x1_64_256_56": (64, 56, 256, 1, 1, 4),
    "conv1x1_256_64_56": (256, 56, 64, 1, 1, 2),
    "conv1x1_256_128_56": (256, 56, 128, 1, 1, 1),
    "conv3x3_128_56_s2": (128, 56, 128, 3, 2, 1),
    "conv1x1_256_512_56_s2": (256, 56, 512, 1, 2, 1),
    "conv1x1_128_512_28": (128, 28, 512, 1, 1, 4),
    "conv1x1_512_128_28": (512, 28, 128, 1, 1, 3),
    "conv3x3_128_28": (128, 28, 128, 3, 1, 3),
    "conv1x1_512_256_28": (512, 28, 256, 1, 1, 1),
    "conv3x3_256_28_s2": (256, 28, 256, 3, 2, 1),
    "conv1x1_512_1024_28_s2": (512, 28, 1024, 1, 2, 1),
    "conv1x1_256_1024_14": (256, 14, 1024, 1, 1, 6),
    "conv1x1_1024_256_14": (1024, 14, 256, 1, 1, 5),
    "conv3x3_256_14": (256, 14, 256, 3, 1, 5),
    "conv1x1_1024_512_14": (1024, 14, 512, 1, 1, 1),
    "conv3x3_512_14_s2": (512, 14, 512, 3, 2, 1),
    "conv1x1_1024_2048_14_s2": (1024, 14, 2048, 1, 2, 1),
    "conv1x1_512_2048_7": (512, 7, 2048, 1, 1, 3),
    "conv1x1_2048_512_7": (2048, 7, 512, 1, 1, 2),
    "conv3x3_512_7": (512, 7, 512, 3, 1, 2),
}
# name: (in, out, GELU, occurrences in BERT-base)
LINEARS = {
    "bert_768x768": (768, 768, False, 48),
    "bert_768x3072_gelu": (768, 3072, True, 12),
    "bert_3072x768": (3072, 768, False, 12),
}


class ConvBnRelu(torch.nn.Module):
    def __init__(self, c: int, k: int, r: int, stride: int):
        super().__init__()
        self.conv = torch.nn.Conv2d(c, k, r, stride=stride, padding=r // 2, bias=False)
        self.bn = torch.nn.BatchNorm2d(k)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class Linear(torch.nn.Module):
    def __init__(self, n_in: int, n_out: int, gelu: bool):
        super().__init__()
        self.lin = torch.nn.Linear(n_in, n_out)
        self.gelu = gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return torch.nn.functional.gelu(y) if self.gelu else y


def cases() -> dict[str, tuple[torch.nn.Module, torch.Tensor, int]]:
    out: dict[str, tuple[torch.nn.Module, torch.Tensor, int]] = {}
    for name, (c, h, k, r, stride, n) in CONVS.items():
        out[name] = (ConvBnRelu(c, k, r, stride).eval(), torch.randn(1, c, h, h), n)
    for name, (n_in, n_out, gelu, n) in LINEARS.items():
        out[name] = (Linear(n_in, n_out, gelu).eval(), torch.randn(1, 128, n_in), n)
    return out


TIMES = re.compile(r"torch is faster \(([\d.]+) µs vs polytile ([\d.]+) µs")


def cpu_seconds(fn: Callable[[], object], calls: int) -> float:
    """The least CPU time of this thread over ``calls`` calls of ``fn`` (one thread: its work, not the
    time other processes of a shared machine took from it)."""
    best = math.inf
    for _ in range(calls):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


def measure(model: torch.nn.Module, x: torch.Tensor, rounds: int, min_time: float, clock: str,
            unpacked: bool = False) -> dict:
    """The anchor group's times. ``clock`` "wall": the backend's own check (``explain``: wall time,
    interleaved rounds, medians); "cpu": the module compiled with the group taken (choose="always")
    and eager, each call timed by this thread's CPU time (the least of interleaved rounds: one
    thread only), a call of the compiled module including torch.compile's guards. ``unpacked``
    (cpu clock): also the module compiled with ``pack_weights=False`` (the weights packed by every
    call), in the same rounds."""
    torch.manual_seed(0)
    if clock == "cpu":
        compiled = torch.compile(model, backend=ptt.backend(choose="always"), dynamic=False)
        torch._dynamo.reset()
        variants = {"polytile_us": compiled, "torch_us": model}
        if unpacked:
            variants["unpacked_us"] = torch.compile(model, backend=ptt.backend(choose="always", pack_weights=False),
                                                    dynamic=False)
            torch._dynamo.reset()
        with torch.no_grad():
            want = model(x)
            rel = {k: float((fn(x) - want).norm() / want.norm()) for k, fn in variants.items() if fn is not model}
            times: dict[str, list[float]] = {k: [] for k in variants}
            for _ in range(rounds):
                for k, fn in variants.items():
                    times[k].append(cpu_seconds(lambda fn=fn: fn(x), 3))
        return {**{k: min(v) * 1e6 for k, v in times.items()}, "rel_error": rel["polytile_us"]}
    rep = ptt.explain(model, x, rounds=rounds, min_time=min_time)
    for g in rep.taken:
        if g.kind in ("gemm", "conv"):
            return {"polytile_us": g.polytile_us, "torch_us": g.torch_us, "taken": True, "ops": g.ops}
    for left in rep.left:
        m = TIMES.search(left.reason)
        if m and left.op in ("convolution", "addmm", "mm", "linear"):
            return {"polytile_us": float(m.group(2)), "torch_us": float(m.group(1)), "taken": False}
    return {"error": str(rep)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="comma-separated names (a prefix selects all that start with it)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min-time", type=float, default=0.05, help="seconds of calls per round and side")
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                   help="cpu: this thread's CPU time (one thread; robust on a shared machine), wall: the backend's")
    p.add_argument("--unpacked", action="store_true",
                   help="also time the backend with pack_weights=False (cpu clock), in the same rounds")
    p.add_argument("--out", help="the JSON record (default benchmarks/results/cpu_model_kernels-<date>.json)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu" and torch.get_num_threads() != 1:
        p.error("--clock cpu times one thread: pass --threads 1")
    only = [w for w in args.only.split(",") if w]
    load_before = os.getloadavg()
    results = []
    for name, (model, x, n) in cases().items():
        if only and not any(name.startswith(o) for o in only):
            continue
        r = {"name": name, "occurrences": n, **measure(model, x, args.rounds, args.min_time, args.clock,
                                                       args.unpacked)}
        if "torch_us" in r:
            r["speed_vs_torch"] = r["torch_us"] / r["polytile_us"]
        if "unpacked_us" in r:
            r["unpacked_vs_torch"] = r["torch_us"] / r["unpacked_us"]
        results.append(r)
        print(json.dumps(r), flush=True)
    now = datetime.datetime.now(datetime.UTC)
    record = {"benchmark": "cpu_model_kernels", "date": now.isoformat(timespec="seconds"),
              "command": " ".join(["python", *sys.argv]), "polytile_commit": git_commit(), **device_record(),
              "threads": torch.get_num_threads(), "clock": args.clock, "load_average_before": load_before,
              "load_average_after": os.getloadavg(), "results": results}
    default = ROOT / "benchmarks" / "results" / f"cpu_model_kernels-{now:%Y%m%d-%H%M%S}.json"
    path = Path(args.out) if args.out else default
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"\n{record['device']}, {torch.get_num_threads()} thread(s), load average {load_before[0]:.1f} before, "
          f"{record['load_average_after'][0]:.1f} after; record {path}")
    print(f"{'kernel':26s} {'n':>3s} {'polytile':>10s} {'torch':>10s} {'ratio':>6s}")
    tot = {}
    for r in results:
        if "torch_us" not in r:
            print(f"{r['name']:26s} FAILED {r.get('error', '')[:200]}")
            continue
        print(f"{r['name']:26s} {r['occurrences']:3d} {r['polytile_us']:9.1f}u {r['torch_us']:9.1f}u "
              f"{r['speed_vs_torch']:5.2f}x" + (f"  unpacked {r['unpacked_us']:9.1f}u {r['unpacked_vs_torch']:5.2f}x"
                                                if "unpacked_us" in r else ""))
        model = "bert" if r["name"].startswith("bert") else "resnet"
        t = tot.setdefault(model, [0.0, 0.0, 0.0])
        t[0] += r["occurrences"] * r["polytile_us"]
        t[1] += r["occurrences"] * r["torch_us"]
        t[2] += r["occurrences"] * min(r["polytile_us"], r["torch_us"])
    for model, (pt, th, best) in tot.items():
        print(f"{model}: weighted polytile {pt / 1e3:.1f} ms, torch {th / 1e3:.1f} ms ({th / pt:.2f}x); "
              f"the faster of each {best / 1e3:.1f} ms ({th / best:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
