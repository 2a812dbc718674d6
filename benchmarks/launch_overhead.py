"""Launch overhead (issue 15): the host time of one call of a tiny kernel, beside the kernel's own
time and beside NumPy's and torch's time for the same operation.

CPU: 8x8x8 matmul, 64x64 softmax and an add of 1024 float32. A *call* is a loop of ``kern(*inputs)``
(outputs allocated by each call, as user code does; also with the outputs given) divided by its
length; the *kernel* is ``kern.benchmark()`` (the compiled function alone on the same pointers); the
difference is the call's overhead (target: at most 10 µs). NumPy and torch (CPU, one thread as for
these sizes) run the same operation in the same kind of loop.

GPU (when one is present): the same tiny operations, the issue's batch_matmul 12x384x384x64 and
fp16 1000^3 matmul, on torch tensors. *Host time* per call is a loop of 200 calls without any
synchronization (fewer than the launch queue holds, so the host never waits for the GPU) divided by
200, for polytile and for torch's own op; the target is polytile at most 1.5x torch. The record names
the call path (C, or Python with ``POLYTILE_FASTCALL=0``) and counts each kernel's calls that ran in C. *Throughput*
is a loop of 2000 calls with one synchronize at the end; the *kernel* time comes from CUDA events;
NumPy arguments (copied in and out, synchronous) are timed too.

Every result is checked against NumPy first. Loop timings are the median over 101 loops of up to 200
calls lasting at most 0.2 ms each (the kernel's: the median of single runs), so that preemptions on
a shared machine stay out. Writes
benchmarks/results/launch_overhead-<date>-<cpu|gpu>.json (device, date, command, load average,
numbers, ratios) and prints a table.

    python benchmarks/launch_overhead.py [--cpu-only | --gpu-only] [--calls 200] [--rounds 101]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import polytile as pt  # noqa: E402
from polytile import ops  # noqa: E402
from polytile.target import cpu_target  # noqa: E402

CPU_TARGET_OVERHEAD_US = 10.0
GPU_TARGET_RATIO = 1.5


def add_func(n: int, gpu: bool) -> pt.Schedule:
    """C = A + B on ``n`` float32 (threads of 128 on a GPU)."""
    A = pt.placeholder((n,), "float32", "A")
    B = pt.placeholder((n,), "float32", "B")
    C = pt.compute((n,), lambda i: A[i] + B[i], "C")
    s = pt.create_schedule(pt.Func([A, B], [C], name="add"))
    if gpu:
        s[C].split("i", 128, "bx", "tx").bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")
    return s


def per_call(fn: Callable[[], object], calls: int, rounds: int, finish: Callable[[], object] = lambda: None,
             loop_seconds: float = 2e-4) -> float:
    """Median over ``rounds`` loops of the seconds per call of up to ``calls`` calls of ``fn`` (then
    ``finish()``). Each loop lasts about ``loop_seconds`` at most, shorter than a scheduler's time
    slice, so that on a shared machine most loops run without being preempted and the median keeps
    the preempted ones out (as ``benchmark()``'s median of single runs does for the kernel)."""
    for _ in range(10):
        fn()
    finish()
    t0 = time.perf_counter()
    fn()
    finish()
    n = max(1, min(calls, int(loop_seconds / max(time.perf_counter() - t0, 1e-9))))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        finish()
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times)


def numpy_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def cpu_cases(rng: np.random.Generator) -> list[tuple[str, object, list[np.ndarray], Callable, Callable | None]]:
    """(name, kernel, inputs, NumPy's op, torch's op on the same inputs)."""
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
    a8, b8 = (rng.standard_normal((8, 8)).astype("float32") for _ in range(2))
    x = rng.standard_normal((64, 64)).astype("float32")
    u, v = (rng.standard_normal(1024).astype("float32") for _ in range(2))
    t = (lambda *arrays: [torch.from_numpy(a) for a in arrays]) if torch else None
    return [
        ("matmul 8x8x8", ops.matmul(8, 8, 8).build("cpu"), [a8, b8], np.matmul,
         (lambda ta, tb: lambda: torch.matmul(ta, tb))(*t(a8, b8)) if t else None),
        ("softmax 64x64", ops.softmax(64, 64).build("cpu"), [x], numpy_softmax,
         (lambda tx: lambda: torch.softmax(tx, 1))(*t(x)) if t else None),
        ("add 1024", pt.build(add_func(1024, gpu=False)), [u, v], np.add,
         (lambda tu, tv: lambda: torch.add(tu, tv))(*t(u, v)) if t else None),
    ]


