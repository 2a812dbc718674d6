"""Small GEMVs whose reduction fits one K step of the direct GEMV's registers (``gpu_schedules.
one_step_gemv``): the default's choice where ``ONE_STEP_GEMV_BYTES`` admits them, and the kernel nvcc
builds for sm_90a — one kernel, no K loop, B's loads unrolled into registers, no local memory. (The
staged GEMV of 2×30×63 float32 copied B through shared memory by 15 threads looping 70 times over
synchronous loads: 29.7 µs on an H200, torch 7.4.) Numerics on the CPU's block emulator
(tests/cuda/block_emulator.py) and on a GPU (test_one_step_gemv_gpu.py)."""

import re
import subprocess
import tempfile

import block_emulator
import numpy as np
import pytest

import polytile as pt
from polytile import ops
from polytile.codegen.cuda import cuda_source
from polytile.dtypes import as_dtype
from polytile.lowering.pipeline import lower
from polytile.ops import gpu_schedules
from polytile.ops.gpu_schedules import ONE_STEP_ROWS, gemm_choice, one_step_gemv
from polytile.runtime.cuda import index32_ok
from polytile.target import CUDATarget
from polytile.tune import make_task

SM90A = CUDATarget(arch="sm_90a")
needs_nvcc = pytest.mark.needs_nvcc
f32 = as_dtype("float32")


@pytest.fixture
def one_step(monkeypatch):
    """The rule on for B of up to 64 KiB."""
    monkeypatch.setattr(gpu_schedules, "ONE_STEP_GEMV_BYTES", 1 << 16)


def _sass(kern) -> str:
    from polytile.sass.disasm import find_nvdisasm
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kern.cubin)
        f.flush()
        return subprocess.run([find_nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout


def test_small_products_take_one_direct_step(one_step):
    for M, N, K, dt in [(2, 30, 63, "float32"), (1, 5, 7, "float32"), (4, 100, 50, "float32"),
                        (3, 257, 17, "bfloat16"), (1, 88, 64, "float16")]:
        c = gemm_choice(SM90A, M, N, K, as_dtype(dt))
        it = as_dtype(dt).itemsize
        assert c.kernel == "gemv" and c.split == 1 and c.params["direct"], (M, N, K, dt)
        # the whole reduction in one step (K rounded up to A's 16-byte rows), 8 bytes of columns a thread
        assert K <= c.params["bk"] < K + 16 // it and c.params["vec"] * it == 8
        threads = c.params["bn"] // c.params["vec"]
        assert threads % 32 == 0 and 32 <= threads <= 128 and (threads == 128 or c.params["bn"] >= N)


def test_larger_products_keep_their_gemv(one_step):
    base = dict(gemm_choice(SM90A, 2, 30, 63, f32).params)
    # K past one step, B past the bound, rows for the tensor cores: unchanged by the rule
    for M, N, K, dt in [(2, 30, ONE_STEP_ROWS + 1, "float32"), (1, 4096, 64, "float32"), (1, 4097, 4093, "float16"),
                        (8, 32, 64, "float16")]:
        c = gemm_choice(SM90A, M, N, K, as_dtype(dt))
        assert not (c.kernel == "gemv" and c.params.get("direct") and c.params["bk"] >= K), (M, N, K, dt)
    assert base["direct"] and one_step_gemv(2, 30, 63, 4, most=0) is None


def test_the_measured_bound():
    # one step where measured faster on an H200: 2×30×63 float32 6.0 µs against 30.2, 4×100×50 10.0
    # against 14.7, 1×5044×24 (484 KB of B) 5.9 against 10.3
    for M, N, K in [(2, 30, 63), (4, 100, 50), (1, 5044, 24)]:
        c = gemm_choice(SM90A, M, N, K, f32)
        assert c.params.get("direct") and c.params["bk"] >= K and c.split == 1, (M, N, K)
    assert one_step_gemv(1, 50257, 64, 2) is None  # 6.4 MB of B: the staged or split GEMVs, as before


def test_the_rule_is_off_without_a_bound(monkeypatch):
    monkeypatch.setattr(gpu_schedules, "ONE_STEP_GEMV_BYTES", 0)
    monkeypatch.setattr(gpu_schedules, "WIDE_ONE_STEP", False)  # the wide products' rule (test_staged_stores.py)
    assert one_step_gemv(2, 30, 63, 4) is None
    assert not gemm_choice(SM90A, 2, 30, 63, f32).params.get("direct")


@needs_nvcc
@pytest.mark.parametrize("dims", [(2, 30, 63, "float32"), (3, 17, 5, "float32"), (1, 45, 64, "bfloat16"),
                                  (2, 7, 33, "bfloat16")],
                         ids=["2x30x63-f32", "3x17x5-f32", "1x45x64-bf16", "2x7x33-bf16"])
def test_one_step_kernel_loads_b_at_once(one_step, dims):
    M, N, K, dt = dims
    kern = pt.build(ops.matmul(M, N, K, dt).schedule(SM90A), SM90A)
    # one kernel: A's rows, even 2-byte aligned ones (33 bf16), are read in place — one step, no
    # pipeline to feed, so no aligned copy of A of its own launch
    (k,) = kern.kernels
    src = kern.source
    # no K loop and no shared tile of B: its rows go straight into registers, unrolled
    assert "B_local" in src and "B_shared" not in src and not re.search(r"for \(int ko\b", src)
    assert len(re.findall(r"B_local\[\d+\] = |\*\(uint2\*\)&B_local\[\d+\]", src)) >= K // 2
    sass = _sass(kern)
    assert not re.search(r"\bLDL\b|\bSTL\b", sass) and ("FFMA" in sass or "HFMA2" in sass)


def _code(sched):
    low = lower(sched, SM90A)
    source, kernels = cuda_source(low, index32_ok(low))
    return source, [(k.name, [str(g) for g in k.grid], list(k.block)) for k in kernels]


def test_the_gemv_template_starts_at_the_one_step_default():
    for op in (ops.matmul(2, 30, 63, "float32"), ops.matmul(3, 17, 5, "bfloat16")):
        task = make_task(op, SM90A)
        default = task.space.default
        assert task.template.name == "matmul_gemv" and task.space.reason_invalid(default.digits) is None
        assert _code(task.schedule(default.values)) == _code(op.schedule(SM90A))


@pytest.mark.parametrize("dims", [(2, 30, 63, "float32"), (4, 100, 50, "float32"), (1, 5044, 3, "float32"),
                                  (2, 44, 33, "bfloat16"), (1, 1, 1, "float32")],
                         ids=["2x30x63", "4x100x50", "1x5044x3", "2x44x33-bf16", "1x1x1"])
def test_one_step_gemv_is_the_product_on_the_block_emulator(dims):
    # the default's kernel (the measured bound) run on the CPU, thread block by thread block
    M, N, K, dt = dims
    op = ops.matmul(M, N, K, dt)
    assert gemm_choice(SM90A, M, N, K, as_dtype(dt)).params["bk"] >= K
    a, b = op.make_inputs(np.random.default_rng(M * N + K))
    (out,) = block_emulator.run(pt.lower(op.schedule(SM90A), SM90A), [a, b, np.zeros((M, N), np.float32)])
    assert ops.rel_error(out, op.reference(a, b)) <= op.tolerance
