"""A fuzz case as data: a program (extents, tensors, expression trees) and its schedule calls,
rendered as Python source that builds the program with polytile.

The rendered text is what runs: the fuzzer executes the program's text to get the ``pt.Func``
and each schedule call's text on the schedule, so a case printed as a snippet is an exact
reproducer. The expression trees exist so that the minimizer can shrink a program (smaller
extents, simpler expressions, fewer computations) and render it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8")
REDUCERS = ("sum", "max", "min", "prod")
CUDA_TARGET = "cuda:sm_90a"
"""What ``polytile fuzz --target cuda`` lowers for (and compiles for, with nvcc)."""


@dataclass(frozen=True)
class Extent:
    """A size of the program: a constant, or a parameter ``pt.param(param)`` of value ``value``
    constrained to be at least ``minimum``."""

    name: str
    value: int
    param: str | None = None
    minimum: int = 0


@dataclass(frozen=True)
class Dim:
    """One dimension of a tensor: an extent plus a constant offset (``N + 1``)."""

    extent: str
    offset: int = 0


@dataclass(frozen=True)
class Node:
    """An expression: ``op`` names the kind, ``args`` are sub-expressions, ``attr`` the kind's datum
    (a constant's value, an axis or tensor name, an operator, a dtype, a function, a ``Dim``).
    ``dtype`` is the type the generator meant (polytile's own typing decides; the reference
    evaluates what polytile built). A ``reduce`` node has its body as ``args[0]``, its condition
    as ``args[1]`` when present, and ``axes`` of (name, lo, hi)."""

    op: str
    args: tuple[Node, ...] = ()
    attr: Any = None
    dtype: str = ""
    axes: tuple[tuple[str, Node, Node], ...] = ()

    def children(self) -> tuple[Node, ...]:
        return self.args + tuple(b for _, lo, hi in self.axes for b in (lo, hi))


@dataclass(frozen=True)
class InputSpec:
    """A placeholder and how its random values are drawn: ``dist`` is "uniform" (floats in
    [lo, hi]), "uniform_nan" (the same, one in six NaN), "integers" (in [lo, hi]), "offsets"
    (non-decreasing in [lo, hi]: CSR row offsets) or "indices" (an index array in [lo, hi],
    unordered). Index arrays declare the range as
    ``value_range`` (``hi_dim`` ties its upper end to an extent) and offsets are ``monotonic``."""

    name: str
    dims: tuple[Dim, ...]
    dtype: str
    dist: str
    lo: float
    hi: float
    range_dim: Dim | None = None  # value_range=(0, range_dim) for index arrays


@dataclass(frozen=True)
class CompSpec:
    """``name = pt.compute(dims, lambda *axes: body, name, where=..., dtype=...)``."""

    name: str
    axes: tuple[str, ...]
    dims: tuple[Dim, ...]
    body: Node
    where: Node | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class Program:
    """A program; ``malformed`` names what makes it one polytile must refuse with a PolytileError
    ("duplicate-input": an input listed twice in ``pt.Func``, "missing-input": an input it reads
    left out, "out-of-bounds": a read past a tensor's end), or is empty for a valid program."""

    extents: tuple[Extent, ...]
    inputs: tuple[InputSpec, ...]
    comps: tuple[CompSpec, ...]
    outputs: tuple[str, ...]
    malformed: str = ""

    @property
    def malformation(self) -> str:
        """``malformed`` where it applies (an input to list twice or leave out needs an input)."""
        if self.malformed in ("duplicate-input", "missing-input") and not self.used_inputs():
            return ""
        return self.malformed

    def extent(self, name: str) -> Extent:
        return next(e for e in self.extents if e.name == name)

    def size(self, dim: Dim) -> int:
        return self.extent(dim.extent).value + dim.offset

    def shape(self, dims: tuple[Dim, ...]) -> tuple[int, ...]:
        return tuple(self.size(d) for d in dims)

    def params(self) -> dict[str, int]:
        return {e.param: e.value for e in self.extents if e.param}

    def tensor_dims(self, name: str) -> tuple[Dim, ...]:
        for t in (*self.inputs, *self.comps):
            if t.name == name:
                return t.dims
        raise KeyError(name)

    def used_inputs(self) -> list[InputSpec]:
        """The placeholders that the computations reachable from the outputs read, in order."""
        read = {n for c in self.reachable() for n in tensors_read(c)}
        return [t for t in self.inputs if t.name in read]

    def reachable(self) -> list[CompSpec]:
        by_name = {c.name: c for c in self.comps}
        need: set[str] = set()
        stack = list(self.outputs)
        while stack:
            n = stack.pop()
            if n in need or n not in by_name:
                continue
            need.add(n)
            stack.extend(tensors_read(by_name[n]))
        return [c for c in self.comps if c.name in need]


@dataclass(frozen=True)
class Call:
    """A schedule primitive as the text that applies it (``s["T"].split("i", 3)``) and how it went:
    "accepted", "refused" (a PolytileError: fine) or the name of what else happened."""

    text: str
    outcome: str = "accepted"
    detail: str = ""


@dataclass
class Case:
    """One fuzz case: a program, the schedule calls applied to it, the seed of its inputs, and the
    target ("cpu": built and run; "cuda": lowered and run on the block emulator)."""

    seed: int
    index: int
    program: Program
    input_seed: int
    calls: list[Call] = field(default_factory=list)
    target: str = "cpu"

    def with_program(self, program: Program) -> Case:
        return replace(self, program=program, calls=list(self.calls))

    def with_calls(self, calls: list[Call]) -> Case:
        return replace(self, calls=list(calls))


# --- traversal ------------------------------------------------------------------------------------

def walk(n: Node):  # noqa: ANN201 - a generator of nodes
    """Every node of ``n``, parents first."""
    stack = [n]
    while stack:
        x = stack.pop()
        yield x
        stack.extend(reversed(x.children()))


def comp_roots(c: CompSpec) -> list[Node]:
    return [c.body] + ([c.where] if c.where is not None else [])


def tensors_read(c: CompSpec) -> list[str]:
    out: dict[str, None] = {}
    for root in comp_roots(c):
        for n in walk(root):
            if n.op == "load":
                out.setdefault(n.attr, None)
    return list(out)


def substitute(n: Node, mapping: dict[str, Node]) -> Node:
    """Replace axes (by name) with expressions; reduce axes shadow names they bind."""
    if n.op == "axis":
        return mapping.get(n.attr, n)
    if n.op == "reduce":
        inner = {k: v for k, v in mapping.items() if k not in {a for a, _, _ in n.axes}}
        axes = tuple((a, substitute(lo, mapping), substitute(hi, mapping)) for a, lo, hi in n.axes)
        return replace(n, args=tuple(substitute(x, inner) for x in n.args), axes=axes)
    if not n.args:
        return n
    return replace(n, args=tuple(substitute(x, mapping) for x in n.args))


def replace_node(root: Node, path: tuple[int, ...], new: Node) -> Node:
    """``root`` with the node at ``path`` (child positions, as ``Node.children`` orders them) replaced."""
    if not path:
        return new
    k, rest = path[0], path[1:]
    if k < len(root.args):
        args = list(root.args)
        args[k] = replace_node(args[k], rest, new)
        return replace(root, args=tuple(args))
    j, side = divmod(k - len(root.args), 2)
    axes = list(root.axes)
    name, lo, hi = axes[j]
    axes[j] = (name, replace_node(lo, rest, new), hi) if side == 0 else (name, lo, replace_node(hi, rest, new))
    return replace(root, axes=tuple(axes))


def paths(root: Node, prefix: tuple[int, ...] = ()):  # noqa: ANN201 - a generator of (path, node)
    """Every node of ``root`` with its path, parents first."""
    yield prefix, root
    for k, child in enumerate(root.children()):
        yield from paths(child, prefix + (k,))


# --- rendering --------------------------------------------------------------------------------------

_BIN = {"+", "-", "*", "/", "//", "%"}
_FUNCS = {"max": "maximum", "min": "minimum"}
_UNEXPORTED = {"sin", "cos", "exp2", "log2"}  # math functions reached through pt.call


class Renderer:
    """Python source of a program's nodes; extents render as their value or their parameter."""

    def __init__(self, program: Program):
        self.program = program

    def dim(self, d: Dim) -> str:
        e = self.program.extent(d.extent)
        if e.param is None:
            return str(e.value + d.offset)
        if d.offset == 0:
            return e.param
        return f"{e.param} {'+' if d.offset > 0 else '-'} {abs(d.offset)}"

    def shape(self, dims: tuple[Dim, ...]) -> str:
        inner = ", ".join(self.dim(d) for d in dims)
        return f"({inner},)" if len(dims) == 1 else f"({inner})"

    def expr(self, n: Node) -> str:
        op = n.op
        if op == "const":
            return _const_text(n.attr, n.dtype)
        if op == "axis":
            return n.attr
        if op == "dim":
            text = self.dim(n.attr)
            return text if text.isidentifier() or text.lstrip("-").isdigit() else f"({text})"
        if op == "load":
            return f"{n.attr}[{', '.join(self.expr(a) for a in n.args) or '()'}]"
        if op in ("bin", "cmp"):
            if n.attr in _FUNCS:
                return f"pt.{_FUNCS[n.attr]}({self.expr(n.args[0])}, {self.expr(n.args[1])})"
            return f"({self.expr(n.args[0])} {n.attr} {self.expr(n.args[1])})"
        if op == "logic":
            return f"({self.expr(n.args[0])} {n.attr} {self.expr(n.args[1])})"
        if op == "not":  # ~ of a Python bool (a condition on constants, e.g. a where= at index 0) is an int
            return f"({'not ' if self.static(n.args[0]) else '~'}{self.expr(n.args[0])})"
        if op == "neg":
            return f"(-{self.expr(n.args[0])})"
        if op == "select":
            return f"pt.select({', '.join(self.expr(a) for a in n.args)})"
        if op == "cast":
            return f'pt.cast("{n.attr}", {self.expr(n.args[0])})'
        if op == "call":
            args = ", ".join(self.expr(a) for a in n.args)
            if n.attr in _UNEXPORTED:
                return f'pt.call("{n.attr}", {args})'
            return f"pt.{n.attr}({args})"
        if op == "reduce":
            names = [a for a, _, _ in n.axes]
            axis = names[0] if len(names) == 1 else f"[{', '.join(names)}]"
            where = f", where={self.expr(n.args[1])}" if len(n.args) > 1 else ""
            return f"pt.{n.attr}({self.expr(n.args[0])}, axis={axis}{where})"
        raise ValueError(f"unknown node {op}")

    def static(self, n: Node) -> bool:
        """Whether ``n`` renders as a plain Python value (constants and fixed extents only)."""
        return all(x.op in ("const", "bin", "cmp", "logic", "not", "neg")
                   or (x.op == "dim" and self.program.extent(x.attr.extent).param is None) for x in walk(n))

    def comp(self, c: CompSpec) -> list[str]:
        reductions = [n for n in walk(c.body) if n.op == "reduce"]
        kwargs = ""
        if c.where is not None:
            kwargs += f", where=lambda {', '.join(c.axes)}: {self.expr(c.where)}"
        if c.dtype is not None:
            kwargs += f', dtype="{c.dtype}"'
        head = f"{c.name} = pt.compute({self.shape(c.dims)}, "
        if not reductions:
            return [f"{head}lambda {', '.join(c.axes)}: {self.expr(c.body)}, \"{c.name}\"{kwargs})"]
        lines = [f"def f_{c.name}({', '.join(c.axes)}):"]
        for red in reductions:
            for name, lo, hi in red.axes:
                lines.append(f'    {name} = pt.reduce_axis(({self.expr(lo)}, {self.expr(hi)}), "{name}")')
        lines.append(f"    return {self.expr(c.body)}")
        lines.append(f"{head}f_{c.name}, \"{c.name}\"{kwargs})")
        return lines

    def input(self, t: InputSpec) -> str:
        extra = ""
        if t.dist in ("offsets", "indices"):
            extra = f", value_range=({int(t.lo)}, {self.dim(t.range_dim) if t.range_dim else int(t.hi)})"
            if t.dist == "offsets":
                extra += ", monotonic=True"
        return f'{t.name} = pt.placeholder({self.shape(t.dims)}, "{t.dtype}", "{t.name}"{extra})'


def _const_text(value: object, dtype: str) -> str:
    if dtype == "bool":
        return "True" if value else "False"
    if dtype in FLOAT_DTYPES:
        text = repr(float(value))
        return f"({text})" if text.startswith("-") else text
    v = int(value)  # type: ignore[call-overload]
    return f"({v})" if v < 0 else str(v)


def program_source(p: Program) -> str:
    """The Python source that defines the program's parameters, tensors and ``func``."""
    r = Renderer(p)
    lines = []
    params = [e for e in p.extents if e.param]
    for e in params:
        lines.append(f'{e.param} = pt.param("{e.param}")')
    for t in p.used_inputs():
        lines.append(r.input(t))
    for c in p.reachable():
        lines.extend(r.comp(c))
    constraints = ", ".join(f"{e.param} >= {e.minimum}" for e in params)
    names = [t.name for t in p.used_inputs()]
    if p.malformation == "duplicate-input":
        names.append(names[0])
    if p.malformation == "missing-input":
        names.pop()
    ins = ", ".join(names)
    outs = ", ".join(p.outputs)
    cons = f", constraints=[{constraints}]" if constraints else ""
    lines.append(f'func = pt.Func([{ins}], [{outs}]{cons}, name="fuzz")')
    return "\n".join(lines) + "\n"


def inputs_source(p: Program, input_seed: int) -> str:
    """The Python source that draws the inputs (``args``) and binds the parameters (``params``)."""
    lines = [f"rng = np.random.default_rng({input_seed})", f"params = {p.params()!r}", "args = ["]
    for t in p.used_inputs():
        lines.append(f"    {input_call(p, t)},")
    lines.append("]")
    return "\n".join(lines) + "\n"


def input_call(p: Program, t: InputSpec) -> str:
    """The ``polytile.fuzz.inputs`` call that draws input ``t`` (``rng`` in scope)."""
    shape = p.shape(t.dims)
    hi = p.size(t.range_dim) if t.range_dim is not None else t.hi
    if t.dist in ("uniform", "uniform_nan"):
        return f'inputs.{t.dist}(rng, {shape!r}, "{t.dtype}", {float(t.lo)!r}, {float(hi)!r})'
    return f'inputs.{t.dist}(rng, {shape!r}, "{t.dtype}", {int(t.lo)}, {int(hi)})'


def case_source(case: Case, title: str = "") -> str:
    """A runnable Python script that replays ``case``: it builds the program and the schedule, runs
    the kernel on the case's inputs (in fenced arrays) and checks the outputs against the
    reference. It exits 0 when the result is right or polytile refuses cleanly (a PolytileError
    other than BuildError), and fails otherwise."""
    p = case.program
    lines = [f"# {title}" if title else f"# polytile fuzz --seed {case.seed} --case {case.index}",
             "import numpy as np", "import polytile as pt",
             f"from polytile.fuzz import {'emulator, ' if case.target == 'cuda' else ''}inputs, reference, schedules",
             "", program_source(p).rstrip(), "", inputs_source(p, case.input_seed).rstrip(),
             f"args = [inputs.fenced(a, at_start={fence_at_start(case)}) for a in args]", "",
             "s = pt.create_schedule(func)", "try:"]
    for call in case.calls:
        if call.outcome == "accepted":
            lines.append(f"    {call.text}")
        elif call.outcome == "non-transactional":
            lines += ["    before = schedules.snapshot(s)", "    try:", f"        {call.text}",
                      "    except pt.PolytileError:",
                      '        assert schedules.snapshot(s) == before, "a refused primitive changed the schedule"']
        else:
            lines.append(f"    # {call.outcome}: {call.text}")
    build = "kern = pt.build(s)" if case.target == "cpu" else f'low = pt.lower(s, "{CUDA_TARGET}")'
    run = ("kern(*args, *outs, **params)" if case.target == "cpu" else
           "emulator.run(low, [*args, *outs], params)  # NotImplementedError: a construct the emulator lacks")
    lines += [f"    {build}", "except pt.BuildError:", "    raise",
              "except pt.PolytileError as err:  # a clean refusal is a right answer",
              '    print("refused:", err)', "    raise SystemExit(0)",
              f"outs = inputs.output_arrays(func, params, at_start={fence_at_start(case)})",
              run, "reference.check(func, args, outs, params)", 'print("ok")']
    return "\n".join(lines) + "\n"


def fence_at_start(case: Case) -> bool:
    """Whether the case's arrays are fenced before their first byte (else after their last)."""
    return case.input_seed % 2 == 1
