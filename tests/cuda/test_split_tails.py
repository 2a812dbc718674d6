"""Split reductions of implicit-GEMM convolutions whose channels are no whole K tiles, the split of the
channel-padded convolution's filter rows, and small batched products on mma.sync's tiles: the default's
decisions at the random shapes that were below 0.5× torch (H200, seeds 97052 and 99391) and at other
sizes off the tiles, the split algorithms against NumPy on the CPU, and their kernels compiled by nvcc
for sm_90a."""

import re
import subprocess
import tempfile

import numpy as np
import pytest

import polytile as pt
from polytile import ops
from polytile.dtypes import as_dtype
from polytile.ops.conv_choice import channel_chunk, igemm_choice, igemm_rows_choice, igemm_splits
from polytile.ops.gpu_schedules import gemm_choice
from polytile.ops.igemm import conv2d_igemm_rows_func, conv2d_igemm_split_func, padded_channels
from polytile.target import CUDATarget

SM90A = CUDATarget(arch="sm_90a")
needs_nvcc = pytest.mark.needs_nvcc


def _out(H, R, stride, pad):
    return (H + 2 * pad - R) // stride + 1


def _choice(N, H, C, K, R, stride):
    P = _out(H, R, stride, R // 2)
    return igemm_choice(SM90A, N * P * P, C, K, R, R, 2, N * H * H, 2)


def _rows_choice(N, H, C, K, R, stride):
    P = _out(H, R, stride, R // 2)
    cp, Sp = padded_channels(C, R)
    return igemm_rows_choice(SM90A, N * P * P, K, R, Sp * cp, 2, (N * H * H * cp + R * Sp * cp * K) * 2, 2)


# --- the splits offered ------------------------------------------------------------------------------

def test_a_channel_tail_leaves_the_filter_row_split_and_chunks_of_whole_k_tiles():
    # 280 channels in K tiles of 64: 4 whole tiles and 24 channels. Before, no split at all (every
    # split needed C % (chunks·64) == 0, even one chunk per filter row)
    splits = igemm_splits(280, 7, 7, 64)
    assert (True, 1) in splits and (False, 5) in splits
    for C, R, S, bk in [(280, 7, 7, 64), (264, 7, 7, 32), (200, 3, 3, 32), (376, 3, 3, 64), (776, 1, 1, 32)]:
        tiles = -(-C // bk)
        for rows, chunks in igemm_splits(C, R, S, bk):
            length = channel_chunk(C, chunks, bk)
            assert chunks == 1 or length % bk == 0, (C, rows, chunks)
            assert (chunks - 1) * length < C <= chunks * length  # no chunk empty, C covered
            assert (R if rows else 1) * chunks <= 16
            # where the taps and the channel tiles form one K loop, every chunk has as many K tiles (a
            # shorter last chunk computed wrong numbers on an H200: 280 in 192 + 88, 264, 200)
            assert tiles % chunks == 0, (C, rows, chunks)
    assert (False, 2) not in igemm_splits(280, 7, 7, 64) and (True, 4) not in igemm_splits(200, 3, 3, 32)
    # a K loop of the channel tiles alone (one filter row of one tap: the channel-padded runs) may end
    # with a shorter chunk: 1600 in 3 chunks of 17, 17 and 16 tiles of 32
    assert (True, 3) in igemm_splits(1600, 5, 1, 32) and (False, 3) not in igemm_splits(1600, 5, 1, 32)
    # whole tiles where they divide: the chunks are as before
    assert channel_chunk(512, 4, 64) == 128 and channel_chunk(280, 1, 64) == 280 and channel_chunk(376, 3, 64) == 128
    # one filter row: no row split
    assert all(not rows for rows, _ in igemm_splits(280, 1, 1, 64))


@pytest.mark.parametrize("shape", [(2, 12, 280, 112, 7, 1), (2, 8, 376, 96, 3, 1), (1, 8, 264, 461, 7, 2),
                                   (8, 9, 88, 32, 3, 2), (1, 8, 200, 24, 3, 1)],
                         ids=["280-112-7x7", "376-96-3x3", "264-461-7x7s2", "88-32-3x3s2", "200-24-3x3"])
def test_few_tiles_over_a_long_reduction_with_a_channel_tail_are_split(shape):
    # random shapes (H200, seed 99391): 2×12×12, 280 → 112, 7×7 in 10 tiles of 64×64 over 245 K steps,
    # 103 µs (0.37× torch); 2×8×8, 376 → 96, 3×3 27 µs (0.58×); seed 31337: 1×8×8, 200 → 24, 3×3 0.40×
    c = _choice(*shape)
    assert c.rows or c.chunks > 1, c
    N, H, C, K, R, stride = shape
    assert (c.rows, c.chunks) in igemm_splits(C, R, R, c.params["bk"])
    assert C % c.params["bk"]  # a channel tail
    P = _out(H, R, stride, R // 2)
    alone = igemm_choice(SM90A, N * P * P, C, K, R, R, 2, N * H * H, 2, split=False)
    assert not alone.rows and alone.chunks == 1 and c.seconds < 0.85 * alone.seconds


def test_measured_layers_keep_their_choices():
    # ResNet-50's late layers (measured splits), a layer of many tiles (no split), and 48 → 72 channels
    # (K tiles of 16 split over the filter rows, measured; 32-channel tiles with a tail are not split
    # where 16 divides the channels)
    def key(c):
        return c.params["bm"], c.params["bn"], c.rows, c.chunks
    assert key(_choice(1, 7, 512, 512, 3, 1)) == (64, 64, True, 4)
    assert key(_choice(32, 7, 512, 512, 3, 1)) == (128, 128, False, 2)
    assert key(_choice(1, 28, 128, 128, 3, 1)) == (128, 64, True, 2)
    assert key(_choice(32, 56, 64, 256, 1, 1)) == (128, 128, False, 1)
    c = igemm_choice(SM90A, 2 * 32 * 32, 48, 72, 5, 5, 2, 2 * 64 * 64, 2)
    assert (c.kernel, c.params["bk"], c.rows, c.chunks) == ("mma", 16, True, 1)
    # a large layer with a channel tail stays unsplit (it fills the GPU); tiles that fill the SMs are not
    # split (32×34×34, 440 → 140, 3×3/2 over the filter rows: 107 µs, unsplit 69; H200)
    for shape in [(32, 56, 280, 256, 3, 1), (32, 34, 440, 140, 3, 2)]:
        c = _choice(*shape)
        assert (c.rows, c.chunks) == (False, 1), shape


def test_channel_padded_convolution_of_one_tile_splits_its_filter_rows():
    # random shapes (H200, seed 99391): 1×14×14, 313 → 22 channels, 5×5 stride 2: one 128×32 tile over
    # 5 rows of 1600 (channels padded to 320), 102 µs (0.32× torch); the runs in whole K tiles
    c = _rows_choice(1, 14, 313, 22, 5, 2)
    assert c.kernel == "mma" and (c.rows or c.chunks > 1)
    run = padded_channels(313, 5)[1] * padded_channels(313, 5)[0]
    assert (c.rows, c.chunks) in igemm_splits(run, 5, 1, c.params["bk"])
    # many tiles (the stem of ResNet-50 at batch 32, MobileNet-v2's): unsplit
    for shape in [(32, 224, 3, 64, 7, 2), (32, 224, 3, 32, 3, 2), (8, 96, 3, 32, 5, 1)]:
        c = _rows_choice(*shape)
        assert (c.rows, c.chunks) == (False, 1), shape
    # a target without the gather rate keeps the unsplit kernel
    P = _out(14, 5, 2, 2)
    assert igemm_rows_choice(CUDATarget(arch="sm_80"), P * P, 22, 5, 1600, 2, 10 ** 6).chunks == 1


def test_small_batched_products_take_mma_tiles_where_the_model_says():
    # random shapes (H200, seed 97052): 3 × 12×104×40 fp16 on the CUDA cores' GEMV 13.9 µs, torch 6.1
    f16 = as_dtype("float16")
    c = gemm_choice(SM90A, 12, 104, 40, f16, batch=3, out_bytes=2)
    assert c.kernel == "mma" and c.split == 1
    assert gemm_choice(SM90A, 12, 104, 40, f16, batch=3, out_bytes=2, batched_tiles=False).kernel == "gemv"
    # seed 31337: 6 × 3×77×211 fp16 0.55× torch on the GEMV split in 7 and summed
    assert gemm_choice(SM90A, 3, 77, 211, f16, batch=6, out_bytes=2).kernel == "mma"
    for M, N, K in [(5, 77, 300), (13, 101, 37), (16, 1914, 56), (2, 60, 144)]:
        assert gemm_choice(SM90A, M, N, K, f16, batch=7).kernel == "mma", (M, N, K)
    # one row (decoding attention: the suite's, off-suite's; mma.sync's tile has no row loop to bind),
    # float32 (no tensor cores), a long batched reduction the GEMV splits: the GEMV
    for batch, N, K in [(12, 1024, 64), (32, 2048, 128), (32, 128, 2048), (20, 1500, 80), (2, 885, 16)]:
        assert gemm_choice(SM90A, 1, N, K, f16, batch=batch).kernel == "gemv", (batch, N, K)
    assert gemm_choice(SM90A, 12, 104, 40, as_dtype("float32"), batch=3).kernel == "gemv"
    assert gemm_choice(SM90A, 16, 128, 2048, f16, batch=32).kernel == "gemv"
    # unbatched products keep their kernels
    assert gemm_choice(SM90A, 12, 4096, 4096, f16).kernel == "gemv_mma"


# --- the algorithms on the CPU ------------------------------------------------------------------------

@pytest.mark.parametrize("dims,rows,chunks,length", [((1, 7, 7, 13, 6, 3, 3, 1, 1), True, 2, 8),
                                                     ((2, 5, 6, 11, 5, 3, 3, 2, 1), False, 3, 4),
                                                     ((1, 6, 5, 9, 3, 3, 2, 1, 1), True, 1, None),
                                                     ((1, 5, 7, 17, 4, 1, 1, 1, 0), False, 2, 16)],
                         ids=["rows-2-chunks-tail", "3-chunks-tail-stride2", "rows-only", "1x1-one-channel-left"])
def test_split_implicit_gemm_with_a_channel_tail_is_the_convolution(dims, rows, chunks, length):
    op = ops.conv2d_igemm(*dims, dtype="float32")
    func = conv2d_igemm_split_func(*dims, dtype="float32", rows=rows, channel_chunks=chunks, channel_chunk=length)
    kern = pt.build(pt.Schedule(func), "cpu")
    i, w = op.make_inputs(np.random.default_rng(sum(dims)))
    assert ops.rel_error(kern(i, w), op.reference(i, w)) < 1e-6
    with pytest.raises(pt.PolytileError, match="channel_chunks=3 of 8 channels must cover the 13 input channels"):
        conv2d_igemm_split_func(1, 5, 5, 13, 4, 3, 3, channel_chunks=3, channel_chunk=8)


@pytest.mark.parametrize("dims,rows,chunks,length", [((1, 7, 7, 13, 6, 3, 3, 1, 1), True, 2, 32),
                                                     ((2, 5, 6, 11, 5, 3, 3, 2, 1), False, 3, 16),
                                                     ((1, 6, 5, 9, 3, 3, 2, 1, 1), True, 1, None),
                                                     ((2, 9, 8, 3, 5, 5, 5, 2, 2), True, 1, None)],
                         ids=["rows-chunks", "chunks-stride2", "rows-3x2", "rows-3-channels"])
def test_split_channel_padded_convolution_is_the_convolution(dims, rows, chunks, length):
    op = ops.conv2d_igemm(*dims, dtype="float32")
    func = conv2d_igemm_rows_func(*dims, dtype="float32", rows=rows, run_chunks=chunks, run_chunk=length)
    kern = pt.build(pt.Schedule(func), "cpu")
    i, w = op.make_inputs(np.random.default_rng(sum(dims)))
    assert ops.rel_error(kern(i, w), op.reference(i, w)) < 1e-6


# --- the kernels (nvcc, sm_90a) -------------------------------------------------------------------------

def _sass(kern, name) -> str:
    from polytile.sass.disasm import find_nvdisasm
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kern.cubin)
        f.flush()
        text = subprocess.run([find_nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout
    return text.split(f".text.{name}:")[1].split(".section")[0]


@needs_nvcc
@pytest.mark.parametrize("dims", [(2, 12, 12, 280, 112, 7, 7, 1, 3), (8, 9, 9, 88, 32, 3, 3, 2, 1)],
                         ids=["wgmma-280", "mma-88"])
def test_split_with_a_channel_tail_builds(dims):
    N, H, W, C, K, R, S, stride, pad = dims
    c = _choice(N, H, C, K, R, stride)
    kern = pt.build(ops.conv2d_igemm(*dims, dtype="float16", out_dtype="float16").schedule(SM90A), SM90A)
    partials, total = kern.kernels
    assert int(partials.grid[2].value) == (R if c.rows else 1) * c.chunks
    # the last chunk's copies test the channels against C (zero-filled past it)
    assert f"< {C})" in kern.source
    sass = _sass(kern, partials.name)
    assert ("HGMMA" if c.kernel == "wgmma" else "HMMA") in sass and not re.search(r"\bLDL\b|\bSTL\b", sass)


def _uneven_split(dims, rows, chunks):
    """A split of ``dims`` (fp16) whose last channel chunk has fewer K tiles than the others — which
    ``igemm_splits`` does not offer where taps and channel tiles form one K loop — built for sm_90a."""
    from polytile.ops.conv_choice import igemm_kernel
    from polytile.ops.gpu_schedules import igemm_split_schedule
    N, H, W, C, K, R, S, stride, pad = dims
    kernel, params = igemm_kernel(SM90A, N * _out(H, R, stride, pad) * _out(W, S, stride, pad), C, K, R * S)
    bk = params["bk"]
    length = channel_chunk(C, chunks, bk)
    assert -(-(C - (chunks - 1) * length) // bk) < length // bk and (rows, chunks) not in igemm_splits(C, R, S, bk)
    func = conv2d_igemm_split_func(*dims, rows=rows, channel_chunks=chunks, channel_chunk=length)
    return kernel, pt.lower(igemm_split_schedule(func, kernel, params, rows), SM90A)


@pytest.mark.parametrize("dims,rows,chunks", [((1, 8, 8, 200, 24, 3, 3, 1, 1), False, 4),
                                              ((2, 12, 12, 280, 112, 7, 7, 1, 3), True, 2)],
                         ids=["mma-200-in-64+64+64+8", "wgmma-280-in-192+88"])
def test_a_k_tile_past_the_channels_computes_nothing(dims, rows, chunks):
    # the last chunk's K loop (taps x its channel tiles, fused) has iterations whose tile lies wholly
    # past C: their copies are skipped, so the shared tiles still hold the previous tile's data; the
    # tensor-core products over the whole tile (tensorize runs the K steps inside a tile over their full
    # range) must be skipped there too (H200, c239e5e: relative errors 0.17-0.35 without the guard)
    from polytile.lowering import loopir as ir
    kernel, low = _uneven_split(dims, rows, chunks)
    instruction = "pt_wgmma_m64" if kernel == "wgmma" else "pt_mma_m16n8k16"
    calls = []

    def walk(st, guards):
        if isinstance(st, ir.If):
            walk(st.then, guards + [st.cond])
            if st.orelse is not None:
                walk(st.orelse, guards)
        elif isinstance(st, ir.Block):
            for child in st.body:
                walk(child, guards)
        elif isinstance(getattr(st, "body", None), ir.Stmt):
            walk(st.body, guards)
        elif instruction in ir.stmt_text(st):
            calls.append(guards)

    walk(low.body, [])
    assert calls
    # every product is under a test that its K tile's loop had iterations (the trip count > 0)
    assert all(any(isinstance(g, ir.Cmp) and g.op == ">" and ir.is_const(g.b, 0) for g in guards) for guards in calls)


@needs_nvcc
def test_split_channel_padded_convolution_builds():
    kern = pt.build(ops.conv2d_igemm(1, 14, 14, 313, 22, 5, 5, 2, 2, dtype="float16").schedule(SM90A), SM90A)
    c = _rows_choice(1, 14, 313, 22, 5, 2)
    pad_input, pad_filter, partials, total = kern.kernels
    assert int(partials.grid[2].value) == (5 if c.rows else 1) * c.chunks > 1
    sass = _sass(kern, partials.name)
    assert "HMMA" in sass and not re.search(r"\bLDL\b|\bSTL\b", sass)


@needs_nvcc
def test_small_batched_product_builds_on_mma_sync():
    kern = pt.build(ops.batch_matmul(3, 12, 104, 40, "float16", out_dtype="float16").schedule(SM90A), SM90A)
    (k,) = kern.kernels
    assert int(k.grid[2].value) == 3
    sass = _sass(kern, k.name)
    assert "HMMA" in sass and not re.search(r"\bLDL\b|\bSTL\b", sass)


# --- the tuning spaces start at the new defaults ------------------------------------------------------

def _code(sched):
    from polytile.codegen.cuda import cuda_source
    from polytile.lowering.pipeline import lower
    from polytile.runtime.cuda import index32_ok
    low = lower(sched, SM90A)
    source, kernels = cuda_source(low, index32_ok(low))
    return source, [(k.name, [str(g) for g in k.grid], list(k.block), k.dynamic_shared) for k in kernels]


@pytest.mark.parametrize("op,shape,template", [
    ("batch_matmul", dict(batch=3, M=12, N=104, K=40, dtype="float16"), "batch_matmul_gemv"),
    ("conv2d_igemm", dict(N=1, H=14, W=14, C=313, K=22, R=5, S=5, stride=2, padding=2), "conv2d_igemm_rows"),
    ("conv2d_igemm", dict(N=2, H=12, W=12, C=280, K=112, R=7, S=7, stride=1, padding=3), "conv2d_igemm_choices"),
], ids=["bmm-tiles", "padded-rows-split", "channel-tail-split"])
def test_the_default_configuration_is_the_new_default(op, shape, template):
    # the tuners measure a space's first configuration first: the default schedule, split or on mma.sync
    from polytile.tune import make_task
    o = ops.get(op, **shape)
    task = make_task(o, SM90A)
    assert task.template.name == template
    default = task.space.default
    assert task.space.reason_invalid(default.digits) is None
    assert _code(task.schedule(default.values)) == _code(o.schedule(SM90A)), default.values
    if op == "batch_matmul":
        assert default.values["kernel"] == "tiles"
    else:
        assert default.values["split"] != "none"
