"""Tuning templates of imported groups ("torch_group_cpu", "torch_group_cuda"), registered with
``pt.tune.template`` for plain Funcs: the recipes of ``schedules`` with their parameters as
decisions. The first choice of every decision is the default schedule's, so the default is always
in the space. They apply only to Funcs the importer wrote (a user's own Func keeps the generic
template, whichever was registered first). Worker processes import this module by name to find the
templates.
"""

from __future__ import annotations

from typing import Any

from ..tune import TemplateConfig, template
from .schedules import GroupInfo, Knobs, group_info, rowwise, schedule_group


def imported_from_torch(op: Any, target: Any) -> bool:
    """Whether the Func of ``op`` is an imported group (it carries the group's description)."""
    return isinstance(getattr(op.func, "torch_group", None), GroupInfo)


def _gemm_knobs(cfg: TemplateConfig, st: Any, whole_k: bool = False) -> dict[str, int]:
    """``whole_k``: the product's sums are finished (an epilogue): its default tiles are those of K in
    one block (``cpu_gemm_tiles(whole_k=True)``), as the default schedule's."""
    from ..ops.matmul import cpu_gemm_tiles
    from .schedules import gemm_dot_tiles
    d = cpu_gemm_tiles(st["M"], st["N"], st["K"], cfg.target, 4, whole_k=whole_k)
    lanes = d["lanes"]
    if st["dot"]:  # dot products: mr rows of A × nr / lanes rows of B a register tile (cache blocks unused)
        dot = gemm_dot_tiles(st, cfg.target)
        d.update(mr=dot["mr"], nr=dot["nj"] * lanes, mc=dot["mr"] * 4, nc=dot["nj"] * lanes * 4)
    mr = cfg.knob("mr", _first(d["mr"], [2, 4, 6, 8]))
    # B packed once (a constant weight: polytile.torch.packing) comes in panels of its register tile's width
    widths = [st["b_block"] // lanes] if st["b_block"] else _first(d["nr"] // lanes, [1, 2, 3, 4])
    nr = lanes * cfg.knob("nr_vecs", widths)  # type: ignore[operator]
    mc = cfg.knob("mc", _first(d["mc"], [mr * b for b in (4, 8, 16, 32)]))  # type: ignore[operator]
    nc = cfg.knob("nc", _first(d["nc"], [nr * b for b in (4, 16, 64)]))
    kc = cfg.knob("kc", _first(d["kc"], [64, 128, 256, 512]))
    cfg.require(mc % mr == 0 and nc % nr == 0, "cache blocks are whole register tiles")  # type: ignore[operator]
    # B's vectors are held for the MR rows that use them (one row uses each as it is loaded)
    cfg.resources(vector_registers=mr * (nr // lanes) + (nr // lanes if mr > 1 else 1) + 1)  # type: ignore[operator]
    return {"mr": mr, "nr": nr, "mc": mc, "nc": nc, "kc": kc}  # type: ignore[dict-item]


def _first(default: int, others: list[int]) -> list[int]:
    return [default] + [v for v in others if v != default]


@template("func", "cpu", name="torch_group_cpu", applies=imported_from_torch)
def torch_group_cpu(cfg: TemplateConfig, op: Any) -> Any:
    func = op.func
    g = group_info(func)
    knobs = Knobs()
    gemms = g.of_kind("gemm")
    convs = g.of_kind("conv")
    if gemms:
        knobs.gemm_tiles = _gemm_knobs(cfg, gemms[0], func.tensor(gemms[0].name).finished)
    if convs:  # k_tile 0: the default schedule (ops.conv.conv2d_cpu_default), else column vectors
        lanes = cfg.target.vector_lanes(4)
        k_tile, q_tile = cfg.knob("k_tile", [0, 8, 4, 16]), cfg.knob("q_tile", [lanes, lanes // 2, 2 * lanes])
        cfg.require(bool(k_tile) or q_tile == lanes, "the default convolution schedule has its own column tile")
        knobs.conv_tiles = (k_tile, q_tile) if k_tile else None  # type: ignore[assignment]
    knobs.lanes_factor = cfg.knob("vectors", [1, 2, 4])
    knobs.parallel = cfg.knob("parallel", [True, False])
    cfg.schedule(func)  # stops here while the space is defined or a configuration checked
    return schedule_group(func, cfg.target, knobs)


@template("func", "cuda", name="torch_group_cuda", applies=imported_from_torch)
def torch_group_cuda(cfg: TemplateConfig, op: Any) -> Any:
    func = op.func
    g = group_info(func)
    knobs = Knobs()
    gemms = g.of_kind("gemm")
    if gemms:
        tiles = cfg.knob("gemm_tiles", ["library", "128x128x8", "64x64x8", "64x128x16", "32x64x8"])
        if tiles != "library":
            bm, bn, bk = (int(v) for v in str(tiles).split("x"))
            tm = tn = 8 if bm >= 64 else 4
            knobs.gemm_cuda = {"bm": bm, "bn": bn, "bk": bk, "tm": tm, "tn": tn}
    if g.kind == "reduce" and rowwise(func, g):
        knobs.threads = cfg.knob("row_threads", [0, 32, 64, 128, 256]) or None
    else:  # elementwise stages and epilogues
        knobs.threads = cfg.knob("threads", [256, 128, 512, 1024])
    cfg.schedule(func)  # stops here while the space is defined or a configuration checked
    return schedule_group(func, cfg.target, knobs)
