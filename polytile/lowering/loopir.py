"""The loop IR: small immutable dataclasses for expressions and statements, a printer and a mutator.

Expressions may be vectors (``lanes`` > 1): ``Ramp`` (base, base+stride, …) and ``Broadcast`` come
from the vectorizer; loads and stores with a vector index move ``lanes`` elements.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..dtypes import INDEX, DType, bool_, int32

# --- buffers ----------------------------------------------------------------------------------------


@dataclass(eq=False)
class Buffer:
    """A named array. ``scope``: "arg" (a kernel argument), "heap", "stack", "register",
    "shared", "local" (GPU registers/local memory), "fragment" (a warp's tensor-core tile), "global" (GPU
    global temporary)."""

    name: str
    dtype: DType
    shape: tuple[Expr, ...]
    scope: str = "heap"
    swizzle: int = 0  # shared memory: 16-byte chunks XOR-permuted within rows of this many bytes (128)
    disjoint_writes: bool = False  # shared memory: no two threads write one element between barriers (proven)
    overlays: str = ""  # shared memory: stored in this enclosing shared buffer's storage, unused by then (proven)

    def __repr__(self) -> str:
        return f"Buffer({self.name})"


# --- expressions ------------------------------------------------------------------------------------


class Expr:
    __slots__ = ()
    dtype: DType
    lanes: int

    def __repr__(self) -> str:
        return expr_text(self)


@dataclass(frozen=True, eq=False, repr=False)
class Const(Expr):
    value: int | float | bool
    dtype: DType
    lanes: int = 1


@dataclass(frozen=True, eq=False, repr=False)
class Var(Expr):
    name: str
    dtype: DType = INDEX
    lanes: int = 1


@dataclass(frozen=True, eq=False, repr=False)
class BinOp(Expr):
    """op: + - * / (true division for floats), // and % (floor semantics), div and mod (the same on
    operands proven non-negative: printed as C's / and %), min, max."""

    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.a.dtype

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return max(self.a.lanes, self.b.lanes)


@dataclass(frozen=True, eq=False, repr=False)
class Cmp(Expr):
    op: str  # < <= > >= == !=
    a: Expr
    b: Expr

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return bool_

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return max(self.a.lanes, self.b.lanes)


@dataclass(frozen=True, eq=False, repr=False)
class Logic(Expr):
    op: str  # && || !
    args: tuple[Expr, ...]

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return bool_

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return max(a.lanes for a in self.args)


@dataclass(frozen=True, eq=False, repr=False)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.a.dtype

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return max(self.cond.lanes, self.a.lanes, self.b.lanes)


@dataclass(frozen=True, eq=False, repr=False)
class Cast(Expr):
    dtype: DType
    a: Expr

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return self.a.lanes


@dataclass(frozen=True, eq=False, repr=False)
class Call(Expr):
    name: str
    args: tuple[Expr, ...]
    dtype: DType

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return max((a.lanes for a in self.args), default=1)


@dataclass(frozen=True, eq=False, repr=False)
class Load(Expr):
    buffer: Buffer
    index: tuple[Expr, ...]  # one per dimension until storage flattening, then one

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.buffer.dtype

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return max((i.lanes for i in self.index), default=1)  # a scalar (0-d) buffer has no index


@dataclass(frozen=True, eq=False, repr=False)
class Ramp(Expr):
    base: Expr
    stride: Expr
    lanes: int

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.base.dtype


@dataclass(frozen=True, eq=False, repr=False)
class Broadcast(Expr):
    value: Expr
    lanes: int

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.value.dtype


# --- statements ---------------------------------------------------------------------------------------


class Stmt:
    __slots__ = ()

    def __repr__(self) -> str:
        return stmt_text(self)


@dataclass(frozen=True, eq=False, repr=False)
class For(Stmt):
    """``for var in [lo, lo + extent)``. kind: serial, parallel, vectorize, unroll, or a GPU binding."""

    var: Var
    lo: Expr
    extent: Expr
    body: Stmt
    kind: str = "serial"
    dim: int = -1  # the schedule dimension it scans (-1: made by a pass)
    bounds: tuple[Expr, Expr] | None = None  # GPU-bound loops: [lo, hi] of the dimension over the kernel


@dataclass(frozen=True, eq=False, repr=False)
class If(Stmt):
    cond: Expr
    then: Stmt
    orelse: Stmt | None = None


@dataclass(frozen=True, eq=False, repr=False)
class Block(Stmt):
    body: tuple[Stmt, ...]


