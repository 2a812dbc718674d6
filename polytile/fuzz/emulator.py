"""A lowered CUDA function run on the CPU, each thread block in lock step (tests and the CUDA fuzzer
without a GPU).

All threads of a block are numpy vectors under an active mask; loops whose trip counts differ between
threads run to the longest, each thread only while its own lasts. What CUDA requires of the threads
is checked as they run: a ``__syncthreads()`` and a block-wide reduction reached by every thread of
the block; a group reduction's or synchronization's lanes (``pt_group_allreduce_*``, an aligned
group of ``lanes`` lanes of a warp; ``pt_group_sync``) all active or all inactive; no two threads
writing different values to one element in one store; no load or store outside its buffer. A kernel
of clusters (``Kernel.cluster``) runs a cluster's blocks in lock step together, each block with its own
copy of the shared buffers (a block that read another's would read its own), its block-wide
reductions over its own threads and ``pt_cluster_allreduce_*`` over the cluster's. A shared buffer that
overlays another (``Buffer.overlays``) shares its elements from the first (a view). Values
are float64 (float types) or int64: the emulated kernel computes more exactly than the GPU's float32,
which a comparison with a float64 reference tolerates (floats are rounded only when stored); a cast
to an integer type wraps to it. Integer ``//`` and ``%`` (floor semantics) by zero give 0, as ``ir.eval_int``.
Size parameters are bound by ``run``'s ``params``.

Covers the loop IR of the row operators and of small reductions (scalars, loads and stores of one
element, vector copies lane by lane, paired stores, the math the row operators call); anything else raises
``NotImplementedError``.
"""

from __future__ import annotations

import math

import numpy as np

from polytile.lowering import loopir as ir
from polytile.lowering.passes.gpu_vectorize import lane

_COMBINE = {"sum": np.add, "prod": np.multiply, "max": np.fmax, "min": np.fmin}
_BIN = {"+": np.add, "-": np.subtract, "*": np.multiply, "min": np.minimum, "max": np.maximum}
_CMP = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal,
        "!=": np.not_equal}
_MATH = {"exp": np.exp, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x), "log": np.log, "tanh": np.tanh,
         "abs": np.abs, "fabs": np.abs, "sin": np.sin, "cos": np.cos, "exp2": np.exp2, "log2": np.log2,
         "floor": np.floor, "ceil": np.ceil, "erf": np.vectorize(math.erf, otypes=[np.float64]),
         "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x))}


def run(func: ir.LoweredFunc, arrays: list[np.ndarray], params: dict[str, int] | None = None) -> list[np.ndarray]:
    """Run ``func`` (``pt.lower``'s, for a CUDA target) on ``arrays`` (its inputs, then its outputs,
    which it fills) with the size parameters ``params``; the outputs."""
    memory = {buf.name: np.ascontiguousarray(a).reshape(-1) for buf, a in zip(func.args, arrays, strict=True)}
    env = {p.name: int((params or {})[p.name]) for p in func.params}
    _host(func.body, memory, env)
    return [memory[buf.name].reshape(np.shape(a)) for buf, a in zip(func.args, arrays)
            if buf.name in func.outputs]


def _host(s: ir.Stmt, memory: dict[str, np.ndarray], env: dict[str, int]) -> None:
    if isinstance(s, ir.Block):
        for x in s.body:
            _host(x, memory, env)
    elif isinstance(s, ir.Allocate):
        memory[s.buffer.name] = np.zeros(_size(s.buffer, env), s.buffer.dtype.numpy)
        _host(s.body, memory, env)
    elif isinstance(s, ir.Kernel):
        grid = [int(ir.eval_int(g, env)) for g in s.grid]
        assert grid[0] % s.cluster == 0, f"a grid of {grid[0]} blocks along x in clusters of {s.cluster}"
        for bz in range(grid[2]):
            for by in range(grid[1]):
                for bx in range(0, grid[0], s.cluster):
                    _Block(s.block, (bx, by, bz), memory, s.cluster, env).stmt(s.body)
    else:
        raise NotImplementedError(f"host statement {type(s).__name__}")


def _size(buf: ir.Buffer, env: dict[str, int]) -> int:
    return max(0, int(np.prod([int(ir.eval_int(d, env)) for d in buf.shape])))


def _typed(a: np.ndarray, dtype) -> np.ndarray:  # noqa: ANN001 - a DType
    """``a`` cast to ``dtype``, held as float64 (not rounded: the emulator computes exactly) or int64
    (wrapped to ``dtype``)."""
    if dtype.is_float:
        return a.astype(np.float64)
    if dtype.is_bool:
        return (a != 0).astype(np.int64)
    return np.trunc(a).astype(np.int64).astype(dtype.numpy).astype(np.int64)


