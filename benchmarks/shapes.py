"""The shape suite (issue 15): polytile's default schedules on the shapes users run, beside torch.

Workloads are generated from model configurations, not listed by hand: the linear layers of
LLaMA-3-8B, GPT-2, BERT-base and BERT-large at 1, 8, 128 and 2048 tokens (1 and 8 are the
matrix–vector-like decode cases), their vocabulary projections, attention's batched GEMMs (heads ×
seq × seq × head_dim, prefill and decode), ResNet-50 and MobileNet-v2 convolutions at batch 1 and
32 (NHWC implicit GEMMs in fp16, and NCHW direct convolutions in fp32), softmax and layernorm rows
768 to 128256 wide, and deliberately awkward sizes (primes, K or N not a multiple of 8, M = 1).
Each model runs in its own dtype (LLaMA and BERT-base bf16, GPT-2 fp16, BERT-large fp32 with TF32
off), so that the suite covers all three.

Each workload is built with the operator's default schedule, checked against a float64 torch
reference with the operator's tolerance (``polytile.dtypes.tolerance``), and timed two ways,
interleaved with torch in the same process (BENCHMARKING.md):

  kernel  CUDA-event medians of single launches, L2 flushed before each (``kern.benchmark`` and
          ``time_gpu``), prepared arguments;
  call    the user's call from Python in a loop (``kern(a, b)``, which allocates its output and
          returns it; ``a @ b`` for torch), synchronized at the end, per call.

Ratios are torch time / polytile time (above 1: polytile is faster). GEMMs and convolutions of
16-bit inputs sum in float32 and write the input dtype, as torch does (the operators' ``out_dtype``;
since 2026-11-28, when the 16-bit write-back came to store whole 32-byte sectors: 0.95× against
0.70× over the 11 output-heavy workloads on an H200, docs/shapes-notes.md); ``--float32-out`` has
them write float32 (the accumulator: twice the bytes; the records before that date). Each is
checked against the float64 reference with the tolerance of its output type, which holds the
output's rounding (half a float16 or bfloat16 epsilon), and torch's own error is recorded beside it.

    python benchmarks/shapes.py [--quick] [--only PATTERN[,PATTERN]] [--repeat 20] [--rounds 3]
                                [--workers N] [--out FILE.json]
    python benchmarks/shapes.py --tune 32 [--records R.jsonl] ...  # after pt.tune, 32 trials per workload
    python benchmarks/shapes.py --cpu [--quick] [--only ...]        # CPU-sized variant vs NumPy/torch
    python benchmarks/shapes.py --offsuite [--only ...]            # shapes not in the suite
    python benchmarks/shapes.py --list [--cpu]                     # the workloads, nothing run
    python benchmarks/shapes.py --build-only [--target cuda:sm_90a] # fill the kernel cache (no GPU)
    python benchmarks/shapes.py --float32-out ...                  # 16-bit GEMMs/convs write float32
    python benchmarks/shapes.py --table RECORD.json                # the README's markdown table

PATTERN is a shell-style pattern or a substring of workload names (``llama*t1``, ``softmax``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import fnmatch
import json
import math
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import _devices  # noqa: E402
import _threads  # noqa: E402, F401 - sets the thread variables before NumPy loads its BLAS

# isort: split
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polytile import PolytileError, ops  # noqa: E402

# --- the workloads ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transformer:
    """The dimensions of a transformer that fix its GEMMs and row operators."""

    name: str
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    seq: int            # the attention length of the batched-GEMM workloads
    dtype: str
    gated: bool = False  # SwiGLU: gate and up projections fused into one GEMM of 2·ffn outputs
    fused_qkv: bool = True  # one GEMM for Q, K and V (else three of hidden × hidden)

    def linears(self) -> list[tuple[str, int, int]]:
        """(layer, in features, out features) of one block; equal shapes are listed once."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        qkv = ("qkv", self.hidden, q + 2 * kv) if self.fused_qkv else ("q", self.hidden, q)
        layers = [qkv, ("attn_out", q, self.hidden), ("mlp_up", self.hidden, self.ffn * (2 if self.gated else 1)),
                  ("mlp_down", self.ffn, self.hidden)]
        seen, out = set(), []
        for name, k, n in layers:
            if (k, n) not in seen:
                seen.add((k, n))
                out.append((name, k, n))
        return out


MODELS = (
    Transformer("llama3-8b", 4096, 14336, 32, 8, 128, 128256, 2048, "bfloat16", gated=True),
    Transformer("gpt2", 768, 3072, 12, 12, 64, 50257, 1024, "float16"),
    Transformer("bert-base", 768, 3072, 12, 12, 64, 30522, 512, "bfloat16", fused_qkv=False),
    Transformer("bert-large", 1024, 4096, 16, 16, 64, 30522, 512, "float32", fused_qkv=False),
)
TOKENS = (1, 8, 128, 2048)


