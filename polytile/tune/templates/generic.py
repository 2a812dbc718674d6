"""A generic CPU template for a plain Func: tile the loops of its last computation.

Every data loop is split in two (powers of two), the tile loops go outside the reduction loops and
the point loops inside, the innermost point loop is vectorized, the outermost tile loop runs in
parallel and results may accumulate in a write cache. Enough to speed up simple reductions and
elementwise code that has no template of its own. The first choice of every decision (tiles of
one, no write cache, no parallel loop) is the Func's default schedule, the one ``pt.build`` gives it.
"""

from __future__ import annotations

from typing import Any

from ..space import TemplateConfig
from ..task import template


@template("func", "cpu", name="generic_cpu")
def generic_cpu(cfg: TemplateConfig, op: Any) -> Any:
    func = op.func
    comp = func.outputs[-1]
    data = [str(a.name) for a in comp.axes]
    reduce = [str(a.name) for a in comp.reduce_axes]
    extents = [int(getattr(d, "value", 1)) for d in comp.shape]
    tiles = [cfg.split(f"tile_{name}", ext, 2, policy="pow2", max_factor=64)[1]
             for name, ext in zip(data, extents, strict=True)]
    cache = cfg.knob("cache_write", [False, True]) if reduce else False
    parallel = cfg.knob("parallel", [False, True])
    sched = cfg.schedule(func)
    st = sched[comp.name]
    outer = [f"{name}_o" if f > 1 else name for name, f in zip(data, tiles, strict=True)]
    inner = [f"{name}_i" for name, f in zip(data, tiles, strict=True) if f > 1]  # a tile of one: no split
    for name, f in zip(data, tiles, strict=True):
        if f > 1:
            st.split(name, f, f"{name}_o", f"{name}_i")
    st.reorder(*outer, *reduce, *inner)
    if tiles[-1] > 1:
        st.vectorize(f"{data[-1]}_i")
    if cache:
        st.cache_write(outer[-1])
    if parallel:
        st.parallel(outer[0])
    return sched
