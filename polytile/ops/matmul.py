"""Matrix products: matmul, batch_matmul and dense + bias + ReLU, with their default schedules.

The CPU schedule follows the BLIS structure, written with polytile's primitives: panels of B
packed at the kc loop, blocks of A packed at the ic loop, an MR×NR accumulator tile kept in
registers (write cache, unrolled and vectorized), full tiles separated from the edges, and the
block loop run in parallel. A product with only a few rows of A (a decoder's one token) is
matrix–vector-like and bound by reading B once: it gets the streaming form of the same schedule
instead (``cpu_stream_tiles``), which packs nothing. The tuning template (``tune/templates/cpu.py``)
chooses among the same forms and tiles.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import lang
from ..dtypes import accumulator, as_dtype, tolerance
from ..errors import PolytileError
from ..lang.expr import select
from ..lang.func import Func
from ..lang.tensor import Tensor, compute, placeholder, reduce_axis
from ..schedule.state import Schedule
from ..target import CPUTarget
from .base import Op, output_dtype, random_array, reference_type


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def cpu_gemm_tiles(M: int, N: int, K: int, target: CPUTarget, itemsize: int = 4, whole_k: bool = False
                   ) -> dict[str, Any]:
    """Default BLIS-style tile sizes for ``target``: register tile MR×NR, cache blocks MC, NC, KC.
    ``whole_k``: K in one block (a product whose epilogue needs complete sums, ``whole_sums``): the
    NC block is then sized for that KC, so that the packed panel of B (KC × NC) still fits in half
    the L2 cache (BERT's 128×768×3072 with KC = 3072 and the NC of KC = 256 packed 6 MiB per block
    and ran 0.54× torch), and A is read in place (``pack_a`` False): packed at the ic loop inside
    the jc loop, it would be copied once per column block, N / NC times (one thread, 128 rows,
    K = 768 and 3072: 5–20% faster in place)."""
    lanes = target.vector_lanes(itemsize)
    regs = 32 if target.vector_bits >= 512 else 16
    nr_vecs = 4 if regs >= 32 else 2
    nr = lanes * nr_vecs
    mr = max(1, min(6, (regs - nr_vecs - 2) // nr_vecs))
    kc = K if whole_k else min(256, K)
    nc = min(_round_up(N, nr), max(nr, (target.l2_bytes // 2) // (kc * itemsize) // nr * nr))
    blocks = target.cores * math.ceil(M / (target.cores * 96))
    mc = min(_round_up(M, mr), _round_up(math.ceil(M / max(1, blocks)), mr))
    tiles = {"mc": max(mr, mc), "nc": nc, "kc": max(1, kc), "mr": mr, "nr": nr, "lanes": lanes}
    if whole_k:
        tiles["pack_a"] = False
    return tiles


STREAM_ROWS_OF_B = 8
"""Rows of B the streaming schedule reads at once (its k block): each row is a sequential stream,
and the accumulators are loaded and stored once per block. More rows ran 2–3× slower on the 2-core
EPYC it was measured on (16 rows at 1×1025×1023 and 1×4096×1024, 32 rows at 8×3072×768: rows 12 KiB
apart fall in the same L1 sets, and more streams than the prefetchers track)."""

STREAM_MAX_ROW_TILES = 4
"""The streaming schedule serves products of up to this many register tiles of rows: B, read in place,
is then read at most this many times from L1, where packing it (the BLIS schedule) costs a whole
extra pass over B that only larger M amortizes (measured on the 2-core EPYC, one thread: M = 5, 8,
13, 16 at N, K ≈ 1000–4096 ran 0.7–2.7× NumPy streaming against 0.45–0.94× packed, one shape,
8×1024×4096, 0.68× against 0.81×; M = 32 was even, M = 128 0.92× packed)."""


def cpu_stream_tiles(M: int, N: int, target: CPUTarget, itemsize: int = 4) -> dict[str, Any] | None:
    """The streaming (matrix–vector-like) form of ``schedule_gemm_cpu`` for a product with few rows
    ``M``, or None when M needs more than ``STREAM_MAX_ROW_TILES`` register tiles (the BLIS form's
    packing then pays off): nothing packed, all the rows in one block, B's rows read
    ``STREAM_ROWS_OF_B`` at a time (each a contiguous stream, reused from L1 by the row tiles).
    Up to a quarter of the vector registers' worth of rows form one register tile of M rows × as
    many vectors as fill half the registers (one token: 8 vectors with 16 registers); more rows take
    the BLIS register tile (``cpu_gemm_tiles``), balanced over the row tiles. ``nc``: the columns of
    a block — all of them, unless the accumulators (M × nc) would not stay in half the L2 cache
    between blocks of B's rows; the column blocks, when there are several, run in parallel. Blocks
    are not made per core: halves of B's rows are shorter streams, and one thread over whole rows
    was 10–30% faster than two over halves at one thread and, on the shared machine it was measured
    on, also at two (1×777×1531, 1×1024×4096, 1×3072×768, 1×4096×4096)."""
    lanes = target.vector_lanes(itemsize)
    regs = 32 if target.vector_bits >= 512 else 16
    if M <= regs // 4:
        mr, nr_vecs = M, (regs // 2) // M
    else:
        blis = cpu_gemm_tiles(M, N, STREAM_ROWS_OF_B, target, itemsize)
        mr, nr_vecs = blis["mr"], blis["nr"] // lanes
        mr = math.ceil(M / math.ceil(M / mr))
    if math.ceil(M / mr) > STREAM_MAX_ROW_TILES:
        return None
    nr = lanes * nr_vecs
    fits = max(nr, (target.l2_bytes // 2) // (M * itemsize) // nr * nr)
    nc = min(_round_up(N, nr), fits)
    blocks = math.ceil(N / nc)
    return {"mr": mr, "nr": nr, "mc": _round_up(M, mr), "nc": nc, "kc": STREAM_ROWS_OF_B, "lanes": lanes,
            "blocks": blocks, "pack_a": False, "pack_b": False, "parallel": "jc" if blocks > 1 else None}


def cpu_gemm_default(M: int, N: int, K: int, target: CPUTarget, itemsize: int = 4, batch: int = 0
                     ) -> dict[str, Any]:
    """The default CPU schedule of a product (``batch`` products when given), as the tiles and form
    ``schedule_gemm_cpu`` takes: the streaming form for few rows (``cpu_stream_tiles``), else the
    BLIS form (``cpu_gemm_tiles``). With at least as many products as cores, the batch loop runs in
    parallel and the packed form takes all of a product's rows in one block."""
    tiles = {**GEMM_FORM, **(cpu_stream_tiles(M, N, target, itemsize)
                             or dict(cpu_gemm_tiles(M, N, K, target, itemsize), parallel="ic"))}
    if batch >= target.cores:
        tiles["parallel"] = "batch"
        tiles["mc"] = _round_up(M, tiles["mr"])
    return tiles


