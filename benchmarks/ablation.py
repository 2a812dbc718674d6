"""Ablation of the Hopper techniques (issue 17; ALCOP's ablation), in one run on one GPU.

For the warpgroup-MMA GEMM (``gemm_choice``'s default: ``gemm_wgmma`` with its tiles, stages, MMA
groups in flight, TMA loads and grouped block order) and one implicit-GEMM convolution (ResNet-50's
3×3 256→256 on 14×14 at batch 32, ``igemm_choice``'s default), each technique the compiler applies
is switched off one at a time from the default ("off" rows), each opt-in technique switched on
("on" rows), and the kernel is built up cumulatively from a plain one (mma.sync without
pipelining) to the default, as ALCOP's figure does ("build-up" rows). Techniques without an off
switch are listed as such, not built. Every variant goes through the operators' own scheduling
code (``gemm_as``, ``igemm_schedule``, the tuning template for the analytical model's first pick)
with one parameter changed, results stored in the operands' type (as cuBLAS/cuDNN store them).

Every built variant is checked against a float32 reference (torch on upcast inputs) on fresh random
inputs with its output poisoned with NaN first; a variant that fails to build or is wrong is
reported as such and not timed. Timing: CUDA events, L2 flushed before each launch, rounds
interleaved over the variants and torch (cuBLAS/cuDNN), medians; per call from Python for the
default and torch. Writes a JSON record (device, date, command, rows) and prints a markdown table
last (time / its baseline's time: above 1 is slower; × torch: torch's time / ours).

    python benchmarks/ablation.py [--shapes gemm4096-fp16,...,r50-conv4-fp16] [--variants default,stages-1,...]
        [--rounds 5] [--repeat 10] [--out FILE.json] [--workers 14] [--triton]
    python benchmarks/ablation.py --build-only [--target cuda:sm_90a]   # no GPU: lower and compile every variant
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import polytile as pt  # noqa: E402
from polytile import ops  # noqa: E402
from polytile.dtypes import as_dtype  # noqa: E402
from polytile.ops.conv_choice import IgemmChoice, igemm_choice, igemm_options, igemm_splits, no_deeper  # noqa: E402
from polytile.ops.gpu_schedules import GemmChoice, gemm_as, gemm_choice, igemm_schedule, tma_fits  # noqa: E402
from polytile.target import CUDATarget, as_target  # noqa: E402
from polytile.tune.analytical import Hardware, WgmmaConfig, occupancy  # noqa: E402

DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class Workload:
    """A GEMM (dims M, N, K) or an NHWC implicit-GEMM convolution (N, H, W, C, K, R, S, stride, padding)."""

    kind: str  # "matmul" or "conv2d_igemm"
    dims: tuple[int, ...]
    dtype: str

    def op(self) -> ops.Op:
        if self.kind == "matmul":
            return ops.matmul(*self.dims, self.dtype, out_dtype=self.dtype)
        return ops.conv2d_igemm(*self.dims, dtype=self.dtype, out_dtype=self.dtype)

    @property
    def spec(self) -> dict:
        """The workload as ``pipelining.py``'s peers (``vendor``, ``torch_inputs``) take it."""
        return {"kind": self.kind, "dims": self.dims}



def _mma_steps(kind: str, mma: GemmChoice | IgemmChoice) -> list[tuple[str, str, tuple[str, object]]]:
    """The build-up's first steps on mma.sync (``kind``: "gemm" or "igemm", ``mma`` its choice): no
    pipelining, then the shared stages, then the register level (ALCOP's multi-level pipeline)."""
    mp = mma.params
    return [("plain", "mma.sync, no pipelining (stages 1, reg_stages 1)",
             (kind, replace(mma, params={**mp, "stages": 1, "reg_stages": 1}))),
            ("+stages", f"+ {mp['stages']} shared stages (cp.async)",
             (kind, replace(mma, params={**mp, "reg_stages": 1}))),
            ("+registers", "+ register double-buffering (ALCOP's multi-level pipeline)", (kind, mma))]

def _named() -> dict[str, Workload]:
    out = {}
    for tag, dtype in DTYPES.items():
        for n in (4096, 8192):
            out[f"gemm{n}-{tag}"] = Workload("matmul", (n, n, n), dtype)
    out["bert-ffn2-fp16"] = Workload("matmul", (512, 768, 3072), "float16")  # BERT-base's FFN down-projection
    out["bert-ffn1-fp16"] = Workload("matmul", (512, 3072, 768), "float16")
    out["r50-conv4-fp16"] = Workload("conv2d_igemm", (32, 14, 14, 256, 256, 3, 3, 1, 1), "float16")
    return out


