"""ALCOP's search comparison (issue 5; ALCOP Figs. 12–13) on the GPU, in one run.

For fp16 matmul 4096³ and BERT's 512×768×3072 GEMM (and, with --workloads, ResNet-50's 3×3
convolution as an implicit GEMM), the tensor-core template's space (block and warp tiles, bk,
shared-memory stages 1–6, register stages 1–2) is searched by four tuners with the same trial
budget, in turns of one batch each (so they meet the same machine conditions):

  xgb                 XGBoost cost model + simulated annealing (random until 16 measurements)
  analytical          the analytical model's ranking, measured from the top
  analytical+xgboost  XGBoost pre-trained on the analytical model, refined by measurements
  random              uniformly random configurations
  grid                configurations in index order (with --exhaustive only, unless named)

Reported per workload: best latency after each trial (the tuning curve) per tuner; the measured
latency of the model's top-1 configuration and of the best of its top 10 against the best latency
any tuner found (the "exhaustive-ish" best: every distinct configuration measured in the run); the
model's pairwise ranking accuracy on all measured configurations; cuBLAS (torch) for scale.

A configuration proposed by several tuners is measured once and its result shared (as ALCOP's
artifact replays logged measurements to compare search models): the curves differ by search alone,
not by timing noise. --no-share measures every proposal. Every measured kernel is checked against
the float64 reference first (a wrong result is a failed trial; one random input set per workload,
so a 4096³ reference is computed once); failures cost a trial and the run goes on. Tuning stops
early, for every tuner at the same trial count, when --budget-minutes runs out (the record says so).

    python benchmarks/alcop_search.py                  # default: 32 trials, bert_ffn2 and mm4096
    python benchmarks/alcop_search.py --quick          # bert_ffn2 only, 16 trials, three tuners
    python benchmarks/alcop_search.py --trials 64 --workloads bert_ffn2,mm4096,conv2d_r50 --plot
    python benchmarks/alcop_search.py --simulate --quick   # CPU-only check: the model plus noise

Exhaustive search (ALCOP Fig. 12, and Fig. 13 against the true optimum): --exhaustive measures every valid
configuration of the workload's space, then the tuners search that table (each proposal answered with its
measured result, as ALCOP's artifact replays its logs), 50 trials by default. Reported: the best of the
analytical model's top 1 / 10 / 50 and of each tuner after 10 and 50 trials, over the exhaustive best.
Building thousands of configurations takes CPU hours; --prebuild builds them on a machine without a GPU
(resumable, a file per chunk) and --prebuilt runs them on the GPU host without building:

    python benchmarks/alcop_search.py --exhaustive --workloads bert_ffn2 --prebuild .exhaustive   # no GPU
    python benchmarks/alcop_search.py --exhaustive --workloads bert_ffn2 --prebuilt .exhaustive   # GPU

Writes benchmarks/results/alcop_search-<date>.json (device, date, command, curves, summaries) and,
with --plot, one PNG of the curves per workload next to it.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import inspect
import json
import lzma
import math
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polytile.errors import PolytileError  # noqa: E402
from polytile.target import as_target  # noqa: E402
from polytile.tune import (  # noqa: E402
    AnalyticalTuner,
    MeasureOptions,
    Measurer,
    MeasureResult,
    RecordLog,
    make_task,
    pairwise_accuracy,
    tune_task,
)
from polytile.tune.cli import plot_curve  # noqa: E402
from polytile.tune.space import Config  # noqa: E402
from polytile.tune.workers import Returned  # noqa: E402

WORKLOADS = {
    "bert_ffn2": ("matmul", dict(M=512, N=768, K=3072, dtype="float16")),
    "mm4096": ("matmul", dict(M=4096, N=4096, K=4096, dtype="float16")),
    "conv2d_r50": ("conv2d_igemm", dict(N=32, H=14, W=14, C=256, K=256, R=3, S=3, stride=1, padding=1)),
}
TUNERS = ("xgb", "analytical", "analytical+xgboost", "random", "grid")
STOP: list[str] = []  # set by SIGTERM (e.g. from `timeout`): finish the round, then report
CHUNK = 32  # configurations per prebuilt file


def config_key(values: dict) -> str:
    """The configuration's key as records compare it (``Config.key``)."""
    return Config(values).key