@dataclass(frozen=True, eq=False, repr=False)
class Store(Stmt):
    buffer: Buffer
    index: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True, eq=False, repr=False)
class LetStmt(Stmt):
    """Bind ``var`` to ``value`` for ``body`` (the loads of data-dependent bounds)."""

    var: Var
    value: Expr
    body: Stmt


@dataclass(frozen=True, eq=False, repr=False)
class Allocate(Stmt):
    """``buffer`` exists (uninitialized) during ``body``."""

    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, eq=False, repr=False)
class Evaluate(Stmt):
    """A call for its effect: barriers, asynchronous copies, intrinsics."""

    call: Call


@dataclass(frozen=True, eq=False, repr=False)
class Kernel(Stmt):
    """A GPU kernel launched by the host: ``grid`` (host expressions over parameters) by ``block``
    threads, in clusters of ``cluster`` blocks along x (the grid's x a multiple of it; 1: no
    clusters); inside ``body``, ``blockIdx``/``threadIdx`` variables are in scope."""

    name: str
    grid: tuple[Expr, Expr, Expr]
    block: tuple[int, int, int]
    body: Stmt
    args: tuple[Buffer, ...] = ()
    params: tuple[Var, ...] = ()
    cluster: int = 1


@dataclass(frozen=True, eq=False, repr=False)
class Declare(Stmt):
    """A scalar or vector variable (a promoted register) initialized to ``value``, live in ``body``."""

    var: Var
    value: Expr | None
    body: Stmt


@dataclass(frozen=True, eq=False, repr=False)
class Assign(Stmt):
    """Assign to a declared variable."""

    var: Var
    value: Expr


# --- construction helpers ---------------------------------------------------------------------------

def const(v: int | float | bool, dtype: DType = INDEX) -> Const:
    return Const(v, dtype)


def block(stmts: Sequence[Stmt]) -> Stmt:
    flat: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Block):
            flat.extend(s.body)
        elif s is not None:
            flat.append(s)
    if len(flat) == 1:
        return flat[0]
    return Block(tuple(flat))


def is_const(e: Expr, value: int | float | None = None) -> bool:
    return isinstance(e, Const) and e.lanes == 1 and (value is None or e.value == value)


def eval_int(e: Expr, env: Mapping[str, int]) -> int:
    """The value of integer expression ``e`` with the variables of ``env`` (KeyError for another
    variable, ValueError for what is not integer arithmetic; a division by zero gives 0)."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var):
        return int(env[e.name])
    if isinstance(e, Cast):
        return eval_int(e.a, env)
    if isinstance(e, BinOp) and e.op in _INT_OPS:
        return _INT_OPS[e.op](eval_int(e.a, env), eval_int(e.b, env))
    if isinstance(e, Select):
        return eval_int(e.a, env) if eval_int(e.cond, env) else eval_int(e.b, env)
    if isinstance(e, Cmp):
        a, b = eval_int(e.a, env), eval_int(e.b, env)
        return int({"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[e.op])
    if isinstance(e, Logic):
        vals = [eval_int(x, env) for x in e.args]
        return int(all(vals) if e.op == "&&" else any(vals) if e.op == "||" else not vals[0])
    raise ValueError(f"cannot evaluate {expr_text(e)} as an integer")


def eval_int_array(e: Expr, env: Mapping[str, object]) -> np.ndarray:
    """``eval_int`` over NumPy arrays: the values of ``e`` at every point of ``env``'s (broadcast)
    arrays at once, with eval_int's semantics (floor division and modulo; a division by zero gives 0)."""
    if isinstance(e, Const):
        return np.asarray(int(e.value), dtype=np.int64)
    if isinstance(e, Var):
        return np.asarray(env[e.name], dtype=np.int64)
    if isinstance(e, Cast):
        return eval_int_array(e.a, env)
    if isinstance(e, BinOp) and e.op in _INT_OPS:
        a, b = eval_int_array(e.a, env), eval_int_array(e.b, env)
        if e.op in ("//", "div", "%", "mod"):
            safe = np.where(b != 0, b, 1)
            q = a // safe if e.op in ("//", "div") else a % safe
            return np.where(b != 0, q, 0)
        return {"+": np.add, "-": np.subtract, "*": np.multiply, "min": np.minimum, "max": np.maximum}[e.op](a, b)
    if isinstance(e, Select):
        return np.where(eval_int_array(e.cond, env) != 0, eval_int_array(e.a, env), eval_int_array(e.b, env))
    if isinstance(e, Cmp):
        a, b = eval_int_array(e.a, env), eval_int_array(e.b, env)
        op = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal,
              "!=": np.not_equal}[e.op]
        return op(a, b).astype(np.int64)
    if isinstance(e, Logic):
        vals = [eval_int_array(x, env) != 0 for x in e.args]
        if e.op == "&&":
            return np.logical_and.reduce(np.broadcast_arrays(*vals)).astype(np.int64)
        if e.op == "||":
            return np.logical_or.reduce(np.broadcast_arrays(*vals)).astype(np.int64)
        return np.logical_not(vals[0]).astype(np.int64)
    raise ValueError(f"cannot evaluate {expr_text(e)} as an integer")