class _Block:
    def __init__(self, block: tuple[int, int, int], index: tuple[int, int, int], memory: dict[str, np.ndarray],
                 cluster: int = 1, params: dict[str, int] | None = None):
        """The threads of ``cluster`` blocks (a cluster: the first at ``index``) in lock step."""
        bx, by, _ = block
        self.threads = int(np.prod(block))  # of one block
        self.n = self.threads * cluster
        self.rank = np.arange(self.n)
        self.block_of = self.rank // self.threads
        t = self.rank % self.threads
        self.env: dict[str, np.ndarray] = {
            **{p: np.full(self.n, v) for p, v in (params or {}).items()},
            "threadIdx.x": t % bx, "threadIdx.y": t // bx % by, "threadIdx.z": t // (bx * by),
            **{f"blockIdx.{a}": np.full(self.n, i) for a, i in zip("xyz", index)}}
        self.env["blockIdx.x"] = self.env["blockIdx.x"] + self.block_of
        self.cluster = cluster
        self.params = params or {}
        self.active = np.ones(self.n, bool)
        self.memory = memory  # global: one copy; shared: a row per block; local: a row per thread
        self.copies: dict[str, np.ndarray] = {}  # a buffer of copies: each thread's row of it

    # --- expressions ---
    def expr(self, e: ir.Expr) -> np.ndarray:
        if isinstance(e, ir.Const):
            return np.full(self.n, e.value, np.float64 if e.dtype.is_float else np.int64)
        if isinstance(e, ir.Var):
            return np.broadcast_to(self.env[e.name], (self.n,))
        if isinstance(e, ir.Cast):
            return _typed(self.expr(e.a), e.dtype)
        if isinstance(e, ir.BinOp):
            a, b = self.expr(e.a), self.expr(e.b)
            if e.op in _BIN:
                return _BIN[e.op](a, b)
            if e.op == "/" and e.dtype.is_float:
                with np.errstate(all="ignore"):
                    return a / b
            safe = np.where(b == 0, 1, b)
            if e.op == "/":
                return np.where(b == 0, 0, np.trunc(a / safe)).astype(np.int64)
            if e.op in ("div", "//", "mod", "%"):
                return np.where(b == 0, 0, a // safe if e.op in ("div", "//") else a % safe)
        if isinstance(e, ir.Cmp):
            return _CMP[e.op](self.expr(e.a), self.expr(e.b)).astype(np.int64)
        if isinstance(e, ir.Logic):
            values = [self.expr(x) != 0 for x in e.args]
            if e.op == "!":
                return (~values[0]).astype(np.int64)
            return (np.logical_and.reduce(values) if e.op == "&&" else np.logical_or.reduce(values)).astype(np.int64)
        if isinstance(e, ir.Select):  # each side for the threads that take it (C's ?: evaluates one)
            cond, saved = self.expr(e.cond) != 0, self.active
            try:
                self.active = saved & cond
                a = self.expr(e.a)
                self.active = saved & ~cond
                b = self.expr(e.b)
            finally:
                self.active = saved
            return np.where(cond, a, b)
        if isinstance(e, ir.Load):
            buf, idx = self._element(e.buffer, e.index)
            if buf.shape[-1] == 0:  # no active thread reads it (``_element`` checks): any value
                return np.zeros(self.n, np.float64 if e.dtype.is_float else np.int64)
            if e.buffer.name in self.copies:
                return buf[self.copies[e.buffer.name], idx].astype(np.float64 if e.dtype.is_float else np.int64)
            return buf[idx].astype(np.float64 if e.dtype.is_float else np.int64)
        if isinstance(e, ir.Call):
            return self.call(e)
        raise NotImplementedError(f"expression {type(e).__name__}: {ir.expr_text(e)}")

    def _element(self, buffer: ir.Buffer, index: tuple[ir.Expr, ...]) -> tuple[np.ndarray, np.ndarray]:
        (i,) = index
        if isinstance(i, ir.Ramp):
            raise NotImplementedError("vector accesses")
        idx = self.expr(i)
        buf = self.memory[buffer.name]
        size = buf.shape[-1]
        outside = self.active & ((idx < 0) | (idx >= size))
        assert not outside.any(), f"{buffer.name}[{idx[outside][:4]}] outside its {size} elements"
        return buf, np.where(self.active, idx, 0)

    def call(self, e: ir.Call) -> np.ndarray:
        if e.name in _MATH:
            with np.errstate(all="ignore"):
                return _MATH[e.name](self.expr(e.args[0]))
        if e.name == "pow":
            with np.errstate(all="ignore"):
                return np.power(self.expr(e.args[0]).astype(np.float64), self.expr(e.args[1]))
        family, _, op = e.name.rpartition("_")
        if family in ("pt_block_allreduce", "pt_ragged_block_allreduce", "pt_cluster_allreduce"):
            assert self.active.all(), f"{e.name} reached by {self.active.sum()} of the block's {self.n} threads"
            v = self.expr(e.args[0])
            if family == "pt_cluster_allreduce":
                return np.full(self.n, _COMBINE[op].reduce(v))
            return np.repeat(_COMBINE[op].reduce(v.reshape(self.cluster, self.threads), axis=1), self.threads)
        if family == "pt_group_allreduce":
            v, lanes = self.expr(e.args[0]), int(e.args[1].value)  # type: ignore[attr-defined]
            self._converged(lanes, e.name)
            for o in (16, 8, 4, 2, 1):
                if o < lanes:  # the butterfly: lane ^ o stays in the aligned group of ``lanes``
                    v = _COMBINE[op](v, v[self.rank ^ o])
            return v
        raise NotImplementedError(f"call {e.name}")

    def _converged(self, lanes: int, what: str) -> None:
        assert lanes & (lanes - 1) == 0 and lanes <= 32 and self.n % lanes == 0, (what, lanes, self.n)
        groups = self.active.reshape(-1, lanes)
        mixed = groups.any(axis=1) & ~groups.all(axis=1)
        assert not mixed.any(), f"{what}: a group of {lanes} lanes with only some of them active"

    # --- statements ---
    def stmt(self, s: ir.Stmt) -> None:
        if not self.active.any() and not isinstance(s, ir.Evaluate):
            return
        if isinstance(s, ir.Block):
            for x in s.body:
                self.stmt(x)
        elif isinstance(s, (ir.LetStmt, ir.Declare)):
            value = s.value
            kind = np.float64 if s.var.dtype.is_float else np.int64
            self.env[s.var.name] = np.zeros(self.n, kind) if value is None else np.array(self.expr(value))
            self.stmt(s.body)
        elif isinstance(s, ir.Assign):
            self.env[s.var.name] = np.where(self.active, self.expr(s.value), self.env[s.var.name])
        elif isinstance(s, ir.Allocate):
            size = _size(s.buffer, self.params)
            if s.buffer.scope in ("local", "auto", "stack", "register"):  # a thread's array (as the CUDA printer)
                self.copies[s.buffer.name] = self.rank
                self.memory[s.buffer.name] = np.full((self.n, size), np.nan)
            elif s.buffer.scope == "shared" and self.cluster > 1:
                self.copies[s.buffer.name] = self.block_of
                self.memory[s.buffer.name] = np.full((self.cluster, size), np.nan)
            elif s.buffer.overlays:  # the storage of an enclosing buffer, element by element from its start
                under = self.memory[s.buffer.overlays]
                assert under.ndim == 1 and under.size >= size, f"{s.buffer.name} overlays a smaller buffer"
                self.memory[s.buffer.name] = under[:size]
            else:
                self.memory[s.buffer.name] = np.full(size, np.nan)
            self.stmt(s.body)
        elif isinstance(s, ir.If):
            cond, saved = self.expr(s.cond) != 0, self.active
            self.active = saved & cond
            self.stmt(s.then)
            if s.orelse is not None:
                self.active = saved & ~cond
                self.stmt(s.orelse)
            self.active = saved
        elif isinstance(s, ir.For):
            lo, extent, saved = self.expr(s.lo), self.expr(s.extent), self.active
            for k in range(int(extent[saved].max(initial=0))):
                self.active = saved & (k < extent)
                self.env[s.var.name] = lo + k
                self.stmt(s.body)
            self.active = saved
        elif isinstance(s, ir.Store) and max(s.value.lanes, *(i.lanes for i in s.index)) > 1:
            for k in range(max(s.value.lanes, *(i.lanes for i in s.index))):  # a vector: its lanes one by one
                self.stmt(ir.Store(s.buffer, tuple(lane(i, k) for i in s.index), lane(s.value, k)))
        elif isinstance(s, ir.Store):
            buf, idx = self._element(s.buffer, s.index)
            value = self.expr(s.value)
            copy = self.copies.get(s.buffer.name, np.zeros(self.n, np.int64))
            written: dict[tuple[int, int], float] = {}
            for c, i, v in zip(copy[self.active], idx[self.active], value[self.active]):
                first = written.setdefault((int(c), int(i)), v)
                assert first == v or first != first and v != v, \
                    f"threads write {s.buffer.name}[{i}] with different values"  # (NaN and NaN alike)
            if s.buffer.name in self.copies:
                buf[copy[self.active], idx[self.active]] = value[self.active]
            else:
                buf[idx[self.active]] = value[self.active]
        elif isinstance(s, ir.Evaluate):
            if s.call.name == "__syncthreads":
                assert self.active.all(), f"__syncthreads() reached by {self.active.sum()} of {self.n} threads"
            elif s.call.name == "pt_store_pair":  # two adjacent elements stored together
                dst, first, second = s.call.args
                assert isinstance(dst, ir.Load)
                (i,) = dst.index
                self.stmt(ir.Store(dst.buffer, (i,), first))
                self.stmt(ir.Store(dst.buffer, (ir.BinOp("+", i, ir.const(1)),), second))
            elif s.call.name == "pt_group_sync":
                self._converged(int(s.call.args[0].value), "pt_group_sync")  # type: ignore[attr-defined]
            else:
                raise NotImplementedError(f"call {s.call.name}")
        else:
            raise NotImplementedError(f"statement {type(s).__name__}")
