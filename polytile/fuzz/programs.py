"""Random programs over the whole algorithm language, valid by construction.

A program is a chain of one to four computations over a few extents (odd and prime sizes, size 1
and now and then size 0, symbolic parameters with constraints), reading inputs of every dtype,
index arrays (CSR offsets, gathers) and the computations before them. Bodies mix arithmetic,
math calls, casts, ``pt.select``, integer ``//`` and ``%``, stencil reads with guarded borders,
and reductions (sum, max, min, prod) with constant, triangular (affine, min/max) and
data-dependent bounds and ``where=`` conditions; computations may have a ``where=`` domain.

Validity is kept by construction: every read is proven inside its tensor by the extents'
relations or guarded by a ``pt.select`` whose condition polytile can use, reads of a computation
with a ``where=`` domain are guarded by that condition, and an interval of values is tracked for
every expression so that no integer leaves its type, no float overflows, no divisor is zero
(except, rarely and on purpose, through ``MAY_DIVIDE_BY_ZERO``) and no math function leaves its
domain. The reference evaluator checks the same on the actual inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .spec import FLOAT_DTYPES, CompSpec, Dim, Extent, InputSpec, Node, Program, substitute

INDEX = "index"
"""The generator's type of index arithmetic (polytile's int64): the minimizer leaves it alone, since
simplifying an index may take a read out of its tensor."""

MALFORMED = 0.03
"""How often a program is made one that polytile must refuse (``Program.malformed``)."""

MAY_DIVIDE_BY_ZERO = 0.03
"""How often an integer ``//`` or ``%`` gets a divisor that may be zero (what polytile does then is
the rule ``reference.int_divide`` states)."""

SIZES = (1, 2, 3, 4, 5, 7, 8, 11, 13, 16, 17, 31, 33, 64)
SIZE_WEIGHTS = (6, 6, 10, 5, 10, 10, 4, 8, 6, 3, 5, 2, 2, 1)
MAX_ELEMENTS = 2048  # per computation's domain
MAX_REDUCTION = 64

DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "int16", "uint8")
DTYPE_WEIGHTS = (36, 10, 10, 8, 14, 6, 6, 4, 6)

_LIMIT = {"bool": 1, "float16": 2000.0, "bfloat16": 1e6, "float32": 1e9, "float64": 1e14, "int8": 127, "int16": 32767,
          "int32": 2 ** 31 - 1, "int64": 2 ** 40, "uint8": 255}
_LOW = {"uint8": 0, "bool": 0}
_BIG = {"int8": (17, 100, -90), "int16": (300, 1001, -257), "int32": (65537, 1 << 20, -100003, 46341),
        "uint8": (17, 100, 200)}
"""Integer constants of programs whose arithmetic may overflow (``ProgramGenerator.wraps``)."""


@dataclass(frozen=True)
class Ival:
    """Closed interval of an expression's values (±inf: an empty max/min reduction's identity)."""

    lo: float
    hi: float

    def __or__(self, other: Ival) -> Ival:
        return Ival(min(self.lo, other.lo), max(self.hi, other.hi))

    @property
    def mag(self) -> float:
        return max(abs(self.lo), abs(self.hi))

    def contains_zero(self) -> bool:
        return self.lo <= 0 <= self.hi


def fits(iv: Ival, dtype: str) -> bool:
    """The interval lies inside what ``dtype`` holds exactly enough (floats keep a margin)."""
    if dtype in FLOAT_DTYPES:
        return -_LIMIT[dtype] <= iv.lo and iv.hi <= _LIMIT[dtype]
    lo = _LOW.get(dtype, -_LIMIT[dtype] - (1 if dtype != "int64" else 0))
    return lo <= iv.lo and iv.hi <= _LIMIT[dtype]


@dataclass
class Source:
    """A tensor expressions may read: its dims, dtype, values, and its ``where=`` domain."""

    name: str
    dims: tuple[Dim, ...]
    dtype: str
    ival: Ival
    axes: tuple[str, ...] = ()
    where: Node | None = None


@dataclass
class Axis:
    """An iterator in scope: ``0 <= axis < bound`` for all parameter values; ``exact`` when it runs
    over exactly that range (a data axis)."""

    name: str
    bound: Dim
    exact: bool
    reduce: bool = False


@dataclass
class Scope:
    axes: list[Axis]
    sources: list[Source]
    depth: int
    reductions_left: int = 0
    csr: tuple[str, Dim, Dim] | None = None  # offsets tensor, rows extent, nnz extent


def node(op: str, *args: Node, attr: object = None, dtype: str = "") -> Node:
    return Node(op, tuple(args), attr, dtype)


def const(v: float | int, dtype: str) -> Node:
    return Node("const", (), v, dtype)


def axis_node(name: str) -> Node:
    return Node("axis", (), name, INDEX)


def dim_node(d: Dim) -> Node:
    return Node("dim", (), d, INDEX)


def idx_add(a: Node, c: int) -> Node:
    if c == 0:
        return a
    return node("bin", a, const(abs(c), INDEX), attr="+" if c > 0 else "-", dtype=INDEX)


class ProgramGenerator:
    """Draws one program from ``rng`` (a NumPy Generator); the same stream gives the same program."""

    def __init__(self, rng: np.random.Generator, modes: np.random.Generator | None = None):
        self.rng = rng
        # the draws of the modes, apart (a program without them is the one ``rng`` always gave):
        # integer arithmetic that overflows and wraps (NumPy's rule and polytile's)
        self.modes = modes
        self.wraps = modes is not None and bool(modes.random() < 0.3)
        self.extents: dict[str, Extent] = {}
        self.inputs: list[InputSpec] = []
        self.sources: list[Source] = []
        self.csr: tuple[str, Dim, Dim] | None = None
        self.theme = "float32"

    # --- random helpers ---------------------------------------------------------------------------
    def may_wrap(self, dtype: str, p: float = 0.8) -> bool:
        """Whether integers of ``dtype`` may overflow here (in a program that lets them; int64, whose
        intervals this generator bounds at 2^40, is left out)."""
        return (self.wraps and dtype not in FLOAT_DTYPES and dtype not in ("bool", "int64")
                and bool(self.modes.random() < p))  # type: ignore[union-attr]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, items, weights=None):  # noqa: ANN001, ANN201 - any sequence
        items = list(items)
        if weights is None:
            return items[int(self.rng.integers(len(items)))]
        w = np.asarray(weights, dtype=float)
        return items[int(self.rng.choice(len(items), p=w / w.sum()))]

    # --- extents ------------------------------------------------------------------------------------
    def value(self, d: Dim) -> int:
        return self.extents[d.extent].value + d.offset

    def least(self, d: Dim) -> int:
        e = self.extents[d.extent]
        return (e.minimum if e.param else e.value) + d.offset

    def le(self, a: Dim, b: Dim) -> bool:
        """``a <= b`` for every parameter value."""
        if a.extent == b.extent:
            return a.offset <= b.offset
        ea, eb = self.extents[a.extent], self.extents[b.extent]
        if ea.param is None:
            return self.value(a) <= (self.value(b) if eb.param is None else self.least(b))
        return False

    def new_extent(self, value: int | None = None, allow_param: bool = True) -> str:
        name = f"e{len(self.extents)}"
        v = value if value is not None else int(self.pick(SIZES, SIZE_WEIGHTS))
        if value is None and self.chance(0.015):
            v = 0
        param = None
        minimum = v
        if allow_param and self.chance(0.2) and not any(e.param for e in self.extents.values()):
            param = "N"
            minimum = min(v, self.pick([0, 1, 1, 2]))
        self.extents[name] = Extent(name, v, param, minimum)
        return name

    def dims(self, rank: int, pool: list[str]) -> tuple[Dim, ...]:
        for _ in range(20):
            out = tuple(Dim(self.pick(pool)) for _ in range(rank))
            if int(np.prod([self.value(d) for d in out])) <= MAX_ELEMENTS:
                return out
        return tuple(Dim(min(pool, key=lambda n: self.extents[n].value)) for _ in range(rank))

    # --- the program --------------------------------------------------------------------------------
    def generate(self) -> Program:
        self.theme = self.pick(DTYPES, DTYPE_WEIGHTS)
        if self.wraps and self.modes.random() < 0.6:  # type: ignore[union-attr]
            self.theme = str(self.modes.choice(list(_BIG)))  # type: ignore[union-attr]  # integers to overflow
        pool = [self.new_extent() for _ in range(int(self.pick([2, 3, 4], [4, 4, 2])))]
        for k in range(int(self.pick([1, 2, 3], [4, 4, 2]))):
            rank = int(self.pick([1, 2, 3], [4, 5, 2]))
            dims = tuple(replace(d, offset=int(self.pick([0, 1, 2], [8, 1, 1]))) for d in self.dims(rank, pool))
            self.add_input(f"{'ABC'[k]}", dims, self.dtype())
        if self.chance(0.18):
            self.add_csr(pool)
        comps: list[CompSpec] = []
        n = int(self.pick([1, 2, 3, 4], [3, 4, 2, 1.5]))
        for m in range(n):
            comps.append(self.computation("TUVW"[m], pool, comps))
        read = {r for c in comps for r in _reads(c)}
        outputs = [c.name for c in comps if c.name not in read or (c is not comps[-1] and self.chance(0.1))]
        if comps[-1].name not in outputs:
            outputs.append(comps[-1].name)
        malformed = ""
        if self.chance(MALFORMED):
            malformed = self.pick(["duplicate-input", "missing-input", "out-of-bounds"])
            if malformed == "out-of-bounds":
                comps[-1] = self.read_past_end(comps[-1])
        return Program(tuple(self.extents.values()), tuple(self.inputs), tuple(comps), tuple(outputs), malformed)

    def read_past_end(self, c: CompSpec) -> CompSpec:
        """``c`` also reading one element past the end of an input in every point of its domain."""
        src = next(s for s in self.sources if s.name == self.inputs[0].name)
        past = node("load", *[dim_node(d) if k == 0 else const(0, INDEX) for k, d in enumerate(src.dims)],
                    attr=src.name, dtype=src.dtype)
        dtype = c.dtype or c.body.dtype
        value, _ = self.convert(past, src.ival, src.dtype, dtype)
        return replace(c, body=node("bin", c.body, value, attr="max", dtype=dtype) if dtype != "bool" else
                       node("logic", c.body, node("cmp", value, value, attr="==", dtype="bool"), attr="&",
                            dtype="bool"), where=None)

    def dtype(self) -> str:
        return self.theme if self.chance(0.75) else self.pick(DTYPES, DTYPE_WEIGHTS)

    def add_input(self, name: str, dims: tuple[Dim, ...], dtype: str) -> Source:
        if dtype in FLOAT_DTYPES:
            lo, hi = self.pick([(-2.0, 2.0), (0.5, 2.0), (-1.0, 3.0)], [5, 3, 2])
            spec = InputSpec(name, dims, dtype, "uniform", lo, hi)
        else:
            lo, hi = self.pick([(-5, 5), (0, 9), (1, 4)], [5, 3, 2]) if dtype != "uint8" else self.pick(
                [(0, 9), (1, 20)])
            if self.may_wrap(dtype, 0.5):  # values whose sums and products overflow
                lo, hi = _LOW.get(dtype, -_LIMIT[dtype] - 1), _LIMIT[dtype]
            spec = InputSpec(name, dims, dtype, "integers", lo, hi)
        self.inputs.append(spec)
        src = Source(name, dims, dtype, Ival(spec.lo, spec.hi))
        self.sources.append(src)
        return src

    def add_csr(self, pool: list[str]) -> None:
        rows = self.pick(pool)
        nnz = self.new_extent(int(self.pick([0, 3, 7, 12, 20, 41], [1, 3, 4, 4, 3, 1])), allow_param=False)
        idx_t = self.pick(["int32", "int64"], [3, 1])
        offs = InputSpec("offs", (Dim(rows, 1),), idx_t, "offsets", 0, self.value(Dim(nnz)), Dim(nnz))
        self.inputs.append(offs)
        self.csr = ("offs", Dim(rows), Dim(nnz))
        other = self.pick(pool)
        dims = (Dim(nnz),) if self.chance(0.5) else (Dim(nnz), Dim(other))
        if int(np.prod([self.value(d) for d in dims])) <= MAX_ELEMENTS:
            self.add_input("vals", dims, self.dtype())

    def index_array(self, over: Dim, into: Dim) -> str:
        """A new index array ``idx[over] in [0, into)`` for gathers."""
        name = f"idx{sum(1 for t in self.inputs if t.dist == 'indices')}"
        dtype = self.pick(["int32", "int64"], [3, 1])
        hi = Dim(into.extent, into.offset - 1)
        self.inputs.append(InputSpec(name, (over,), dtype, "indices", 0, self.value(hi), hi))
        return name

    # --- computations -------------------------------------------------------------------------------
    def computation(self, name: str, pool: list[str], before: list[CompSpec]) -> CompSpec:
        dtype = self.dtype()
        rank = int(self.pick([0, 1, 2, 3], [0.06, 4, 5, 2]))
        dims = self.dims(rank, pool)
        if self.csr is not None and rank and self.chance(0.6):
            dims = (self.csr[1],) + dims[1:]
        axes = tuple("ijh"[:rank])
        scope = Scope([Axis(a, d, True) for a, d in zip(axes, dims)], list(self.sources), depth=3, csr=self.csr)
        prev = self.sources[-1] if before else None
        where = None
        if rank and self.chance(0.18):
            where = self.condition(scope, data_only=True)
        kind = self.pick(["elementwise", "reduction", "nested", "mask"], [5, 4, 1, 0.4])
        if kind == "mask":
            dtype = "bool"
            body, iv = self.condition(scope), Ival(0, 1)
        elif kind == "reduction":
            body, iv = self.reduction(dtype, scope)
        else:
            scope.reductions_left = 1 if kind == "nested" else 0
            body, iv = self.value_expr(dtype, scope, prefer=prev)
        if prev is not None and prev.name not in _node_reads(body) and dtype != "bool" and self.chance(0.85):
            extra, iv2 = self.load(prev, dtype, scope)
            op = self.pick(["+", "max"]) if dtype != "bool" else "+"
            body, iv = self.combine(op, body, iv, extra, iv2, dtype)
        out_dtype = None
        if self.chance(0.05):
            out_dtype = self.pick(["float32", "float64"]) if dtype in FLOAT_DTYPES else None
        spec = CompSpec(name, axes, dims, body, where, out_dtype)
        final_dtype = out_dtype or dtype
        self.sources.append(Source(name, dims, final_dtype, iv, axes, where))
        return spec

    def combine(self, op: str, a: Node, ia: Ival, b: Node, ib: Ival, dtype: str) -> tuple[Node, Ival]:
        if op == "max":
            return node("bin", a, b, attr="max", dtype=dtype), Ival(max(ia.lo, ib.lo), max(ia.hi, ib.hi))
        iv = Ival(ia.lo + ib.lo, ia.hi + ib.hi)
        if fits(iv, dtype):
            return node("bin", a, b, attr="+", dtype=dtype), iv
        return node("bin", a, b, attr="max", dtype=dtype), Ival(max(ia.lo, ib.lo), max(ia.hi, ib.hi))

    # --- reads --------------------------------------------------------------------------------------
    def index(self, d: Dim, scope: Scope, affine: bool = False) -> tuple[Node, list[Node]]:
        """An index into dimension ``d`` and the guards it needs to stay inside it (``affine``: no
        gathers, for indices that guards will test: polytile proves bounds from affine guards only)."""
        options: list[tuple[float, str, Axis | None]] = []
        for ax in scope.axes:
            same = ax.bound == d
            base = 6.0 if same else (2.0 if self.le(ax.bound, d) else 0.8)
            if ax.reduce:
                base *= 2
            options += [(base, "plain", ax), (0.25 * base + 0.4, "plus", ax), (0.25 * base + 0.4, "minus", ax),
                        (0.3, "half", ax), (0.2, "double", ax), (0.2, "mod", ax)]
            if same and ax.exact:
                options.append((0.6, "reverse", ax))
            if self.least(d) >= 1 and not affine:
                options.append((0.25, "gather", ax))
        if self.least(d) >= 1:
            options.append((0.3, "zero", None))
        if not options:
            return const(0, INDEX), [node("cmp", const(0, INDEX), dim_node(d), attr="<", dtype="bool")]
        _, form, ax = self.pick(options, [w for w, _, _ in options])
        return self.index_form(form, ax, d)

    def index_form(self, form: str, ax: Axis | None, d: Dim) -> tuple[Node, list[Node]]:
        if ax is None:
            return const(0, INDEX), []
        a = axis_node(ax.name)
        below = node("cmp", a, dim_node(d), attr="<", dtype="bool")
        if form == "plain":
            return a, [] if self.le(ax.bound, d) else [below]
        if form == "plus":
            c = int(self.pick([1, 2], [3, 1]))
            i = idx_add(a, c)
            ok = self.le(Dim(ax.bound.extent, ax.bound.offset + c), d)
            return i, [] if ok else [node("cmp", i, dim_node(d), attr="<", dtype="bool")]
        if form == "minus":
            c = int(self.pick([1, 2], [3, 1]))
            i = idx_add(a, -c)
            guards = [node("cmp", a, const(c, INDEX), attr=">=", dtype="bool")]
            if not self.le(ax.bound, Dim(d.extent, d.offset + c)):
                guards.append(node("cmp", i, dim_node(d), attr="<", dtype="bool"))
            return i, guards
        if form == "reverse":
            last = node("bin", dim_node(d), const(1, INDEX), attr="-", dtype=INDEX)
            return node("bin", last, a, attr="-", dtype=INDEX), []
        if form == "half":
            i = node("bin", a, const(2, INDEX), attr="//", dtype=INDEX)
            return i, [] if self.le(ax.bound, d) else [node("cmp", i, dim_node(d), attr="<", dtype="bool")]
        if form == "double":
            i = node("bin", const(2, INDEX), a, attr="*", dtype=INDEX)
            return i, [node("cmp", i, dim_node(d), attr="<", dtype="bool")]
        if form == "mod":
            c = max(1, min(self.least(d), int(self.pick([2, 3]))))
            if self.least(d) < 1:
                return a, [below]
            return node("bin", a, const(c, INDEX), attr="%", dtype=INDEX), []
        # gather through a fresh index array over the axis' range
        name = self.index_array(ax.bound, d)
        load = node("load", a, attr=name, dtype=INDEX)
        if not ax.exact:  # idx[k] for an axis that may not cover the array: guard the array read
            return load, [node("cmp", a, dim_node(ax.bound), attr="<", dtype="bool")]
        return load, []

    def load(self, src: Source, dtype: str, scope: Scope) -> tuple[Node, Ival]:
        """A read of ``src`` as ``dtype``: guarded where it may leave the tensor or its domain."""
        idx, guards = [], []
        for d in src.dims:
            i, g = self.index(d, scope, affine=src.where is not None)
            idx.append(i)
            guards += g
        value = node("load", *idx, attr=src.name, dtype=src.dtype)
        iv = src.ival
        if src.where is not None:
            cond = substitute(src.where, dict(zip(src.axes, idx)))
            fallback = self.fallback(src.dtype)
            value = node("select", cond, value, fallback, dtype=src.dtype)
            iv = iv | Ival(fallback.attr, fallback.attr)
        if guards:
            cond = guards[0]
            for g in guards[1:]:
                cond = node("logic", cond, g, attr="&", dtype="bool")
            fallback = self.fallback(src.dtype)
            value = node("select", cond, value, fallback, dtype=src.dtype)
            iv = iv | Ival(fallback.attr, fallback.attr)
        if iv.lo == -np.inf or iv.hi == np.inf or not fits(iv, src.dtype):
            value, iv = self.clamp(value, iv, src.dtype)
        return self.convert(value, iv, src.dtype, dtype)

    def fallback(self, dtype: str) -> Node:
        if dtype == "bool":
            return const(False, "bool")
        return const(self.pick([0, 1]) if dtype not in FLOAT_DTYPES else self.pick([0.0, 1.0, -0.5]), dtype)

    def clamp(self, value: Node, iv: Ival, dtype: str) -> tuple[Node, Ival]:
        """Bound a value that may be an empty max/min reduction's identity."""
        if iv.lo < -_LIMIT.get(dtype, 1e9) / 4 or iv.lo == -np.inf:
            c = -4.0 if dtype in FLOAT_DTYPES else _LOW.get(dtype, -4)
            value = node("bin", value, const(c, dtype), attr="max", dtype=dtype)
            iv = Ival(max(iv.lo, c), max(iv.hi, c))
        if iv.hi > _LIMIT.get(dtype, 1e9) / 4 or iv.hi == np.inf:
            c = 4.0 if dtype in FLOAT_DTYPES else 4
            value = node("bin", value, const(c, dtype), attr="min", dtype=dtype)
            iv = Ival(min(iv.lo, c), min(iv.hi, c))
        return value, iv

    def convert(self, value: Node, iv: Ival, src: str, dtype: str) -> tuple[Node, Ival]:
        """``value`` of type ``src`` as ``dtype`` (a cast where they differ)."""
        if src == dtype:
            return value, iv
        if src == "bool":
            return node("cast", value, attr=dtype, dtype=dtype), Ival(0, 1)
        if dtype not in FLOAT_DTYPES and src in FLOAT_DTYPES:
            iv = Ival(float(np.trunc(iv.lo)), float(np.trunc(iv.hi)))
            if not fits(iv, dtype) or (dtype == "uint8" and iv.lo < 0):
                value = node("call", value, attr="abs", dtype=src)
                iv = Ival(0, float(np.trunc(max(abs(iv.lo), abs(iv.hi)))))
                if not fits(iv, dtype):
                    return const(1, dtype), Ival(1, 1)
        elif not fits(iv, dtype):
            return const(1, dtype), Ival(1, 1)
        return node("cast", value, attr=dtype, dtype=dtype), iv

    # --- values -------------------------------------------------------------------------------------
    def value_expr(self, dtype: str, scope: Scope, prefer: Source | None = None, depth: int | None = None
                   ) -> tuple[Node, Ival]:
        depth = scope.depth if depth is None else depth
        for _ in range(4):
            try:
                got = self.try_value(dtype, scope, prefer, depth)
            except OverflowError:  # an interval too wide to compute is too wide to use
                continue
            if got is not None and fits(got[1], dtype):
                return got
        return self.leaf(dtype, scope, prefer)

    def leaf(self, dtype: str, scope: Scope, prefer: Source | None = None) -> tuple[Node, Ival]:
        readable = list(scope.sources)
        choice = self.pick(["load", "const", "axis"], [8, 1, 1.2 if scope.axes else 0])
        if choice == "load" and readable:
            src = prefer if prefer is not None and self.chance(0.6) else self.pick(readable)
            return self.load(src, dtype, scope)
        if choice == "axis" and scope.axes:
            ax = self.pick(scope.axes)
            iv = Ival(0, max(0, self.value(ax.bound) - 1))
            return self.convert(replace(axis_node(ax.name), dtype="int64"), iv, "int64", dtype)
        if dtype in FLOAT_DTYPES:
            v = float(self.pick([0.5, 1.5, 2.0, -1.0, 3.0, 0.25, -2.5]))
        else:
            v = int(self.pick([1, 2, 3, -1, 7])) if dtype != "uint8" else int(self.pick([1, 2, 3, 7]))
            if self.may_wrap(dtype, 0.5):  # a factor that makes products overflow
                v = int(self.modes.choice(_BIG[dtype]))  # type: ignore[union-attr]
        return const(v, dtype), Ival(v, v)

    def try_value(self, dtype: str, scope: Scope, prefer: Source | None, depth: int) -> tuple[Node, Ival] | None:
        if depth <= 0:
            return self.leaf(dtype, scope, prefer)
        is_float = dtype in FLOAT_DTYPES
        kinds = {"leaf": 3, "arith": 5, "unary": 2, "select": 1.2, "minmax": 0.8, "cast": 1,
                 "stencil": 1.0 if scope.axes else 0, "divide": 1.2, "reduce": 4 * scope.reductions_left}
        kind = self.pick(list(kinds), list(kinds.values()))
        sub = depth - 1
        if kind == "leaf":
            return self.leaf(dtype, scope, prefer)
        if kind == "reduce":
            scope.reductions_left -= 1
            r, iv = self.reduction(dtype, scope)
            return r, iv
        if kind == "arith":
            a, ia = self.value_expr(dtype, scope, prefer, sub)
            b, ib = self.value_expr(dtype, scope, None, sub)
            op = self.pick(["+", "-", "*"], [4, 3, 3])
            if op == "+":
                iv = Ival(ia.lo + ib.lo, ia.hi + ib.hi)
            elif op == "-":
                iv = Ival(ia.lo - ib.hi, ia.hi - ib.lo)
            else:
                ps = [ia.lo * ib.lo, ia.lo * ib.hi, ia.hi * ib.lo, ia.hi * ib.hi]
                iv = Ival(min(ps), max(ps))
            if not fits(iv, dtype) and any(n.op == "load" for x in (a, b) for n in _walk(x)) and self.may_wrap(dtype):
                iv = _type_ival(dtype)  # it overflows and wraps (values read from tensors: polytile's rule)
            return node("bin", a, b, attr=op, dtype=dtype), iv
        if kind == "divide":
            return self.divide(dtype, scope, prefer, sub)
        if kind == "minmax":
            a, ia = self.value_expr(dtype, scope, prefer, sub)
            b, ib = self.value_expr(dtype, scope, None, sub)
            if self.chance(0.5):
                return node("bin", a, b, attr="max", dtype=dtype), Ival(max(ia.lo, ib.lo), max(ia.hi, ib.hi))
            return node("bin", a, b, attr="min", dtype=dtype), Ival(min(ia.lo, ib.lo), min(ia.hi, ib.hi))
        if kind == "select":
            c = self.condition(scope, depth=sub)
            a, ia = self.value_expr(dtype, scope, prefer, sub)
            b, ib = self.value_expr(dtype, scope, None, sub)
            return node("select", c, a, b, dtype=dtype), ia | ib
        if kind == "cast":
            src_t = self.pick(DTYPES, DTYPE_WEIGHTS)
            if src_t == dtype:
                return None
            a, ia = self.value_expr(src_t, scope, prefer, sub)
            return self.convert(a, ia, src_t, dtype)
        if kind == "stencil":
            return self.stencil(dtype, scope, prefer)
        return self.unary(dtype, scope, prefer, sub, is_float)

    def unary(self, dtype: str, scope: Scope, prefer: Source | None, sub: int, is_float: bool
              ) -> tuple[Node, Ival] | None:
        a, ia = self.value_expr(dtype, scope, prefer, sub)
        signed = dtype != "uint8"
        if not is_float:
            if signed and self.chance(0.5):
                return node("neg", a, dtype=dtype), Ival(-ia.hi, -ia.lo)
            return node("call", a, attr="abs", dtype=dtype), Ival(0 if ia.contains_zero() else min(
                abs(ia.lo), abs(ia.hi)), ia.mag)
        fns = ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "sin", "cos", "floor",
               "ceil", "exp2", "pow"]
        fn = self.pick(fns)
        if fn == "neg":
            return node("neg", a, dtype=dtype), Ival(-ia.hi, -ia.lo)
        if fn == "abs":
            return node("call", a, attr="abs", dtype=dtype), Ival(0, ia.mag)
        if fn in ("exp", "exp2"):
            if ia.hi > 4:
                return None
            base = np.e if fn == "exp" else 2.0
            return node("call", a, attr=fn, dtype=dtype), Ival(0, float(base ** ia.hi))
        if fn in ("log", "sqrt", "rsqrt", "pow"):
            if ia.lo < 0.25:  # keep away from the domain's edge, where the result is ill-conditioned
                a = node("bin", node("call", a, attr="abs", dtype=dtype), const(0.5, dtype), attr="+", dtype=dtype)
                ia = Ival(0.5, ia.mag + 0.5)
            if fn == "log":
                return node("call", a, attr="log", dtype=dtype), Ival(float(np.log(ia.lo)), float(np.log(ia.hi)))
            if fn == "sqrt":
                return node("call", a, attr="sqrt", dtype=dtype), Ival(float(np.sqrt(ia.lo)), float(np.sqrt(ia.hi)))
            if fn == "rsqrt":
                return node("call", a, attr="rsqrt", dtype=dtype), Ival(float(ia.hi ** -0.5), float(ia.lo ** -0.5))
            e = float(self.pick([2.0, 0.5, 3.0, -1.0]))
            ends = [ia.lo ** e, ia.hi ** e]
            return node("call", a, const(e, dtype), attr="pow", dtype=dtype), Ival(min(ends), max(ends))
        if fn == "tanh":
            return node("call", a, attr=fn, dtype=dtype), Ival(-1, 1)
        if fn in ("sigmoid",):
            return node("call", a, attr=fn, dtype=dtype), Ival(0, 1)
        if fn in ("erf", "sin", "cos"):
            return node("call", a, attr=fn, dtype=dtype), Ival(-1, 1)
        return node("call", a, attr=fn, dtype=dtype), Ival(float(np.floor(ia.lo)), float(np.ceil(ia.hi)))

    def divide(self, dtype: str, scope: Scope, prefer: Source | None, sub: int) -> tuple[Node, Ival] | None:
        a, ia = self.value_expr(dtype, scope, prefer, sub)
        if dtype in FLOAT_DTYPES:
            b, ib = self.value_expr(dtype, scope, None, sub)
            if ib.lo < 0.25 and ib.hi > -0.25:
                b = node("bin", node("call", b, attr="abs", dtype=dtype), const(1.0, dtype), attr="+", dtype=dtype)
                ib = Ival(1.0, ib.mag + 1.0)
            q = [ia.lo / ib.lo, ia.lo / ib.hi, ia.hi / ib.lo, ia.hi / ib.hi]
            return node("bin", a, b, attr="/", dtype=dtype), Ival(min(q), max(q))
        op = self.pick(["//", "%"])
        form = self.pick(["const", "abs", "raw"], [4, 3, MAY_DIVIDE_BY_ZERO * 7 / (1 - MAY_DIVIDE_BY_ZERO)])
        if form == "const":
            c = int(self.pick([2, 3, 5, 7, -3, -2])) if dtype != "uint8" else int(self.pick([2, 3, 5, 7]))
            b, ib = const(c, dtype), Ival(c, c)
        else:
            b, ib = self.value_expr(dtype, scope, None, min(sub, 1))
            if form == "abs" or not ib.contains_zero():
                if ib.contains_zero():
                    absb = node("call", b, attr="abs", dtype=dtype) if dtype != "uint8" else b
                    b = node("bin", absb, const(1, dtype), attr="+", dtype=dtype)
                    ib = Ival(1, ib.mag + 1)
        if ib.contains_zero():
            iv = _int_div_ival(ia, Ival(1, max(1, ib.hi)), op) | _int_div_ival(ia, Ival(min(-1, ib.lo), -1), op)
            iv = iv | Ival(0, 0)
        else:
            iv = _int_div_ival(ia, ib, op)
        return node("bin", a, b, attr=op, dtype=dtype), iv

    def stencil(self, dtype: str, scope: Scope, prefer: Source | None) -> tuple[Node, Ival]:
        """Two or three reads of one tensor at neighbouring points along one axis (guarded borders)."""
        cands = [s for s in scope.sources if s.dims and s.dtype != "bool"]
        if not cands:
            return self.leaf(dtype, scope, prefer)
        src = prefer if prefer is not None and prefer in cands and self.chance(0.6) else self.pick(cands)
        data = [a for a in scope.axes if not a.reduce]
        if not data:
            return self.load(src, dtype, scope)
        ax = self.pick(data)
        out, iv = None, None
        for shift in self.pick([(-1, 0, 1), (0, 1), (-1, 1), (-2, 0, 2)]):
            idx, guards = [], []
            for k, d in enumerate(src.dims):
                if k == 0 or (len(src.dims) > 1 and self.chance(0.3)):
                    i = idx_add(axis_node(ax.name), shift)
                    g = []
                    if shift < 0:
                        g.append(node("cmp", axis_node(ax.name), const(-shift, INDEX), attr=">=", dtype="bool"))
                    if not self.le(Dim(ax.bound.extent, ax.bound.offset + max(shift, 0)), d):
                        g.append(node("cmp", i, dim_node(d), attr="<", dtype="bool"))
                else:
                    i, g = self.index(d, scope, affine=src.where is not None)
                idx.append(i)
                guards += g
            one, one_iv = self._guarded(src, idx, guards, dtype)
            if out is None:
                out, iv = one, one_iv
            else:
                out, iv = self.combine("+", out, iv, one, one_iv, dtype)
        return out, iv

    def _guarded(self, src: Source, idx: list[Node], guards: list[Node], dtype: str) -> tuple[Node, Ival]:
        value = node("load", *idx, attr=src.name, dtype=src.dtype)
        iv = src.ival
        if src.where is not None:
            fb = self.fallback(src.dtype)
            value = node("select", substitute(src.where, dict(zip(src.axes, idx))), value, fb, dtype=src.dtype)
            iv = iv | Ival(fb.attr, fb.attr)
        if guards:
            cond = guards[0]
            for g in guards[1:]:
                cond = node("logic", cond, g, attr="&", dtype="bool")
            fb = self.fallback(src.dtype)
            value = node("select", cond, value, fb, dtype=src.dtype)
            iv = iv | Ival(fb.attr, fb.attr)
        if iv.lo == -np.inf or iv.hi == np.inf or not fits(iv, src.dtype):
            value, iv = self.clamp(value, iv, src.dtype)
        return self.convert(value, iv, src.dtype, dtype)

    # --- conditions ---------------------------------------------------------------------------------
    def condition(self, scope: Scope, data_only: bool = False, depth: int = 1) -> Node:
        axes = [a for a in scope.axes if not (data_only and a.reduce)]
        kinds = {"index": 5 if axes else 0, "value": 2, "logic": 1.5 if depth > 0 else 0}
        kind = self.pick(list(kinds), list(kinds.values()))
        if kind == "logic":
            a = self.condition(scope, data_only, depth - 1)
            if self.chance(0.25):
                return node("not", a, dtype="bool")
            b = self.condition(scope, data_only, depth - 1)
            return node("logic", a, b, attr=self.pick(["&", "|"]), dtype="bool")
        if kind == "index":
            a = self.pick(axes)
            others = [x for x in axes if x is not a]
            form = self.pick(["rel", "sum", "const", "parity"], [4 if others else 0, 2 if others else 0, 2, 1])
            x = axis_node(a.name)
            if form == "rel":
                b = axis_node(self.pick(others).name)
                return node("cmp", x, idx_add(b, int(self.pick([0, 0, 1, -1]))),
                            attr=self.pick(["<=", "<", ">=", "!="]), dtype="bool")
            if form == "sum":
                b = axis_node(self.pick(others).name)
                s = node("bin", x, b, attr="+", dtype=INDEX)
                return node("cmp", s, dim_node(a.bound), attr=self.pick(["<", ">="]), dtype="bool")
            if form == "const":
                c = int(self.rng.integers(0, max(1, self.value(a.bound))))
                return node("cmp", x, const(c, INDEX), attr=self.pick([">=", "<", "!="]), dtype="bool")
            m = node("bin", x, const(2, INDEX), attr="%", dtype=INDEX)
            return node("cmp", m, const(int(self.pick([0, 1])), INDEX), attr="==", dtype="bool")
        sub = Scope(axes, scope.sources, 0, csr=scope.csr)
        bools = [s for s in scope.sources if s.dtype == "bool"]
        if bools and self.chance(0.3):
            v, _ = self.load(self.pick(bools), "bool", sub)
            return v
        t = self.pick(["float32", "int32", self.theme])
        v, iv = self.value_expr(t, sub, depth=1)
        mid = (iv.lo + iv.hi) / 2 if np.isfinite(iv.lo + iv.hi) else 0.0
        c = round(mid * 2) / 2 if t in FLOAT_DTYPES else int(mid)
        return node("cmp", v, const(c, t), attr=self.pick([">", "<=", "!="]), dtype="bool")

    # --- reductions ---------------------------------------------------------------------------------
    def reduction(self, dtype: str, scope: Scope) -> tuple[Node, Ival]:
        data = [a for a in scope.axes if not a.reduce]
        n_axes = int(self.pick([1, 2], [6, 1]))
        axes: list[tuple[str, Node, Node]] = []
        inner: list[Axis] = []
        may_be_empty = False
        length = 1
        for name in ("k", "l")[:n_axes]:
            lo, hi, bound, empty = self.reduce_bounds(data + inner, scope)
            axes.append((name, lo, hi))
            inner.append(Axis(name, bound, False, reduce=True))
            may_be_empty |= empty
            length *= max(1, self.value(bound))
        rscope = Scope(scope.axes + inner, scope.sources, max(1, scope.depth - 1), csr=scope.csr)
        where = None
        if self.chance(0.3):
            where = self.condition(rscope)
            may_be_empty = True
        op = self.pick(["sum", "max", "min", "prod"], [5, 2, 1.5, 1.5])
        body, iv = self.reduce_body(dtype, rscope, op, length)
        if iv is None:  # no bounded body sums or multiplies this many times in this type
            op = "max"
            body, iv = self.reduce_body(dtype, rscope, op, length)
        args = (body,) + ((where,) if where is not None else ())
        red = Node("reduce", args, op, dtype, tuple(axes))
        total = _reduce_ival(op, iv, length, may_be_empty, dtype)
        if op in ("sum", "prod") and not fits(total, dtype) and self.wraps and dtype not in (*FLOAT_DTYPES, "int64"):
            total = _type_ival(dtype)  # reduce_body let it overflow: it wraps
        return red, total

    def reduce_body(self, dtype: str, scope: Scope, op: str, length: int) -> tuple[Node, Ival | None]:
        cands = [s for s in scope.sources if s.dims and s.dtype != "bool"]
        body, iv = (self.load(self.pick(cands), dtype, scope) if cands and self.chance(0.3)
                    else self.value_expr(dtype, scope))
        if not any(n.op == "axis" and n.attr in ("k", "l") for n in _walk(body)) and cands:
            extra, ie = self.load(self.pick(cands), dtype, scope)
            body, iv = self.combine(self.pick(["+", "max"]), body, iv, extra, ie, dtype)
        total = _reduce_ival(op, iv, length, True, dtype)
        if op in ("sum", "prod") and not fits(total, dtype) and not self.may_wrap(dtype):
            body, iv = self.squash(body, iv, dtype, op)
            if not fits(_reduce_ival(op, iv, length, True, dtype), dtype):  # e.g. 2 * 289 terms in uint8
                return body, None
        return body, iv

    def squash(self, body: Node, iv: Ival, dtype: str, op: str) -> tuple[Node, Ival]:
        """A bounded function of ``body`` (small enough to sum or multiply many times)."""
        if dtype in FLOAT_DTYPES:
            t = node("call", body, attr="tanh", dtype=dtype)
            if op == "prod":
                return node("bin", node("bin", t, const(0.25, dtype), attr="*", dtype=dtype), const(1.0, dtype),
                            attr="+", dtype=dtype), Ival(0.75, 1.25)
            return t, Ival(-1, 1)
        if op == "prod":
            m = node("bin", body, const(3, dtype), attr="%", dtype=dtype)
            if dtype == "uint8":
                return node("bin", m, const(1, dtype), attr="//", dtype=dtype), Ival(0, 1)
            return node("bin", m, const(1, dtype), attr="-", dtype=dtype), Ival(-1, 1)
        return node("bin", body, const(3, dtype), attr="%", dtype=dtype), Ival(0, 2)

    def reduce_bounds(self, outer: list[Axis], scope: Scope) -> tuple[Node, Node, Dim, bool]:
        """(lo, hi, a bound of the axis, whether the range may be empty somewhere)."""
        kinds = {"const": 4, "triangle": 3 if outer else 0, "window": 1 if outer else 0,
                 "minmax": 1 if outer else 0,
                 "csr": 5 if scope.csr and any(a.bound == scope.csr[1] and a.exact for a in outer) else 0}
        kind = self.pick(list(kinds), list(kinds.values()))
        zero = const(0, INDEX)
        if kind == "csr":
            offs, rows, nnz = scope.csr  # type: ignore[misc]
            row = self.pick([a for a in outer if a.bound == rows and a.exact])
            r = axis_node(row.name)
            return (node("load", r, attr=offs, dtype=INDEX), node("load", idx_add(r, 1), attr=offs, dtype=INDEX),
                    nnz, True)
        if kind == "const":
            sources = [d for s in scope.sources for d in s.dims]
            d = self.pick(sources) if sources and self.chance(0.7) else Dim(self.pick(list(self.extents)))
            if self.value(d) > MAX_REDUCTION:
                d = Dim(min(self.extents, key=lambda n: self.extents[n].value))
            return zero, dim_node(d), d, self.least(d) < 1
        a = self.pick(outer)
        x = axis_node(a.name)
        if kind == "triangle":
            form = self.pick(["upto", "below", "from"])
            if form == "upto":  # k in [0, a]
                return zero, idx_add(x, 1), a.bound, False
            if form == "below":  # k in [0, a)
                return zero, x, a.bound, True
            d = a.bound if a.exact else Dim(a.bound.extent, a.bound.offset)
            return x, dim_node(d), d, False  # k in [a, bound)
        if kind == "window":  # k in [a, a + w)
            w = int(self.pick([2, 3]))
            return x, idx_add(x, w), Dim(a.bound.extent, a.bound.offset + w - 1), False
        # min/max bounds: k in [max(a - 2, 0), min(a + 2, bound))
        lo = node("bin", idx_add(x, -2), zero, attr="max", dtype=INDEX)
        hi = node("bin", idx_add(x, 2), dim_node(a.bound), attr="min", dtype=INDEX)
        return lo, hi, a.bound, False


