"""Implicit-GEMM convolutions whose filter rows (their K filters, the GEMM's columns) are only 2-byte
aligned — an odd number of 16-bit filters — read an aligned copy of the filter (``gpu_schedules.
aligned_filter``; the channel-padded convolution's own padded filter ``Wf``): every K loop fills its
filter tiles with 16-byte asynchronous copies, no element loads (random shapes, seed 52817, H200:
304 → 33 channels, 3×3 on 1×102×102 in 477 µs, cuDNN 28, the filter loaded element by element).
Generated source, the IR of the copies, and the machine code nvcc builds for sm_90a; the padded
filter's algorithm against NumPy on the CPU. Numerics on a GPU: test_aligned_filters_gpu.py."""

import re
import subprocess
import tempfile

import numpy as np
import pytest

import polytile as pt
from polytile import ops
from polytile.ops.conv_choice import igemm_choice
from polytile.ops.gpu_schedules import igemm_schedule
from polytile.ops.igemm import conv2d_igemm_rows_func
from polytile.target import CUDATarget

SM90A = CUDATarget(arch="sm_90a")
needs_nvcc = pytest.mark.needs_nvcc


def _sass(kern, name) -> str:
    from polytile.sass.disasm import find_nvdisasm
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kern.cubin)
        f.flush()
        text = subprocess.run([find_nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout
    return text.split(f".text.{name}:")[1].split(".section")[0]


def _kernel_source(source: str, name: str) -> str:
    """The text of kernel ``name`` in a module's source (up to the next kernel)."""
    return re.split(r'extern "C" __global__', source.split(f" {name}(")[1])[0]


def _filter_tiles(source: str, tile: str) -> list[str]:
    """The statements of ``source`` that write the shared filter tile ``tile``."""
    return [line for line in source.splitlines() if f"{tile}[" in line and "ldmatrix" not in line
            and "wgmma" not in line and "__shared__" not in line and "pt_smem" not in line]


def _product_kernel(kern):
    """The kernel that runs the tensor-core products (the one whose source issues them)."""
    return next(k for k in kern.kernels if re.search(r"pt_(mma_m16n8k16|wgmma_m64)\w*\(&",
                                                     _kernel_source(kern.source, k.name)))


# (N, H, W, C, K, R, S, stride, padding): filters off the 16-byte rows, channels whole vectors
UNALIGNED = [(1, 11, 13, 40, 33, 3, 3, 1, 1),     # seed 52817's 33 filters, mma.sync
             (1, 9, 7, 48, 17, 3, 3, 2, 1),       # 17 filters: a 32-wide tile
             (2, 10, 9, 96, 65, 3, 3, 1, 1),      # wgmma (64 channels and filters), 65: two 64-wide tiles
             (1, 8, 8, 200, 25, 3, 3, 1, 1),      # a split reduction (filter rows × channel chunks)
             (1, 8, 8, 264, 461, 7, 7, 2, 3)]     # wgmma, split, a prime number of filters
IDS = ["k33-mma", "k17-stride2", "k65-wgmma", "k25-split", "k461-wgmma-split"]


@pytest.mark.parametrize("dims", UNALIGNED, ids=IDS)
def test_unaligned_filters_are_copied_aligned_once(dims):
    K = dims[4]
    kern = pt.build(ops.conv2d_igemm(*dims, dtype="float16", out_dtype="float16").schedule(SM90A), SM90A)
    src = kern.source
    # one copy kernel: the filter's rows rounded up to 16 bytes (8 elements), 16-byte stores
    copy = next(k for k in kern.kernels if "Wt_aligned" in _kernel_source(src, k.name)
                and "pt_ldg_realign16" in _kernel_source(src, k.name))
    assert f"{-(-K // 8) * 8} *" in _kernel_source(src, copy.name).replace("(", "")
    # the products' K loop reads the copy only, its filter tiles filled by 16-byte asynchronous copies
    body = _kernel_source(src, _product_kernel(kern).name)
    assert "Wt_aligned" in body and not re.search(r"\bWt\[", body) and "__half2float" not in body
    fills = _filter_tiles(body, "Wt_shared")
    assert fills and all("pt_cp_async16" in line for line in fills)


@pytest.mark.parametrize("dims", UNALIGNED[:1], ids=IDS[:1])
def test_the_filter_read_in_place_loads_it_element_by_element(dims):
    # the schedule the default took before (``filter_granule=None``): what the copy removes
    N, H, W, C, K, R, S, stride, pad = dims
    op = ops.conv2d_igemm(*dims, dtype="float16", out_dtype="float16")
    P, Q = (H + 2 * pad - R) // stride + 1, (W + 2 * pad - S) // stride + 1
    choice = igemm_choice(SM90A, N * P * Q, C, K, R, S, 2, N * H * W, 2)
    sched = pt.Schedule(op.func)
    sched = igemm_schedule(sched, SM90A, choice, *dims, filter_granule=None) or sched
    kern = pt.build(sched, SM90A)
    assert len(kern.kernels) == 1 and "Wt_aligned" not in kern.source
    fills = _filter_tiles(kern.source, "Wt_shared")
    assert fills and not any("pt_cp_async" in line for line in fills)
    assert any("__half2float(Wt[" in line for line in fills)


def test_filters_of_whole_pieces_are_read_in_place():
    # 100 filters: 200-byte rows, 8-byte asynchronous copies in place (as a GEMM's operands); 64 filters
    # whole 16-byte vectors
    for K, piece in ((100, "pt_cp_async8"), (64, "pt_cp_async16")):
        kern = pt.build(ops.conv2d_igemm(1, 9, 9, 48, K, 3, 3, 1, 1, dtype="float16").schedule(SM90A), SM90A)
        assert len(kern.kernels) == 1 and "Wt_aligned" not in kern.source
        fills = _filter_tiles(kern.source, "Wt_shared")
        assert fills and all(piece in line for line in fills), K


def test_channel_padded_convolution_pads_its_filter_to_16_byte_rows():
    # 3 channels (an image's colors) and 33 filters: the channel-padded filter Wf is already a copy;
    # its rows are 40 filters (zeros past 33), its tiles 16-byte asynchronous copies
    kern = pt.build(ops.conv2d_igemm(1, 16, 15, 3, 33, 3, 3, 1, 1, dtype="float16",
                                     out_dtype="float16").schedule(SM90A), SM90A)
    body = _kernel_source(kern.source, _product_kernel(kern).name)
    fills = _filter_tiles(body, "Wf_shared")
    assert fills and all("pt_cp_async16" in line for line in fills)
    assert "Wt_aligned" not in kern.source and not re.search(r"\bWf\[[^]]*\]\s*=", body)


@pytest.mark.parametrize("dims,rows,chunks", [((1, 7, 6, 3, 33, 3, 3, 1, 1), False, 1),
                                              ((2, 9, 8, 3, 5, 5, 5, 2, 2), True, 1),
                                              ((1, 6, 7, 5, 17, 3, 3, 1, 1), False, 2)],
                         ids=["k33", "k5-rows", "k17-run-chunks"])
def test_channel_padded_convolution_with_padded_filters_is_the_convolution(dims, rows, chunks):
    # the padded filters (past K: zeros, never read by the output) leave the convolution as it was
    op = ops.conv2d_igemm(*dims, dtype="float32")
    func = conv2d_igemm_rows_func(*dims, dtype="float32", rows=rows, run_chunks=chunks)
    K = dims[4]
    assert int(func.tensor("Wf").shape[-1].value) == -(-K * 4 // 16) * 4  # float32: rows of 16-byte multiples
    kern = pt.build(pt.Schedule(func), "cpu")
    i, w = op.make_inputs(np.random.default_rng(sum(dims)))
    assert ops.rel_error(kern(i, w), op.reference(i, w)) < 1e-6


@needs_nvcc
@pytest.mark.parametrize("dims", [UNALIGNED[0], UNALIGNED[2]], ids=["k33-mma", "k65-wgmma"])
def test_the_k_loop_has_no_synchronous_filter_loads(dims):
    # machine code: the products' kernel loads nothing 2 bytes at a time (LDG.E.U16) — its tiles are
    # LDGSTS.128 — and keeps its accumulators in registers
    kern = pt.build(ops.conv2d_igemm(*dims, dtype="float16", out_dtype="float16").schedule(SM90A), SM90A)
    sass = _sass(kern, _product_kernel(kern).name)
    assert "LDGSTS.E.BYPASS.128" in sass or "LDGSTS.E.BYPASS.LTC128B.128" in sass
    assert not re.search(r"\bLDG\.E\.(U16|16)", sass) and not re.search(r"\bLDL\b|\bSTL\b", sass)
    assert ("HGMMA" if dims[4] == 65 else "HMMA") in sass