def bench_cpu(calls: int, rounds: int) -> list[dict]:
    rng = np.random.default_rng(0)
    return [bench_cpu_case(*case, calls, rounds) for case in cpu_cases(rng)]


def bench_cpu_case(name: str, kern, inputs: list[np.ndarray], np_op: Callable,  # noqa: ANN001 - a CPUKernel
                   torch_call: Callable | None, calls: int, rounds: int) -> dict:
    want = np_op(*inputs)
    out = np.empty_like(want)
    row = {"name": name, "max_rel_error": float(np.abs(kern(*inputs) - want).max() / np.abs(want).max()),
           "call_us": per_call(lambda: kern(*inputs), calls, rounds) * 1e6,
           "call_outputs_given_us": per_call(lambda: kern(*inputs, out), calls, rounds) * 1e6,
           "kernel_us": kern.benchmark(*inputs, repeat=calls * rounds, warmup=50, min_time=0) * 1e6,
           "numpy_us": per_call(lambda: np_op(*inputs), calls, rounds) * 1e6,
           "torch_us": per_call(torch_call, calls, rounds) * 1e6 if torch_call else None}
    row["overhead_us"] = row["call_us"] - row["kernel_us"]
    row["target_met"] = row["overhead_us"] <= CPU_TARGET_OVERHEAD_US
    return row


def bench_gpu(calls: int, rounds: int) -> list[dict]:
    import torch
    rng = np.random.default_rng(0)
    a8, b8 = (rng.standard_normal((8, 8)).astype("float32") for _ in range(2))
    a64, b64 = (rng.standard_normal((64, 64)).astype("float32") for _ in range(2))
    x = rng.standard_normal((64, 64)).astype("float32")
    u, v = (rng.standard_normal(1024).astype("float32") for _ in range(2))
    ba, bb = rng.standard_normal((12, 384, 64)).astype("float32"), rng.standard_normal((12, 64, 384)).astype("float32")
    ha, hb = (rng.standard_normal((1000, 1000)).astype("float16") for _ in range(2))
    cases = [
        ("add 1024", pt.build(add_func(1024, gpu=True), "cuda"), [u, v], torch.add, np.add),
        ("matmul 8x8x8", ops.matmul(8, 8, 8).build("cuda"), [a8, b8], torch.matmul, np.matmul),
        ("matmul 64x64x64", ops.matmul(64, 64, 64).build("cuda"), [a64, b64], torch.matmul, np.matmul),
        ("softmax 64x64", ops.softmax(64, 64).build("cuda"), [x], lambda t: torch.softmax(t, 1), numpy_softmax),
        ("batch_matmul 12x384x384x64", ops.batch_matmul(12, 384, 384, 64).build("cuda"), [ba, bb], torch.bmm,
         np.matmul),
        ("matmul fp16 1000^3", ops.matmul(1000, 1000, 1000, "float16").build("cuda"), [ha, hb], torch.matmul,
         lambda p, q: p.astype(np.float32) @ q.astype(np.float32)),
    ]
    return [bench_gpu_case(*case, calls, rounds) for case in cases]