class SharedMeasurer:
    """Measures each distinct configuration of a task once; later proposals get the same result."""

    def __init__(self, inner: object, share: bool = True):
        self.inner = inner
        self.share = share
        self.results: dict[tuple[str, str], MeasureResult] = {}
        self.measured = 0

    def measure(self, task, batch, on_result=None):  # noqa: ANN001, ANN201 - Measurer.measure
        keys = [(task.key, config_key(v)) for v in batch]
        todo = [k for k, key in enumerate(keys) if not (self.share and key in self.results)]
        fresh = self.inner.measure(task, [batch[k] for k in todo]) if todo else []
        self.measured += len(todo)
        got = dict(zip(todo, fresh, strict=True))
        out = []
        for k, key in enumerate(keys):
            res = got[k] if k in got else self.results[key]
            self.results.setdefault(key, res)
            if on_result is not None:
                on_result(k, res)
            out.append(res)
        return out


class SimulatedMeasurer:
    """--simulate: no GPU. A configuration's 'time' is the analytical prediction times a fixed random
    factor (lognormal, σ = 0.25, seeded by the configuration); one in eleven fails to build."""

    def measure(self, task, batch, on_result=None):  # noqa: ANN001, ANN201 - Measurer.measure
        out = []
        for k, values in enumerate(batch):
            seed = zlib.crc32(json.dumps(values, sort_keys=True).encode())
            if seed % 11 == 0:
                res = MeasureResult("build_error", error="simulated build failure")
            else:
                noise = float(np.random.default_rng(seed).lognormal(0.0, 0.25))
                res = MeasureResult("ok", [float(task.predict([values])[0]) * noise])
            if on_result is not None:
                on_result(k, res)
            out.append(res)
        return out

    def close(self) -> None:
        pass


def device_info(simulated: bool) -> str:
    if simulated:
        return "simulated (analytical model × noise; no GPU)"
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except OSError:
        return "unknown"


def preflight() -> str | None:
    """Why a GPU run cannot work here, or None."""
    from polytile.runtime.cuda import CUDAKernel
    from polytile.runtime.cuda_device import gpu_available
    if not gpu_available():
        return "no usable GPU (use --simulate for a CPU-only check)"
    if "min_time" not in inspect.signature(CUDAKernel.benchmark).parameters:
        return ("CUDAKernel.benchmark takes no min_time, which the tuner's runner passes: every trial would "
                "fail; merge the commit that adds it (misc 2cf13a3)")
    return None


def curve_of(path: Path, task) -> list[float]:  # noqa: ANN001
    best, out = math.inf, []
    for r in RecordLog(path).select(task.key, task.target.key):
        best = min(best, r.cost)
        out.append(best)
    return out


def finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def ratio(found: float, cost: float) -> float | None:
    """found / cost (1 = as good as the best found), None where either is missing."""
    return found / cost if math.isfinite(found) and math.isfinite(cost) else None


def vendor_time(op_name: str, shape: dict) -> dict | None:
    """cuBLAS through torch on the same sizes (None where torch with CUDA is missing)."""
    try:
        import torch
        if not torch.cuda.is_available() or op_name != "matmul":
            return None
        from polytile.runtime.timing import time_gpu
        g = torch.Generator(device="cuda").manual_seed(0)
        a = (torch.rand((shape["M"], shape["K"]), device="cuda", generator=g) * 2 - 1).half()
        b = (torch.rand((shape["K"], shape["N"]), device="cuda", generator=g) * 2 - 1).half()
        return {"name": "cuBLAS (torch)", "seconds": time_gpu(lambda: a @ b, repeat=50)}
    except Exception as err:  # noqa: BLE001 - the peer is context, not the subject
        return {"name": "cuBLAS (torch)", "error": f"{type(err).__name__}: {err}"}


def valid_configs(task) -> list[dict]:  # noqa: ANN001
    """Every configuration of the task's space that its constraints admit, in space order."""
    space = task.space
    configs = (space.config_at(i) for i in range(space.size))
    return [c.values for c in configs if space.is_valid(c.digits)]


def chunk_path(folder: Path, start: int) -> Path:
    """The prebuilt file of the chunk starting at configuration ``start``."""
    return folder / f"chunk-{start // CHUNK:04d}.pkl.xz"


