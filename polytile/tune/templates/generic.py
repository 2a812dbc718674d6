"""A generic CPU template for a plain Func: tile the loops of its last computation.

Every data loop is split in two (powers of two), the tile loops go outside the reduction loops and
the point loops inside, the innermost point loop is vectorized, the outermost tile loop runs in
parallel and results may accumulate in a write cache. Enough to speed up simple reductions and
elementwise code that has no template of its own.
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
    parallel = cfg.knob("parallel", [True, False])
    sched = cfg.schedule(func)
    st = sched[comp.name]
    for name, f in zip(data, tiles, strict=False):
        st.split(name, f, f"{name}_o", f"{name}_i")
    st.reorder(*[f"{n}_o" for n in data], *reduce, *[f"{n}_i" for n in data])
    if tiles[-1] > 1:
        st.vectorize(f"{data[-1]}_i")
    if cache:
        st.cache_write(f"{data[-1]}_o")
    if parallel:
        st.parallel(f"{data[0]}_o")
    return sched