WORKLOADS = _named()
DEFAULT_SHAPES = "gemm4096-fp16,gemm4096-bf16,gemm8192-fp16,gemm8192-bf16,bert-ffn2-fp16,r50-conv4-fp16"


def workload(name: str) -> Workload:
    """A named workload, or ``MxNxK-fp16`` / ``MxNxK-bf16`` for another GEMM."""
    if name in WORKLOADS:
        return WORKLOADS[name]
    dims, _, tag = name.partition("-")
    try:
        return Workload("matmul", tuple(int(x) for x in dims.split("x")), DTYPES[tag])
    except (KeyError, ValueError):
        raise SystemExit(f"unknown shape {name!r}: one of {', '.join(WORKLOADS)} or MxNxK-fp16/-bf16") from None


@dataclass(frozen=True)
class Variant:
    """One row of the ablation: ``how`` it is built (None: not built, ``change`` says why), the
    ``technique`` it concerns, its ``role`` ("default", "off": the technique switched off from the
    default, "on": an opt-in technique switched on, "same": a choice that turned out to be the
    default's, "build-up": one step of the cumulative build-up, "no switch") and the variant its time
    is compared with (``baseline``)."""

    name: str
    role: str
    technique: str
    change: str
    how: tuple | None
    baseline: str = "default"


def build_key(how: tuple) -> str:
    """One key per distinct kernel (variants that build the same kernel are built and timed once)."""
    def plain(x: object) -> object:
        if dataclasses.is_dataclass(x):
            return {k: plain(v) for k, v in dataclasses.asdict(x).items() if k != "seconds"}
        if isinstance(x, dict):
            return {k: plain(v) for k, v in sorted(x.items())}
        if isinstance(x, (tuple, list)):
            return [plain(v) for v in x]
        return x
    return json.dumps(plain(how), sort_keys=True)


# --- GEMM variants -----------------------------------------------------------------------------------

def without_wgmma(target: CUDATarget) -> CUDATarget:
    """The same GPU's facts without warpgroup MMA (sm_90): the choice its operators would make on mma.sync."""
    return replace(target, arch="sm_90")


def model_first_pick(op: ops.Op, target: CUDATarget, template: str) -> tuple[dict[str, object], bool]:
    """The configuration the analytical tuner measures first (``AnalyticalTuner``: the template's model),
    and whether it is the template's default (its first configuration: the operator's default)."""
    from polytile.tune.search import AnalyticalTuner
    from polytile.tune.task import make_task
    task = make_task(op, target, template=template)
    space = task.space
    tuner = AnalyticalTuner(space, predict=lambda ds: task.predict([space.config(d).values for d in ds]))
    pick = dict(space.config(tuner.next_batch(1)[0]).values)
    return pick, pick == dict(space.config_at(0).values)