_INT_OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "min": min, "max": max,
    "//": lambda a, b: a // b if b else 0, "div": lambda a, b: a // b if b else 0,
    "%": lambda a, b: a % b if b else 0, "mod": lambda a, b: a % b if b else 0, "^": lambda a, b: a ^ b,
}


def call_stmt(name: str, *args: Expr) -> Stmt:
    """An intrinsic called for its effect (``pt_cp_async_commit()``, an mma, a barrier)."""
    return Evaluate(Call(name, tuple(args), int32))


def strip_casts(e: Expr) -> Expr:
    while isinstance(e, Cast):
        e = e.a
    return e


def unguard(s: Stmt) -> Stmt:
    """``s`` without the tests (with no else branch) around it."""
    while isinstance(s, If) and s.orelse is None:
        s = s.then
    return s


def uses_var(e: Expr, name: str) -> bool:
    return any(isinstance(n, Var) and n.name == name for n in walk_expr(e))


# --- traversal ---------------------------------------------------------------------------------------

def expr_children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, (BinOp, Cmp)):
        return (e.a, e.b)
    if isinstance(e, Logic):
        return e.args
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    if isinstance(e, Cast):
        return (e.a,)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Load):
        return e.index
    if isinstance(e, Ramp):
        return (e.base, e.stride)
    if isinstance(e, Broadcast):
        return (e.value,)
    return ()


def walk_expr(e: Expr) -> Iterator[Expr]:
    stack = [e]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(expr_children(n))


def stmt_exprs(s: Stmt) -> tuple[Expr, ...]:
    if isinstance(s, For):
        return (s.lo, s.extent)
    if isinstance(s, Kernel):
        return s.grid
    if isinstance(s, If):
        return (s.cond,)
    if isinstance(s, Store):
        return (*s.index, s.value)
    if isinstance(s, (LetStmt, Assign)):
        return (s.value,)
    if isinstance(s, Declare):
        return (s.value,) if s.value is not None else ()
    if isinstance(s, Evaluate):
        return (s.call,)
    return ()


def stmt_children(s: Stmt) -> tuple[Stmt, ...]:
    if isinstance(s, (For, LetStmt, Allocate, Declare, Kernel)):
        return (s.body,)
    if isinstance(s, If):
        return (s.then,) + ((s.orelse,) if s.orelse is not None else ())
    if isinstance(s, Block):
        return s.body
    return ()


def walk_stmt(s: Stmt) -> Iterator[Stmt]:
    stack = [s]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(stmt_children(n)))


def all_exprs(s: Stmt) -> Iterator[Expr]:
    for st in walk_stmt(s):
        for e in stmt_exprs(st):
            yield from walk_expr(e)