def sources_digest() -> str:
    """A digest of polytile's Python sources: prebuilt kernels are used only by the code that built them."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "polytile").rglob("*.py")):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


STAMP = "polytile-sources.sha256"  # in each prebuilt folder: sources_digest() of the code that built it


def check_prebuilt(folder: Path) -> None:
    """Refuse chunks built by other polytile sources (a fixed compiler bug would come back through them)."""
    if not any(folder.glob("chunk-*.pkl.xz")):
        return
    stamp = folder / STAMP
    if not stamp.exists() or stamp.read_text().strip() != sources_digest():
        raise ValueError(f"the prebuilt kernels in {folder} were built by other polytile sources than these "
                         f"({STAMP} {'differs' if stamp.exists() else 'is missing'}); delete the folder or "
                         "build it again with --prebuild")


def prebuild(name: str, task, measurer: Measurer, root: Path, deadline: float,  # noqa: ANN001
             chunks: tuple[int, int] | None = None) -> None:
    """Build every valid configuration of workload ``name`` (no GPU needed) into ``root/name``, an
    xz-compressed pickle of (values, build outcome) pairs per chunk (about 90 KB for 32 tensor-core
    GEMM kernels); chunks already there are kept (resumable). ``chunks``: only chunks A to B-1."""
    configs = valid_configs(task)
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    check_prebuilt(folder)
    (folder / STAMP).write_text(sources_digest() + "\n")
    first, last = chunks or (0, len(configs))
    for start in range(first * CHUNK, min(last * CHUNK, len(configs)), CHUNK):
        path = chunk_path(folder, start)
        if path.exists():
            continue
        if time.monotonic() > deadline or STOP:
            print(f"{name}: stopped before configuration {start} of {len(configs)} (run again to go on)")
            return
        batch = configs[start:start + CHUNK]
        built = measurer.build(task, batch)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(lzma.compress(pickle.dumps(list(zip(batch, built, strict=True)))))
        tmp.replace(path)
        failed = sum(1 for b in built if not isinstance(b, Returned))
        print(f"{name}: built {min(start + CHUNK, len(configs))}/{len(configs)} ({failed} failed in this chunk)",
              flush=True)


def _chunks(name: str, task, configs: list[dict], inner, prebuilt: Path | None,  # noqa: ANN001, ANN202
            done: set[str]):
    """(configurations, build outcomes) per chunk of ``configs`` (the valid configurations) that has
    some not in ``done``: from ``prebuilt`` where a chunk file is there, else built here, the next
    chunk building while the caller runs this one."""
    if prebuilt is not None:
        check_prebuilt(prebuilt / name)
    starts = [i for i in range(0, len(configs), CHUNK)
              if any(config_key(v) not in done for v in configs[i:i + CHUNK])]

    def load_or_build(start: int) -> tuple[list[dict], list]:
        path = chunk_path(prebuilt / name, start) if prebuilt is not None else None
        if path is not None and path.exists():
            pairs = pickle.loads(lzma.decompress(path.read_bytes()))
            return [v for v, _ in pairs], [b for _, b in pairs]
        batch = configs[start:start + CHUNK]
        return batch, inner.build(task, batch)

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(load_or_build, starts[0]) if starts else None
        for k in range(len(starts)):
            batch, built = future.result()
            if k + 1 < len(starts):
                future = pool.submit(load_or_build, starts[k + 1])
            yield batch, built


def exhaustive_table(name: str, task, inner, prebuilt: Path | None, saved: Path,  # noqa: ANN001
                     deadline: float) -> tuple[dict[str, MeasureResult], int]:
    """Every valid configuration measured: {config key: result} and the number of valid configurations
    (more than the table holds when the time budget cut it short). Results are appended to ``saved``
    as they come; those already there are not measured again (a run that was cut short resumes)."""
    configs = valid_configs(task)
    table: dict[str, MeasureResult] = {}
    if saved.exists():
        for line in saved.read_text().splitlines():
            row = json.loads(line)
            table[config_key(row["config"])] = MeasureResult(row["status"], row["costs"], row["error"])
    t0 = time.monotonic()
    if len(table) < len(configs):
        simulated = isinstance(inner, SimulatedMeasurer)
        chunks = ((b, None) for b in (configs[i:i + CHUNK] for i in range(0, len(configs), CHUNK))) \
            if simulated else _chunks(name, task, configs, inner, prebuilt, set(table))
        with saved.open("a") as out:
            for batch, built in chunks:
                if time.monotonic() > deadline or STOP:
                    break
                todo = [k for k, v in enumerate(batch) if config_key(v) not in table]
                if not todo:
                    continue
                results = inner.measure(task, [batch[k] for k in todo]) if simulated else \
                    [inner.run_built(task, batch[k], built[k]) for k in todo]
                for k, res in zip(todo, results, strict=True):
                    table[config_key(batch[k])] = res
                    out.write(json.dumps({"config": batch[k], "status": res.status, "costs": res.costs,
                                          "error": res.error[:300]}) + "\n")
                out.flush()
                if len(table) % 256 < CHUNK:
                    print(f"{name}: exhaustive {len(table)}/{len(configs)} ({time.monotonic() - t0:.0f} s)",
                          flush=True)
    return table, len(configs)


def exhaustive_summary(task, ranked: list, table: dict[str, MeasureResult], valid: int) -> dict:  # noqa: ANN001
    """ALCOP Fig. 12: the best measured time of the model's top 1 / 10 / 50 over the exhaustive best."""
    costs = {k: r.cost for k, r in table.items()}
    ok = {k: c for k, c in costs.items() if math.isfinite(c)}
    best_key = min(ok, key=ok.get) if ok else None
    best = ok[best_key] if best_key else math.inf
    order = [config_key(task.space.config(d).values) for d in ranked]
    out: dict = {"valid_configs": valid, "measured": len(table), "complete": len(table) == valid,
                 "failed": len(table) - len(ok), "best_s": finite(best),
                 "best_config": json.loads(best_key) if best_key else None,
                 "statuses": {s: sum(1 for r in table.values() if r.status == s)
                              for s in sorted({r.status for r in table.values()})}}
    for k in (1, 10, 50):
        top = [costs.get(key, math.inf) for key in order[:k]]
        out[f"model_top{k}_over_best"] = ratio(best, min(top, default=math.inf))
    if len(ok) > 1:
        keys = list(ok)
        predicted = task.predict([json.loads(k) for k in keys])
        out["model_pairwise_accuracy"] = pairwise_accuracy(-np.asarray(predicted), np.array([ok[k] for k in keys]))
        rank = sorted(ok.values())
        out["best_rank_of_model_top1"] = rank.index(costs.get(order[0], math.inf)) + 1 \
            if math.isfinite(costs.get(order[0], math.inf)) else None
    return out