def gemm_variants(w: Workload, target: CUDATarget, model_pick: bool = True) -> list[Variant]:
    from tma_gemm import variant_config  # the TMA store's staging tile beside fewer stages where needed
    M, N, K = w.dims
    dt = as_dtype(w.dtype)
    d = gemm_choice(target, M, N, K, dt, out_bytes=dt.itemsize)
    if d.kernel != "wgmma":
        raise SystemExit(f"{w}: the default GEMM is on {d.kernel}, not warpgroup MMA: the ablation needs an sm_90a "
                         "target and at least 17 rows")
    p = d.params
    tma = p.get("producer") == "tma"

    def wg(**change: object) -> tuple:
        params = {k: v for k, v in {**p, **change}.items() if v is not None}
        return ("gemm", replace(d, params=params, seconds=0.0))

    mma = gemm_choice(without_wgmma(target), M, N, K, dt, out_bytes=dt.itemsize, split_k=d.split)
    mma = replace(mma, seconds=0.0)
    mp = mma.params
    v = [Variant("default", "default", "all (the default)", _describe(d), ("gemm", replace(d, seconds=0.0)),
                 baseline="")]
    # switched off from the default
    v += _fewer_stages(p, wg, "cp.async: TMA rings need 2")
    if p.get("inflight"):
        v.append(Variant("inflight-0", "off", "asynchronous MMA groups in flight (wgmma.wait_group)",
                         f"inflight {p['inflight']} → 0", wg(inflight=0)))
    v.append(Variant("cp.async", "off" if tma else "no switch", "TMA loads (cp.async.bulk.tensor, mbarrier rings)",
                     "producer tma → threads (cp.async, commit groups)" if tma
                     else "the default loads with cp.async here (rows not 16-byte aligned or tiles past the matrix)",
                     wg(producer=None) if tma else None))
    v.append(Variant("swizzle", "no switch", "128-byte swizzled shared tiles",
                     "no switch: tensorize(wgmma) stores 64-wide tiles swizzled and TMA fills only swizzled "
                     "tiles; the unswizzled core-matrix layout appears only for tiles under 64 wide", None))
    v.append(Variant("mma.sync", "off", "wgmma (vs mma.sync)",
                     f"mma.sync with the choice gemm_choice makes without wgmma: {_describe(mma)}", ("gemm", mma)))
    if mp.get("reg_stages", 1) > 1:
        v.append(Variant("mma.sync-reg1", "off", "multi-level pipelining (register double-buffering, ALCOP)",
                         "on the mma.sync kernel: reg_stages 2 → 1 (wgmma reads its operands from shared memory: "
                         "no register level to switch)",
                         ("gemm", replace(mma, params={**mp, "reg_stages": 1})), baseline="mma.sync"))
    group = p.get("group", 1)
    if group > 1:
        v.append(Variant("group-1", "off", "grouped block order (rasterization)", f"group {group} → 1 (row by row)",
                         wg(group=None)))
    else:
        v.append(Variant("group-8", "on", "grouped block order (rasterization)",
                         "group 1 → 8 (the model's group for this shape is 1)", wg(group=8)))
    v.append(_split_variant(d, target, M, N, K, dt.itemsize))
    # switched on (opt-in)
    v.append(Variant("persistent-1", "on", "persistent blocks", "persistent=1 (one block per SM)",
                     wg(persistent=1)))
    fits = occupancy(WgmmaConfig(p["bm"], p["bn"], p["bk"], p["stages"], p.get("inflight", 0)),
                     Hardware.of(target), dt.itemsize).blocks
    if fits > 1:
        v.append(Variant(f"persistent-{fits}", "on", "persistent blocks",
                         f"persistent={fits} (as many blocks per SM as fit, as the tuning template does)",
                         wg(persistent=fits)))
    staged = variant_config("tma-store", p, dt.itemsize, target.shared_per_block)
    staged = {**staged, "producer": p.get("producer")}
    shrink = f"; stages {p['stages']} → {staged['stages']} to fit the staging tile" if staged["stages"] != p["stages"] \
        else ""
    fewer = f"stages-{staged['stages']}"  # the same stages with the threads' stores: the store's own effect
    v.append(Variant("tma-store", "on", "TMA stores", f"store threads → tma{shrink}",
                     wg(**{k: staged[k] for k in ("store", "stages", "inflight", "producer")}),
                     baseline=fewer if shrink and any(x.name == fewer for x in v) else "default"))
    if tma:
        v.append(Variant("specialize", "on", "warp specialization (producer warpgroup, setmaxnreg)",
                         "specialize=True", wg(specialize=True)))
    if model_pick:
        pick, same = model_first_pick(w.op(), target, "matmul_wgmma")
        v.append(Variant("model-first", "same" if same else "on",
                         "the analytical model's first pick (matmul_wgmma template)",
                         _values(pick) + (" (the template's default configuration)" if same else ""),
                         ("template", "matmul_wgmma", pick)))
    # built up from a plain kernel
    base = {**p, "inflight": 0, "producer": None, "group": None}
    steps = [*_mma_steps("gemm", mma),
             ("+wgmma", f"+ wgmma in swizzled tiles {p['bm']}×{p['bn']}×{p['bk']}, {p['stages']} stages (cp.async)",
              wg(**{k: base[k] for k in ("inflight", "producer", "group")}))]
    if p.get("inflight"):
        steps.append(("+inflight", f"+ {p['inflight']} MMA group in flight", wg(producer=None, group=None)))
    if tma:
        steps.append(("+tma", "+ TMA loads on mbarrier rings", wg(group=None)))
    if group > 1:
        steps.append(("+group", f"+ grouped block order ({group} rows of tiles): the default", wg()))
    return v + _build_up(steps)