DOT_MAX_ROWS = STREAM_MAX_ROW_TILES * 6
"""The rows of A up to which a product with B transposed takes the dot-product form: those the
streaming form serves (``STREAM_MAX_ROW_TILES`` register tiles of the BLIS form's 6 rows)."""


def dot_form_fits(M: int, K: int, lanes: int) -> bool:
    """Whether a product of ``M`` rows with B transposed takes the dot-product form: few rows, and K
    of at least one vector of ``lanes``."""
    return M <= DOT_MAX_ROWS and K >= lanes


def cpu_dot_tiles(M: int, N: int, K: int, target: CPUTarget, itemsize: int = 4) -> dict[str, Any] | None:
    """Tiles of the dot-product form (``schedule_dot_cpu``) of a product with B transposed (``dense``'s
    W, N × K) and few rows M (``dot_form_fits``), or None for more rows or K shorter than a vector
    (the BLIS form then). Each pair (row of A, row of B) sums in the lanes of one vector
    accumulator: a register tile of ``mr`` rows × ``nj`` rows of B (half the vector registers: one
    token, 8 rows of B read as 8 contiguous streams), the tiles of rows of A balanced with at most 4
    rows each. Nothing is packed: B transposed read in place would otherwise need packing (the
    BLIS form's extra pass over B, which few rows do not amortize)."""
    lanes = target.vector_lanes(itemsize)
    regs = 32 if target.vector_bits >= 512 else 16
    if not dot_form_fits(M, K, lanes):
        return None
    mr = math.ceil(M / math.ceil(M / 4))
    return {"lanes": lanes, "mr": mr, "nj": max(1, (regs // 2) // mr), "parallel": "jr"}


def schedule_dot_cpu(sched: Schedule, name: str, tiles: dict[str, Any]) -> None:
    """Schedule the partials ``name_lanes[i, j, lane]`` of ``lanewise_row_reduce(.., cols=N)`` (the
    dot products of rows of A and rows of B): an ``mr`` × ``nj`` tile of vector accumulators over the
    whole vectors of the rows, the tiles of B's rows outermost (each row of B read once per tile of
    A's rows, from cache after the first), full tiles separated, the ``parallel`` loop "jr" or None."""
    st = sched[f"{name}_lanes"]
    st.split("j", tiles["nj"], "jr", "jn").split("i", tiles["mr"], "ir", "im")
    st.reorder("jr", "ir", f"{name}_v", "im", "jn", "lane")
    st.cache_write("ir")
    if tiles.get("separate", True):
        st.separate("ir")
    st.tag("im", tiles.get("unroll_m", "unroll")).unroll("jn").vectorize("lane")
    if tiles["parallel"] is not None:
        st.parallel(tiles["parallel"])


GEMM_FORM: dict[str, Any] = {"order": ("jc", "kc", "ic"), "inner": ("jr", "ir"), "pack_a": True, "pack_b": True,
                             "unroll_m": "unroll", "separate": True}
"""The BLIS form of ``schedule_gemm_cpu`` (the values its tiles may override)."""


def schedule_gemm_cpu(sched: Schedule, out: str, a: str, b: str, tiles: dict[str, Any],
                      b_transposed: bool = False, batch: str | None = None) -> None:
    """Schedule ``out[i, j] = sum_k a[i, k] * b[k, j]`` (``b[j, k]`` when ``b_transposed``; a leading
    batch loop ``batch`` when given, indexing all three tensors): cache blocks MC × NC × KC of the
    loops in ``order`` (outermost first), register tiles MR × NR in ``inner`` order, B's panels
    packed at the kc loop (``pack_b``), A's blocks at the ic loop (``pack_a``), the MR × NR
    accumulators in registers (the rows ``unroll_m``, NR in vectors), full tiles separated from the
    edges (``separate``), and the ``parallel`` loop ("ic", "jc", "jr", "batch" or None; by default
    the batch loop when there is one, else ic). ``tiles`` holds mc, nc, kc, mr, nr, lanes and may
    override any value of ``GEMM_FORM``. The sum over k keeps its order."""
    t = {**GEMM_FORM, **tiles}
    mc, nc, kc, mr, nr, lanes = (t[k] for k in ("mc", "nc", "kc", "mr", "nr", "lanes"))
    st = sched[out]
    st.split("j", nc, "jc", "j1").split("k", kc, "kc", "k1").split("i", mc, "ic", "i1")
    st.split("j1", nr, "jr", "jn").split("i1", mr, "ir", "im").split("jn", lanes, "jv", "jl")
    st.reorder(*((batch,) if batch else ()), *t["order"], *t["inner"], "k1", "im", "jv", "jl")
    if t["pack_b"]:
        if b_transposed:
            st.cache(b, "kc", layout=lambda *e: (*e[:-2], e[-2] // nr, e[-1], e[-2] % nr),
                     copy_order=t.get("b_copy", "source" if rows_span_pages(sched, b) else "cache"))
        else:
            st.cache(b, "kc", layout=lambda *e: (*e[:-2], e[-1] // nr, e[-2], e[-1] % nr))
    if t["pack_a"]:
        st.cache(a, "ic", layout=lambda *e: (*e[:-2], e[-2] // mr, e[-1], e[-2] % mr))
    st.cache_write(t["inner"][1])
    if t["separate"]:
        st.separate(t["inner"][1])
    st.tag("im", t["unroll_m"]).unroll("jv").vectorize("jl")
    par = t.get("parallel", "batch" if batch else "ic")
    if par == "batch":
        if batch is None:
            raise PolytileError(f"schedule of {out}: parallel='batch' needs a batch loop")
        par = batch
    if par is not None:
        st.parallel(par)


PAGE_BYTES = 4096


def rows_span_pages(sched: Schedule, b: str) -> bool:
    """Whether the rows of ``b`` (B transposed: N × K) are a page or longer: its pack then copies row
    by row (copy_order "source"), each row one stream; in the packed order it reads nr rows at once,
    each on its own page (BERT's 128×768×3072, rows of 12 KiB: 12.9 ms against 8.2 ms row by row;
    at K = 768, rows of 3 KiB, the packed order was as fast or faster: one thread, CPU time)."""
    t = sched.func.tensor(b)
    return int(t.shape[-1].value) * t.dtype.itemsize >= PAGE_BYTES  # type: ignore[attr-defined]


def whole_sums(tiles: dict[str, Any], out: Tensor, K: int) -> dict[str, Any]:
    """``tiles`` of ``schedule_gemm_cpu`` for ``out``: a result stored narrower than it is summed in
    (``out_dtype``) takes the whole of K in one block, so that its register tile holds complete sums,
    rounded once (a K block would store and reload rounded partial sums)."""
    return dict(tiles, kc=K) if getattr(out, "narrowed", False) else tiles


def product(a: lang.expr.Expr, b: lang.expr.Expr, dtype: object) -> lang.expr.Expr:
    """``a * b`` of two ``dtype`` operands in the type they are summed in (``dtypes.accumulator``:
    16-bit floats in float32, 8- and 16-bit integers in int32), so sums neither lose precision nor
    wrap around."""
    acc = accumulator(dtype)
    return a.astype(acc) * b.astype(acc)


def _nbytes(dtype: str) -> int:
    return as_dtype(dtype).itemsize


def _reference_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    wide = reference_type(a.dtype)
    return np.matmul(a.astype(wide), b.astype(wide))


def matmul_func(M: int, N: int, K: int, dtype: str = "float32", split_k: int = 1, out_dtype: str | None = None,
                chunk: int | None = None) -> Func:
    """The algorithm of ``matmul``. With ``split_k`` = S > 1 the reduction is split in S chunks of
    ``chunk`` (by default ⌈K/S⌉; the last one shorter where S chunks overrun K; none empty):
    ``P[s, i, j]`` sums chunk s, and ``C[i, j] = sum_s P[s, i, j]`` — the same function, with S times
    more independent work for small outputs over a long reduction (split-K). A kernel that computes
    whole K tiles takes a ``chunk`` that is a multiple of its K tile (``ops.gpu_schedules.tile_chunks``).
    The sums, the partial ones included, are of ``dtypes.accumulator(dtype)`` (16-bit floats in
    float32, 8- and 16-bit integers in int32); C is stored as ``out_dtype`` (by default that type),
    rounded once when complete."""
    return _gemm_func("matmul", 0, M, N, K, dtype, split_k, out_dtype, chunk)


def batch_matmul_func(batch: int, M: int, N: int, K: int, dtype: str = "float32", split_k: int = 1,
                      out_dtype: str | None = None, chunk: int | None = None) -> Func:
    """The algorithm of ``batch_matmul``, its reduction split as in ``matmul_func``
    (``P[bb, s, i, j]``, then ``C[bb, i, j] = sum_s P[bb, s, i, j]``)."""
    return _gemm_func("batch_matmul", batch, M, N, K, dtype, split_k, out_dtype, chunk)


def _gemm_func(name: str, batch: int, M: int, N: int, K: int, dtype: str, split_k: int, out_dtype: str | None,
               chunk: int | None = None) -> Func:
    out = output_dtype(name, dtype, out_dtype)
    lead = (batch,) if batch else ()
    A = placeholder((*lead, M, K), dtype, "A")
    B = placeholder((*lead, K, N), dtype, "B")
    kc = chunk or -(-K // max(1, split_k))
    if split_k < 1 or (split_k - 1) * kc >= K:
        raise PolytileError(f"{name}: split_k={split_k} must be between 1 (no split) and K={K}, and leave no chunk "
                            f"of {'' if chunk else '⌈K/split_k⌉ = '}{kc} empty")
    if split_k * kc < K:
        raise PolytileError(f"{name}: {split_k} chunks of {kc} do not cover K={K}; take chunk ≥ ⌈K/split_k⌉ = "
                            f"{-(-K // split_k)}")
    k = reduce_axis(kc if split_k > 1 else K, "k")

    def chunk_sum(lead: tuple[object, ...], i: object, j: object, s: object = 0) -> lang.expr.Expr:
        kk = s * kc + k if split_k > 1 else k  # type: ignore[operator]
        where = kk < K if split_k > 1 and split_k * kc > K else None  # type: ignore[operator]
        return lang.tensor.sum(product(A[(*lead, i, kk)], B[(*lead, kk, j)], dtype), axis=k, where=where)

    if split_k <= 1:
        if batch:
            C = compute((batch, M, N), lambda bb, i, j: chunk_sum((bb,), i, j), "C", store_dtype=out)
        else:
            C = compute((M, N), lambda i, j: chunk_sum((), i, j), "C", store_dtype=out)
        return Func([A, B], [C], name=name)
    ks = reduce_axis(split_k, "ks")
    if batch:
        P = compute((batch, split_k, M, N), lambda bb, s, i, j: chunk_sum((bb,), i, j, s), "P")
        C = compute((batch, M, N), lambda bb, i, j: lang.tensor.sum(P[bb, ks, i, j], axis=ks), "C", store_dtype=out)
    else:
        P = compute((split_k, M, N), lambda s, i, j: chunk_sum((), i, j, s), "P")
        C = compute((M, N), lambda i, j: lang.tensor.sum(P[ks, i, j], axis=ks), "C", store_dtype=out)
    return Func([A, B], [C], name=name)


def matmul_tail_split_func(M: int, N: int, K: int, dtype: str = "float16", head_rows: int = 0, split: int = 1,
                           out_dtype: str | None = None, chunk: int | None = None) -> Func:
    """``matmul``'s algorithm with its rows in two parts, for a GPU whose last wave of output tiles would
    leave most multiprocessors idle: the first ``head_rows`` rows summed over the whole of K,
    ``H[i, j]`` (in the output type: the whole waves), the rest as partial sums over ``split`` chunks of
    K, ``P[s, i, j]`` (float32; chunks of ``chunk``, by default ⌈K/split⌉, the last one ending at K:
    more blocks for the tail), then ``C[i, j]`` = H's row where i < head_rows, else the sum of the
    tail's chunks (only the chosen side is read). Same inputs and output as ``matmul``
    (``gpu_schedules.tail_split_schedule``)."""
    if not 0 < head_rows < M:
        raise PolytileError(f"matmul: head_rows={head_rows} must leave rows on both sides (0 < head_rows < M={M})")
    out = output_dtype("matmul", dtype, out_dtype)
    tail = M - head_rows
    kc = chunk or -(-K // split)
    if split < 1 or (split - 1) * kc >= K or split * kc < K:
        raise PolytileError(f"matmul: {split} chunks of {kc} must cover K={K} with none empty")
    A = placeholder((M, K), dtype, "A")
    B = placeholder((K, N), dtype, "B")
    k = reduce_axis(K, "k")
    H = compute((head_rows, N), lambda i, j: lang.tensor.sum(product(A[i, k], B[k, j], dtype), axis=k), "H",
                store_dtype=out)
    kk = reduce_axis(kc, "k")

    def chunk_sum(s: object, i: object, j: object) -> lang.expr.Expr:
        kx = s * kc + kk if split > 1 else kk  # type: ignore[operator]
        where = kx < K if split * kc > K else None
        return lang.tensor.sum(product(A[head_rows + i, kx], B[kx, j], dtype), axis=kk, where=where)  # type: ignore[operator]

    P = compute((split, tail, N), chunk_sum, "P")

    def combined(i: object, j: object) -> lang.expr.Expr:
        total = P[0, i - head_rows, j]  # type: ignore[operator]
        for s in range(1, split):
            total = total + P[s, i - head_rows, j]  # type: ignore[operator]
        return select(i < head_rows, H[i, j].astype(total.dtype), total)  # type: ignore[operator]

    C = compute((M, N), combined, "C", store_dtype=out)
    return Func([A, B], [C], name="matmul")


def matmul_padded_func(M: int, N: int, K: int, dtype: str = "float16", out_dtype: str | None = None) -> Func:
    """``matmul``'s algorithm with its product computed in rows of whole 16-byte vectors: B copied as
    ``Bp[k, j]`` with its columns rounded up to Np, a multiple of 16 bytes of the output (zeros past
    N), the product ``Cp[i, j]`` (M × Np, in the output type), then ``C[i, j] = Cp[i, j]`` for j < N.
    Same inputs and output as ``matmul``: for outputs whose rows are only 2-byte aligned (an odd N of
    16-bit results), which a tensor-core kernel otherwise writes element by element, 8 rows a store
    instruction (``gpu_schedules.padded_output``)."""
    out = output_dtype("matmul", dtype, out_dtype)
    Np = -(-N * out.itemsize // 16) * 16 // out.itemsize
    A = placeholder((M, K), dtype, "A")
    B = placeholder((K, N), dtype, "B")
    Bp = compute((K, Np), lambda k, j: select(j < N, B[k, j], 0), "Bp")
    k = reduce_axis(K, "k")
    Cp = compute((M, Np), lambda i, j: lang.tensor.sum(product(A[i, k], Bp[k, j], dtype), axis=k), "Cp",
                 store_dtype=out)
    C = compute((M, N), lambda i, j: Cp[i, j], "C", store_dtype=out)
    return Func([A, B], [C], name="matmul")


def matmul(M: int, N: int, K: int, dtype: str = "float32", split_k: int | None = None,
           out_dtype: str | None = None) -> Op:
    """C[i, j] = sum_k A[i, k] * B[k, j], summed in ``dtypes.accumulator(dtype)`` (float16/bfloat16
    inputs: float32; int8/uint8/int16: int32) and returned as ``out_dtype``: by default that type;
    float16, bfloat16 or float32 for floating-point inputs (the sums rounded once, when complete, as
    torch's float16 GEMMs return them; half the bytes written of a float32 result).

    ``split_k``: None lets the target's default schedule decide (on a GPU it splits K when the output
    tiles leave multiprocessors idle and K is long), 1 never splits, S > 1 sums K in S chunks first
    (``matmul_func``; the partial sums stay in the summation type)."""
    func = matmul_func(M, N, K, dtype, 1 if split_k is None else split_k, out_dtype)
    C = func.outputs[0]
    acc = C.value_dtype.itemsize

    def cpu(sched: Schedule, target: CPUTarget) -> None:
        if not split_k or split_k <= 1:
            schedule_gemm_cpu(sched, "C", "A", "B", whole_sums(cpu_gemm_default(M, N, K, target, acc), C, K))
            return
        tiles = cpu_gemm_tiles(M, N, K, target, acc)
        schedule_gemm_cpu(sched, "P", "A", "B", dict(tiles, kc=min(tiles["kc"], -(-K // split_k))), batch="s")
        sched["C"].parallel("i")

    op = Op("matmul", {"M": M, "N": N, "K": K}, func,
            lambda rng: [random_array(rng, (M, K), dtype), random_array(rng, (K, N), dtype)], _reference_matmul,
            2.0 * M * N * K, _nbytes(dtype) * (M * K + K * N) + C.dtype.itemsize * M * N, {"cpu": cpu},
            baseline=lambda a, b: a @ b, tolerance=tolerance(C.dtype, K, dtype))
    if C.narrowed:
        op.shape["out_dtype"] = C.dtype.name  # type: ignore[assignment]
    if split_k is not None:
        op.shape["split_k"] = split_k
    _add_cuda(op, "matmul", (M, N, K, split_k))
    return op


def batch_matmul(batch: int, M: int, N: int, K: int, dtype: str = "float32", split_k: int | None = None,
                 out_dtype: str | None = None) -> Op:
    """C[b, i, j] = sum_k A[b, i, k] * B[b, k, j] (summed in ``dtypes.accumulator(dtype)`` and returned
    as ``out_dtype``, as in ``matmul``); ``split_k`` as in ``matmul``."""
    func = batch_matmul_func(batch, M, N, K, dtype, 1 if split_k is None else split_k, out_dtype)
    C = func.outputs[0]
    acc = C.value_dtype.itemsize

    def cpu(sched: Schedule, target: CPUTarget) -> None:
        if not split_k or split_k <= 1:
            schedule_gemm_cpu(sched, "C", "A", "B", whole_sums(cpu_gemm_default(M, N, K, target, acc, batch), C, K),
                              batch="bb")
            return
        tiles = cpu_gemm_tiles(M, N, K, target, acc)
        if batch >= target.cores:
            tiles.update(mc=_round_up(M, tiles["mr"]), parallel="batch")
        schedule_gemm_cpu(sched, "P", "A", "B", dict(tiles, kc=min(tiles["kc"], -(-K // split_k))),
                          batch="bb" if batch >= target.cores else None)
        sched["C"].parallel("bb")

    op = Op("batch_matmul", {"batch": batch, "M": M, "N": N, "K": K}, func,
            lambda rng: [random_array(rng, (batch, M, K), dtype), random_array(rng, (batch, K, N), dtype)],
            _reference_matmul,
            2.0 * batch * M * N * K, batch * (_nbytes(dtype) * (M * K + K * N) + C.dtype.itemsize * M * N),
            {"cpu": cpu}, baseline=np.matmul, tolerance=tolerance(C.dtype, K, dtype))
    if C.narrowed:
        op.shape["out_dtype"] = C.dtype.name  # type: ignore[assignment]
    if split_k is not None:
        op.shape["split_k"] = split_k
    _add_cuda(op, "batch_matmul", (batch, M, N, K, split_k))
    return op


def dense(M: int, N: int, K: int, dtype: str = "float32", activation: str = "relu") -> Op:
    """Y[i, j] = act(sum_k X[i, k] * W[j, k] + bias[j]) — a fully connected layer (W is N×K), summed in
    and returned as ``dtypes.accumulator(dtype)`` (as in ``matmul``)."""
    if activation not in ("relu", "none"):
        raise PolytileError(f"dense: unknown activation {activation!r}; use 'relu' or 'none'")
    X = placeholder((M, K), dtype, "X")
    W = placeholder((N, K), dtype, "W")
    bias = placeholder((N,), dtype, "bias")
    k = reduce_axis(K, "k")
    mm = compute((M, N), lambda i, j: lang.tensor.sum(product(X[i, k], W[j, k], dtype), axis=k), "XW")

    def act(v: lang.expr.Expr) -> lang.expr.Expr:
        return lang.expr.call("max", v, 0) if activation == "relu" else v  # 0 of v's type

    Y = compute((M, N), lambda i, j: act(mm[i, j] + bias[j].astype(mm.dtype)), "Y")
    func = Func([X, W, bias], [Y], name="dense")

    def cpu(sched: Schedule, target: CPUTarget, form: dict[str, Any] | None = None) -> Schedule | None:
        """The default schedule, or the one of ``form`` (the tuning template's): ``kernel`` "dot" (few
        rows: ``cpu_dot_tiles``) or "gemm" (the BLIS form's tiles, ``schedule_gemm_cpu``), and
        ``epilogue`` "vector" (the bias and activation over vectors of columns, rows in parallel)."""
        f = form or dense_cpu_default(M, N, K, target, Y.dtype.itemsize)
        lanes = target.vector_lanes(Y.dtype.itemsize)
        if f["kernel"] == "gemm":
            schedule_gemm_cpu(sched, "XW", "X", "W", f, b_transposed=True)
            out = sched
        else:
            from .norm import lanewise_row_reduce
            dots = lanewise_row_reduce(M, K, lanes, lambda i, j, k: product(X[i, k], W[j, k], dtype), "sum",
                                       "XW", cols=N)
            out = Schedule(Func([X, W, bias], [compute((M, N), lambda i, j: act(dots[i, j] + bias[j].astype(
                dots.dtype)), "Y")], name="dense"))
            schedule_dot_cpu(out, "XW", f)
        ep = out["Y"].split("j", lanes, "jo", "jl").vectorize("jl")
        if f.get("epilogue", "vector") == "vector":
            ep.parallel("i")
        return None if out is sched else out

    def reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        y = _reference_matmul(x, w.T) + b.astype(reference_type(b.dtype))
        return np.maximum(y, 0) if activation == "relu" else y

    op = Op("dense", {"M": M, "N": N, "K": K}, func,
            lambda rng: [random_array(rng, (M, K), dtype), random_array(rng, (N, K), dtype),
                         random_array(rng, (N,), dtype)],
            reference, 2.0 * M * N * K, _nbytes(dtype) * (M * K + N * K) + Y.dtype.itemsize * M * N, {"cpu": cpu},
            baseline=lambda x, w, b: np.maximum(x @ w.T + b, 0) if activation == "relu" else x @ w.T + b,
            tolerance=tolerance(Y.dtype, K, dtype))
    _add_cuda(op, "dense", (M, N, K))
    return op


def dense_cpu_default(M: int, N: int, K: int, target: CPUTarget, itemsize: int = 4) -> dict[str, Any]:
    """The form and tiles of ``dense``'s default CPU schedule: dot products for few rows
    (``cpu_dot_tiles``), else the BLIS form with W's panels packed (``cpu_gemm_tiles``)."""
    dot = cpu_dot_tiles(M, N, K, target, itemsize)
    if dot is not None:
        return {"kernel": "dot", **dot}
    return {"kernel": "gemm", **GEMM_FORM, **cpu_gemm_tiles(M, N, K, target, itemsize), "parallel": "ic"}


def _add_cuda(op: Op, kind: str, dims: tuple[int, ...]) -> None:
    """Attach the CUDA schedule when the GPU operator module provides one."""
    from . import gpu_schedules
    fn = gpu_schedules.SCHEDULES.get(kind)
    if fn is not None:
        op.schedules["cuda"] = lambda sched, target: fn(sched, target, *dims)  # type: ignore[misc]