def _int_div_ival(a: Ival, b: Ival, op: str) -> Ival:
    if op == "%":
        return Ival(0, b.hi - 1) if b.lo > 0 else Ival(b.lo + 1, 0)
    qs = [np.floor(x / y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    if a.contains_zero():
        qs.append(0.0)
    return Ival(float(min(qs)), float(max(qs)))


def _type_ival(dtype: str) -> Ival:
    """Every value of integer type ``dtype``."""
    return Ival(_LOW.get(dtype, -_LIMIT[dtype] - 1), _LIMIT[dtype])


def _reduce_ival(op: str, iv: Ival, length: int, may_be_empty: bool, dtype: str) -> Ival:
    if op == "sum":
        return Ival(length * min(iv.lo, 0), length * max(iv.hi, 0))
    if op == "prod":
        with np.errstate(over="ignore"):
            m = float(np.power(np.float64(iv.mag), length)) if iv.mag > 1 else 1.0
        lo = 0.0 if iv.lo >= 0 else -m
        return Ival(min(lo, 1.0), max(m, 1.0))
    if not may_be_empty:
        return iv
    if dtype in FLOAT_DTYPES:
        return Ival(-np.inf, iv.hi) if op == "max" else Ival(iv.lo, np.inf)
    lo = _LOW.get(dtype, -_LIMIT[dtype] - 1)
    return Ival(lo, iv.hi) if op == "max" else Ival(iv.lo, _LIMIT[dtype])


def _walk(n: Node):  # noqa: ANN202
    from .spec import walk
    return walk(n)


def _node_reads(n: Node) -> set[str]:
    return {x.attr for x in _walk(n) if x.op == "load"}


def _reads(c: CompSpec) -> set[str]:
    out = _node_reads(c.body)
    if c.where is not None:
        out |= _node_reads(c.where)
    return out


def generate(rng: np.random.Generator, modes: np.random.Generator | None = None) -> Program:
    """A random valid program drawn from ``rng``; ``modes``, where given, draws the modes that
    programs without them do not draw: integer overflow (``ProgramGenerator.wraps``) and NaN inputs
    to half the programs with a float maximum or minimum (NaN must propagate through them)."""
    program = ProgramGenerator(rng, modes).generate()
    if modes is not None and _float_minmax(program) and modes.random() < 0.5:
        program = replace(program, inputs=tuple(replace(t, dist="uniform_nan") if t.dist == "uniform" else t
                                                for t in program.inputs))
    return program


def _float_minmax(p: Program) -> bool:
    """Whether a computation of ``p`` takes a float maximum or minimum (elementwise or a reduction)."""
    return any(n.dtype in FLOAT_DTYPES and (n.op == "bin" and n.attr in ("max", "min") or
                                            n.op == "reduce" and n.attr in ("max", "min"))
               for c in p.comps for n in _walk(c.body))