def run_workload(name: str, args: argparse.Namespace, tuners: list[str], target, measurer: SharedMeasurer,
                 records_dir: Path, deadline: float) -> dict:
    op_name, shape = WORKLOADS[name]
    task = make_task(op_name, target, template=f"{op_name}_tensorcore", **shape)
    exhaustive = None
    if args.exhaustive:
        table, valid = exhaustive_table(name, task, measurer.inner, args.prebuilt and Path(args.prebuilt),
                                        records_dir / f"{name}-exhaustive.jsonl", deadline)
        measurer.results.update({(task.key, k): r for k, r in table.items()})  # the tuners search the table
    space = task.space
    t0 = time.perf_counter()
    ranking = AnalyticalTuner(space, predict=lambda ds: task.predict([space.config(d).values for d in ds]))
    ranked = ranking.ranking()
    rank_s = time.perf_counter() - t0
    top = [space.config(d).values for d in ranked[:10]]
    entry: dict = {"op": op_name, "shape": shape, "template": task.template.name, "flops": task.flops,
                   "space_size": space.size, "valid_configs": len(ranked), "rank_seconds": round(rank_s, 2),
                   "model_top10": [{"config": v, "predicted_s": float(p)}
                                   for v, p in zip(top, task.predict(top), strict=True)],
                   "tuners": {}}
    if args.exhaustive:
        exhaustive = exhaustive_summary(task, ranked, table, valid)
        entry["exhaustive"] = exhaustive
        if not exhaustive["complete"]:  # searching a partial table would measure the rest one by one
            print(f"{name}: {len(table)} of {valid} configurations measured; the tuners did not run (run "
                  "again with the same --records-dir to go on)", flush=True)
            return entry
    paths = {t: records_dir / f"{name}-{t.replace('+', '_')}.jsonl" for t in tuners}
    seconds = dict.fromkeys(tuners, 0.0)
    done = 0
    for n in range(args.batch, args.trials + args.batch, args.batch):
        n = min(n, args.trials)
        if time.monotonic() > deadline or STOP:
            entry["truncated_at"] = done
            why = "terminated" if STOP else "time budget spent"
            print(f"{name}: {why}; every tuner stops at {done} trials", flush=True)
            break
        for tuner in tuners:
            start = time.perf_counter()
            try:
                tune_task(task, n, paths[tuner], tuner=tuner, batch_size=args.batch, seed=args.seed + n,
                          verify=False, build_best=False, progress=False, measurer=measurer)
            except Exception as err:  # noqa: BLE001 - one tuner's failure is recorded, the others go on
                entry["tuners"].setdefault(tuner, {})["error"] = f"{type(err).__name__}: {err}"
            seconds[tuner] += time.perf_counter() - start
        done = n
        bests = {t: min(curve_of(paths[t], task), default=math.inf) * 1e3 for t in tuners}
        print(f"{name} {n:4d} trials: " + "  ".join(f"{t} {b:.4f} ms" for t, b in bests.items()), flush=True)
    def records(t: str) -> list:
        return RecordLog(paths[t]).select(task.key, task.target.key)

    # every distinct configuration measured in this run, with the model's prediction
    measured = {json.dumps(r.config, sort_keys=True): (r.config, r.cost) for t in tuners for r in records(t)}
    configs = [c for c, _ in measured.values()]
    costs = np.array([c for _, c in measured.values()])
    ok = np.isfinite(costs)
    best_found = float(costs[ok].min()) if ok.any() else math.inf
    predicted = task.predict(configs) if configs else np.zeros(0)
    entry["measured_configs"] = len(configs)
    entry["failed_configs"] = int((~ok).sum())
    entry["best_found_s"] = finite(best_found)
    entry["best_found_config"] = configs[int(np.argmin(np.where(ok, costs, np.inf)))] if ok.any() else None
    entry["model_pairwise_accuracy"] = pairwise_accuracy(-predicted[ok], costs[ok]) if ok.sum() > 1 else None
    for t in tuners:
        curve = curve_of(paths[t], task)
        info = entry["tuners"].setdefault(t, {})
        info.update({"curve": [finite(c) for c in curve], "seconds": round(seconds[t], 1),
                     "failures": sum(1 for r in records(t) if not r.ok),
                     "best_after": {str(k): finite(curve[k - 1]) for k in (1, 8, 10, 16, 32, 50, 64, 128)
                                    if k <= len(curve)},
                     "best_vs_found": ratio(best_found, curve[-1] if curve else math.inf)})
        if exhaustive is not None:
            best = exhaustive["best_s"] or math.inf
            info["best_vs_exhaustive"] = {str(k): ratio(best, curve[k - 1]) for k in (10, 16, 32, 50, 64, 128)
                                          if k <= len(curve)}
    analytical = records("analytical") if "analytical" in tuners else []
    if analytical:  # the model's ranking in measured order: its top-1 first
        top1 = analytical[0]
        entry["model_top1"] = {"config": top1.config, "measured_s": finite(top1.cost), "status": top1.status,
                               "predicted_s": float(task.predict([top1.config])[0]),
                               "best_found_over_top1": ratio(best_found, top1.cost)}
        entry["model_top10_best_over_found"] = ratio(best_found, min(r.cost for r in analytical[:10]))
    if not args.simulate:
        entry["vendor"] = vendor_time(op_name, shape)
    return entry


