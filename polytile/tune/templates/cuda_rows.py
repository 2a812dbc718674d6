"""CUDA schedule templates of the row operators (softmax, layernorm): the choices of their default
schedules (``ops.gpu_schedules.softmax``/``layernorm``: one block per row, or several narrow rows a
block) as decisions.

``threads``: the threads along a row (whole warps, 32 to 1024, or for rows of at most
``NARROW_ROW`` elements also a part of a warp, 1 to 16; no more than the row has elements, but for
the default); ``rows``: rows a block (several only for rows
of at most a warp's threads, each row its own lanes: up to the target's block); ``shared_row``:
whether the block's rows are read once into shared memory (offered only where they fit in a block's
shared memory; else each pass reads them from global memory, the later passes mostly from the L1 or
L2 cache); ``vec``: one element a read, or 16 bytes (the rows' alignment proven: their width a
multiple of 16 bytes; from global memory), each thread's adjacent elements read into registers
together; ``cluster``: one block a row, or each row split over 2 to 8 blocks of a thread-block cluster
(targets with clusters; rows wider than ``NARROW_ROW``, one a block, read from global memory: the
blocks' statistics combined through distributed shared memory). The first choice of each is the
operator's default for the shape and target (``gpu_schedules.row_plan``), so the space's default
configuration is the default kernel and the tuners measure it first.
"""

from __future__ import annotations

from typing import Any

from ...ops.gpu_schedules import NARROW_ROW, ROW_LANES, ROW_THREADS, SCHEDULES, cluster_slice, row_fits, row_plan
from ..space import TemplateConfig
from ..task import template

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
"""The rows a block may take (narrow rows)."""

CLUSTERS = (1, 2, 4, 8)
"""The blocks of a cluster a row may be split over (targets with clusters, up to their cluster size)."""


def _first(default: object, choices: tuple[Any, ...]) -> list[Any]:
    """``choices`` once each, ``default`` first."""
    return list(dict.fromkeys([default, *choices]))


def _rows(cfg: TemplateConfig, op: Any) -> Any:
    M, N = op.shape["M"], op.shape["N"]
    itemsize = op.func.inputs[0].dtype.itemsize
    default = row_plan(cfg.target, op.name, N, itemsize, M=M)
    # parts of a warp for narrow rows only
    widths = ROW_LANES + ROW_THREADS if N <= NARROW_ROW else ROW_THREADS
    threads = int(cfg.knob("threads", _first(default.threads, widths)))  # type: ignore[call-overload]
    rows = int(cfg.knob("rows", _first(default.rows, ROWS)))  # type: ignore[call-overload]
    # the default caches the rows wherever they fit
    fits = row_fits(cfg.target, N, itemsize)
    shared_row = bool(cfg.knob("shared_row", _first(default.shared_row, (True, False) if fits else (False,))))
    widest = 16 // itemsize  # elements of a 16-byte read
    vec = int(cfg.knob("vec", _first(default.vec, (1, widest))))  # type: ignore[call-overload]
    clusters = [c for c in CLUSTERS if c <= cfg.target.max_cluster_blocks] \
        if cfg.target.has("clusters") and N > NARROW_ROW else [1]
    cluster = int(cfg.knob("cluster", _first(default.cluster, tuple(clusters))))  # type: ignore[call-overload]
    # a loop bound to the threads is as long as the row at most: a wider block would shrink to the row
    cfg.require(threads == default.threads or threads <= N, f"{threads} threads for a row of {N} elements")
    cfg.require(rows == 1 or threads in ROW_LANES, f"{rows} rows of {threads} threads: several rows a block "
                                                   "take a part of a warp each")
    cfg.require(rows == default.rows or rows < 2 * M, f"{rows} rows a block for {M} rows")
    cfg.require(not shared_row or row_fits(cfg.target, N, itemsize, rows),
                f"{rows} rows of {N} × {itemsize} bytes in shared memory")
    # 16-byte reads of rows that are 16-byte aligned (the buffers are), from global memory
    cfg.require(vec == 1 or N % vec == 0 and not shared_row, f"reads of {vec} elements of rows of {N} elements"
                f"{' in shared memory' if shared_row else ''}")
    cfg.require(rows == 1 or threads * vec <= N or threads == default.threads and vec == 1,
                f"{threads} threads of {vec} elements a read for a row of {N} elements, several rows a block")
    # a row split over a cluster: one a block of whole warps, from global memory, each block its slice
    # (no fewer reads than the block's threads: a wider block would shrink to them)
    cfg.require(cluster == 1 or rows == 1 and not shared_row and threads in ROW_THREADS
                and -(-N // cluster_slice(N, cluster)) == cluster and threads * vec <= cluster_slice(N, cluster),
                f"a row of {N} over {cluster} blocks of a cluster, {rows} rows of {threads} threads a block"
                f"{', in shared memory' if shared_row else ''}")
    # the rows, the block reductions' scratch (32 floats) and one row's two statistics
    cfg.resources(threads_per_block=threads * rows, shared_bytes=rows * N * itemsize * shared_row + 4 * 32 + 2 * 4)
    sched = cfg.schedule(op.func)
    SCHEDULES[op.name](sched, cfg.target, M, N, threads=threads, shared_row=shared_row, rows=rows, vec=vec,
                       cluster=cluster)
    return sched


@template("softmax", "cuda")
def softmax_cuda(cfg: TemplateConfig, op: Any) -> Any:
    return _rows(cfg, op)


@template("layernorm", "cuda")
def layernorm_cuda(cfg: TemplateConfig, op: Any) -> Any:
    return _rows(cfg, op)