@dataclass(frozen=True)
class ConvLayer:
    """One convolution of a CNN: input channels, output channels, kernel, stride, input size."""

    name: str
    C: int
    K: int
    R: int
    stride: int
    H: int

    def dims(self, batch: int) -> dict[str, int]:
        return dict(N=batch, H=self.H, W=self.H, C=self.C, K=self.K, R=self.R, S=self.R, stride=self.stride,
                    padding=self.R // 2)


RESNET50 = (
    ConvLayer("conv1", 3, 64, 7, 2, 224), ConvLayer("l1.3x3", 64, 64, 3, 1, 56),
    ConvLayer("l1.expand", 64, 256, 1, 1, 56), ConvLayer("l2.3x3", 128, 128, 3, 1, 28),
    ConvLayer("l3.reduce", 1024, 256, 1, 1, 14), ConvLayer("l4.3x3", 512, 512, 3, 1, 7),
)
# MobileNet-v2's dense convolutions (its depthwise 3×3 layers have no polytile operator)
MOBILENET_V2 = (
    ConvLayer("stem", 3, 32, 3, 2, 224), ConvLayer("b2.expand", 16, 96, 1, 1, 112),
    ConvLayer("b3.project", 144, 24, 1, 1, 56), ConvLayer("head", 320, 1280, 1, 1, 7),
)
# fp32 NCHW direct convolutions of ResNet-50 at batch 1
RESNET50_FP32 = ("l1.3x3", "l3.reduce", "l4.3x3")


HALF_OUTPUT = ("matmul", "batch_matmul", "conv2d_igemm", "conv2d")
"""The operators that take ``out_dtype``: with 16-bit inputs they write the input dtype, as torch."""


@dataclass(frozen=True)
class Workload:
    """One operator instance: ``ops.<kind>(**dims)`` in ``dtype``; ``family`` groups the table."""

    name: str
    kind: str
    dims: tuple[tuple[str, int], ...]
    dtype: str
    family: str
    half_out: bool = True  # 16-bit GEMMs and convolutions write the input dtype, as torch (not: --float32-out)

    def arguments(self) -> dict[str, object]:
        """The operator's arguments: sizes, dtype, and for 16-bit GEMMs and convolutions ``out_dtype``."""
        half = self.half_out and self.kind in HALF_OUTPUT and self.dtype in ("float16", "bfloat16")
        return {**dict(self.dims), "dtype": self.dtype, **({"out_dtype": self.dtype} if half else {})}

    def op(self) -> ops.Op:
        return ops.get(self.kind, **self.arguments())

    @property
    def shape(self) -> str:
        return "×".join(str(v) for _, v in self.dims)


def _w(name: str, kind: str, dtype: str, family: str, **dims: int) -> Workload:
    return Workload(name, kind, tuple(dims.items()), dtype, family)


def gpu_suite(quick: bool = False) -> list[Workload]:
    """The GPU suite: model GEMMs, attention, convolutions, row operators and awkward sizes."""
    tokens = (8, 128) if quick else TOKENS
    out: list[Workload] = []
    for m in MODELS:
        for layer, k, n in m.linears():
            out += [_w(f"{m.name}.{layer}.t{t}", "matmul", m.dtype, "linear", M=t, N=n, K=k) for t in tokens]
    for m in MODELS[:3]:  # vocabulary projections (BERT-large shares BERT-base's vocabulary)
        out += [_w(f"{m.name}.vocab.t{t}", "matmul", m.dtype, "vocab", M=t, N=m.vocab, K=m.hidden)
                for t in ((1, 128) if not quick else (128,))]
    for m in MODELS[:3]:  # attention: scores Q·Kᵀ and context P·V per head, prefill and decode
        h, s, d = m.heads, m.seq, m.head_dim
        out += [_w(f"{m.name}.attn_scores.s{s}", "batch_matmul", m.dtype, "attention", batch=h, M=s, N=s, K=d),
                _w(f"{m.name}.attn_context.s{s}", "batch_matmul", m.dtype, "attention", batch=h, M=s, N=d, K=s)]
        if not quick:
            out += [_w(f"{m.name}.decode_scores.s{s}", "batch_matmul", m.dtype, "attention", batch=h, M=1, N=s,
                       K=d),
                    _w(f"{m.name}.decode_context.s{s}", "batch_matmul", m.dtype, "attention", batch=h, M=1, N=d,
                       K=s)]
    for net, layers, dtype in (("resnet50", RESNET50, "float16"), ("mobilenetv2", MOBILENET_V2, "float16")):
        for batch in (1,) if quick else (1, 32):
            out += [_w(f"{net}.{c.name}.n{batch}", "conv2d_igemm", dtype, "conv", **c.dims(batch)) for c in layers]
    for c in RESNET50:
        if c.name in RESNET50_FP32:
            d = c.dims(1)
            out.append(_w(f"resnet50.{c.name}.n1.nchw", "conv2d", "float32", "conv", N=1, C=d["C"], H=d["H"],
                          W=d["W"], K=d["K"], R=d["R"], S=d["S"], stride=d["stride"], padding=d["padding"]))
    rows = [("attn_probs.gpt2", 12 * 1024, 1024), ("attn_probs.llama", 4 * 2048, 2048), ("awkward", 3000, 1000),
            ("vocab.bert", 512, 30522), ("vocab.bert", 128, 30522), ("vocab.gpt2", 128, 50257),
            ("vocab.gpt2", 8, 50257), ("vocab.llama", 32, 128256), ("vocab.llama", 1, 128256)]
    out += [_w(f"softmax.{what}.{M}x{N}", "softmax", "float32", "rows", M=M, N=N) for what, M, N in rows]
    norms = [("bert-base", 128, 768), ("gpt2", 2048, 768), ("bert-large", 2048, 1024), ("llama", 8, 4096),
             ("llama", 2048, 4096), ("awkward", 3001, 5003), ("wide", 16, 128256)]
    out += [_w(f"layernorm.{what}.{M}x{N}", "layernorm", "float32", "rows", M=M, N=N) for what, M, N in norms]
    awkward = [("odd_kn", 4095, 4097, 1023, "float16"), ("small_mn_long_k", 127, 255, 4096, "bfloat16"),
               ("square_4k_1k", 4096, 4096, 1024, "float16"), ("fp32_1536", 1536, 1536, 1536, "float32"),
               ("primes", 997, 1009, 1013, "float16"), ("primes", 1009, 2003, 509, "float32"),
               ("m1_odd", 1, 4097, 4093, "bfloat16"), ("k_not_8", 33, 1000, 999, "float16"),
               ("n_not_8", 2048, 1002, 4096, "bfloat16")]
    out += [_w(f"awkward.{what}.{M}x{N}x{K}", "matmul", dt, "awkward", M=M, N=N, K=K) for what, M, N, K, dt in awkward]
    if quick:
        out = out[::2]
    return _unique(out)


def cpu_suite(quick: bool = False) -> list[Workload]:
    """The CPU-sized variant (float32, what NumPy and torch's CPU kernels compute): the smaller
    models' linear layers at 1, 8 and 128 tokens, BERT's vocabulary projection, ResNet-50 and
    MobileNet-v2 convolutions at batch 1 (NCHW), the row operators and awkward sizes."""
    tokens = (1, 32) if quick else (1, 8, 128)
    out: list[Workload] = []
    for m in MODELS[1:]:
        for layer, k, n in m.linears():
            out += [_w(f"{m.name}.{layer}.t{t}", "matmul", "float32", "linear", M=t, N=n, K=k) for t in tokens]
    out += [_w(f"bert-base.vocab.t{t}", "matmul", "float32", "vocab", M=t, N=30522, K=768) for t in (1, 8)]
    out.append(_w("llama3-8b.attn_out.t1", "matmul", "float32", "linear", M=1, N=4096, K=4096))
    out.append(_w("bert-base.attn_scores.s128", "batch_matmul", "float32", "attention", batch=12, M=128, N=128,
                  K=64))
    for net, layers in (("resnet50", RESNET50), ("mobilenetv2", MOBILENET_V2)):
        for c in layers:
            d = c.dims(1)
            out.append(_w(f"{net}.{c.name}.n1", "conv2d", "float32", "conv", N=1, C=d["C"], H=d["H"], W=d["W"],
                          K=d["K"], R=d["R"], S=d["S"], stride=d["stride"], padding=d["padding"]))
    rows = [(512, 1024), (3000, 1000), (64, 30522), (8, 128256)]
    out += [_w(f"softmax.{M}x{N}", "softmax", "float32", "rows", M=M, N=N) for M, N in rows]
    out += [_w(f"layernorm.{M}x{N}", "layernorm", "float32", "rows", M=M, N=N) for M, N in
            [(128, 768), (512, 1024), (1001, 4093)]]
    awkward = [("odd_kn", 511, 513, 257), ("primes", 257, 509, 263), ("m1_odd", 1, 1025, 1023),
               ("n_not_8", 256, 1002, 768)]
    out += [_w(f"awkward.{what}.{M}x{N}x{K}", "matmul", "float32", "awkward", M=M, N=N, K=K)
            for what, M, N, K in awkward]
    if quick:
        out = out[::2]
    return _unique(out)


def offsuite() -> list[Workload]:
    """Shapes that are not in the suite, for checking that a change to the defaults holds up away from
    it (``--offsuite``): float32 GEMMs off every tile, 3-channel convolutions of other filters, GEMVs
    of odd sizes, 16-bit GEMMs and batched products of sizes no model has, convolutions of odd
    spatial sizes and channel counts, row operators of odd widths."""
    gemms = [(1, 3001, 2999, "float16"), (4, 1000, 1999, "float16"), (3, 5000, 777, "bfloat16"),
             (12, 2222, 3333, "bfloat16"), (1234, 2345, 777, "float16"), (300, 5003, 640, "bfloat16"),
             (2500, 96, 1536, "float16"), (61, 61, 8191, "bfloat16")]
    convs = [(3, 45, 45, 96, 160, 3, 3, 1, 1), (8, 33, 33, 256, 384, 1, 1, 1, 0), (2, 64, 64, 48, 72, 5, 5, 2, 2),
             (16, 15, 15, 320, 320, 3, 3, 1, 1)]
    return [*(_w(f"off.gemm.{M}x{N}x{K}", "matmul", dt, "awkward", M=M, N=N, K=K) for M, N, K, dt in gemms),
            _w("off.bmm.7x333x555x96", "batch_matmul", "bfloat16", "attention", batch=7, M=333, N=555, K=96),
            _w("off.bmm.20x1x1500x80", "batch_matmul", "float16", "attention", batch=20, M=1, N=1500, K=80),
            *(_w(f"off.conv.{N}x{H}x{W}x{C}x{K}x{R}x{S}s{st}", "conv2d_igemm", "float16", "conv", N=N, H=H, W=W, C=C,
                 K=K, R=R, S=S, stride=st, padding=pad) for N, H, W, C, K, R, S, st, pad in convs),
            _w("off.softmax.777x12345", "softmax", "float32", "rows", M=777, N=12345),
            _w("off.layernorm.5x70001", "layernorm", "float32", "rows", M=5, N=70001),
            _w("off.fp32.777x1531x999", "matmul", "float32", "awkward", M=777, N=1531, K=999),
            _w("off.fp32.256x3000x2000", "matmul", "float32", "awkward", M=256, N=3000, K=2000),
            _w("off.fp32.129x4095x1023", "matmul", "float32", "awkward", M=129, N=4095, K=1023),
            _w("off.conv.5x5s1.c3.n8", "conv2d_igemm", "float16", "conv", N=8, H=96, W=96, C=3, K=32, R=5, S=5,
               stride=1, padding=2),
            _w("off.conv.3x3s1.c3.n16", "conv2d_igemm", "float16", "conv", N=16, H=64, W=64, C=3, K=48, R=3, S=3,
               stride=1, padding=1)]


def random_shapes(count: int, seed: int) -> list[Workload]:
    """``count`` workloads of sizes drawn at random (``--random N --seed S``; the seed is in the record),
    so that a run checks the defaults on shapes nobody chose: GEMMs and GEMVs (sizes log-uniform, half
    of them rounded down to a multiple of 8, as a model's would be), batched products, NHWC convolutions
    (filters 1, 3, 5, 7, strides 1 and 2, channels from 3) and row operators from 1 row to 128k-wide rows, in the three
    dtypes. Sizes are bounded so that each workload runs within milliseconds."""
    rng = np.random.default_rng(seed)

    def size(lo: int, hi: int) -> int:
        v = int(round(float(np.exp(rng.uniform(np.log(lo), np.log(hi))))))
        if rng.random() < 0.5:  # half the sizes a multiple of 8, as a model's would be
            v = max(8, v // 8 * 8) if v >= 8 else v
        return max(lo, min(hi, v))

    out: list[Workload] = []
    kinds = ["matmul", "matmul", "matmul", "batch_matmul", "conv2d_igemm", "conv2d_igemm", "softmax", "layernorm"]
    while len(out) < count:
        kind = kinds[int(rng.integers(len(kinds)))]
        dt = ["float16", "bfloat16", "float32"][int(rng.integers(3))]
        if kind == "matmul":
            M = 1 if rng.random() < 0.15 else size(1, 8192)
            N, K = size(16, 16384), size(16, 8192)
            if M * N * K > 2 ** 37:
                continue
            out.append(_w(f"rand.gemm.{M}x{N}x{K}.{dt}", "matmul", dt, "awkward", M=M, N=N, K=K))
        elif kind == "batch_matmul":
            b, M, N, K = size(2, 64), size(1, 2048), size(16, 2048), size(16, 256)
            if b * M * N * K > 2 ** 35 or dt == "float32":
                continue
            out.append(_w(f"rand.bmm.{b}x{M}x{N}x{K}.{dt}", "batch_matmul", dt, "attention", batch=b, M=M, N=N,
                          K=K))
        elif kind == "conv2d_igemm":
            R = [1, 3, 3, 5, 7][int(rng.integers(5))]
            st = 1 if rng.random() < 0.7 else 2
            n, hw = [1, 1, 2, 8, 16, 32][int(rng.integers(6))], size(7, 112)
            C = 3 if rng.random() < 0.1 else size(8, 512)
            K = size(8, 512)
            P = (hw + 2 * (R // 2) - R) // st + 1
            if P < 1 or n * P * P * K * C * R * R > 2 ** 34:
                continue
            out.append(_w(f"rand.conv.{n}x{hw}x{hw}x{C}x{K}x{R}x{R}s{st}", "conv2d_igemm", "float16", "conv", N=n,
                          H=hw, W=hw, C=C, K=K, R=R, S=R, stride=st, padding=R // 2))
        else:
            M, N = size(1, 8192), size(8, 131072)
            if M * N > 2 ** 26:
                continue
            out.append(_w(f"rand.{kind}.{M}x{N}", kind, "float32", "rows", M=M, N=N))
        out = _unique(out)
    return out


def _unique(ws: list[Workload]) -> list[Workload]:
    seen, out = set(), []
    for w in ws:
        key = (w.kind, w.dims, w.dtype)
        if key not in seen:
            seen.add(key)
            out.append(w)
    return out


def select(ws: list[Workload], only: str) -> list[Workload]:
    pats = [p for p in only.split(",") if p]
    if not pats:
        return ws
    return [w for w in ws if any(fnmatch.fnmatchcase(w.name, p) or p in w.name for p in pats)]


# --- GPU --------------------------------------------------------------------------------------------


def build_one(w: Workload, target: str = "cuda"):  # noqa: ANN201 - (name, kernel or error, seconds)
    """Build ``w``'s default schedule (in a worker process; kernels are pickled back)."""
    t0 = time.perf_counter()
    try:
        return w.name, w.op().build(target), time.perf_counter() - t0
    except Exception as err:  # noqa: BLE001 - a failed build is recorded, the run goes on
        return w.name, f"{type(err).__name__}: {err}"[:2000], time.perf_counter() - t0


def _build_job(job: tuple[Workload, str]):  # noqa: ANN202
    return build_one(*job)


def build_all(ws: list[Workload], target: str, workers: int) -> dict[str, tuple[object, float]]:
    if workers <= 1:
        return {n: (k, s) for n, k, s in (build_one(w, target) for w in ws)}
    with ProcessPoolExecutor(workers) as ex:
        return {n: (k, s) for n, k, s in ex.map(_build_job, [(w, target) for w in ws])}


# --- tuning (--tune): workloads spread over GPUs, resumable ------------------------------------------------

WORKLOAD_SECONDS = 12.0
"""Per workload besides its trials: the template's space, the reference computed once, the last
builds' drain and the final timing against torch (the lead's try of this code, 2026-11-28 11:23 UTC:
3 workloads × 12 trials tuned and timed in 34 s on one H200, 31 builders)."""


def family(w: Workload) -> str:
    """The template family ``pt.tune`` picks for ``w`` on the GPU (for cost estimates only)."""
    if w.kind in ("softmax", "layernorm"):
        return "rows"
    if w.kind == "conv2d":
        return "conv2d"
    if w.kind == "conv2d_igemm":
        return "igemm"
    if dict(w.dims)["M"] <= 16:
        return "gemv"
    return "cuda" if w.dtype == "float32" else "wgmma"


def expected_seconds(w: Workload, trials: int, builders: int) -> float:
    """The wall time ``trials`` more trials of ``w`` should take with ``builders`` build processes: the
    builds or the runner bound the trials, whichever is slower."""
    return _devices.expected_seconds(trials, family(w), builders) + WORKLOAD_SECONDS


def tune_key(w: Workload) -> str:
    """The workload part of ``w``'s records' keys (``polytile.tune.task.Workload.key``)."""
    from polytile.tune.task import Workload as TuneWorkload
    return TuneWorkload.of(w.kind, **w.arguments()).key


def trials_done(records: Path) -> dict[str, int]:
    """Trials recorded per workload key (any template and GPU: for estimates)."""
    from polytile.tune.records import RecordLog
    done: dict[str, int] = {}
    for r in RecordLog(records):
        parts = r.workload.split("/")  # the task's key: template/workload/space signature
        if r.role == "trial" and len(parts) >= 2:
            done[parts[1]] = done.get(parts[1], 0) + 1
    return done


def results_path(records: Path) -> Path:
    """Where the timed rows of a tuned run go, beside its records (one JSON line per workload)."""
    return records.with_name(records.stem + ".results.jsonl")


def read_rows(path: Path, trials: int) -> dict[str, dict]:
    """The timed rows of ``path`` tuned with ``trials`` trials, by workload name (the last of each; a line
    cut by a kill is skipped: that workload is timed again)."""
    return {row["name"]: row for row in _devices.read_rows(path) if row.get("tune", {}).get("trials") == trials}


def tune_gpu(ws: list[Workload], args: argparse.Namespace) -> dict:
    """``--tune``: one process per GPU of ``--devices`` (``tune_worker``), each owning a share of the
    workloads balanced by expected cost; their trials go to ``--records`` and their timed rows beside
    it (``results_path``), so a call stopped by ``--max-seconds`` (or killed) resumes where it was:
    a workload whose records hold the trials is not tuned again, one already timed not timed again.
    The record is complete when every workload has its row."""
    records = Path(args.records).resolve()
    rows_file = results_path(records)
    deadline = _devices.deadline_after(args.max_seconds)
    devices = _devices.parse_devices(args.devices)
    builders = _devices.builders_per_device(devices, args.builders)
    todo = [w for w in ws if w.name not in read_rows(rows_file, args.tune)]
    done = trials_done(records)
    costs = {w.name: expected_seconds(w, max(0, args.tune - done.get(tune_key(w), 0)), builders) for w in todo}
    shares = _devices.spread(todo, lambda w: costs[w.name], devices)
    print(f"{len(ws) - len(todo)} of {len(ws)} workloads already tuned and timed; expected per device: "
          + ", ".join(f"GPU {d} {sum(costs[w.name] for w in share):.0f} s ({len(share)} workloads)"
                      for d, share in shares.items()), flush=True)
    commands = {}
    for d, share in shares.items():
        if not share:
            continue
        names = records.with_name(f"{records.stem}.gpu{d}.names")
        names.parent.mkdir(parents=True, exist_ok=True)
        names.write_text("\n".join(w.name for w in share) + "\n")
        commands[d] = [sys.executable, str(Path(__file__).resolve()), "--tune-worker", str(names), "--tune",
                       str(args.tune), "--records", str(records), "--builders", str(builders), "--deadline",
                       str(deadline), "--repeat", str(args.repeat), "--rounds", str(args.rounds)]
        if not args.half_out:
            commands[d].append("--float32-out")
    _devices.finish(_devices.start(commands), "tuning process")
    rows = read_rows(rows_file, args.tune)
    missing = [w.name for w in ws if w.name not in rows]
    if missing:
        print(f"{len(missing)} of {len(ws)} workloads not yet tuned and timed (run the same command again to "
              f"resume): {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}", flush=True)
    return {"results": [rows[w.name] for w in ws if w.name in rows], "complete": not missing,
            "devices": devices, "builders_per_device": builders, "records": str(records)}


TIME_SECONDS = 3.0
"""The final timing of one tuned workload (winner, default and torch in rounds), reserved before the deadline."""


def tune_worker(ws: list[Workload], args: argparse.Namespace) -> int:
    """One GPU's share of ``--tune`` (this process sees only that GPU). First the tuning: one builder
    pool and runner for all its workloads, each tuned by ``tune_one`` (its trials appended to the
    shared records) while two background processes build its default schedule and then its winner;
    it stops before a workload that would not end, with the timings of those tuned, before
    ``--deadline``. Then, the GPU free of the tuner's runner, each tuned workload's winner, default
    and torch are timed side by side (``bench_gpu``) and its row appended to the results."""
    import torch

    from polytile.tune import MeasureOptions, Measurer
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    records = Path(args.records)
    rows_file = results_path(records)
    timed = read_rows(rows_file, args.tune)
    todo = [w for w in ws if w.name not in timed]
    # no re-timing in a fresh process, no check at prime sizes: the winner is timed again beside the
    # default below, checked against the reference at the workload's sizes (a build and a process
    # start saved per workload); 50 ms of launches per trial (thousands of a 10–1000 µs kernel)
    opts = MeasureOptions(builders=args.builders, same_inputs=True, retime=0, min_time=0.05)
    tuned: list[tuple[Workload, dict, object, object]] = []
    # spawned, not forked: this process initializes the CUDA driver (the target's facts), which a
    # forked child could not use
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as kernels:
        with Measurer(opts) as measurer:
            for w in todo:
                left = max(0, args.tune - trials_done(records).get(tune_key(w), 0))
                need = expected_seconds(w, left, args.builders) + TIME_SECONDS * (len(tuned) + 1)
                if args.deadline and time.time() + need > args.deadline:
                    print(f"stopping before {w.name}: {need:.0f} s needed, {args.deadline - time.time():.0f} s "
                          "left; run again to resume", flush=True)
                    break
                default = kernels.submit(build_one, w)
                info, config = tune_one(w, args, measurer, opts)
                best = kernels.submit(build_config, w, config) if config is not None else None
                tuned.append((w, info, default, best))
                print(json.dumps({"name": w.name, **info}), flush=True)
        for w, info, default, best in tuned:
            row = time_one(w, args, info, default.result(), best.result() if best is not None else None)
            _devices.append_row(rows_file, row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("launches", "tune")}), flush=True)
            torch.cuda.empty_cache()
    return 0


def tune_one(w: Workload, args: argparse.Namespace, measurer, opts) -> tuple[dict, dict | None]:  # noqa: ANN001
    """Tune ``w`` (XGBoost, ``args.tune`` trials, resumed from the records): what won — template,
    configuration, whether it is the default, both as measured while tuning — and the winner's
    configuration (None when no trial succeeded)."""
    from polytile.tune import make_task, tune_task
    t0 = time.perf_counter()
    try:
        task = make_task(w.kind, "cuda", **w.arguments())
        default_config = task.space.default.to_json()
        result = tune_task(task, args.tune, args.records, tuner="xgb", measure=opts, progress=False,
                           measurer=measurer, verify=False, build_best=False)
    except Exception as err:  # noqa: BLE001 - recorded, the run goes on
        return {"trials": args.tune, "error": f"{type(err).__name__}: {err}"[:2000],
                "seconds": time.perf_counter() - t0}, None
    best = result.best
    info = {"trials": args.tune, "template": task.template.name, "space": len(task.space),
            "config": best.config if best else None, "default_config": default_config,
            "winner_is_default": bool(best and best.config == default_config),
            "best_during_tuning_s": _seconds(best.cost) if best else None,
            "default_during_tuning_s": next((_seconds(r.cost) for r in result.records
                                             if r.config == default_config), None),
            "failures": result.failures, "new_trials": result.new_trials, "seconds": time.perf_counter() - t0}
    return info, best.config if best else None


def _seconds(cost: float) -> float | None:
    """A trial's time for JSON: None for a failed one (inf)."""
    return cost if math.isfinite(cost) else None


def build_config(w: Workload, config: dict):  # noqa: ANN201 - (name, kernel or error, seconds)
    """Build ``w``'s configuration ``config`` of the template ``pt.tune`` picks (in a worker process)."""
    from polytile.build import build
    from polytile.tune import make_task
    t0 = time.perf_counter()
    try:
        task = make_task(w.kind, "cuda", **w.arguments())
        return w.name, build(task.schedule(config), task.target), time.perf_counter() - t0
    except Exception as err:  # noqa: BLE001 - a failed build is recorded, the run goes on
        return w.name, f"{type(err).__name__}: {err}"[:2000], time.perf_counter() - t0


def time_one(w: Workload, args: argparse.Namespace, info: dict, default: tuple, best: tuple | None) -> dict:
    """The row of a tuned workload: its winner timed beside the default schedule and torch (the default
    alone, as the tuned kernel, when tuning found nothing: ``tune`` says so)."""
    row = {**_describe(w), "tune": info}
    _, default_kernel, row["build_s"] = default
    kern = best[1] if best is not None else default_kernel
    if best is not None and isinstance(kern, str):
        info["build_error"] = kern
        kern = default_kernel
    if isinstance(kern, str):
        row["error"] = kern
        return row
    try:
        row.update(bench_gpu(w, kern, args.repeat, args.rounds, seed=1,
                             default=None if isinstance(default_kernel, str) else default_kernel))
    except (PolytileError, RuntimeError) as err:
        row["error"] = f"{type(err).__name__}: {err}"[:2000]
    return row


def torch_rows(w: Workload, y):  # noqa: ANN001, ANN201 - torch tensors
    """torch's result ``y`` of ``w`` in polytile's output layout (the reference's): a channels-last
    convolution's output, NCHW to torch, as rows of pixels (reshaped as it is, torch's result was
    compared in the wrong order: a relative error of √2 on every convolution of the random draws)."""
    if w.kind == "conv2d_igemm":
        return y.permute(0, 2, 3, 1).reshape(-1, dict(w.dims)["K"])
    return y


def torch_case(w: Workload, op: ops.Op, seed: int, device: str = "cuda"):  # noqa: ANN201 - (inputs, call, ref)
    """Random inputs of ``op`` on ``device``, the torch call a user would make, and a float64 reference in
    polytile's output layout (torch's result in that layout: ``torch_rows``)."""
    import torch
    import torch.nn.functional as F
    g = torch.Generator(device=device).manual_seed(seed)
    tdt = getattr(torch, w.dtype)
    lo, hi = (-4.0, 4.0) if w.kind == "softmax" else (-1.0, 1.0)
    shapes = [tuple(int(d.value) for d in t.shape) for t in op.func.inputs]
    inputs = [(torch.rand(s, device=device, generator=g) * (hi - lo) + lo).to(tdt) for s in shapes]
    wide = torch.float64
    d = dict(w.dims)
    if w.kind in ("matmul", "batch_matmul"):
        a, b = inputs
        return inputs, (lambda a, b: a @ b), (lambda: a.to(wide) @ b.to(wide))
    if w.kind == "conv2d_igemm":
        st, pad = d["stride"], d["padding"]
        x = inputs[0].permute(0, 3, 1, 2)  # channels_last: the NHWC memory seen as NCHW
        wt = inputs[1].permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
        return (inputs, lambda i, _w: F.conv2d(x, wt, stride=st, padding=pad),
                lambda: torch_rows(w, F.conv2d(x.to(wide), wt.to(wide), stride=st, padding=pad)))
    if w.kind == "conv2d":
        st, pad = d["stride"], d["padding"]
        return (inputs, lambda i, k: F.conv2d(i, k, stride=st, padding=pad),
                lambda: F.conv2d(inputs[0].to(wide), inputs[1].to(wide), stride=st, padding=pad))
    if w.kind == "softmax":
        return inputs, (lambda x: torch.softmax(x, dim=1)), (lambda: torch.softmax(inputs[0].to(wide), dim=1))
    x, gm, bt = inputs
    return (inputs, lambda x, g, b: F.layer_norm(x, (x.shape[1],), g, b, 1e-5),
            lambda: F.layer_norm(x.to(wide), (x.shape[1],), gm.to(wide), bt.to(wide), 1e-5))


def per_call(fn, args: list[object], seconds: float = 0.05, max_calls: int = 2000) -> float:  # noqa: ANN001
    """Seconds per call of ``fn(*args)`` in a loop from Python, synchronized at the end (after a warm-up)."""
    import torch
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(*args)
    torch.cuda.synchronize()
    once = max(time.perf_counter() - t0, 1e-6)
    n = max(5, min(max_calls, int(seconds / once)))
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def bench_gpu(w: Workload, kern, repeat: int, rounds: int, seed: int, default=None) -> dict:  # noqa: ANN001
    """Check ``kern`` and time it beside torch, kernel-only and per call, in interleaved rounds; with
    ``default`` (the default schedule's kernel, beside a tuned one) that one too, in the same rounds."""
    import torch

    from polytile.runtime.timing import rel_error, time_gpu
    op = w.op()
    inputs, fn, ref_fn = torch_case(w, op, seed)
    ref = ref_fn()
    out = kern(*inputs)
    err = rel_error(out.reshape(ref.shape), ref)
    base_err = rel_error(torch_rows(w, fn(*inputs)).reshape(ref.shape), ref)
    res: dict = {"rel_error": err, "tolerance": op.tolerance, "correct": bool(err <= op.tolerance),
                 "torch_rel_error": base_err}
    if default is not None:
        derr = rel_error(default(*inputs).reshape(ref.shape), ref)
        res.update(default_rel_error=derr, default_correct=bool(derr <= op.tolerance))
    del ref
    outs = [torch.empty_like(out)]
    ours, theirs, ours_call, theirs_call, base, base_call = [], [], [], [], [], []
    for _ in range(rounds):
        ours.append(kern.benchmark(*inputs, *outs, repeat=repeat))
        if default is not None:
            base.append(default.benchmark(*inputs, *outs, repeat=repeat))
        theirs.append(time_gpu(lambda: fn(*inputs), repeat=repeat))
        ours_call.append(per_call(kern, inputs))
        if default is not None:
            base_call.append(per_call(default, inputs))
        theirs_call.append(per_call(fn, inputs))
    t, tb = statistics.median(ours), statistics.median(theirs)
    tc, tbc = statistics.median(ours_call), statistics.median(theirs_call)
    if default is not None:
        td = statistics.median(base)
        res.update(default_s=td, default_speed=tb / td, default_call_s=statistics.median(base_call),
                   tuned_vs_default=td / t)
    res.update(polytile_s=t, torch_s=tb, speed=tb / t, polytile_call_s=tc, torch_call_s=tbc, speed_call=tbc / tc,
               polytile_tflops=op.flops / t / 1e12, polytile_gbs=op.bytes_moved / t / 1e9,
               launches=[{"kernel": k.name, "grid": [str(g) for g in k.grid], "block": list(k.block),
                          "registers": kern.resources[k.name].registers if k.name in kern.resources else None}
                         for k in kern.kernels])
    return res


TIMING = ("kernel: CUDA-event medians of single launches, L2 flushed before each, prepared arguments; call: the "
          "Python call in a loop (polytile allocates and returns its output), synchronized at the end; "
          "interleaved with torch in rounds, medians of the rounds.")


def gpu_record() -> dict:
    import torch
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,power.draw",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    return {"device": torch.cuda.get_device_name(), "nvidia_smi": smi, "torch": torch.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version()}


def run_gpu(ws: list[Workload], args: argparse.Namespace) -> dict:
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.perf_counter()
    if args.tune:
        tuned = tune_gpu(ws, args)
        print(f"tuned {len(tuned['results'])} of {len(ws)} workloads in {time.perf_counter() - t0:.0f} s", flush=True)
        return {"benchmark": "shapes", "variant": "gpu-tuned", **gpu_record(), "timing": TIMING + " Tuned: each "
                "workload's winner of pt.tune (XGBoost, --tune trials; the template, configuration and whether "
                "it is the default in 'tune'), timed in the same rounds as the default schedule's kernel "
                "(default_s, tuned_vs_default) and torch.", **tuned}
    built = build_all(ws, "cuda", args.workers)
    print(f"built {len(ws)} workloads in {time.perf_counter() - t0:.0f} s", flush=True)
    results = []
    for n, w in enumerate(ws):
        kern, build_s = built[w.name]
        row = {**_describe(w), "build_s": build_s}
        if isinstance(kern, str):
            row["error"] = kern
        else:
            try:
                row.update(bench_gpu(w, kern, args.repeat, args.rounds, seed=n + 1))
            except (PolytileError, RuntimeError) as err:
                row["error"] = f"{type(err).__name__}: {err}"[:2000]
            torch.cuda.empty_cache()
        results.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "launches"}), flush=True)
    after = gpu_record()["nvidia_smi"]
    return {"benchmark": "shapes", "variant": "gpu", **gpu_record(), "nvidia_smi_after": after,
            "timing": TIMING + " GEMMs and convolutions of 16-bit inputs write " + (
                "the input dtype (summed in float32), as torch does." if any(w.half_out for w in ws) else
                "float32 (torch: the input dtype)."),
            "results": results}


def _describe(w: Workload) -> dict:
    out = w.arguments().get("out_dtype")
    return {"name": w.name, "family": w.family, "kind": w.kind, "dims": dict(w.dims), "dtype": w.dtype,
            **({"out_dtype": out} if out else {})}


# --- CPU --------------------------------------------------------------------------------------------


def run_cpu(ws: list[Workload], args: argparse.Namespace) -> dict:
    from polytile.cli import time_call
    results = []
    for n, w in enumerate(ws):
        row = _describe(w)
        try:
            op = w.op()
            t0 = time.perf_counter()
            kern = op.build("cpu")
            row["build_s"] = time.perf_counter() - t0
            inputs = op.make_inputs(np.random.default_rng(n + 1))
            ref = op.reference(*inputs)
            err = ops.rel_error(kern(*inputs), ref)
            row.update(rel_error=err, tolerance=op.tolerance, correct=bool(err <= op.tolerance),
                       baseline=op.baseline_name)
            ours, theirs, ours_call = [], [], []
            for _ in range(args.rounds):
                ours.append(kern.benchmark(*inputs, repeat=5, min_time=args.min_time))
                theirs.append(time_call(op.baseline, inputs, repeat=5, min_time=args.min_time))
                ours_call.append(time_call(kern, inputs, repeat=5, min_time=args.min_time))
            t, tb, tc = (statistics.median(x) for x in (ours, theirs, ours_call))
            row.update(polytile_s=t, torch_s=tb, speed=tb / t, polytile_call_s=tc, torch_call_s=tb, speed_call=tb / tc,
                       polytile_gflops=op.flops / t / 1e9)
        except PolytileError as err:
            row["error"] = f"{type(err).__name__}: {err}"[:2000]
        results.append(row)
        print(json.dumps(row), flush=True)
    from polytile.target import cpu_target
    tgt = cpu_target()
    return {"benchmark": "shapes", "variant": "cpu", "device": tgt.model.replace("_", " "), "cores": tgt.cores,
            "threads": int(os.environ.get("OMP_NUM_THREADS", tgt.cores)), "numpy": np.__version__,
            "python": platform.python_version(), "load_average": os.getloadavg(),
            "timing": "medians of repeated runs after warm-up in interleaved rounds; kernel = the compiled function "
                      "on prepared arguments, call = the Python call; baseline: NumPy (matmul, softmax, layernorm) "
                      "or torch's CPU conv2d, called from Python",
            "results": results}


# --- summary and table ------------------------------------------------------------------------------


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summary(record: dict) -> dict:
    ok = [r for r in record["results"] if "speed" in r and r.get("correct")]
    bad = [r["name"] for r in record["results"] if "error" in r or not r.get("correct", False)]
    s = {"workloads": len(record["results"]), "measured": len(ok), "failed_or_wrong": bad,
         "geomean_kernel": geomean([r["speed"] for r in ok]),
         "geomean_call": geomean([r["speed_call"] for r in ok]),
         "below_0.5_kernel": sum(r["speed"] < 0.5 for r in ok),
         "worst_kernel": [(r["name"], round(r["speed"], 3)) for r in sorted(ok, key=lambda r: r["speed"])[:8]]}
    s["below_0.7_kernel"] = sum(r["speed"] < 0.7 for r in ok)
    fams: dict[str, list[float]] = {}
    for r in ok:
        fams.setdefault(r["family"], []).append(r["speed"])
    s["geomean_kernel_by_family"] = {f: round(geomean(v), 3) for f, v in fams.items()}
    beside = [r for r in ok if "default_speed" in r]
    if beside:  # a tuned run: the default schedules timed in the same rounds
        s["geomean_default_kernel"] = geomean([r["default_speed"] for r in beside])
        s["geomean_tuned_vs_default"] = geomean([r["tuned_vs_default"] for r in beside])
        s["winner_is_default"] = sum(bool(r.get("tune", {}).get("winner_is_default")) for r in beside)
        s["tuned_slower_than_default"] = [(r["name"], round(r["tuned_vs_default"], 3)) for r in beside
                                          if r["tuned_vs_default"] < 0.97]
    return s


def table(record: dict) -> str:
    """The markdown table of a record (README)."""
    tuned = any("default_s" in r for r in record["results"])
    extra = " default µs | default ratio | template |" if tuned else ""
    lines = ["| workload | shape | dtype | polytile µs | library µs | kernel ratio | call µs (polytile / library) "
             "| call ratio |" + extra, "|---|---|---|---|---|---|---|---|" + "---|---|---|" * tuned]
    for r in record["results"]:
        shape = "×".join(str(v) for v in r["dims"].values())
        dt = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[r["dtype"]]
        if "speed" not in r:
            lines.append(f"| {r['name']} | {shape} | {dt} | {'FAILED' if 'error' in r else '–'} | | | | |"
                         + " | | |" * tuned)
            continue
        flag = "" if r.get("correct") else " (WRONG)"
        line = (f"| {r['name']} | {shape} | {dt} | {r['polytile_s'] * 1e6:.1f}{flag} | {r['torch_s'] * 1e6:.1f} | "
                f"{r['speed']:.2f}× | {r['polytile_call_s'] * 1e6:.1f} / {r['torch_call_s'] * 1e6:.1f} | "
                f"{r['speed_call']:.2f}× |")
        if tuned:
            t = r.get("tune", {})
            won = "default" if t.get("winner_is_default") else t.get("template", "?")
            line += (f" {r['default_s'] * 1e6:.1f} | {r['default_speed']:.2f}× | {won} |" if "default_s" in r
                     else " | | |")
        lines.append(line)
    s = summary(record)
    lines.append("")
    lines.append(f"Geometric mean over {s['measured']} workloads: kernel {s['geomean_kernel']:.2f}×, per call "
                 f"{s['geomean_call']:.2f}×; {s['below_0.5_kernel']} below 0.5× (kernel); by family: "
                 + ", ".join(f"{f} {g:.2f}×" for f, g in s["geomean_kernel_by_family"].items()) + ".")
    if "geomean_default_kernel" in s:
        lines.append(f"Tuned ({record.get('tune_trials')} trials): {s['below_0.7_kernel']} below 0.7×; the default "
                     f"schedules in the same rounds {s['geomean_default_kernel']:.2f}×; tuned / default "
                     f"{s['geomean_tuned_vs_default']:.2f}×; the default won {s['winner_is_default']} of "
                     f"{s['measured']}.")
    return "\n".join(lines)


def git_commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="half the workloads, fewer token counts")
    parser.add_argument("--only", default="", help="comma-separated name patterns (glob or substring)")
    parser.add_argument("--cpu", action="store_true", help="the CPU-sized variant against NumPy/torch")
    parser.add_argument("--offsuite", action="store_true", help="shapes that are not in the suite (GPU)")
    parser.add_argument("--random", type=int, default=0, metavar="N",
                        help="N workloads of random sizes instead of the suite (GPU; see --seed)")
    parser.add_argument("--seed", type=int, default=None, help="--random: the seed (default: from the clock; "
                        "in the record)")
    parser.add_argument("--list", action="store_true", help="print the workloads and stop")
    parser.add_argument("--build-only", action="store_true", help="build every kernel (fills the cache) and stop")
    parser.add_argument("--target", default="cuda", help="the target of --build-only (e.g. cuda:sm_90a)")
    parser.add_argument("--table", help="print the markdown table of a JSON record and stop")
    parser.add_argument("--repeat", type=int, default=20, help="GPU: timed launches per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--min-time", type=float, default=0.1, help="CPU: seconds timed per round at least")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2), help="parallel builds")
    parser.add_argument("--threads", type=int, default=0, help="CPU: threads for OpenMP, OpenBLAS and torch")
    parser.add_argument("--out", help="the JSON record (default benchmarks/results/shapes-<variant>-<date>.json)")
    parser.add_argument("--tune", type=int, default=0, help="GPU: time each workload's kernel after pt.tune with "
                        "this many trials (default: the default schedules)")
    parser.add_argument("--records", default="shapes-tune.jsonl", help="--tune: the tuning records (resumable); "
                        "the timed rows go beside them (RECORDS.results.jsonl)")
    parser.add_argument("--devices", default="0", help="--tune: the GPUs to tune on, one process each (0,1)")
    parser.add_argument("--builders", type=int, default=0, help="--tune: build processes per GPU (default: the "
                        "cores shared among the GPUs, one left to each)")
    parser.add_argument("--max-seconds", type=float, default=0, help="--tune: start no workload that would not "
                        "end within this many seconds of the start (0: no limit); run again to resume")
    parser.add_argument("--tune-worker", help=argparse.SUPPRESS)  # a file of names: one GPU's share
    parser.add_argument("--deadline", type=float, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--half-out", dest="half_out", action="store_true", default=True,
                        help="16-bit GEMMs and convolutions write the input dtype (out_dtype), as torch does "
                        "(the default)")
    parser.add_argument("--float32-out", dest="half_out", action="store_false",
                        help="16-bit GEMMs and convolutions write float32 (the accumulator), as the records "
                        "before 2026-11-28 did")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return 0
    if args.random < 0:
        parser.error(f"--random takes a number of workloads, at least 1 (got {args.random})")
    if args.random and (args.tune or args.cpu):
        parser.error("--random draws GPU workloads timed with their default schedules (not with --tune or --cpu)")
    if args.random and args.seed is None:
        args.seed = int(time.time()) % 100000
    ws = select(cpu_suite(args.quick) if args.cpu else random_shapes(args.random, args.seed) if args.random
                else offsuite() if args.offsuite else gpu_suite(args.quick), args.only)
    if not args.half_out:
        ws = [dataclasses.replace(w, half_out=False) for w in ws]
    if args.tune_worker:
        wanted = Path(args.tune_worker).read_text().split()
        by_name = {w.name: w for w in [*gpu_suite(), *offsuite()]}
        return tune_worker([dataclasses.replace(by_name[n], half_out=args.half_out) for n in wanted], args)
    if args.list:
        for w in ws:
            print(f"{w.name:45s} {w.kind:13s} {w.dtype:9s} {w.shape}")
        print(f"{len(ws)} workloads")
        return 0
    if args.build_only:
        t0 = time.perf_counter()
        built = build_all(ws, args.target, args.workers)
        failed = {n: k for n, (k, _) in built.items() if isinstance(k, str)}
        for n, e in failed.items():
            print(f"{n}: {e[:300]}")
        print(f"built {len(ws) - len(failed)} of {len(ws)} in {time.perf_counter() - t0:.0f} s")
        return 1 if failed else 0
    if args.cpu and args.threads:
        try:
            import torch
            torch.set_num_threads(args.threads)
        except ImportError:
            pass
    started = datetime.datetime.now(datetime.UTC)
    record = run_cpu(ws, args) if args.cpu else run_gpu(ws, args)
    record = {**record, "date": started.isoformat(timespec="seconds"), "command": " ".join(["python", *sys.argv]),
              "polytile_commit": git_commit(), "quick": args.quick, "only": args.only, "tune_trials": args.tune,
              **({"random": args.random, "seed": args.seed} if args.random else {})}
    record["summary"] = summary(record)
    path = Path(args.out) if args.out else (ROOT / "benchmarks" / "results" /
                                            f"shapes-{record['variant']}-{started:%Y%m%d-%H%M%S}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"\nshape suite ({record['variant']}) on {record['device']}, {record['date']}; record {path}")
    print(table(record))
    s = record["summary"]
    print(json.dumps({k: v for k, v in s.items() if k != "geomean_kernel_by_family"}))
    if record.get("complete") is False:
        return 3  # resumable: the same command continues
    return 0 if not s["failed_or_wrong"] else 1


if __name__ == "__main__":
    sys.exit(main())