def bench_gpu_case(name: str, kern, host: list[np.ndarray], torch_op: Callable,  # noqa: ANN001 - a CUDAKernel
                   np_op: Callable, calls: int, rounds: int) -> dict:
    import torch

    from polytile.runtime.timing import time_gpu
    sync = torch.cuda.synchronize
    tensors = [torch.from_numpy(a).cuda() for a in host]
    want = np.asarray(np_op(*host), dtype=np.float64)
    got = kern(*tensors).double().cpu().numpy()
    row = {"name": name, "max_rel_error": float(np.abs(got - want).max() / np.abs(want).max()),
           "host_us": per_call(lambda: kern(*tensors), calls, rounds) * 1e6,
           "torch_host_us": per_call(lambda: torch_op(*tensors), calls, rounds) * 1e6,
           "throughput_us": per_call(lambda: kern(*tensors), 10 * calls, 11, sync, loop_seconds=1.0) * 1e6,
           "torch_throughput_us": per_call(lambda: torch_op(*tensors), 10 * calls, 11, sync, loop_seconds=1.0) * 1e6,
           "kernel_us": kern.benchmark(*tensors, repeat=200, warmup=20, flush_cache=False) * 1e6,
           "torch_kernel_us": time_gpu(lambda: torch_op(*tensors), repeat=200, warmup=20, flush_l2=False) * 1e6,
           "numpy_args_us": per_call(lambda: kern(*host), calls, 11, loop_seconds=0.1) * 1e6}
    sync()
    pt.synchronize()
    row["c_calls"] = sum(call.calls for call in kern._c_calls)  # 0: this kernel's calls stay in Python
    row["host_ratio"] = row["host_us"] / row["torch_host_us"]
    row["target_met"] = row["host_ratio"] <= GPU_TARGET_RATIO
    return row


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    def fmt(v: object) -> str:
        if isinstance(v, bool):
            return "yes" if v else "NO"
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e-2 else f"{v:.2f}"
        return "-" if v is None else str(v)
    head = "| " + " | ".join(title for _, title in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(fmt(r.get(key)) for key, _ in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


CPU_COLUMNS = [("name", "kernel"), ("call_us", "call µs"), ("call_outputs_given_us", "call, outputs given µs"),
               ("kernel_us", "kernel µs"), ("overhead_us", "overhead µs"), ("numpy_us", "NumPy µs"),
               ("torch_us", "torch µs"), ("target_met", f"overhead ≤ {CPU_TARGET_OVERHEAD_US:g} µs")]
GPU_COLUMNS = [("name", "kernel"), ("host_us", "host µs/call"), ("torch_host_us", "torch host µs/op"),
               ("host_ratio", "ratio"), ("throughput_us", "µs/call, synced"),
               ("torch_throughput_us", "torch µs/op, synced"), ("kernel_us", "kernel µs"),
               ("torch_kernel_us", "torch kernel µs"), ("numpy_args_us", "NumPy args µs/call"),
               ("c_calls", "C calls"), ("target_met", f"ratio ≤ {GPU_TARGET_RATIO:g}")]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu-only", action="store_true")
    parser.add_argument("--gpu-only", action="store_true")
    parser.add_argument("--calls", type=int, default=200,
                        help="calls per timed loop (GPU: fewer than the launch queue holds)")
    parser.add_argument("--rounds", type=int, default=101, help="timed loops (the median is reported)")
    parser.add_argument("--out", help="the JSON record (default benchmarks/results/launch_overhead-<date>-<kind>.json)")
    args = parser.parse_args()
    from polytile.runtime.cuda_device import gpu_available
    gpu = not args.cpu_only and gpu_available()
    record: dict = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "host": platform.node(), "cpu": cpu_target().model, "cores": cpu_target().cores,
        "python": platform.python_version(), "numpy": np.__version__,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "passive (polytile's default)"),
        "load_average_before": os.getloadavg(),
    }
    if not args.gpu_only:
        record["cpu_results"] = bench_cpu(args.calls, args.rounds)
    if gpu:
        import torch

        from polytile.runtime import fastcall
        record.update(gpu=torch.cuda.get_device_name(), torch=torch.__version__, call_path=fastcall.describe())
        record["gpu_results"] = bench_gpu(args.calls, args.rounds)
    elif args.gpu_only:
        print("no GPU found")
        return 1
    record["load_average_after"] = os.getloadavg()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    default = ROOT / "benchmarks" / "results" / f"launch_overhead-{stamp}-{'gpu' if gpu else 'cpu'}.json"
    out = Path(args.out) if args.out else default
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{record['date']}  {record['cpu']} ({record['cores']} cores), load average "
          f"{record['load_average_before'][0]:.2f} -> {record['load_average_after'][0]:.2f}"
          + (f"; GPU {record['gpu']}, call path: {record['call_path']}" if gpu else ""))
    if "cpu_results" in record:
        print(table(record["cpu_results"], CPU_COLUMNS))
    if gpu:
        print(table(record["gpu_results"], GPU_COLUMNS))
    print(f"record: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