def save(result: dict, out: Path, start: float, measurer: SharedMeasurer) -> None:
    result["seconds"] = round(time.monotonic() - start, 1)
    result["distinct_measurements"] = measurer.measured
    result["terminated"] = bool(STOP)
    out.write_text(json.dumps(result, indent=1))


def print_summary(name: str, entry: dict, checkpoints: list[int]) -> None:
    found = entry.get("best_found_s")
    print(f"\n{name}: {entry['op']} {entry['shape']}  space {entry['space_size']} "
          f"({entry['valid_configs']} valid), {entry['measured_configs']} distinct measured "
          f"({entry['failed_configs']} failed)")
    print("  tuner              " + "".join(f"{'@' + str(n):>10}" for n in checkpoints) + "   best/found")
    for t, info in entry["tuners"].items():
        curve = info.get("curve", [])
        cells = "".join(f"{(curve[n - 1] or math.nan) * 1e3 if n <= len(curve) else math.nan:>9.4f} "
                        for n in checkpoints)
        print(f"  {t:<19}{cells}{info.get('best_vs_found') or math.nan:>9.3f}" + (f"  ({info['error']})"
                                                                                 if "error" in info else ""))
    if found:
        print(f"  best found: {found * 1e3:.4f} ms, {entry['flops'] / found / 1e12:.1f} TFLOP/s "
              f"({entry['best_found_config']})")
    if "model_top1" in entry:
        m = entry["model_top1"]
        print(f"  model top-1: measured {(m['measured_s'] or math.nan) * 1e3:.4f} ms "
              f"(predicted {m['predicted_s'] * 1e3:.4f} ms), best found / top-1 = "
              f"{m['best_found_over_top1'] or math.nan:.3f}; best of top-10 / found = "
              f"{entry.get('model_top10_best_over_found') or math.nan:.3f}")
    if entry.get("model_pairwise_accuracy") is not None:
        print(f"  model's pairwise ranking accuracy on the measured configurations: "
              f"{entry['model_pairwise_accuracy']:.3f}")
    if ex := entry.get("exhaustive"):
        nan = math.nan
        print(f"  exhaustive: {ex['measured']}/{ex['valid_configs']} valid configurations measured "
              f"({ex['failed']} failed), best {(ex['best_s'] or nan) * 1e3:.4f} ms ({ex['best_config']})")
        print("  exhaustive best / model's top-1, best of top-10, top-50: " + ", ".join(
            f"{ex.get(f'model_top{k}_over_best') or nan:.3f}" for k in (1, 10, 50))
            + f"; pairwise accuracy {ex.get('model_pairwise_accuracy') or nan:.3f}")
        for t, info in entry["tuners"].items():
            got = info.get("best_vs_exhaustive", {})
            print(f"  {t:<19} exhaustive best / tuner's best: " + ", ".join(
                f"@{k} {v or nan:.3f}" for k, v in got.items()))
    vendor = entry.get("vendor") or {}
    if "seconds" in vendor and found:
        print(f"  {vendor['name']}: {vendor['seconds'] * 1e3:.4f} ms (best found / cuBLAS time = "
              f"{found / vendor['seconds']:.2f})")


