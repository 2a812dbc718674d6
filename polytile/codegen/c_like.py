"""The printer shared by the C++ (CPU) and CUDA backends: expressions, statements, types.

Subclasses override the few places where targets differ: scalar and vector type names, loop
headers (OpenMP, GPU bindings), allocations, half-precision conversions and the function frame.
"""

from __future__ import annotations

import math

from ..dtypes import DType
from ..errors import LoweringError
from ..lowering import loopir as ir
from .helpers import Helper

_C_INT = {"int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t", "uint8": "uint8_t",
          "bool": "bool"}

_MATH = {name: (c, c + "f") for name, c in {
    "exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "erf": "erf", "sin": "sin", "cos": "cos",
    "floor": "floor", "ceil": "ceil", "exp2": "exp2", "log2": "log2", "pow": "pow", "fma": "fma", "abs": "fabs",
}.items()}
_MATH.update({"sigmoid": ("pt_sigmoid", "pt_sigmoid"), "rsqrt": ("pt_rsqrt", "pt_rsqrt")})  # overloaded helpers
"""The C functions of a math call: (the double one, the float one)."""


_SHARED_HELPERS = {
    # NumPy's minimum and maximum: a NaN operand, in either place, gives NaN (``a < b ? a : b`` alone
    # drops a NaN ``a``, so a reduction's result would depend on its order). ``x != x`` folds away for
    # integers; on floats it costs a compare and a select (on vectors GCC blends instead of vmaxps)
    "pt_min": """template <typename A, typename B> INLINE auto pt_min(A a, B b) -> decltype(a + b) {
  typedef decltype(a + b) T; const T x = a, y = b;
  return x != x ? x : x < y ? x : y;
}
""",
    "pt_max": """template <typename A, typename B> INLINE auto pt_max(A a, B b) -> decltype(a + b) {
  typedef decltype(a + b) T; const T x = a, y = b;
  return x != x ? x : x > y ? x : y;
}
""",
    # integer floor division and modulo by a divisor known to be a constant other than 0 and -1
    "pt_floordiv_nz": """template <typename A, typename B> INLINE auto pt_floordiv_nz(A a, B b) -> decltype(a + b) {
  decltype(a + b) q = a / b; return ((a % b) != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
""",
    "pt_floormod_nz": """template <typename A, typename B> INLINE auto pt_floormod_nz(A a, B b) -> decltype(a + b) {
  decltype(a + b) r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
""",
    # any divisor, NumPy's rule: x // 0 == 0, x % 0 == 0, MIN // -1 == MIN (wraps), MIN % -1 == 0
    "pt_floordiv1": """template <typename T> INLINE T pt_floordiv1(T a, T b) {
  if (b == 0) return 0;
  if ((T)-1 < (T)0 && b == (T)-1) return (T)(0ULL - (unsigned long long)a);
  return pt_floordiv_nz(a, b);
}
""",
    "pt_floormod1": """template <typename T> INLINE T pt_floormod1(T a, T b) {
  if (b == 0 || ((T)-1 < (T)0 && b == (T)-1)) return 0;
  return pt_floormod_nz(a, b);
}
""",
    # NumPy's integer + - * of 32 and 64 bits: two's complement, wrapping (C leaves a signed overflow
    # undefined; the same instructions, computed on the unsigned type of the width, pt_unsigned_of)
    "pt_wadd": """template <typename A, typename B> INLINE auto pt_wadd(A a, B b) -> decltype(a + b) {
  typedef decltype(a + b) T; typedef typename pt_unsigned_of<T>::type U; return (T)((U)a + (U)b);
}
""",
    "pt_wsub": """template <typename A, typename B> INLINE auto pt_wsub(A a, B b) -> decltype(a + b) {
  typedef decltype(a + b) T; typedef typename pt_unsigned_of<T>::type U; return (T)((U)a - (U)b);
}
""",
    "pt_wmul": """template <typename A, typename B> INLINE auto pt_wmul(A a, B b) -> decltype(a + b) {
  typedef decltype(a + b) T; typedef typename pt_unsigned_of<T>::type U; return (T)((U)a * (U)b);
}
""",
    # NumPy's rule: abs(MIN) == MIN (it wraps; -MIN overflows, which C leaves undefined)
    "pt_iabs": """template <typename T> INLINE T pt_iabs(T a) { return a < 0 ? (T)(0ULL - (unsigned long long)a) : a; }
""",
}


