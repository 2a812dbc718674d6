"""Whole models through torch.compile (issue 18): the "polytile" backend against eager torch and inductor.

Models of ``polytile.torch.zoo`` at their published sizes with random weights: BERT-base (sequence 128,
batch 1 and 32), GPT-2 small (prefill 512; one decoding step after a 512-token KV cache), a LLaMA-style
stack (2 layers at LLaMA-3-8B widths, 128 tokens) and ResNet-50 (batch 1 and 32); fp16 on a GPU, fp32 on
the CPU. For each model, in one process:

1. optionally, model-level tuning (``polytile.torch.tune``) with ``--trials-per-task`` trials per distinct
   workload into ``<records-dir>/<model>-<device>.jsonl`` (resumed when it exists), timed;
2. the polytile backend compiled with those records (the cost-based choice: a group is kept only when
   it beats torch on its own), timed, and its output checked against eager (relative error);
3. the peers compiled: inductor (default), inductor max-autotune without CUDA graphs
   (``inductor-max-nocg``: mode max-autotune-no-cudagraphs) and with them (``inductor-max``), inductor
   reduce-overhead (its CUDA graphs; ``inductor-cudagraphs``), and the polytile backend with other
   options (``POLYTILE_VARIANTS``: ``polytile-unpacked``, ``pack_weights=False``, every call packs the
   constant weights, as before that option; ``polytile-vector``, ``vector_elementwise=True``;
   ``polytile-cudnn``, ``cudnn_fusion=True``; ``polytile-cudnn-vector``, both; ``polytile-plain``, both off, as
   the backend was before they became the default on 2026-11-29)
   (``--peers``; ``polytile-default``: the backend's defaults, when ``--options`` changes polytile's);
   the table gives each one's time over polytile's (above 1: polytile faster);
4. every variant timed in interleaved rounds: the median over rounds of the median call time (CUDA
   events around one call on a GPU, wall time on the CPU; ``--clock cpu``: this thread's CPU time,
   with ``--threads 1`` — what the model costs on a shared machine, where wall time mostly measures
   the other processes).

Writes ``benchmarks/results/models-<date>-<device>.json`` (device, load, threads, command, per model the
times, ratios, compile and tuning seconds, the groups taken and left), rewritten after each model (a run
stopped at a time limit keeps the models it finished; ``--out`` names another folder), and prints a
table last.

    python benchmarks/models.py [--device cpu|cuda] [--models bert-b1,resnet50-b1] [--trials-per-task 20]
        [--peers eager,inductor,inductor-max-nocg,inductor-max,inductor-cudagraphs,polytile-unpacked,polytile-vector,
                 polytile-cudnn,polytile-cudnn-vector,polytile-plain]
        [--threads N] [--rounds 5]
        [--calls 10] [--clock wall|cpu] [--records-dir DIR] [--cuda-graphs default|on|off]
        [--channels-last default|on|off] [--options JSON] [--torch-convs] [--out DIR]
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
from pathlib import Path
from typing import Any

import _threads  # noqa: F401 - sets the thread variables before NumPy or torch load their libraries

# isort: split
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import polytile.torch as ptt  # noqa: E402
from polytile.torch import zoo  # noqa: E402

MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "bert-b1": ("bert-base", {"batch": 1, "seq": 128}),
    "bert-b32": ("bert-base", {"batch": 32, "seq": 128}),
    "gpt2-prefill": ("gpt2-prefill", {"batch": 1, "seq": 512}),
    "gpt2-s128": ("gpt2-prefill", {"batch": 1, "seq": 128}),
    "gpt2-decode": ("gpt2-decode", {"batch": 1, "seq": 512}),
    "llama": ("llama", {"batch": 1, "seq": 128, "layers": 2}),
    "resnet50-b1": ("resnet50", {"batch": 1}),
    "resnet50-b32": ("resnet50", {"batch": 32}),
}
DEFAULT_MODELS = {"cpu": ["bert-b1", "resnet50-b1"], "cuda": [m for m in MODELS if m != "gpt2-s128"]}
GPU_PEERS = ("eager", "inductor", "inductor-max-nocg", "inductor-max", "inductor-cudagraphs")  # default on a GPU
POLYTILE_VARIANTS = {"polytile-default": {}, "polytile-unpacked": {"pack_weights": False},
                     "polytile-plain": {"vector_elementwise": False, "cudnn_fusion": False},
                     "polytile-vector": {"vector_elementwise": True},
                     "polytile-cudnn": {"cudnn_fusion": True},
                     "polytile-cudnn-vector": {"cudnn_fusion": True, "vector_elementwise": True}}
"""The backend again with other options, timed in the same rounds (``--peers``)."""
PEERS = (*GPU_PEERS, *POLYTILE_VARIANTS)
LAYOUTS = {"default": None, "on": True, "off": False}  # --channels-last: the backend's channels_last option
INDUCTOR_MODES = (("inductor", "default"), ("inductor-max-nocg", "max-autotune-no-cudagraphs"),
                  ("inductor-max", "max-autotune"), ("inductor-cudagraphs", "reduce-overhead"))
"""inductor's modes: max-autotune also replays CUDA graphs (as reduce-overhead does); -nocg: without them."""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--trials-per-task", type=int, default=0, help="model-level tuning budget per workload (0: none)")
    p.add_argument("--peers", default=None,
                   help="eager,inductor,inductor-max (default: eager on the CPU, all on a GPU)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch and polytile (0: the default)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=10, help="calls per variant and round")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="CPU: wall time, or this thread's CPU time (cpu; needs --threads 1)")
    p.add_argument("--records-dir", default="benchmarks/results/records")
    p.add_argument("--tuner", default="xgb")
    p.add_argument("--cuda-graphs", choices=["default", "on", "off"], default="default",
                   help="the backend's cuda_graphs option (default: on a GPU, for inference)")
    p.add_argument("--channels-last", choices=["default", "on", "off"], default="default",
                   help="the backend's channels_last option (convolution weights channels-last, converted once; "
                        "default: on a GPU)")
    p.add_argument("--options", default="{}",
                   help='more backend options for polytile (JSON), e.g. \'{"cudnn_fusion": true}\' '
                        '(recorded as "options")')
    p.add_argument("--torch-convs", action="store_true",
                   help="leave every convolution to torch without trying polytile's (saves their builds and "
                        "measurements: at ResNet-50 on an H200 each lost to cuDNN)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="folder of the JSON record")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.torch_convs:
        from polytile.torch import importer
        importer.CONVS = set()
    device = args.device
    if args.clock == "cpu" and (device != "cpu" or torch.get_num_threads() != 1):
        p.error("--clock cpu times one thread on the CPU: pass --device cpu --threads 1")
    names = args.models.split(",") if args.models else DEFAULT_MODELS["cuda" if device.startswith("cuda") else "cpu"]
    peers = (args.peers or ("eager" if device == "cpu" else ",".join(GPU_PEERS))).split(",")
    for n in names:
        if n not in MODELS:
            p.error(f"unknown model {n!r}; known: {', '.join(MODELS)}")
    for peer in peers:
        if peer not in PEERS:
            p.error(f"unknown peer {peer!r}; known: {', '.join(PEERS)}")
    kind = "gpu" if device != "cpu" else "cpu"
    out = Path(args.out) / f"models-{time.strftime('%Y%m%d-%H%M%S')}-{kind}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    load_before = os.getloadavg()
    for name in names:
        print(f"== {name}", flush=True)
        results.append(run_model(name, device, peers, args))
        print(json.dumps(results[-1], indent=1)[:2000], flush=True)
        # rewritten after every model: a run stopped at a time limit keeps the models it finished
        record = {"benchmark": "models", "date": datetime.datetime.now(datetime.UTC).isoformat(),
                  "command": " ".join(sys.argv), "device": _device_name(device), "torch": torch.__version__,
                  "threads": torch.get_num_threads(), "clock": args.clock, "load_average": os.getloadavg(),
                  "load_average_before": load_before, "host": platform.node(),
                  "models": results}
        out.write_text(json.dumps(record, indent=1))
    print_table(results, peers)
    print(f"record: {out}")
    return 0


def run_model(name: str, device: str, peers: list[str], args: argparse.Namespace) -> dict[str, Any]:
    zoo_name, kwargs = MODELS[name]
    model, inputs = zoo.model(zoo_name, device=device, **kwargs)
    res: dict[str, Any] = {"model": name, "dtype": str(next(model.parameters()).dtype).removeprefix("torch.")}
    records = None
    if args.trials_per_task > 0:
        records = Path(args.records_dir) / f"{name}-{'gpu' if device != 'cpu' else 'cpu'}.jsonl"
        records.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        rep = ptt.tune(model, inputs, trials_per_task=args.trials_per_task, records=str(records), tuner=args.tuner,
                       progress=False, channels_last=LAYOUTS[args.channels_last])
        res.update(tune_s=time.perf_counter() - t0, tasks=len(rep.tasks), trials=sum(t.trials for t in rep.tasks),
                   new_trials=rep.new_trials, trials_per_task=args.trials_per_task)
    variants: dict[str, Any] = {}
    with torch.no_grad():
        want = model(*inputs)
        if "eager" in peers:
            variants["eager"] = model
        torch._dynamo.reset()
        # the first compile of a model traced other graphs than every later one (GPT-2 decoding: 16
        # lift_fresh_copy and 40 cat instead of 24, 1.94 ms against 1.51-1.54 for the same options compiled
        # second, 2026-11-29): a throwaway compile first, so that no variant pays for being first
        torch.compile(model, backend="eager", dynamic=False)(*inputs)
        report = ptt.Report()
        graphs = {"default": None, "on": True, "off": False}[args.cuda_graphs]
        extra = json.loads(args.options)
        compiled = torch.compile(model, backend=ptt.backend(records=str(records) if records else None, report=report,
                                                            cuda_graphs=graphs,
                                                            channels_last=LAYOUTS[args.channels_last], **extra),
                                 dynamic=False)
        t0 = time.perf_counter()
        got = compiled(*inputs)
        _sync(device)
        res["compile_s"] = {"polytile": time.perf_counter() - t0}
        res["options"] = extra
        print(f"polytile compiled in {res['compile_s']['polytile']:.1f} s", flush=True)
        res["rel_error"] = _rel(got, want)
        res["out_strides"] = [list(got.stride()), list(want.stride())]  # polytile's and eager's
        res["notes"] = report.notes
        res["cuda_graphs"] = report.cuda_graphs
        res["taken"] = [f"{g.kind}: {' + '.join(g.ops)} [{g.schedule}]" + (f" ({g.kernels} kernels)" if g.kernels > 1
                                                                          else "") for g in report.taken]
        res["kernels"] = report.kernels  # launched by the taken groups (an epilogue fused into its product: none)
        res["left"] = {op: dict(r) for op, r in report.reasons().items()}
        res["packed_weights"] = sum(g.packed for g in report.taken)
        variants["polytile"] = compiled
        for variant, options in POLYTILE_VARIANTS.items():
            if variant not in peers:
                continue
            rep = ptt.Report()
            c = torch.compile(model, backend=ptt.backend(**{"records": str(records) if records else None, "report": rep,
                                                            "cuda_graphs": graphs,
                                                            "channels_last": LAYOUTS[args.channels_last], **options}),
                              dynamic=False)
            t0 = time.perf_counter()
            short = variant.removeprefix("polytile-")
            res[f"rel_error_{short}"] = _rel(c(*inputs), want)
            _sync(device)
            res["compile_s"][variant] = time.perf_counter() - t0
            print(f"{variant} compiled in {res['compile_s'][variant]:.1f} s", flush=True)
            res[f"taken_{short}"] = [f"{g.kind}: {' + '.join(g.ops)}" for g in rep.taken]
            res[f"kernels_{short}"] = rep.kernels
            res[f"left_{short}"] = {op: dict(r) for op, r in rep.reasons().items()}
            res[f"notes_{short}"] = rep.notes
            if options.get("cudnn_fusion"):  # fused convolutions cuDNN had no kernel for (run unfused)
                from polytile.torch.folding import UNFUSED
                res[f"unfused_{short}"] = [f"{k}: {v}" for k, v in UNFUSED.items()]
            variants[variant] = c
        for peer, mode in INDUCTOR_MODES:
            if peer in peers:
                c = torch.compile(model, mode=mode, dynamic=False)
                t0 = time.perf_counter()
                c(*inputs)
                _sync(device)
                res["compile_s"][peer] = time.perf_counter() - t0
                print(f"{peer} compiled in {res['compile_s'][peer]:.1f} s", flush=True)
                variants[peer] = c
        times = {k: [] for k in variants}
        for _ in range(args.rounds):
            for k, fn in variants.items():
                times[k].append(_time(fn, inputs, device, args.calls, args.clock))
    res["ms"] = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    res["ms_rounds"] = {k: [t * 1e3 for t in v] for k, v in times.items()}
    res["speedup"] = {k: res["ms"][k] / res["ms"]["polytile"] for k in res["ms"] if k != "polytile"}
    return res


def _time(fn: Any, inputs: list[Any], device: str, calls: int, clock: str = "wall") -> float:
    fn(*inputs)
    ts = []
    now = time.thread_time if clock == "cpu" else time.perf_counter
    for _ in range(calls):
        if device == "cpu":
            t0 = now()
            fn(*inputs)
            ts.append(now() - t0)
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            end.synchronize()
            ts.append(start.elapsed_time(end) / 1e3)
    return statistics.median(ts)


def _sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    g, w = got.double(), want.double()
    return float(torch.linalg.vector_norm(g - w) / torch.linalg.vector_norm(w))


def _device_name(device: str) -> str:
    if device == "cpu":
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
        except OSError:
            pass
        return platform.processor()
    return torch.cuda.get_device_name()


def print_table(results: list[dict[str, Any]], peers: list[str]) -> None:
    head = ["model", "dtype", "polytile ms"] + [f"{p} ms" for p in peers] + [f"vs {p}" for p in peers] + [
        "compile s", "tune s", "rel. error", "groups taken", "kernels"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in results:
        row = [r["model"], r["dtype"], f"{r['ms']['polytile']:.2f}"]
        row += [f"{r['ms'][p]:.2f}" if p in r["ms"] else "-" for p in peers]
        row += [f"{r['speedup'][p]:.2f}×" if p in r["speedup"] else "-" for p in peers]
        row += [f"{r['compile_s']['polytile']:.0f}", f"{r['tune_s']:.0f}" if "tune_s" in r else "-",
                f"{r['rel_error']:.1e}", str(len(r["taken"])), str(r.get("kernels", "-"))]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    sys.exit(main())
