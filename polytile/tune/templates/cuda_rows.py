"""CUDA schedule templates of the row operators (softmax, layernorm): the choices of their default
schedules (``ops.gpu_schedules.softmax``/``layernorm``, one block per row) as decisions.

``threads``: the block's threads along the row (whole warps, 32 to 1024); ``shared_row``: whether the
row is read once into shared memory (offered only where it fits in a block's shared memory; else
each pass reads it from global memory, the later passes mostly from L2). The first choice of each is
the operator's default for the width and target (``gpu_schedules.row_plan``), so the space's default
configuration is the default kernel and the tuners measure it first.
"""

from __future__ import annotations

from typing import Any

from ...ops.gpu_schedules import ROW_THREADS, SCHEDULES, row_plan
from ..space import TemplateConfig
from ..task import template


def _rows(cfg: TemplateConfig, op: Any) -> Any:
    N = op.shape["N"]
    itemsize = op.func.inputs[0].dtype.itemsize
    default = row_plan(cfg.target, op.name, N, itemsize)
    threads = int(cfg.knob("threads", [default.threads, *(t for t in ROW_THREADS if t != default.threads)]))  # type: ignore[call-overload]
    # the default caches the row wherever it fits
    shared_row = bool(cfg.knob("shared_row", [True, False] if default.shared_row else [False]))
    # a loop bound to the threads is as long as the row at most: a wider block would shrink to the row
    cfg.require(threads == ROW_THREADS[0] or threads <= N, f"{threads} threads for a row of {N} elements")
    # the row, the block reductions' scratch (32 floats) and the row's two statistics
    cfg.resources(threads_per_block=threads, shared_bytes=N * itemsize * shared_row + 4 * 32 + 2 * 4)
    sched = cfg.schedule(op.func)
    SCHEDULES[op.name](sched, cfg.target, op.shape["M"], N, threads=threads, shared_row=shared_row)
    return sched


@template("softmax", "cuda")
def softmax_cuda(cfg: TemplateConfig, op: Any) -> Any:
    return _rows(cfg, op)


@template("layernorm", "cuda")
def layernorm_cuda(cfg: TemplateConfig, op: Any) -> Any:
    return _rows(cfg, op)