def _fewer_stages(p: dict[str, int], make: object, single: str = "") -> list[Variant]:
    """The pipeline 1, 2 and 3 stages deep where the default's is deeper (1: none; the MMA groups left
    in flight that the stages allow: inflight + 2 at most); ``single``: what else one stage changes."""
    out = []
    for stages in (1, 2, 3):
        if stages >= p["stages"]:
            break
        inflight = min(p.get("inflight", 0), max(0, stages - 2))
        change = {"stages": stages, "inflight": inflight, **({"producer": None} if stages == 1 and single else {})}
        notes = [single] if stages == 1 and single else []
        notes += [f"inflight {inflight}"] if inflight != p.get("inflight", 0) else []
        out.append(Variant(f"stages-{stages}", "off", "multi-stage shared-memory pipelining",
                           f"stages {p['stages']} → {stages}" + (f" ({'; '.join(notes)})" if notes else ""),
                           make(**change)))  # type: ignore[operator]
    return out


def _split_variant(d: GemmChoice, target: CUDATarget, M: int, N: int, K: int, itemsize: int) -> Variant:
    """Split-K switched off where the default splits; on (enough chunks for a wave) where the default's
    tiles leave SMs idle; else not applicable."""
    p = d.params
    if d.split > 1:
        return Variant("split-1", "off", "split-K", f"split {d.split} → 1", ("gemm", replace(d, split=1, chunk=0,
                                                                                              seconds=0.0)))
    tiles = -(-M // p["bm"]) * -(-N // p["bn"])
    split = -(-target.sms // tiles)
    chunk = K // split if K % split == 0 else 0
    if tiles >= target.sms or split < 2 or not chunk or chunk % p["bk"] or chunk < 2 * p["bk"]:
        return Variant("split-k", "no switch", "split-K",
                       f"not applicable: the default's {tiles} tiles fill the {target.sms} SMs, or K={K} has no "
                       "split into whole K tiles", None)
    params = dict(p) if tma_fits(p, M, N, K, itemsize, 1, split) else {k: v for k, v in p.items() if k != "producer"}
    return Variant(f"split-{split}", "on", "split-K",
                   f"split 1 → {split} (the default's {tiles} tiles on {target.sms} SMs)",
                   ("gemm", replace(d, params=params, split=split, chunk=0, seconds=0.0)))


def _build_up(steps: list[tuple[str, str, tuple]]) -> list[Variant]:
    out = []
    for k, (name, change, how) in enumerate(steps):
        out.append(Variant(name, "build-up", "cumulative", change, how, baseline=steps[k - 1][0] if k else ""))
    return out


def _describe(c: GemmChoice | IgemmChoice) -> str:
    if isinstance(c, GemmChoice):
        return f"{c.kernel} {_values(c.params)}" + (f", split {c.split}" if c.split > 1 else "")
    split = "unsplit" if not c.rows and c.chunks == 1 else f"split rows={c.rows} chunks={c.chunks}"
    return f"{c.kernel} {_values(c.params)}, {split}"


def _values(values: dict[str, object]) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items())


# --- convolution variants ----------------------------------------------------------------------------

def conv_variants(w: Workload, target: CUDATarget) -> list[Variant]:
    N, H, W, C, K, R, S, stride, pad = w.dims
    P, Q = (H + 2 * pad - R) // stride + 1, (W + 2 * pad - S) // stride + 1
    M = N * P * Q
    it = as_dtype(w.dtype).itemsize
    args = (M, C, K, R, S, it, N * H * W, it)
    d = replace(igemm_choice(target, *args), seconds=0.0)
    if d.kernel != "wgmma":
        raise SystemExit(f"{w}: the default implicit GEMM is on {d.kernel}, not warpgroup MMA (an sm_90a target)")
    p = d.params
    split = d.rows or d.chunks > 1
    steps_unsplit = R * S * -(-C // p["bk"])

    def ig(**change: object) -> tuple:
        return ("igemm", replace(d, params={**p, **change}))

    mma = replace(igemm_choice(without_wgmma(target), *args), seconds=0.0)
    v = [Variant("default", "default", "all (the default)", _describe(d), ("igemm", d), baseline="")]
    v += _fewer_stages(p, ig)
    if p.get("inflight"):
        v.append(Variant("inflight-0", "off", "asynchronous MMA groups in flight (wgmma.wait_group)",
                         f"inflight {p['inflight']} → 0", ig(inflight=0)))
    for name, technique, why in (
            ("cp.async", "TMA loads", "no switch: the gathered input tile (im2col) is loaded by zero-filling cp.async "
                                      "copies; igemm_wgmma has no TMA producer"),
            ("swizzle", "128-byte swizzled shared tiles", "no switch (tensorize(wgmma) sets the layout)"),
            ("group", "grouped block order (rasterization)", "no switch: igemm_wgmma has no raster/group option"),
            ("persistent", "persistent blocks", "no switch: igemm_wgmma has no persistent option"),
            ("tma-store", "TMA stores", "no switch: igemm_wgmma has no store option")):
        v.append(Variant(name, "no switch", technique, why, None))
    v.append(Variant("mma.sync", "off", "wgmma (vs mma.sync)",
                     f"mma.sync with the choice igemm_choice makes without wgmma: {_describe(mma)}", ("igemm", mma)))
    if mma.params.get("reg_stages", 1) > 1:
        v.append(Variant("mma.sync-reg1", "off", "multi-level pipelining (register double-buffering, ALCOP)",
                         "on the mma.sync kernel: reg_stages 2 → 1",
                         ("igemm", replace(mma, params={**mma.params, "reg_stages": 1})), baseline="mma.sync"))
    if split:
        v.append(Variant("split-1", "off", "split-K (filter rows / channel chunks)", "unsplit",
                         ("igemm", replace(d, rows=False, chunks=1, params=no_deeper(p, steps_unsplit)))))
    elif (False, 2) in igemm_splits(C, R, S, p["bk"]):
        v.append(Variant("split-c2", "on", "split-K (filter rows / channel chunks)", "2 channel chunks",
                         ("igemm", replace(d, chunks=2))))
    first = replace(igemm_options(target, *args)[0], seconds=0.0)
    same = build_key(("igemm", first)) == build_key(("igemm", d))
    v.append(Variant("model-first", "same" if same else "on", "the analytical model's first pick (igemm_options)",
                     _describe(first) + (" (the default's: no margin overrides it)" if same else ""),
                     ("igemm", first)))
    steps = [*_mma_steps("igemm", mma),
             ("+wgmma", f"+ wgmma in swizzled tiles {p['bm']}×{p['bn']}×{p['bk']}, {p['stages']} stages",
              ("igemm", replace(d, rows=False, chunks=1, params={**no_deeper(p, steps_unsplit), "inflight": 0})))]
    if p.get("inflight"):
        steps.append(("+inflight", f"+ {p['inflight']} MMA group in flight",
                      ("igemm", replace(d, rows=False, chunks=1, params=no_deeper(p, steps_unsplit)))))
    if split:
        steps.append(("+split", f"+ the split ({_describe(d)}): the default", ("igemm", d)))
    return v + _build_up(steps)


def variants(w: Workload, target: CUDATarget, model_pick: bool = True) -> list[Variant]:
    return gemm_variants(w, target, model_pick) if w.kind == "matmul" else conv_variants(w, target)


# --- building ----------------------------------------------------------------------------------------

def schedule(w: Workload, how: tuple, target: CUDATarget) -> pt.Schedule:
    """The schedule of a variant, by the operators' own code: ``gemm_as`` of a GEMM choice,
    ``igemm_schedule`` of an implicit-GEMM choice, or a tuning template's configuration."""
    op = w.op()
    sched = pt.Schedule(op.func)
    if how[0] == "gemm":
        return gemm_as(sched, how[1], *w.dims) or sched
    if how[0] == "igemm":
        return igemm_schedule(sched, target, how[1], *w.dims) or sched
    from polytile.tune.task import make_task
    return make_task(op, target, template=how[1]).schedule(how[2])


def build(job: tuple[Workload, tuple, CUDATarget]) -> tuple[object, float]:
    """The kernel of one variant (in a worker process), or the error's text; seconds spent."""
    w, how, target = job
    t0 = time.perf_counter()
    try:
        return pt.build(schedule(w, how, target), target), time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - a variant that does not build is reported, the run goes on
        return f"{type(e).__name__}: {e}"[:1500], time.perf_counter() - t0


def build_all(plan: dict[str, tuple[Workload, list[Variant]]], target: CUDATarget, pool: ProcessPoolExecutor
              ) -> dict[tuple[str, str], tuple[object, float]]:
    """Every distinct kernel of the plan, by (workload name, build key)."""
    jobs = {(name, build_key(v.how)): (w, v.how, target) for name, (w, vs) in plan.items() for v in vs if v.how}
    return dict(zip(jobs, pool.map(build, jobs.values(), chunksize=1)))


def _variants_job(job: tuple[Workload, CUDATarget, bool]) -> list[Variant]:
    return variants(*job)


def resources(kern: object) -> dict:
    return {"registers": {n: r.registers for n, r in kern.resources.items()},  # type: ignore[attr-defined]
            "spills": sum(r.spill_stores for r in kern.resources.values())}  # type: ignore[attr-defined]


# --- measuring ---------------------------------------------------------------------------------------

def check(kern: object, w: Workload, seed: int) -> float:
    """‖out − ref‖ / ‖ref‖ of ``kern`` on fresh random inputs, its output poisoned with NaN first
    (infinite where any element is not finite: unwritten or NaN), in float64 on the GPU."""
    import torch
    from pipelining import torch_inputs, vendor
    inputs = torch_inputs(w.spec, w.dtype, seed)
    ref = vendor(w.spec, inputs)[2]().double()
    out = torch.full(tuple(ref.shape), float("nan"), device="cuda", dtype=inputs[0].dtype)
    kern(*inputs, out)  # type: ignore[operator]
    if not bool(torch.isfinite(out).all()):
        return math.inf
    return float((out.double() - ref).norm() / ref.norm())


def per_call(fn: object, calls: int = 50) -> float:
    """Seconds per call from Python: a loop of ``fn()`` synchronized at the end (after a warm-up)."""
    import torch
    for _ in range(5):
        fn()  # type: ignore[operator]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()  # type: ignore[operator]
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls


LIBRARY = "library"  # torch's call among the kernels a round times


def measure(name: str, w: Workload, vs: list[Variant], built: dict, args: argparse.Namespace) -> dict:
    """Check every built variant, then time the correct ones beside torch in interleaved rounds."""
    import torch
    from pipelining import time_triton, torch_inputs, triton_gemm, vendor

    from polytile.runtime.timing import time_gpu
    op = w.op()
    row: dict = {"workload": name, "kind": w.kind, "dims": list(w.dims), "dtype": w.dtype, "flops": op.flops,
                 "variants": {}}
    kernels: dict[str, object] = {}  # the correct ones, timed
    checked: dict[str, dict] = {}  # by build key: a kernel shared by several variants is checked once
    for k, v in enumerate(vs):
        entry: dict = {"role": v.role, "technique": v.technique, "change": v.change, "baseline": v.baseline}
        row["variants"][v.name] = entry
        if v.how is None:
            continue
        key = build_key(v.how)
        if key not in checked:
            checked[key] = result = {}
            kern, build_s = built[(name, key)]
            result["build_s"] = round(build_s, 1)
            if isinstance(kern, str):
                result["error"] = kern
            else:
                result.update(resources(kern))
                try:
                    err = check(kern, w, seed=1000 + k)
                    result["rel_error"] = err
                    if math.isfinite(err) and err < args.tolerance:
                        kernels[key] = kern
                    else:
                        result["error"] = f"wrong: relative error {err:.3g} (tolerance {args.tolerance})"
                except pt.PolytileError as e:
                    result["error"] = f"{type(e).__name__}: {e}"[:1500]
        entry.update(checked[key], kernel=key)
    inputs = torch_inputs(w.spec, w.dtype, seed=1)
    library, lib_fn, _, _ = vendor(w.spec, inputs)
    out = torch.empty(tuple(int(d.value) for d in op.func.outputs[0].shape), device="cuda", dtype=inputs[0].dtype)
    times: dict[str, list[float]] = {key: [] for key in [*kernels, LIBRARY]}
    order = [*kernels, LIBRARY]
    for k in range(args.rounds):
        if args.shuffle:  # a drift of the clocks within a round falls on other variants each round
            random.Random(k).shuffle(order)
        for key in order:
            kern = kernels.get(key)
            times[key].append(time_gpu(lib_fn, repeat=args.repeat) if kern is None else
                              kern.benchmark(*inputs, out, repeat=args.repeat))  # type: ignore[attr-defined]
        if args.clocks:
            row.setdefault("clocks_rounds", []).append(clocks())
    theirs = times.pop(LIBRARY)
    row["library"] = library
    row["library_us"] = statistics.median(theirs) * 1e6
    for v in vs:
        entry = row["variants"][v.name]
        key = entry.get("kernel")
        if key in times and times[key]:
            t = statistics.median(times[key])
            entry.update(us=t * 1e6, tflops=op.flops / t / 1e12, vs_torch=row["library_us"] / (t * 1e6),
                         rounds_us=[x * 1e6 for x in times[key]])
    for v in vs:  # ratios to each row's baseline, once every time is known
        entry, base = row["variants"][v.name], row["variants"].get(v.baseline, {})
        if "us" in entry and "us" in base:
            entry["vs_baseline"] = entry["us"] / base["us"]
    default = kernels.get(row["variants"]["default"].get("kernel", ""))
    if default is not None:
        row["per_call_us"] = per_call(lambda: default(*inputs, out)) * 1e6  # type: ignore[operator]
        row["library_per_call_us"] = per_call(lib_fn) * 1e6
    if args.triton and w.kind == "matmul":
        gemm = triton_gemm()
        if gemm is not None:
            _, _, ref_fn, _ = vendor(w.spec, inputs)
            row["triton"] = time_triton(gemm, inputs[0], inputs[1], ref_fn(), args.repeat)
    return row


# --- reporting ---------------------------------------------------------------------------------------

def cell(entry: dict, times: bool = True) -> str:
    if "us" in entry:
        ratio = f"{entry['vs_baseline']:.2f}, " if "vs_baseline" in entry else ""
        return f"{ratio}{entry['vs_torch']:.2f}×" + (f" ({entry['us']:.1f} µs)" if times else "")
    if "error" in entry:
        return "WRONG" if entry["error"].startswith("wrong") else "build failed"
    return "no switch" if entry["role"] == "no switch" else "—"


ROLES = ("default", "off", "on", "same", "no switch", "build-up")


def markdown(rows: list[dict], times: bool = True) -> str:
    """Rows: the variants by role (the default, switched off, on, without a switch, the build-up), each
    role's in the order the workloads list them; columns: the workloads. A cell: time / baseline's
    time, × torch (torch's time / ours) and, with ``times``, our time."""
    first: dict[str, dict] = {}
    for r in rows:
        for n, entry in r["variants"].items():
            first.setdefault(n, entry)
    names = sorted(first, key=lambda n: ROLES.index(first[n]["role"]))  # stable: the listed order within a role
    head = "| variant | role | vs |" + "".join(f" {r['workload']} |" for r in rows)
    lines = [head, "|" + "---|" * (3 + len(rows))]
    for n in names:
        lines.append(f"| {n} | {first[n]['role']} | {first[n]['baseline'] or '—'} |"
                     + "".join(f" {cell(r['variants'][n], times) if n in r['variants'] else ''} |" for r in rows))
    lines.append("| torch | library | — |" + "".join(f" {r['library']} {r['library_us']:.1f} µs |" for r in rows))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"comma-separated, of {', '.join(WORKLOADS)} "
                        "or MxNxK-fp16/-bf16")
    parser.add_argument("--variants", default="", help="comma-separated variant names (default: all); the "
                        "default and each kept variant's baseline are always built")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (medians over them)")
    parser.add_argument("--repeat", type=int, default=10, help="timed launches per round (their median)")
    parser.add_argument("--shuffle", action="store_true", help="time each round's variants and torch in another "
                        "(seeded) order (default: torch first, then the variants as listed)")
    parser.add_argument("--clocks", action="store_true", help="record the SM clock and power after each round")
    parser.add_argument("--tolerance", type=float, default=1e-2, help="the largest relative error accepted")
    parser.add_argument("--out", help="the JSON record (default: benchmarks/results/ablation-<date>.json)")
    parser.add_argument("--workers", type=int, default=14, help="build processes")
    parser.add_argument("--triton", action="store_true", help="also Triton's tutorial GEMM (best of its configs)")
    parser.add_argument("--no-model", action="store_true", help="leave out the analytical model's first pick")
    parser.add_argument("--max-seconds", type=float, default=0, help="print what was measured and end after this "
                        "many seconds (0: no limit)")
    parser.add_argument("--table", help="print the markdown table of this record (no GPU) and end")
    parser.add_argument("--no-times", action="store_true", help="with --table: ratios only, not our times")
    parser.add_argument("--build-only", action="store_true", help="lower and compile every variant; no GPU")
    parser.add_argument("--target", default="", help="the target to build for (default: the GPU's; --build-only: "
                        "cuda:sm_90a)")
    args = parser.parse_args()
    if args.table:
        print(markdown(json.loads(Path(args.table).read_text())["rows"], times=not args.no_times))
        return 0
    started = time.perf_counter()
    target = as_target(args.target or ("cuda:sm_90a" if args.build_only else "cuda"))
    wanted = {n for n in args.variants.split(",") if n}
    names = args.shapes.split(",")
    pool = ProcessPoolExecutor(args.workers)  # the model's picks (seconds each), then the builds
    lists = pool.map(_variants_job, [(workload(n), target, not args.no_model) for n in names])
    plan = {n: (workload(n), vs) for n, vs in zip(names, lists)}
    known = {v.name for _, vs in plan.values() for v in vs}
    if wanted - known:
        parser.error(f"unknown variants {', '.join(sorted(wanted - known))} (of {', '.join(sorted(known))})")
    if wanted:
        plan = {name: (w, selected(vs, wanted)) for name, (w, vs) in plan.items()}
    t0 = time.perf_counter()
    with pool:
        built = build_all(plan, target, pool)
    print(f"built {len(built)} kernels in {time.perf_counter() - t0:.0f} s", flush=True)
    if args.build_only:
        failed = 0
        for name, (_, vs) in plan.items():
            for v in vs:
                if v.how is None:
                    print(f"{name:16s} {v.name:16s} {v.role:10s} {v.change}")
                    continue
                kern, secs = built[(name, build_key(v.how))]
                failed += isinstance(kern, str)
                what = kern if isinstance(kern, str) else ", ".join(
                    f"{k} {r} registers" for k, r in resources(kern)["registers"].items()) \
                    + f", {resources(kern)['spills']} spill stores"
                print(f"{name:16s} {v.name:16s} {v.role:10s} {secs:5.1f} s  {what}")
        return 1 if failed else 0
    import torch
    from gpu_ops import device_record
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    stamp = datetime.datetime.now(datetime.UTC)
    path = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"ablation-{stamp:%Y%m%d-%H%M}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"benchmark": "ablation", "date": stamp.isoformat(timespec="seconds"), "command": " ".join(sys.argv),
              **device_record(), "target": dataclasses.asdict(target),
              "timing": f"CUDA events, L2 flushed before each launch; {args.rounds} interleaved rounds of "
                        f"{args.repeat} launches{' in shuffled order' if args.shuffle else ''}, median of the rounds' "
                        "medians; results in the operands' type (as cuBLAS/cuDNN)", "rows": []}
    record["clocks_before"] = clocks()
    watchdog = threading.Timer(max(0.0, args.max_seconds - (time.perf_counter() - started)), report,
                               (record, path, 3))
    watchdog.daemon = True
    if args.max_seconds:  # a hung or slow run still prints what it measured, then ends
        watchdog.start()
    for name, (w, vs) in plan.items():
        row = measure(name, w, vs, built, args)
        record["rows"].append(row)
        path.write_text(json.dumps(record, indent=1, default=str))  # after each workload: a cut run keeps its rows
        print(json.dumps({k: v for k, v in row.items() if k != "variants"}), flush=True)
    watchdog.cancel()
    record["clocks_after"] = clocks()
    report(record, path, 0)
    return 0


