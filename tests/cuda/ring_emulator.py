"""The mbarrier protocol of a TMA-pipelined wgmma GEMM kernel run on the CPU (tests without a GPU).

Each block runs its lowered loop IR with the first lane of each warp (the threads that issue the
copies and release the slots) in lock step; TMA copies complete at once, wgmma groups too. A correct
ring never blocks in lock step (the copies run ahead of their use and every slot is released
before it is refilled), so a wait on an mbarrier whose awaited phase has not completed is reported
as a deadlock; a copy into a slot that some warp has not read yet, a product reading a slot that
holds another K tile, and a block tile computed twice or never are reported too. Only the
protocol is emulated: products, fragments and the epilogue's stores are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polytile.lowering import loopir as ir


class ProtocolError(AssertionError):
    pass


@dataclass
class _Barrier:
    count: int
    arrived: int = 0
    tx: int = 0
    phase: int = 0  # phases completed

    def step(self) -> None:
        if self.arrived == self.count and self.tx == 0:
            self.phase += 1
            self.arrived = 0


@dataclass
class _Slot:
    coords: tuple[int, ...] = ()
    readers: set[int] = field(default_factory=set)


@dataclass
class Trace:
    """What the blocks did: the (bi, bj) tiles each computed, and the waits that passed."""

    tiles: list[tuple[int, ...]] = field(default_factory=list)
    waits: int = 0


def _slot_size(buf: ir.Buffer) -> int:
    n = 1
    for d in buf.shape[1:]:
        n *= int(d.value)  # type: ignore[attr-defined]
    return n


def run_block(kernel: ir.Kernel, block_x: int, tile_vars: tuple[str, str], trace: Trace,
              tile_k: tuple[int, int] = (64, 64), bk: int = 64) -> None:
    """Run block ``block_x`` of ``kernel`` (warps along threadIdx.z, grid along x); ``tile_vars``:
    the lets of the block tile's row and column (bi, bj); ``tile_k``: the block tile (bm, bn), whose
    operand boxes the copies must have loaded for each K tile of ``bk``."""
    warps = kernel.block[2]
    threads = [{"threadIdx.x": 0, "threadIdx.y": 0, "threadIdx.z": w, "blockIdx.x": block_x, "blockIdx.y": 0,
                "blockIdx.z": 0, "ko": 0, **dict.fromkeys(tile_vars, 0)} for w in range(warps)]  # (a loop of one
    # block tile or of one K tile vanishes)
    bars: dict[tuple[str, int], _Barrier] = {}
    slots: dict[tuple[str, int], _Slot] = {}

    def flat(ld: ir.Load, env: dict) -> int:
        off = 0
        for i, d in zip(ld.index, ld.buffer.shape):
            off = off * int(d.value) + ir.eval_int(i, env)  # type: ignore[attr-defined]
        return off

    def bar(e: ir.Expr, env: dict) -> _Barrier:
        assert isinstance(e, ir.Load)
        key = (e.buffer.name, flat(e, env))
        if key not in bars:
            raise ProtocolError(f"block {block_x}: mbarrier {key} used before its initialization")
        return bars[key]

    def call(c: ir.Call, envs: list[dict]) -> None:
        name = c.name
        if name == "__syncthreads":
            if len(envs) != warps:
                raise ProtocolError(f"block {block_x}: __syncthreads() reached by {len(envs)} of {warps} warps")
            return
        for env in envs:
            if name == "pt_mbar_init":
                ld = c.args[0]
                bars[(ld.buffer.name, flat(ld, env))] = _Barrier(ir.eval_int(c.args[1], env))
            elif name == "pt_mbar_expect_tx":
                b = bar(c.args[0], env)
                b.tx += ir.eval_int(c.args[1], env)
                b.arrived += 1
                b.step()
            elif name == "pt_mbar_arrive":
                b = bar(c.args[0], env)
                b.arrived += 1
                b.step()
            elif name == "pt_mbar_wait":
                b, parity = bar(c.args[0], env), ir.eval_int(c.args[1], env) & 1
                if b.phase % 2 == parity:  # the phase of that parity has not completed
                    raise ProtocolError(f"block {block_x}, tile {env.get('pt_tile')}, warp {env['threadIdx.z']}: "
                                        f"waits on {c.args[0].buffer.name}[{flat(c.args[0], env)}] for parity "
                                        f"{parity} after {b.phase} phases: a deadlock")
                trace.waits += 1
            elif name.startswith("pt_tma_load_"):
                dst = c.args[0]
                size = _slot_size(dst.buffer)
                at = flat(dst, env)
                slot = slots.setdefault((dst.buffer.name, at // size), _Slot())
                if slot.coords and len(slot.readers) < warps:
                    raise ProtocolError(f"block {block_x}: a copy overwrites slot {at // size} of {dst.buffer.name} "
                                        f"that warps {sorted(set(range(warps)) - slot.readers)} have not read")
                rows, width = ir.eval_int(c.args[-1], env), ir.eval_int(c.args[-2], env)
                if at % size == 0:
                    slot.coords, slot.readers = tuple(ir.eval_int(x, env) for x in c.args[3:-2]), set()
                b = bar(c.args[2], env)
                b.tx -= rows * width * dst.buffer.dtype.itemsize
                b.step()
            elif name.startswith("pt_wgmma_m64n"):
                for ld, want in ((c.args[1], (env["ko"] * bk, env[tile_vars[0]] * tile_k[0])),
                                 (c.args[2], (env[tile_vars[1]] * tile_k[1], env["ko"] * bk))):
                    size = _slot_size(ld.buffer)
                    slot = slots.get((ld.buffer.name, flat(ld, env) // size))
                    if slot is None or slot.coords != want:
                        raise ProtocolError(f"block {block_x}: warp {env['threadIdx.z']} multiplies slot "
                                            f"{flat(ld, env) // size} of {ld.buffer.name} holding "
                                            f"{slot.coords if slot else None}, K tile {env['ko']} is at {want}")
                    slot.readers.add(env["threadIdx.z"])

    def run(s: ir.Stmt, envs: list[dict]) -> None:
        if not envs:
            return
        if isinstance(s, ir.Block):
            for x in s.body:
                run(x, envs)
        elif isinstance(s, (ir.Allocate, ir.Declare)):
            run(s.body, envs)
        elif isinstance(s, ir.LetStmt):
            if s.var.name in tile_vars and s.var.name == tile_vars[1]:
                trace.tiles.append(tuple(ir.eval_int(v, envs[0]) for v in (ir.Var(tile_vars[0]), s.value)))
            for env in envs:
                try:
                    env[s.var.name] = ir.eval_int(s.value, env)
                except (KeyError, ValueError):
                    env[s.var.name] = 0  # a value the protocol does not use (a load)
            run(s.body, envs)
        elif isinstance(s, ir.For):
            trips = {(ir.eval_int(s.lo, e), ir.eval_int(s.extent, e)) for e in envs}
            assert len(trips) == 1, f"loop {s.var.name} runs differently in the warps"
            lo, ext = trips.pop()
            for v in range(lo, lo + ext):
                for env in envs:
                    env[s.var.name] = v
                run(s.body, envs)
        elif isinstance(s, ir.If):
            try:
                taken = [ir.eval_int(s.cond, e) != 0 for e in envs]
            except (KeyError, ValueError):
                taken = [True] * len(envs)  # a guard of the epilogue's elements
            run(s.then, [e for e, t in zip(envs, taken) if t])
            if s.orelse is not None:
                run(s.orelse, [e for e, t in zip(envs, taken) if not t])
        elif isinstance(s, ir.Evaluate):
            call(s.call, envs)

    run(kernel.body, threads)


def run_grid(kernel: ir.Kernel, tile_vars: tuple[str, str] = ("bi", "bj"), **kw: object) -> Trace:
    """Every block of ``kernel``'s one-dimensional grid (``run_block``)."""
    trace = Trace()
    for x in range(ir.eval_int(kernel.grid[0], {})):
        run_block(kernel, x, tile_vars, trace, **kw)  # type: ignore[arg-type]
    return trace