class Mutator:
    """Rebuilds the IR bottom-up; override ``visit_<Node>`` for the nodes a pass cares about."""

    def expr(self, e: Expr) -> Expr:
        fn = getattr(self, f"visit_{type(e).__name__}", None)
        if fn is not None:
            return fn(e)
        return self.default_expr(e)

    def default_expr(self, e: Expr) -> Expr:
        if isinstance(e, BinOp):
            a, b = self.expr(e.a), self.expr(e.b)
            return e if (a is e.a and b is e.b) else BinOp(e.op, a, b)
        if isinstance(e, Cmp):
            a, b = self.expr(e.a), self.expr(e.b)
            return e if (a is e.a and b is e.b) else Cmp(e.op, a, b)
        if isinstance(e, Logic):
            args = tuple(self.expr(x) for x in e.args)
            return e if all(x is y for x, y in zip(args, e.args)) else Logic(e.op, args)
        if isinstance(e, Select):
            c, a, b = self.expr(e.cond), self.expr(e.a), self.expr(e.b)
            return e if (c is e.cond and a is e.a and b is e.b) else Select(c, a, b)
        if isinstance(e, Cast):
            a = self.expr(e.a)
            return e if a is e.a else Cast(e.dtype, a)
        if isinstance(e, Call):
            args = tuple(self.expr(x) for x in e.args)
            return e if all(x is y for x, y in zip(args, e.args)) else Call(e.name, args, e.dtype)
        if isinstance(e, Load):
            idx = tuple(self.expr(x) for x in e.index)
            return e if all(x is y for x, y in zip(idx, e.index)) else Load(e.buffer, idx)
        if isinstance(e, Ramp):
            b, s = self.expr(e.base), self.expr(e.stride)
            return e if (b is e.base and s is e.stride) else Ramp(b, s, e.lanes)
        if isinstance(e, Broadcast):
            v = self.expr(e.value)
            return e if v is e.value else Broadcast(v, e.lanes)
        return e

    def stmt(self, s: Stmt) -> Stmt:
        fn = getattr(self, f"visit_{type(s).__name__}", None)
        if fn is not None:
            return fn(s)
        return self.default_stmt(s)

    def default_stmt(self, s: Stmt) -> Stmt:
        if isinstance(s, For):
            lo, ext, body = self.expr(s.lo), self.expr(s.extent), self.stmt(s.body)
            return s if (lo is s.lo and ext is s.extent and body is s.body) else replace(s, lo=lo, extent=ext,
                                                                                        body=body)
        if isinstance(s, If):
            c, t = self.expr(s.cond), self.stmt(s.then)
            o = self.stmt(s.orelse) if s.orelse is not None else None
            return s if (c is s.cond and t is s.then and o is s.orelse) else If(c, t, o)
        if isinstance(s, Block):
            body = tuple(self.stmt(x) for x in s.body)
            return s if all(x is y for x, y in zip(body, s.body)) else block(body)
        if isinstance(s, Store):
            idx = tuple(self.expr(x) for x in s.index)
            v = self.expr(s.value)
            return s if (v is s.value and all(x is y for x, y in zip(idx, s.index))) else Store(s.buffer, idx, v)
        if isinstance(s, LetStmt):
            v, b = self.expr(s.value), self.stmt(s.body)
            return s if (v is s.value and b is s.body) else LetStmt(s.var, v, b)
        if isinstance(s, Allocate):
            b = self.stmt(s.body)
            return s if b is s.body else Allocate(s.buffer, b)
        if isinstance(s, Evaluate):
            c = self.expr(s.call)
            return s if c is s.call else Evaluate(c)  # type: ignore[arg-type]
        if isinstance(s, Declare):
            v = self.expr(s.value) if s.value is not None else None
            b = self.stmt(s.body)
            return s if (v is s.value and b is s.body) else Declare(s.var, v, b)
        if isinstance(s, Assign):
            v = self.expr(s.value)
            return s if v is s.value else Assign(s.var, v)
        if isinstance(s, Kernel):
            b = self.stmt(s.body)
            return s if b is s.body else replace(s, body=b)
        return s


def substitute(node: Stmt | Expr, mapping: dict[str, Expr]) -> Stmt | Expr:
    """Replace variables by name."""

    class _Sub(Mutator):
        def visit_Var(self, v: Var) -> Expr:
            return mapping.get(v.name, v)

    m = _Sub()
    return m.stmt(node) if isinstance(node, Stmt) else m.expr(node)


def map_stmts(s: Stmt, fn: Callable[[Stmt], Stmt | None]) -> Stmt:
    """Rebuild ``s``, letting ``fn`` replace statements top-down (None keeps and descends)."""

    class _Map(Mutator):
        def stmt(self, st: Stmt) -> Stmt:
            out = fn(st)
            return out if out is not None else self.default_stmt(st)

    return _Map().stmt(s)


# --- printer -----------------------------------------------------------------------------------------

_PREC = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, "<=": 4, ">": 4, ">=": 4, "+": 5, "-": 5,
         "*": 6, "/": 6, "//": 6, "%": 6}