def clocks() -> str:
    """The SM clock, power and temperature of the GPU in use (they move under load)."""
    import subprocess

    import torch
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    pci = [getattr(props, f"pci_{part}_id", None) for part in ("domain", "bus", "device")]
    which = [f"--id={pci[0]:08X}:{pci[1]:02X}:{pci[2]:02X}.0"] if None not in pci else []  # else every GPU's
    return subprocess.run(["nvidia-smi", *which, "--query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu",
                           "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()


def report(record: dict, path: Path, status: int) -> None:
    """Write the record and print the table; with a nonzero ``status`` (the deadline passed) end the process."""
    path.write_text(json.dumps(record, indent=1, default=str))
    if status:
        print(f"\n--max-seconds passed: {len(record['rows'])} workloads measured", flush=True)
    print(f"\nAblation on {record['device']} ({record['date']}); record {path}")
    print("cell: time / baseline's time (above 1: slower), × torch (its time / ours), our time\n")
    print(markdown(record["rows"]), flush=True)
    if status:
        os._exit(status)


def selected(vs: list[Variant], wanted: set[str]) -> list[Variant]:
    """The variants named in ``wanted``, with the default and their baselines (their ratios' denominators)."""
    keep = {"default"} | {v.name for v in vs if v.name in wanted}
    keep |= {v.baseline for v in vs if v.name in keep}
    return [v for v in vs if v.name in keep]


if __name__ == "__main__":
    sys.exit(main())