def chunk_range(text: str) -> tuple[int, int]:
    """--chunks A:B, checked."""
    try:
        first, last = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not A:B (two chunk numbers, e.g. 0:43)") from None
    if not 0 <= first < last:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= A < B")
    return first, last


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default="bert_ffn2,mm4096", help=f"subset of {', '.join(WORKLOADS)}")
    p.add_argument("--tuners", help=f"subset of {', '.join(TUNERS)} (default: all but grid; all with "
                   "--exhaustive)")
    p.add_argument("--trials", type=int, help="trials per tuner and workload (default 32; 50 with --exhaustive)")
    p.add_argument("--batch", type=int, default=8, help="candidates built in parallel per turn")
    p.add_argument("--quick", action="store_true", help="bert_ffn2 only, 16 trials, no random search")
    p.add_argument("--simulate", action="store_true",
                   help="no GPU: 'measure' with the model times noise (checks the script, not the model)")
    p.add_argument("--no-share", action="store_true", help="measure a configuration again for each tuner")
    p.add_argument("--budget-minutes", type=float, default=5.0,
                   help="start no new round of batches after this long (default 5: the run ends within 7)")
    p.add_argument("--records-dir", help="keep the records here (a killed run resumes; default: temporary)")
    p.add_argument("--plot", action="store_true", help="write a PNG of the curves per workload")
    p.add_argument("--out", help="result JSON (default benchmarks/results/alcop_search-<date>.json)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exhaustive", action="store_true",
                   help="measure every valid configuration first; the tuners then search that table")
    p.add_argument("--prebuild", metavar="DIR", help="with --exhaustive: only build every configuration into "
                   "DIR (no GPU; resumable)")
    p.add_argument("--prebuilt", metavar="DIR", help="with --exhaustive: run the configurations --prebuild "
                   "built into DIR instead of building them")
    p.add_argument("--target", help="with --prebuild: the GPU to build for (default cuda:sm_90a, the H100)")
    p.add_argument("--chunks", metavar="A:B", type=chunk_range, help="with --prebuild: only chunks A to B-1 "
                   "(32 configurations each), e.g. to share the building between machines")
    p.add_argument("--builders", type=int, default=0, help="parallel build processes (default: every core)")
    args = p.parse_args(argv)
    if args.trials is None:
        args.trials = 50 if args.exhaustive else 32
    if args.tuners is None:
        args.tuners = ",".join(t for t in TUNERS if args.exhaustive or t != "grid")
    if (args.prebuild or args.prebuilt) and not args.exhaustive:
        p.error("--prebuild and --prebuilt go with --exhaustive")
    if args.prebuilt and args.simulate:
        p.error("--prebuilt runs real kernels; leave out --simulate")
    if args.prebuilt and not Path(args.prebuilt).is_dir():
        p.error(f"--prebuilt {args.prebuilt}: no such folder (make it with --prebuild)")
    if args.chunks and not args.prebuild:
        p.error("--chunks goes with --prebuild")
    if args.quick:
        args.workloads, args.trials = "bert_ffn2", min(args.trials, 16)
        args.tuners = ",".join(t for t in args.tuners.split(",") if t != "random")
    workloads = args.workloads.split(",")
    tuners = args.tuners.split(",")
    for w in workloads:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    if args.prebuild:
        try:
            target = as_target(args.target or "cuda:sm_90a")
        except PolytileError as err:
            p.error(f"--target: {err}")
        deadline = time.monotonic() + 60 * args.budget_minutes
        with Measurer(MeasureOptions(builders=args.builders)) as builder:
            for w in workloads:
                op_name, shape = WORKLOADS[w]
                try:
                    task = make_task(op_name, target, template=f"{op_name}_tensorcore", **shape)
                    prebuild(w, task, builder, Path(args.prebuild), deadline, args.chunks)
                except ValueError as err:  # chunks of other sources
                    print(f"alcop_search: {err}", file=sys.stderr)
                    return 2
        return 0
    if not args.simulate and (why := preflight()):
        print(f"alcop_search: {why}", file=sys.stderr)
        return 2
    target = as_target("cuda")
    start = time.monotonic()
    deadline = start + 60 * args.budget_minutes
    result: dict = {
        "benchmark": "alcop_search",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/alcop_search.py", *argv]),
        "device": device_info(args.simulate),
        "target": target.key, "simulated": args.simulate, "trials": args.trials, "batch": args.batch,
        "tuners": tuners, "shared_measurements": not args.no_share, "workloads": {},
    }
    records_dir = Path(args.records_dir or tempfile.mkdtemp(prefix="alcop-records-"))
    records_dir.mkdir(parents=True, exist_ok=True)
    date = datetime.date.today().isoformat()
    out = Path(args.out or ROOT / "benchmarks" / "results" /
               f"alcop_search{'-simulated' if args.simulate else ''}-{date}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: STOP.append("SIGTERM"))
    # one input set per workload: the float64 reference of a 4096³ GEMM takes seconds on one core
    inner = SimulatedMeasurer() if args.simulate else Measurer(MeasureOptions(
        builders=args.builders, repeat=10, min_time=0.05, same_inputs=True))
    measurer = SharedMeasurer(inner, share=not args.no_share)
    try:
        for w in workloads:
            if STOP:
                break
            try:
                entry = run_workload(w, args, tuners, target, measurer, records_dir, deadline)
            except Exception as err:  # noqa: BLE001 - the other workloads still run and are recorded
                entry = {"error": f"{type(err).__name__}: {err}"}
                print(f"{w}: {entry['error']}", file=sys.stderr)
            result["workloads"][w] = entry
            save(result, out, start, measurer)  # after every workload: a kill keeps the rest
    finally:
        inner.close()
    save(result, out, start, measurer)
    checkpoints = sorted({n for n in (1, 8, 16, 32, 64, args.trials) if n <= args.trials})
    for w, entry in result["workloads"].items():
        if "error" not in entry and "measured_configs" not in entry:  # an exhaustive run cut short
            ex = entry["exhaustive"]
            print(f"\n{w}: exhaustive table incomplete, {ex['measured']}/{ex['valid_configs']} measured so far")
        elif "error" not in entry:
            print_summary(w, entry, checkpoints)
            if args.plot:
                curves = {t: [c if c is not None else math.inf for c in info.get("curve", [])]
                          for t, info in entry["tuners"].items()}
                first, *rest = curves
                vendor = (entry.get("vendor") or {}).get("seconds")
                png = out.with_name(f"{out.stem}-{w}.png")
                plot_curve(curves[first], png, f"{w} on {target.key}", vendor, {t: curves[t] for t in rest},
                           label=first)
                print(f"  plot: {png}")
    print(f"\nwrote {out} ({result['seconds']} s, {measurer.measured} distinct measurements; records in "
          f"{records_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