def expr_text(e: Expr) -> str:
    if isinstance(e, Const):
        if e.dtype.is_float:
            return f"{e.value!r}" if e.dtype.bits >= 32 else f"{e.dtype.name}({e.value!r})"
        return str(e.value).lower() if e.dtype.is_bool else str(e.value)
    if isinstance(e, Var):
        return e.name
    if isinstance(e, BinOp):
        if e.op in ("min", "max"):
            return f"{e.op}({expr_text(e.a)}, {expr_text(e.b)})"
        return f"({expr_text(e.a)} {e.op} {expr_text(e.b)})"
    if isinstance(e, Cmp):
        return f"({expr_text(e.a)} {e.op} {expr_text(e.b)})"
    if isinstance(e, Logic):
        if e.op == "!":
            return f"!{expr_text(e.args[0])}"
        return "(" + f" {e.op} ".join(expr_text(a) for a in e.args) + ")"
    if isinstance(e, Select):
        return f"select({expr_text(e.cond)}, {expr_text(e.a)}, {expr_text(e.b)})"
    if isinstance(e, Cast):
        return f"{e.dtype.name}{'x' + str(e.lanes) if e.lanes > 1 else ''}({expr_text(e.a)})"
    if isinstance(e, Call):
        return f"{e.name}({', '.join(expr_text(a) for a in e.args)})"
    if isinstance(e, Load):
        return f"{e.buffer.name}[{', '.join(expr_text(i) for i in e.index)}]"
    if isinstance(e, Ramp):
        return f"ramp({expr_text(e.base)}, {expr_text(e.stride)}, {e.lanes})"
    if isinstance(e, Broadcast):
        return f"x{e.lanes}({expr_text(e.value)})"
    return f"<{type(e).__name__}>"


def stmt_text(s: Stmt, indent: int = 0) -> str:
    pad = "  " * indent
    if isinstance(s, For):
        kind = f" {s.kind}" if s.kind != "serial" else ""
        hi = expr_text(s.extent) if is_const(s.lo, 0) else f"{expr_text(s.lo)} + {expr_text(s.extent)}"
        lo = expr_text(s.lo)
        return f"{pad}for{kind} {s.var.name} in [{lo}, {hi}):\n{stmt_text(s.body, indent + 1)}"
    if isinstance(s, If):
        out = f"{pad}if {expr_text(s.cond)}:\n{stmt_text(s.then, indent + 1)}"
        if s.orelse is not None:
            out += f"\n{pad}else:\n{stmt_text(s.orelse, indent + 1)}"
        return out
    if isinstance(s, Block):
        return "\n".join(stmt_text(x, indent) for x in s.body) if s.body else f"{pad}pass"
    if isinstance(s, Store):
        return f"{pad}{s.buffer.name}[{', '.join(expr_text(i) for i in s.index)}] = {expr_text(s.value)}"
    if isinstance(s, LetStmt):
        return f"{pad}let {s.var.name} = {expr_text(s.value)}\n{stmt_text(s.body, indent)}"
    if isinstance(s, Allocate):
        shape = ", ".join(expr_text(d) for d in s.buffer.shape)
        return (f"{pad}allocate {s.buffer.name}[{shape}] {s.buffer.dtype.name} in {s.buffer.scope}\n"
                f"{stmt_text(s.body, indent)}")
    if isinstance(s, Evaluate):
        return f"{pad}{expr_text(s.call)}"
    if isinstance(s, Declare):
        init = f" = {expr_text(s.value)}" if s.value is not None else ""
        lanes = f"x{s.var.lanes}" if s.var.lanes > 1 else ""
        return f"{pad}var {s.var.name}: {s.var.dtype.name}{lanes}{init}\n{stmt_text(s.body, indent)}"
    if isinstance(s, Assign):
        return f"{pad}{s.var.name} = {expr_text(s.value)}"
    if isinstance(s, Kernel):
        grid = ", ".join(expr_text(g) for g in s.grid)
        cluster = f" cluster=({s.cluster}, 1, 1)" if s.cluster > 1 else ""
        return (f"{pad}kernel {s.name} grid=({grid}) block={s.block}{cluster}:\n{stmt_text(s.body, indent + 1)}")
    return f"{pad}<{type(s).__name__}>"


@dataclass
class LoweredFunc:
    """The result of lowering: a body over argument buffers and scalar parameters."""

    name: str
    args: list[Buffer]  # inputs then outputs, in the Func's order
    params: list[Var]  # size parameters, passed as int64 after the buffers
    body: Stmt
    outputs: list[str] = field(default_factory=list)
    meta: dict[str, object] = field(default_factory=dict)

    def __str__(self) -> str:
        sig = ", ".join([f"{b.name}: {b.dtype.name}[{', '.join(expr_text(d) for d in b.shape)}]" for b in self.args]
                        + [p.name for p in self.params])
        return f"func {self.name}({sig}):\n{stmt_text(self.body, 1)}"