def shared_helpers(inline: str, unsigned_of: str, overloads: dict[str, str] | None = None) -> list[Helper]:
    """The helpers both backends define alike (min/max, scalar floor division and modulo, integer
    abs, wrapping integer arithmetic); ``inline`` is how a backend declares an inline function,
    ``unsigned_of`` its definition of ``pt_unsigned_of<T>::type`` (the unsigned integer type, or
    vector type, of T's width), ``overloads`` what it adds to a helper's definition (faster forms for
    some types). Each backend defines ``pt_floordiv``/``pt_floormod`` for the operands it computes on
    over ``pt_floordiv1``/``pt_floormod1``."""
    extra = overloads or {}
    return [Helper("pt_unsigned_of", unsigned_of)] + [
        Helper(name, (text + extra.get(name, "")).replace("INLINE", inline)) for name, text in _SHARED_HELPERS.items()]


def _narrow_int(d: DType) -> bool:
    """An integer type that C promotes to int before computing on it."""
    return not d.is_float and not d.is_bool and d.itemsize < 4


class CLikePrinter:
    """Prints a ``LoweredFunc`` as C-family source."""

    indent_unit = "  "

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0
        self.vector_types: set[tuple[str, int]] = set()
        self.wrapping = False  # printing a statement's value or condition, not an index (value_expr)
        self.data_vars: set[str] = set()  # variables holding values computed from data (registers)

    # --- types ----------------------------------------------------------------------------------
    def scalar_type(self, d: DType) -> str:
        if d.name in _C_INT:
            return _C_INT[d.name]
        return {"float32": "float", "float64": "double", "float16": self.half_type(),
                "bfloat16": self.bf16_storage_type()}[d.name]

    def half_type(self) -> str:
        return "_Float16"

    def bf16_storage_type(self) -> str:
        return "uint16_t"

    def compute_type(self, d: DType) -> DType:
        """The type arithmetic happens in (bfloat16 values are computed in float32)."""
        from ..dtypes import float32
        return float32 if d.name == "bfloat16" else d

    def type_name(self, d: DType, lanes: int = 1) -> str:
        d = self.compute_type(d)
        if lanes == 1:
            return self.scalar_type(d)
        self.vector_types.add((d.name, lanes))
        return f"pt_{d.name}x{lanes}"

    # --- output helpers -------------------------------------------------------------------------
    def emit(self, line: str) -> None:
        self.lines.append(self.indent_unit * self.depth + line)

    # --- expressions ----------------------------------------------------------------------------
    def expr(self, e: ir.Expr) -> str:
        fn = getattr(self, f"e_{type(e).__name__}")
        return fn(e)

    def e_Const(self, e: ir.Const) -> str:
        d = self.compute_type(e.dtype)
        if d.is_bool:
            text = "true" if e.value else "false"
        elif d.is_float:
            text = self.float_literal(float(e.value), d)
        else:
            v = int(e.value)
            text = f"{v}LL" if d.bits == 64 and not -(1 << 31) <= v < (1 << 31) else str(v)
            if d.bits == 64 and v == -(1 << 63):
                text = "INT64_MIN"
        if e.lanes > 1:
            return self.broadcast(text, d, e.lanes)
        return text

    def float_literal(self, v: float, d: DType) -> str:
        if math.isinf(v) or math.isnan(v):  # INFINITY and NAN are float constants: cast to the others
            text = "NAN" if math.isnan(v) else "INFINITY" if v > 0 else "-INFINITY"
            return text if d.name == "float32" else f"(({self.type_name(d)}){text})"
        text = repr(v)
        if "e" not in text and "." not in text:
            text += ".0"
        if d.name == "float32":
            return text + "f"
        if d.name == "float16":
            return f"(({self.half_type()}){text}f)"
        return text

    def e_Var(self, e: ir.Var) -> str:
        return e.name

    def e_BinOp(self, e: ir.BinOp) -> str:
        text = self._binop(e)
        if e.lanes == 1 and _narrow_int(e.dtype) and e.op not in ("min", "max"):
            # C computes on 8- and 16-bit integers as int: the result wraps to its own type, as
            # NumPy's does (int8 MIN // -1 == MIN even where it is then cast to a float)
            return f"(({self.type_name(e.dtype)}){text})"
        return text

    def _binop(self, e: ir.BinOp) -> str:
        a, b = self.expr(e.a), self.expr(e.b)
        if e.a.lanes != e.b.lanes:
            lanes = e.lanes
            if e.a.lanes == 1:
                a = self.broadcast(a, self.compute_type(e.a.dtype), lanes)
            if e.b.lanes == 1:
                b = self.broadcast(b, self.compute_type(e.b.dtype), lanes)
        if e.op in ("min", "max"):
            return self.minmax(e.op, a, b, e)
        if e.op in ("//", "%"):
            if e.dtype.is_float:
                raise LoweringError("floor division or modulo of floats")
            # a constant divisor other than 0 and -1 needs none of the checks of the total forms
            fast = "_nz" if _constant_value(e.b) not in (None, 0, -1) else ""
            return f"pt_{'floordiv' if e.op == '//' else 'floormod'}{fast}({a}, {b})"
        if e.op == "div":  # proven non-negative operands: C's division is floor division
            return f"({a} / {b})"
        if e.op == "mod":
            return f"({a} % {b})"
        if e.op == "/" and not e.dtype.is_float:
            raise LoweringError("true division of integers")
        if self.wrapping and e.op in _WRAPPING and e.dtype.name in ("int32", "int64") and self.on_data(e):
            return f"{_WRAPPING[e.op]}({a}, {b})"
        return f"({a} {e.op} {b})"

    def minmax(self, op: str, a: str, b: str, e: ir.BinOp) -> str:
        return f"pt_{op}({a}, {b})"

    def on_data(self, e: ir.Expr) -> bool:
        """Whether ``e`` computes on data: it reads a tensor or a variable holding data, or casts to
        a narrower integer type (the algorithm's ``int32(j) * c``: index arithmetic, on loop and
        thread indices, does none of these)."""
        return any(isinstance(x, ir.Load) or (isinstance(x, ir.Var) and x.name in self.data_vars)
                   or isinstance(x, ir.Cast) and x.dtype.is_int and x.a.dtype.is_int and x.dtype.bits < x.a.dtype.bits
                   for x in ir.walk_expr(e))

    def e_Cmp(self, e: ir.Cmp) -> str:
        return f"({self.expr(e.a)} {e.op} {self.expr(e.b)})"

    def e_Logic(self, e: ir.Logic) -> str:
        if e.op == "!":
            return f"(!{self.expr(e.args[0])})"
        return "(" + f" {e.op} ".join(self.expr(a) for a in e.args) + ")"

    def e_Select(self, e: ir.Select) -> str:
        return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"

    def e_Cast(self, e: ir.Cast) -> str:
        inner = self.expr(e.a)
        if e.lanes > 1:
            if e.a.dtype.is_bool:  # a vector comparison: 0 or -1 (all bits set) per lane
                inner = f"(-{inner})"
            # bfloat16 lanes are float32 ones rounded to bfloat16's precision lane by lane
            vector = f"__builtin_convertvector({inner}, {self.type_name(e.dtype, e.lanes)})"
            return f"pt_bf16_round_v({vector})" if e.dtype.name == "bfloat16" else vector
        if e.dtype.name == "bfloat16":
            return f"pt_bf16_round({inner})"
        return f"(({self.type_name(e.dtype)}){inner})"

    def e_Call(self, e: ir.Call) -> str:
        args = ", ".join(self.expr(a) for a in e.args)
        d = self.compute_type(e.dtype)
        if e.name == "abs" and not d.is_float:
            return f"pt_iabs({args})"
        if e.name in _MATH:
            return self.math_call(e.name, d, args, e)
        return f"{e.name}({args})"

    def math_call(self, name: str, d: DType, args: str, e: ir.Call) -> str:
        double, single = _MATH[name]
        if d.name == "float64":
            return f"{double}({args})"
        if d.name == "float32":
            return f"{single}({args})"
        # half precision: computed in float, rounded to the half type
        conv = ", ".join(f"(float)({self.expr(a)})" for a in e.args)
        return f"(({self.type_name(d)}){single}({conv}))"

    def e_Load(self, e: ir.Load) -> str:
        wrapping, self.wrapping = self.wrapping, False  # index arithmetic stays as isl made it
        try:
            (idx,) = e.index
            if idx.lanes > 1:
                return self.vector_load(e.buffer, idx)
            return self.scalar_load(e.buffer, self.expr(idx))
        finally:
            self.wrapping = wrapping

    def value_expr(self, e: ir.Expr) -> str:
        """What a statement stores, assigns or tests: its 32- and 64-bit integer ``+ - *`` on data
        (``on_data``) wrap as NumPy's do (``pt_wadd``...); index arithmetic (isl's, the indices of
        its loads, the guards of a tile's edges) does not overflow and stays plain for the
        compiler's analyses."""
        wrapping, self.wrapping = self.wrapping, True
        try:
            return self.expr(e)
        finally:
            self.wrapping = wrapping

    def scalar_load(self, buf: ir.Buffer, idx: str) -> str:
        if buf.dtype.name == "bfloat16":
            return f"pt_bf16_to_f32({buf.name}[{idx}])"
        return f"{buf.name}[{idx}]"

    def e_Ramp(self, e: ir.Ramp) -> str:
        base, stride = self.expr(e.base), self.expr(e.stride)
        lanes = ", ".join(f"{base} + {k} * {stride}" for k in range(e.lanes))
        return f"(({self.type_name(e.dtype, e.lanes)}){{{lanes}}})"

    def e_Broadcast(self, e: ir.Broadcast) -> str:
        return self.broadcast(self.expr(e.value), self.compute_type(e.dtype), e.lanes)

    def broadcast(self, text: str, d: DType, lanes: int) -> str:
        return f"pt_bcast<{self.type_name(d, lanes)}>(({self.type_name(d)})({text}))"

    def vector_load(self, buf: ir.Buffer, idx: ir.Expr) -> str:
        raise LoweringError(f"vector loads are not supported by {type(self).__name__}")

    # --- statements -----------------------------------------------------------------------------
    def stmt(self, s: ir.Stmt) -> None:
        getattr(self, f"s_{type(s).__name__}")(s)

    def s_Block(self, s: ir.Block) -> None:
        for x in s.body:
            self.stmt(x)

    def s_If(self, s: ir.If) -> None:
        self.emit(f"if ({self.value_expr(s.cond)}) {{")
        self.depth += 1
        self.stmt(s.then)
        self.depth -= 1
        if s.orelse is not None:
            self.emit("} else {")
            self.depth += 1
            self.stmt(s.orelse)
            self.depth -= 1
        self.emit("}")

    def s_For(self, s: ir.For) -> None:
        self.loop_header(s)
        lo, ext = self.expr(s.lo), self.expr(s.extent)
        end = ext if ir.is_const(s.lo, 0) else f"{lo} + {ext}"
        self.emit(f"for (int64_t {s.var.name} = {lo}; {s.var.name} < {end}; ++{s.var.name}) {{")
        self.depth += 1
        self.stmt(s.body)
        self.depth -= 1
        self.emit("}")

    def loop_header(self, s: ir.For) -> None:
        """Pragmas before a loop (OpenMP, unroll hints)."""

    def s_Store(self, s: ir.Store) -> None:
        (idx,) = s.index
        if idx.lanes > 1 or s.value.lanes > 1:
            self.vector_store(s.buffer, idx, s.value)
            return
        self.emit(f"{s.buffer.name}[{self.expr(idx)}] = {self.store_value(s.buffer, s.value)};")

    def store_value(self, buf: ir.Buffer, value: ir.Expr) -> str:
        text = self.value_expr(value)
        if buf.dtype.name == "bfloat16":
            return f"pt_f32_to_bf16({text})"
        return text

    def vector_store(self, buf: ir.Buffer, idx: ir.Expr, value: ir.Expr) -> None:
        raise LoweringError(f"vector stores are not supported by {type(self).__name__}")

    def s_LetStmt(self, s: ir.LetStmt) -> None:
        self.emit("{")
        self.depth += 1
        self.emit(f"const {self.type_name(s.var.dtype, s.var.lanes)} {s.var.name} = {self.let_value(s)};")
        self.stmt(s.body)
        self.depth -= 1
        self.emit("}")

    def let_value(self, s: ir.LetStmt) -> str:
        if self.on_data(s.value):
            self.data_vars.add(s.var.name)
        return self.value_expr(s.value)

    def s_Declare(self, s: ir.Declare) -> None:
        decls = []
        while isinstance(s, ir.Declare):  # one scope for a run of declarations
            self.data_vars.add(s.var.name)  # a register: an accumulator, a partial result
            init = f" = {self.value_expr(s.value)}" if s.value is not None else ""
            decls.append(f"{self.type_name(s.var.dtype, s.var.lanes)} {s.var.name}{init};")
            s = s.body  # type: ignore[assignment]
        self.emit("{")
        self.depth += 1
        for d in decls:
            self.emit(d)
        self.stmt(s)
        self.depth -= 1
        self.emit("}")

    def s_Assign(self, s: ir.Assign) -> None:
        self.emit(f"{s.var.name} = {self.value_expr(s.value)};")

    def s_Evaluate(self, s: ir.Evaluate) -> None:
        self.emit(f"{self.expr(s.call)};")

    def s_Allocate(self, s: ir.Allocate) -> None:
        raise LoweringError(f"allocation of {s.buffer.name} is not supported by {type(self).__name__}")

    # --- buffers --------------------------------------------------------------------------------
    def buffer_elems(self, buf: ir.Buffer) -> str:
        return " * ".join(f"({self.expr(d)})" for d in buf.shape) or "1"


_WRAPPING = {"+": "pt_wadd", "-": "pt_wsub", "*": "pt_wmul"}
"""The helpers of integer arithmetic that wraps (``CLikePrinter.value_expr``)."""


def _constant_value(e: ir.Expr) -> int | float | bool | None:
    """The value of a constant (or of a broadcast constant), else None."""
    if isinstance(e, ir.Broadcast):
        e = e.value
    return e.value if isinstance(e, ir.Const) else None
