"""The loop part of a statement's schedule: an affine map from its domain to named loops.

Every loop primitive (split, reorder, fuse, skew, shift, reverse, any user map) is an affine map
composed on the right, both as a relation and as a piecewise function. The static (ordering)
dimensions of the 2d+1 form are kept beside it as integers by the schedule layer; ``full_map``
interleaves the two.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from functools import cached_property

import islpy as isl
import numpy as np

from ..errors import ScheduleError


def integer_argument(value: object, what: str, positive: bool = False) -> int:
    """``value`` as a Python int: an integer (NumPy's included), not a bool, a float or a string."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        value = int(value)
        if not positive or value >= 1:
            return value
    raise ScheduleError(f"{what} must be {'a positive' if positive else 'an'} integer, got {value!r}")


def _xs(n: int, prefix: str = "x") -> list[str]:
    return [f"{prefix}{k}" for k in range(n)]


class LoopSchedule:
    """``stmt[dims] -> [l0, …]`` with loop names; immutable, every primitive returns a new one."""

    def __init__(self, owner: str, dims: Sequence[str], rel: isl.Map, names: Sequence[str], domain: isl.Set,
                 function: isl.PwMultiAff | None = None, inverse: isl.PwMultiAff | None = None):
        self.owner = owner  # the computation, for messages
        self.dims = list(dims)
        self.rel = rel  # over every integer point (an initialization's loops are projected from it)
        self.names = list(names)
        self.domain = domain  # the statement's instances: analyses look at the loops there only
        # ``rel`` as the primitives' functions composed (their floors explicit), where known: isl
        # recovers a function from a relation whose floors it has eliminated (a skew of split loops:
        # 265·o7 = 2i - 9k + …) by parametric integer programming, in pieces per residue, for minutes
        # (fuzz seed 53 case 1483)
        self.function = function
        # the statement's dimensions from the loops, the primitives' inverses composed, where known
        # (``[l0, …] -> stmt[dims]``): it agrees with the instances isl derives for the loops on the
        # domain and goes on past it the way the loops do (a split's ``8·o + i`` for every i), where
        # isl's may read the domain's shape (``80 - 16·((4a + 7b + 5) mod 8)`` where ``b <= 1`` for
        # odd a): the tensor-core nests run their calls over whole zero-filled tiles
        self.inverse = inverse

    @staticmethod
    def identity(owner: str, stmt: str, dims: Sequence[str], domain: isl.Set) -> LoopSchedule:
        d = ", ".join(dims)
        text = f"{{ {stmt}[{d}] -> [{d}] }}"
        return LoopSchedule(owner, dims, isl.Map(text), dims, domain, isl.PwMultiAff(text),
                            isl.PwMultiAff(f"{{ [{d}] -> {stmt}[{d}] }}"))

    # --- helpers --------------------------------------------------------------------------------
    def index(self, name: str) -> int:
        if name not in self.names:
            raise ScheduleError(f"computation {self.owner} has no loop named {name!r}; its loops are "
                                + ", ".join(self.names))
        return self.names.index(name)

    def _fresh(self, wanted: str | None, default: str, taken: set[str]) -> str:
        if wanted is not None and not isinstance(wanted, str):
            raise ScheduleError(f"loop name {wanted!r} of {self.owner} is not a string")
        name = wanted or default
        if not wanted:
            k = 1
            while name in taken:
                name, k = f"{default}{k}", k + 1
        elif name in taken:
            raise ScheduleError(f"computation {self.owner} already has a loop named {name!r}")
        if not name.replace(".", "_").isidentifier():
            raise ScheduleError(f"loop name {name!r} of {self.owner} is not an identifier")
        return name

    def _compose(self, out_exprs: Sequence[str], names: Sequence[str], undo: Sequence[str]) -> LoopSchedule:
        """The loops followed by ``[x0, …] -> [out_exprs]``, whose inverse is ``[y0, …] -> [undo]``."""
        xs, ys = _xs(len(self.names)), _xs(len(names), "y")
        t = isl.Map(f"{{ [{', '.join(xs)}] -> [{', '.join(out_exprs)}] }}")
        back = isl.PwMultiAff(f"{{ [{', '.join(ys)}] -> [{', '.join(undo)}] }}")
        return LoopSchedule(self.owner, self.dims, self.rel.apply_range(t), names, self.domain, self._then(t),
                            self._undo(back))

    def _then(self, t: isl.Map) -> isl.PwMultiAff | None:
        """``function`` followed by the single-valued map ``t`` (over the loops, without parameters)."""
        if self.function is None:
            return None
        return isl.PwMultiAff.from_map(t).pullback_pw_multi_aff(self.function)

    def _undo(self, back: isl.PwMultiAff) -> isl.PwMultiAff | None:
        """``inverse`` after ``back``, the inverse of a primitive's map (new loops -> old loops)."""
        if self.inverse is None:
            return None
        return self.inverse.pullback_pw_multi_aff(back)

    # --- primitives -----------------------------------------------------------------------------
    def split(self, name: str, factor: int, outer: str | None = None, inner: str | None = None) -> LoopSchedule:
        factor = integer_argument(factor, f"split of loop {name} of {self.owner}: the factor", positive=True)
        p = self.index(name)
        taken = set(self.names) - {name}
        o = self._fresh(outer, f"{name}o", taken)
        i = self._fresh(inner, f"{name}i", taken | {o})
        xs = _xs(len(self.names))
        outs = xs[:p] + [f"floor({xs[p]}/{factor})", f"{xs[p]} mod {factor}"] + xs[p + 1:]
        ys = _xs(len(self.names) + 1, "y")
        undo = ys[:p] + [f"{factor}*{ys[p]} + {ys[p + 1]}"] + ys[p + 2:]
        return self._compose(outs, self.names[:p] + [o, i] + self.names[p + 1:], undo)

    def reorder(self, order: Sequence[str]) -> LoopSchedule:
        if len(set(order)) != len(order):
            raise ScheduleError(f"reorder of {self.owner}: a loop is named twice in {list(order)}")
        positions = sorted(self.index(n) for n in order)
        names = list(self.names)
        for pos, n in zip(positions, order):
            names[pos] = n
        xs = _xs(len(self.names))
        outs = [xs[self.names.index(n)] for n in names]
        ys = _xs(len(names), "y")
        undo = [ys[names.index(n)] for n in self.names]
        return self._compose(outs, names, undo)

    def fuse(self, outer: str, inner: str, domain: isl.Set, name: str | None = None) -> LoopSchedule:
        p, q = self.index(outer), self.index(inner)
        if q != p + 1:
            raise ScheduleError(f"fuse of {self.owner}: loop {inner} must be directly inside {outer}")
        lo, hi = (0, 0) if domain.is_empty() else self.loop_range(q, domain)  # no iteration: any extent
        if lo != 0 or hi is None:
            runs = f"it runs from {lo} to {hi}" if lo is not None and hi is not None else "its bounds vary"
            raise ScheduleError(f"fuse of {self.owner}: loop {inner} must run over 0..E-1 with a constant E "
                                f"for every value of {outer} ({runs})")
        taken = set(self.names) - {outer, inner}
        f = self._fresh(name, f"{outer}{inner}", taken)
        xs = _xs(len(self.names))
        outs = xs[:p] + [f"{hi + 1}*{xs[p]} + {xs[q]}"] + xs[q + 1:]
        ys = _xs(len(self.names) - 1, "y")
        undo = ys[:p] + [f"floor({ys[p]}/{hi + 1})", f"{ys[p]} mod {hi + 1}"] + ys[p + 1:]
        return self._compose(outs, self.names[:p] + [f] + self.names[q + 1:], undo)

    def skew(self, outer: str, inner: str, factor: int) -> LoopSchedule:
        factor = integer_argument(factor, f"skew of {self.owner}: the factor")
        p, q = self.index(outer), self.index(inner)
        if p >= q:
            raise ScheduleError(f"skew of {self.owner}: loop {outer} must be outside {inner}")
        xs = _xs(len(self.names))
        outs = list(xs)
        outs[q] = f"{xs[q]} + {int(factor)}*{xs[p]}"
        undo = _xs(len(self.names), "y")
        undo[q] = f"{undo[q]} - {int(factor)}*{undo[p]}"
        return self._compose(outs, self.names, undo)

    def shift(self, name: str, offset: int) -> LoopSchedule:
        offset = integer_argument(offset, f"shift of loop {name} of {self.owner}: the offset")
        p = self.index(name)
        xs = _xs(len(self.names))
        outs = list(xs)
        outs[p] = f"{xs[p]} + {int(offset)}"
        undo = _xs(len(self.names), "y")
        undo[p] = f"{undo[p]} - {int(offset)}"
        return self._compose(outs, self.names, undo)

    def reverse(self, name: str) -> LoopSchedule:
        p = self.index(name)
        xs = _xs(len(self.names))
        outs = list(xs)
        outs[p] = f"-{xs[p]}"
        undo = _xs(len(self.names), "y")
        undo[p] = f"-{undo[p]}"
        return self._compose(outs, self.names, undo)

    def apply(self, text: str, names: Sequence[str] | None = None) -> LoopSchedule:
        """Compose a user's isl map over the current loops (input dimensions matched by position)."""
        if not isinstance(text, str):
            raise ScheduleError(f"apply_sch on {self.owner}: the map must be isl text such as "
                                f"'{{ [i, j] -> [j, i] }}', got {text!r}")
        try:
            t = isl.Map(text)
        except isl.Error as err:
            raise ScheduleError(f"apply_sch on {self.owner}: {text!r} is not an isl map ({err})") from None
        if t.dim(isl.dim_type.param) != 0:
            raise ScheduleError(f"apply_sch on {self.owner}: the map {text!r} has parameters; use integers")
        n_in = t.dim(isl.dim_type.in_)
        if n_in != len(self.names):
            raise ScheduleError(f"apply_sch on {self.owner}: the map takes {n_in} loop(s) but the computation has "
                                f"{len(self.names)} ({', '.join(self.names)})")
        if not t.is_single_valued():
            raise ScheduleError(f"apply_sch on {self.owner}: the map {text!r} is not a function")
        if not t.is_injective():
            raise ScheduleError(f"apply_sch on {self.owner}: the map {text!r} sends two iterations to one point")
        t = t.reset_tuple_id(isl.dim_type.in_).reset_tuple_id(isl.dim_type.out)
        n_out = t.dim(isl.dim_type.out)
        out_names = list(names) if names else [t.get_dim_name(isl.dim_type.out, k) or f"t{k}" for k in range(n_out)]
        if len(out_names) != n_out or len(set(out_names)) != n_out:
            raise ScheduleError(f"apply_sch on {self.owner}: give {n_out} distinct names for the new loops")
        out_names = [self._fresh(n, n, set()) for n in out_names]
        for k in range(n_out):
            t = t.set_dim_name(isl.dim_type.out, k, f"y{k}")
        for k in range(n_in):
            t = t.set_dim_name(isl.dim_type.in_, k, f"x{k}")
        rel = self.rel.apply_range(t)
        if rel.is_empty() and not self.rel.is_empty():
            raise ScheduleError(f"apply_sch on {self.owner}: the map {text!r} drops every iteration")
        loops = self.domain.apply(self.rel)  # the iterations, as values of the current loops
        undefined = loops.subtract(t.domain().align_params(loops.get_space()))
        if not undefined.is_empty():  # e.g. [a] -> [a/2] only holds for even a
            point = undefined.sample_point()
            example = [point.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(n_in)]
            raise ScheduleError(f"apply_sch on {self.owner}: the map {text!r} is not defined at every iteration "
                                f"(not at {dict(zip(self.names, example))}); give a map of every integer point")
        # the user's map is injective: its inverse is a function on its image
        return LoopSchedule(self.owner, self.dims, rel, out_names, self.domain, self._then(t),
                            self._undo(isl.PwMultiAff.from_map(t.reverse())))

    # --- queries --------------------------------------------------------------------------------
    def loop_range(self, pos: int, domain: isl.Set) -> tuple[int | None, int | None]:
        """The constant bounds of loop ``pos`` over all iterations (None where not constant)."""
        image = domain.apply(self.rel)
        n = image.dim(isl.dim_type.set)
        if not image.project_out(isl.dim_type.set, pos + 1, n - pos - 1).project_out(
                isl.dim_type.set, 0, pos).is_bounded():
            return None, None  # a data-dependent range without declared bounds
        return _const_of(image.dim_min(pos)), _const_of(image.dim_max(pos))

    def depends_on(self, pos: int, dims: Sequence[str]) -> bool:
        """Whether loop ``pos`` varies with the domain dimensions ``dims``: fixing the others leaves
        its value undetermined. Taken jointly: where the domain ties dimensions together (a
        reduction's ``where=k5 == 5 - k4``), each of them alone is redundant, yet the loop varies
        with the two."""
        if any(d in self._involved[pos] for d in dims):
            return True
        ks = sorted({self.dims.index(d) for d in dims if d in self.dims}, reverse=True)
        if len(ks) < 2:
            return False
        key = (pos, tuple(ks))
        if key not in self._joint:
            graph = self._graphs[pos]
            for k in ks:
                graph = graph.project_out(isl.dim_type.in_, k, 1)
            self._joint[key] = not graph.is_single_valued()
        return self._joint[key]

    @cached_property
    def _joint(self) -> dict[tuple[int, tuple[int, ...]], bool]:
        return {}

    @cached_property
    def _graphs(self) -> list[isl.Map]:
        """For each loop, its value as a relation of the domain dimensions. Over the statement's
        instances only, where compositions of floors and fusions are simple, unlike over every
        integer point (where extracting the functions can take isl minutes)."""
        rel = self.rel.intersect_domain(self.domain).detect_equalities()
        if rel.is_empty():  # no instance: what the loops vary with over every point
            rel = self.rel
        n = len(self.names)
        return [rel.project_out(isl.dim_type.out, pos + 1, n - pos - 1).project_out(isl.dim_type.out, 0, pos)
                for pos in range(n)]

    @cached_property
    def _involved(self) -> list[set[str]]:
        """For each loop, the domain dimensions it varies with one by one: those whose removal leaves
        the loop's value undetermined (computed once: schedules are immutable)."""
        return [{d for k, d in enumerate(self.dims) if graph.involves_dims(isl.dim_type.in_, k, 1)
                 and not graph.project_out(isl.dim_type.in_, k, 1).is_single_valued()}
                for graph in self._graphs]

    def __repr__(self) -> str:
        return f"LoopSchedule({self.owner}: {self.rel} names={self.names})"


def _const_of(pa: isl.PwAff) -> int | None:
    pieces = pa.get_pieces()
    if pieces and all(aff.is_cst() for _, aff in pieces):
        vals = {int(aff.get_constant_val().to_python()) for _, aff in pieces}
        if len(vals) == 1:
            return vals.pop()
    return None


def full_map(loops: LoopSchedule, statics: Sequence[int], width: int) -> isl.Map:
    """The 2d+1 schedule ``stmt -> [s0, l0, s1, …, sn, 0, …]`` padded to ``width`` dimensions."""
    t = _interleave(loops, statics, width)
    # over the statement's instances, with the equalities isl finds there made explicit: composed
    # splits and fusions otherwise reach the AST generator as large floor expressions it explores
    # for minutes (a split of a fused loop: o5 = i - 7 * o3 instead of three floor constraints)
    return loops.rel.intersect_domain(loops.domain).apply_range(t).detect_equalities().coalesce()


def full_map_everywhere(loops: LoopSchedule, statics: Sequence[int], width: int) -> isl.Map:
    """``full_map`` over every integer point the loops are defined on, not only the instances: the
    functions the primitives composed (``i mod 3`` for a split of ``i``), where those of ``full_map``
    may read the domain's strides (on odd i, ``i mod 3`` is ``((3 - i) mod 6)/2``, no integer on
    even i)."""
    return loops.rel.apply_range(_interleave(loops, statics, width))


def full_function(loops: LoopSchedule, statics: Sequence[int], width: int) -> isl.PwMultiAff | None:
    """``full_map_everywhere`` as the primitives' composed function, where known."""
    if loops.function is None:
        return None
    return isl.PwMultiAff.from_map(_interleave(loops, statics, width)).pullback_pw_multi_aff(loops.function)


def full_inverse(loops: LoopSchedule, width: int) -> isl.PwMultiAff | None:
    """``[s0, l0, s1, …] -> stmt[dims]`` (``width`` dimensions): the statement's instance at the loops'
    values, from ``LoopSchedule.inverse`` (the static dimensions read nowhere), where known."""
    if loops.inverse is None:
        return None
    cs = _xs(width, "c")
    pick = isl.MultiAff(f"{{ [{', '.join(cs)}] -> [{', '.join(cs[2 * k + 1] for k in range(len(loops.names)))}] }}")
    return loops.inverse.pullback_multi_aff(pick)


def _interleave(loops: LoopSchedule, statics: Sequence[int], width: int) -> isl.Map:
    """``[l0, …] -> [s0, l0, s1, …, sn, 0, …]``."""
    n = len(loops.names)
    assert len(statics) == n + 1, (loops.names, statics)
    xs = _xs(n)
    outs: list[str] = []
    for k in range(n):
        outs += [str(int(statics[k])), xs[k]]
    outs.append(str(int(statics[n])))
    outs += ["0"] * (width - len(outs))
    return isl.Map(f"{{ [{', '.join(xs)}] -> [{', '.join(outs)}] }}")
