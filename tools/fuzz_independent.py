#!/usr/bin/env python3
"""An independent black-box differential fuzzer of polytile (issue 14's second fuzzer).

Written from the public documentation only (README.md, docs/, the docstrings of ``polytile``):
it shares nothing with ``polytile/fuzz/``, so its blind spots differ. Each case is a random
program (multi-stage pipelines with several consumers and outputs, nested reductions, triangular
and data-dependent bounds, gathers, ``where=`` domains, 0-d scalars, ``pt.param`` sizes bound by
arrays or keywords, 1-element, prime and zero-size dimensions, every documented dtype mixed with
casts, integer ``//`` and ``%`` by zero and ``MIN // -1``; in some cases integer ``+ - *`` that
overflow and wrap, and NaN inputs to programs with a float maximum or minimum, both as NumPy
defines them, drawn from a generator of their own so that other cases stay as they were) under
a random sequence of the CPU schedule primitives with random — also nonsensical — arguments,
built for the CPU and run twice
(given outputs pre-filled with a sentinel, then allocated outputs and other parameter values)
against a NumPy reference evaluated from the algorithm with a running error bound per element.
A few cases misuse the public API or the command line instead (bad calls, targets, arguments).

Every case runs in a subprocess of its own and is classified:
  ok              the results match (refused primitives included: a refusal is legal)
  refused         the program was refused at construction (only for deliberately bad ones)
  refused-late    every primitive was accepted, then ``pt.build`` raised a PolytileError
                  (a finding unless the schedule asked for a GPU-only feature: ``late-gpu``)
  wrong           a result differs from the reference beyond the error bound
  crash           the process died of a signal (or exited without a result)
  hang            the case ran past ``--timeout``
  internal        an exception that is not a documented PolytileError escaped polytile, a refused
                  primitive changed the schedule, a bad CLI argument printed a traceback
  invalid         the generator's own fault (a value out of its integer type): not a finding

Usage:
  python tools/fuzz_independent.py --seed 5 --cases 10000 --jobs 28 --timeout 120 --json out.json
  python tools/fuzz_independent.py --seed 5 --case 17          # replay one case, verbose
  python tools/fuzz_independent.py --seed 5 --case 17 --script # print it as a polytile script

Case K of seed S depends on (S, K) and this file alone. Exit status 1 when a finding occurred.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
import traceback

import numpy as np

FINDINGS = ("wrong", "crash", "hang", "internal", "refused-late")
FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("int8", "int16", "int32", "int64", "uint8")
UNIT = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24, "float64": 2.0 ** -53}
# the spacing of subnormals: a product, quotient or function value that underflows is off by up to
# this however small it is (UNIT * |v| alone called float16(0.1614 ** 8) = 8 * 2^-24 wrong by
# 1.7e-8 against a bound of 2e-10: seed 21 case 3004, a fuzzer bug)
TINY = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -133, "float32": 2.0 ** -149, "float64": 2.0 ** -1074}
FMAX = {"float16": 6.0e4, "bfloat16": 1e30, "float32": 1e30, "float64": 1e300}
SIZES = (1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 32, 33)
GPU_ONLY = ("bind", "blockIdx", "threadIdx", "shared", "local", "global", "tensorize", "pipeline")


def irange(dtype: str) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def wrap(v, dtype: str):
    """Integers ``v`` (int64) wrapped into ``dtype`` (two's complement), as NumPy's integer arrays and
    polytile's generated code wrap (int64 arithmetic in NumPy wraps by itself)."""
    if dtype not in INTS or dtype == "int64":
        return v
    bits = np.iinfo(dtype).bits
    v = np.asarray(v, np.int64) & ((1 << bits) - 1)
    return np.where(v >= 1 << (bits - 1), v - (1 << bits), v) if dtype != "uint8" else v


def round_to(dtype: str, v: np.ndarray) -> np.ndarray:
    """Values of float64 ``v`` rounded to ``dtype`` (bfloat16 by round-to-nearest-even on float32)."""
    if dtype == "bfloat16":
        b = np.asarray(v, np.float32).view(np.uint32).astype(np.uint64)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.astype(np.uint32).view(np.float32).astype(np.float64)
    return np.asarray(v).astype(dtype).astype(np.float64)


def promote(a: str, b: str) -> str:
    """The result type of a binary operation (polytile's rule, as documented by its examples)."""
    if a == b:
        return a
    if a == "bool":
        return b
    if b == "bool":
        return a
    fa, fb = a in FLOATS, b in FLOATS
    if fa and fb:
        if {a, b} == {"float16", "bfloat16"}:
            return "float32"
        return max(a, b, key=FLOATS.index)
    if fa or fb:
        return a if fa else b
    width = {"int8": 8, "uint8": 8, "int16": 16, "int32": 32, "int64": 64}
    if "uint8" in (a, b):
        other = b if a == "uint8" else a
        return {"int8": "int16", "int16": "int32", "int32": "int64", "int64": "int64"}[other]
    return a if width[a] >= width[b] else b


# ----------------------------------------------------------------------------------------------
# The program: tensors, stages, expression nodes
# ----------------------------------------------------------------------------------------------

class Node:
    """An expression: ``kind`` with ``args``, its dtype and an interval holding its exact values."""

    def __init__(self, kind, args, dtype, lo, hi, amb=False):
        self.kind, self.args, self.dtype, self.lo, self.hi = kind, args, dtype, float(lo), float(hi)
        self.amb = amb  # a boolean from a float comparison (may flip within rounding)


class Tensor:
    def __init__(self, name, shape, dtype, lo, hi, is_input, **extra):
        self.name, self.shape, self.dtype, self.lo, self.hi = name, shape, dtype, lo, hi
        self.is_input = is_input
        self.extreme = extra.get("extreme", False)
        self.value_range = extra.get("value_range")
        self.monotonic = extra.get("monotonic", False)
        self.body = self.where = self.dtype_kw = self.store_dtype = None
        self.iters: list[str] = []
        self.terminal = False  # not read by other stages (where=, infinities)
        self.readers = 0


class Program:
    def __init__(self):
        self.inputs: list[Tensor] = []
        self.stages: list[Tensor] = []
        self.params: dict[str, tuple[int, int]] = {}   # name -> (value of run 1, of run 2)
        self.param_min: dict[str, int] = {}
        self.keyword_params: list[str] = []
        self.outputs: list[Tensor] = []
        self.malformed = None
        self.missing = None  # the input a "missing input" program leaves out
        self.name = "func"
        self.wraps = False  # integer + - * may overflow their type (and wrap, as NumPy's do)
        self.nans = False  # float inputs hold NaNs (a program with a float maximum or minimum)


def size_max(p: Program, s) -> int:
    return max(p.params[s]) if isinstance(s, str) else s


def size_val(s, pv: dict) -> int:
    return pv[s] if isinstance(s, str) else s


class Gen:
    """Draws one random program."""

    def __init__(self, rng: random.Random, modes: random.Random):
        self.rng = rng
        self.modes = modes  # the draws of the modes (overflow, NaN): cases without them stay as they were
        self.p = Program()
        self.counter = 0
        self.in_reduction = False

    def fresh(self, base):
        self.counter += 1
        return f"{base}{self.counter}"

    # ---- sizes and inputs
    def universe(self):
        r, p = self.rng, self.p
        sizes = [r.choice(SIZES) for _ in range(r.randint(2, 4))]
        if r.random() < 0.05:
            sizes[r.randrange(len(sizes))] = 0
        if r.random() < 0.2:
            name = r.choice(["N", "M", "L"])
            lo = r.choice([1, 2])
            p.params[name] = (r.randint(lo, 12), r.randint(lo, 12))
            p.param_min[name] = lo
            sizes.append(name)
        return sizes

    def make_input(self, shape, kind=None):
        r = self.rng
        kind = kind or r.choices(["float", "int", "bool"], [6, 3, 0.4])[0]
        name = self.fresh(r.choice(["A", "B", "X", "in_", "W"]))
        if kind == "float":
            dt = r.choices(FLOATS, [2, 1.5, 5, 1.5])[0]
            t = Tensor(name, shape, dt, -1.0, 1.0, True)
        elif kind == "bool":
            t = Tensor(name, shape, "bool", 0, 1, True)
        else:
            dt = r.choices(INTS, [2, 1.5, 3, 1.5, 1.5])[0]
            if r.random() < 0.15 or (self.p.wraps and self.modes.random() < 0.7):
                lo, hi = irange(dt)
                t = Tensor(name, shape, dt, lo, hi, True, extreme=True)
            else:
                lo, hi = (0, 12) if dt == "uint8" else (-9, 9)
                t = Tensor(name, shape, dt, lo, hi, True)
        self.p.inputs.append(t)
        return t

    # ---- index expressions
    def index_for(self, S, env):
        """An index node into a dimension of size ``S`` from the variables in ``env``, or None."""
        r, p = self.rng, self.p
        cands = []
        for name, m in env:
            if isinstance(S, str):
                if m == ("sym", S):
                    cands += [f"{name}", f"{S} - 1 - {name}"]
                continue
            if S <= 0:
                continue
            if isinstance(m, tuple):
                cands.append(f"{name} % {S}")
                continue
            if m <= S - 1:
                cands += [name, name, f"{S - 1} - {name}"]
            if m + 1 <= S - 1:
                cands.append(f"{name} + 1")
            if 2 * m <= S - 1:
                cands.append(f"2 * {name}")
            if m // 2 <= S - 1:
                cands.append(f"{name} // 2")
            cands.append(f"{name} % {S}")
        if not isinstance(S, str) and S > 0:
            cands.append(str(r.randrange(S)))
        if isinstance(S, str) and self.p.param_min.get(S, 0) >= 1 and r.random() < 0.3:
            cands.append("0")
        if not cands:
            return None
        src = r.choice(cands)
        return Node("ix", src, "int64", 0, size_max(p, S) if not isinstance(S, str) else max(p.params[S]))

    def gather_index(self, S, env):
        """A load of an index array (value_range-declared) as the index into size ``S``."""
        r = self.rng
        if isinstance(S, str) or S <= 0:
            return None
        ints = [(n, m) for n, m in env if not isinstance(m, tuple)]
        if not ints:
            return None
        name, m = r.choice(ints)
        dt = r.choice(["int32", "int64"])
        t = Tensor(self.fresh("idx"), [m + 1], dt, 0, S - 1, True, value_range=(0, S - 1))
        self.p.inputs.append(t)
        return Node("load", (t, [Node("ix", name, "int64", 0, m)]), dt, 0, S - 1)

    # ---- expressions
    def load(self, env, want=None, allow_stage=True):
        r = self.rng
        pool = list(self.p.inputs) + ([s for s in self.p.stages if not s.terminal] if allow_stage else [])
        pool = [t for t in pool if t.value_range is None and t.dtype not in ("int32", "int64") or not t.value_range]
        if want == "float":
            pool = [t for t in pool if t.dtype in FLOATS]
        elif want == "bool":
            pool = [t for t in pool if t.dtype == "bool"]
        else:
            pool = [t for t in pool if t.dtype != "bool"]
        r.shuffle(pool)
        pool.sort(key=lambda t: 0 if (not t.is_input and r.random() < 0.7) else 1)
        for t in pool[:6]:
            idx = []
            for S in t.shape:
                ix = None
                if r.random() < 0.06:
                    ix = self.gather_index(S, env)
                ix = ix or self.index_for(S, env)
                if ix is None:
                    break
                idx.append(ix)
            else:
                if not t.is_input:
                    t.readers += 1
                return Node("load", (t, idx), t.dtype, t.lo, t.hi)
        return None

    def const(self, dtype):
        r = self.rng
        if dtype in FLOATS:
            v = r.choice([0.5, 2.0, -1.5, 0.25, 3.0, 1.0])
            return Node("const", v, dtype, v, v)
        if dtype == "bool":
            return None
        lo, hi = irange(dtype)
        v = r.choice([0, 1, 2, 3, -1, -2, 7, -5])
        v = min(max(v, lo), hi)
        return Node("const", v, dtype, v, v)

    def leaf(self, env, want):
        r = self.rng
        x = self.load(env, want) if r.random() < 0.85 else None
        if x is None and want != "bool":
            if env and r.random() < 0.5 and want != "float":
                name, m = r.choice(env)
                hi = m if not isinstance(m, tuple) else max(self.p.params[m[1]]) - 1
                return Node("ix", name, "int64", 0, hi)
            x = self.const(r.choice(["float32", "int64"]) if want is None else
                           ("float32" if want == "float" else "int64"))
        return x

    def fits(self, dtype, lo, hi):
        if dtype in FLOATS:
            return max(abs(lo), abs(hi)) <= FMAX[dtype] / 4
        if dtype == "bool":
            return True
        a, b = irange(dtype)
        return a <= lo and hi <= b

    def cast(self, x, dtype):
        return Node("cast", (dtype, x), dtype, x.lo, x.hi)

    def widen(self, x, y, lo, hi):
        """Cast both integer operands to a signed type wide enough for [lo, hi], or None."""
        for dt in ("int16", "int32", "int64"):
            a, b = irange(dt)
            if a <= lo and hi <= b and a <= min(x.lo, y.lo) and max(x.hi, y.hi) <= b:
                return self.cast(x, dt), self.cast(y, dt)
        return None

    def combine(self, x, y):
        """The type of an operation on ``x`` and ``y``: a Python number takes its partner's type
        (a float one makes an integer partner float32), or None where it does not fit that type."""
        if (x.kind == "const") == (y.kind == "const"):
            return promote(x.dtype, y.dtype)
        c, o = (x, y) if x.kind == "const" else (y, x)
        if isinstance(c.args, float) and o.dtype not in FLOATS:
            return "float32"
        if o.dtype in INTS and not self.fits(o.dtype, c.args, c.args):
            return None
        return o.dtype

    def binary(self, op, x, y):
        if x.kind == "const" and y.kind == "const":  # Python would fold two numbers itself
            return None
        dt = self.combine(x, y)
        if dt is None:
            return None
        ends = [(a, b) for a in (x.lo, x.hi) for b in (y.lo, y.hi)]
        if op == "+":
            lo, hi = x.lo + y.lo, x.hi + y.hi
        elif op == "-":
            lo, hi = x.lo - y.hi, x.hi - y.lo
        elif op == "*":
            vals = [a * b for a, b in ends]
            lo, hi = min(vals), max(vals)
        elif op in ("max", "min"):
            f = max if op == "max" else min
            lo, hi = f(x.lo, y.lo), f(x.hi, y.hi)
        elif op == "/":
            if not (y.lo >= 0.5 or y.hi <= -0.5):
                return None
            vals = [a / b for a, b in ends]
            lo, hi = min(vals), max(vals)
        elif op in ("//", "%"):
            m = max(abs(x.lo), abs(x.hi))
            lo, hi = (-m, m) if op == "//" else (-max(abs(y.lo), abs(y.hi)), max(abs(y.lo), abs(y.hi)))
            if op == "//":  # MIN // -1 wraps to MIN: stays inside the type by the documented rule
                a, b = irange(dt)
                lo, hi = max(lo, a), min(hi, b)
        else:
            raise AssertionError(op)
        if dt in INTS and op not in ("//", "%") and not self.fits(dt, lo, hi) and self.p.wraps and \
                self.modes.random() < 0.8:
            lo, hi = irange(dt)  # overflows and wraps (polytile's rule and NumPy's)
        if dt in INTS and op not in ("//", "%") and not self.fits(dt, lo, hi):
            w = self.widen(x, y, lo, hi)
            if w is None:
                return None
            x, y = w
            dt = promote(x.dtype, y.dtype)
        if not self.fits(dt, lo, hi):
            return None
        return Node("bin", (op, x, y), dt, lo, hi)

    def expr(self, env, depth, want=None):
        r = self.rng
        if depth <= 0 or r.random() < 0.25:
            return self.leaf(env, want)
        if want == "bool":
            return self.cond(env, depth)
        choice = r.choices(["bin", "intdiv", "call", "cast", "select", "neg", "red"],
                           [6, 1.5, 2, 1, 1.5, 0.7, 1.2])[0]
        if choice == "red" and self.in_reduction:
            choice = "bin"
        if choice == "red":
            x = self.reduction(env, depth - 1, want)
        elif choice == "bin":
            x, y = self.expr(env, depth - 1, want), self.expr(env, depth - 1, want)
            if x is None or y is None:
                return x or y
            op = r.choice(["+", "-", "*", "max", "min", "/"])
            if op == "/" and (x.dtype not in FLOATS and y.dtype not in FLOATS):
                op = "+"
            if op == "/" and not (y.lo >= 0.5 or y.hi <= -0.5):
                y = self.call1("abs", y)
                y = self.binary("+", y, Node("const", 1.0, y.dtype if y.dtype in FLOATS else "float32", 1, 1))
                if y is None:
                    return x
            z = self.binary(op, x, y)
            x = z if z is not None else x
        elif choice == "intdiv":
            x = self.load(env, None) or self.leaf(env, None)
            if x is None or x.dtype in FLOATS or x.dtype == "bool":
                return x
            if r.random() < 0.5:
                y = Node("const", r.choice([0, -1, 1, 2, 3, -3, 7]), x.dtype, 0, 0)
                y.lo = y.hi = y.args
            else:
                y = self.load(env, None)
                if y is None or y.dtype in FLOATS or y.dtype == "bool":
                    return x
            z = self.binary(r.choice(["//", "%"]), x, y)
            x = z if z is not None else x
        elif choice == "call":
            x = self.expr(env, depth - 1, None)
            if x is None or x.dtype == "bool":
                return x
            x = self.math(x)
        elif choice == "cast":
            x = self.expr(env, depth - 1, None)
            if x is None or x.dtype == "bool":
                return x
            if x.dtype in FLOATS:
                dt = r.choice(FLOATS)
            else:
                dt = r.choice(FLOATS + ("int32", "int64", "int16"))
            if self.fits(dt, x.lo, x.hi) and not (dt == "float16" and max(abs(x.lo), abs(x.hi)) > 2048):
                x = self.cast(x, dt)
        elif choice == "neg":
            x = self.expr(env, depth - 1, want)
            if x is not None and x.dtype != "bool":
                x = self.binary("-", Node("const", 0 if x.dtype in INTS else 0.0, x.dtype, 0, 0), x) or x
        else:
            c = self.cond(env, depth - 1)
            a, b = self.expr(env, depth - 1, want), self.expr(env, depth - 1, want)
            if c is None or a is None or b is None or "bool" in (a.dtype, b.dtype):
                return a or b
            dt = self.combine(a, b)
            if dt is None or not self.fits(dt, min(a.lo, b.lo), max(a.hi, b.hi)):
                return a
            x = Node("select", (c, a, b), dt, min(a.lo, b.lo), max(a.hi, b.hi))
        if x is not None and want == "float" and x.dtype not in FLOATS and x.dtype != "bool":
            x = self.cast(x, "float32")
        return x

    def math(self, x):
        r = self.rng
        if x.dtype in INTS and x.lo <= irange(x.dtype)[0]:
            x = self.cast(x, "float64")  # abs(MIN) is MIN: keep NaNs from sqrt out of the program
        fdt = x.dtype if x.dtype in FLOATS else "float32"
        m = max(abs(x.lo), abs(x.hi))
        f = r.choice(["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "abs", "pow"])
        if f == "exp":
            if x.hi > 8 or x.dtype not in FLOATS and x.hi > 8:
                f = "tanh"
            else:
                return Node("call", ("exp", x), fdt, math.exp(x.lo), math.exp(x.hi))
        if f in ("tanh", "sigmoid", "erf"):
            return Node("call", (f, x), fdt, -1, 1)
        if f == "abs":
            return self.call1("abs", x)
        a = self.call1("abs", x)
        if f == "sqrt":
            return Node("call", ("sqrt", a), fdt, 0, math.sqrt(m))
        one = Node("const", 1.0 if a.dtype in FLOATS else 1, a.dtype, 1, 1)
        a1 = self.binary("+", a, one)
        if a1 is None:
            return x
        if f == "log":
            return Node("call", ("log", a1), fdt, 0, math.log(m + 1))
        if f == "rsqrt":
            return Node("call", ("rsqrt", a1), fdt, 0, 1)
        e = r.choice([2, 3, 0.5])
        hi = (m + 1) ** e
        if hi > 1000:
            return x
        return Node("call", ("pow", a1, e), fdt, 1, hi)

    def call1(self, f, x):
        if f == "abs":  # abs(MIN) == MIN, as NumPy's: an integer type's MIN stays in the interval
            if x.dtype in INTS and x.lo <= irange(x.dtype)[0]:
                return Node("call", ("abs", x), x.dtype, irange(x.dtype)[0], irange(x.dtype)[1])
            return Node("call", ("abs", x), x.dtype, 0, max(abs(x.lo), abs(x.hi)))
        raise AssertionError(f)

    def cond(self, env, depth):
        r = self.rng
        k = r.random()
        if k < 0.4 and env:
            (a, _), (b, _) = r.choice(env), r.choice(env)
            op = r.choice(["<", "<=", ">", ">=", "=="])
            rhs = r.choice([b, f"{b} + 1", str(r.randint(0, 4)), f"{r.randint(1, 5)} - {b}"])
            return Node("ixcmp", f"({a}) {op} ({rhs})", "bool", 0, 1)
        if k < 0.5 and env:
            a, _ = r.choice(env)
            return Node("ixcmp", f"({a} % {r.randint(2, 4)}) {r.choice(['<', '=='])} 1", "bool", 0, 1)
        if k < 0.6:
            x = self.load(env, "bool")
            if x is not None:
                return x
        x, y = self.expr(env, depth - 1), self.expr(env, depth - 1)
        if x is None or y is None or "bool" in (x.dtype, y.dtype):
            return None
        amb = x.dtype in FLOATS or y.dtype in FLOATS
        c = Node("cmp", (r.choice(["<", "<=", ">", ">=", "!="]), x, y), "bool", 0, 1, amb)
        if r.random() < 0.2:
            d = self.cond(env, depth - 1)
            if d is not None:
                c = Node("bool", (r.choice(["&", "|"]), c, d), "bool", 0, 1, c.amb or d.amb)
        elif r.random() < 0.1:
            c = Node("not", c, "bool", 0, 1, c.amb)
        return c

    def reduction(self, env, depth, want):
        """A sum/max/min/prod over one or two new reduce axes (constant, triangular or CSR bounds)."""
        r, p = self.rng, self.p
        axes, env2 = [], list(env)
        kind_bounds = []
        for _ in range(r.choice([1, 1, 1, 2])):
            name = self.fresh("k")
            int_env = [(n, m) for n, m in env2 if not isinstance(m, tuple)]
            how = r.choices(["const", "tri", "data", "sym"], [5, 2, 1.2, 0.6 if p.params else 0])[0]
            if how == "tri" and int_env:
                v, m = r.choice(int_env)
                if r.random() < 0.5:
                    b = ("tri", "0", f"{v} + 1")
                else:
                    b = ("tri", v, str(m + 1))
                env2.append((name, m))
            elif how == "data" and int_env:
                v, m = r.choice(int_env)
                S = r.choice([s for s in SIZES if s <= 17] + [0])
                off = Tensor(self.fresh("off"), [m + 2], r.choice(["int32", "int64"]), 0, S, True,
                             value_range=(0, S), monotonic=True)
                p.inputs.append(off)
                lo = Node("load", (off, [Node("ix", v, "int64", 0, m)]), off.dtype, 0, S)
                hi = Node("load", (off, [Node("ix", f"{v} + 1", "int64", 0, m + 1)]), off.dtype, 0, S)
                b = ("data", lo, hi)
                env2.append((name, S - 1 if S > 0 else 0))
                if S == 0:
                    return None
            elif how == "sym":
                P = r.choice(list(p.params))
                b = ("sym", P)
                env2.append((name, ("sym", P)))
            else:
                e = r.choice([1, 2, 3, 5, 7, 8, 13, 16])
                if r.random() < 0.03:
                    e = 0
                b = ("const", e)
                env2.append((name, max(e - 1, 0)))
                if e == 0:
                    env2[-1] = (name, 0)
            axes.append(name)
            kind_bounds.append(b)
        self.in_reduction = True
        body = self.expr(env2, depth, want if want != "bool" else None)
        self.in_reduction = False
        if body is None or body.dtype == "bool":
            return None
        kind = r.choices(["sum", "max", "min", "prod"], [5, 2, 2, 0.7])[0]
        may_empty = any(b[0] in ("tri", "data") and b[1] != "0" or b[0] == "sym" or b == ("const", 0)
                        for b in kind_bounds) or any(b[0] == "data" for b in kind_bounds)
        where = None
        if r.random() < 0.25:
            where = self.cond([(a, m) for a, m in env2], 0)
            if where is not None and where.amb:
                where = None
            may_empty = may_empty or where is not None
        if may_empty and kind in ("max", "min") and body.dtype not in FLOATS:
            kind = "sum"
        n = 1
        for b in kind_bounds:
            n *= b[1] if b[0] == "const" else 12 if b[0] == "sym" else 33
        m = max(abs(body.lo), abs(body.hi))
        if kind == "sum":
            lo, hi = min(0, body.lo) * n, max(0, body.hi) * n
        elif kind == "prod":
            if m > 2 or n > 8:
                kind = "sum"
                lo, hi = min(0, body.lo) * n, max(0, body.hi) * n
            else:
                lo, hi = -max(m, 1) ** n, max(m, 1) ** n
        else:
            lo, hi = body.lo, body.hi
        dt = body.dtype
        if dt in INTS and kind in ("sum", "prod") and not self.fits(dt, lo, hi) and self.p.wraps and \
                self.modes.random() < 0.8:
            lo, hi = irange(dt)  # the sum overflows its type and wraps
        if not self.fits(dt, lo, hi):
            if dt in INTS:
                for w in ("int32", "int64"):
                    if self.fits(w, lo, hi):
                        body, dt = self.cast(body, w), w
                        break
                else:
                    return None
            else:
                return None
        node = Node("red", (kind, body, list(zip(axes, kind_bounds)), where), dt, lo, hi)
        node.may_inf = may_empty and kind in ("max", "min")
        return node

    # ---- stages
    def stage(self, sizes, idx):
        r = self.rng
        rank = r.choices([0, 1, 2, 3], [0.6, 3, 4, 1.5])[0]
        shape = [r.choice(sizes) for _ in range(rank)]
        names = r.sample(["i", "j", "l", "m", "n_", "x", "y", "z", "h", "w"], rank)
        if r.random() < 0.05 and rank:
            names[0] = r.choice(["int", "new", "A1", "double", "k1"])  # loop names C++ cannot use
        env = []
        for nm, S in zip(names, shape):
            env.append((nm, ("sym", S) if isinstance(S, str) else max(S - 1, 0)))
        want = r.choice([None, None, "float"])
        body = None
        for _ in range(4):
            if rank == 0 or r.random() < 0.25:
                body = self.reduction(env, r.randint(1, 3), want)
            else:
                body = self.expr(env, r.randint(1, 3), want)
            if body is not None and body.dtype != "bool" or body is not None and r.random() < 0.3:
                break
        if body is None:
            return None
        name = self.fresh(r.choice(["C", "T", "S", "out", "D"]))
        t = Tensor(name, shape, body.dtype, body.lo, body.hi, False)
        t.iters, t.body = names, body
        if getattr(body, "may_inf", False) or self.contains_inf(body):
            t.terminal = True
        if r.random() < 0.15 and body.dtype != "bool":
            dt = r.choice(FLOATS + ("int32", "int64"))
            ok = self.fits(dt, body.lo, body.hi) and (dt in FLOATS or body.dtype not in FLOATS)
            if ok and not (dt == "float16" and max(abs(body.lo), abs(body.hi)) > 2048):
                t.dtype_kw = dt
                t.dtype = dt
        if (body.kind == "red" and body.dtype in ("float32", "float64") and not t.dtype_kw
                and r.random() < 0.25 and max(abs(body.lo), abs(body.hi)) < 2048):
            t.store_dtype = r.choice(["float16", "bfloat16", "float32"])
            t.dtype = t.store_dtype
        if rank and r.random() < 0.2:
            w = self.cond(env, 1)
            if w is not None and not w.amb:
                t.where = w
                t.terminal = True
        return t

    def contains_inf(self, node):
        if not isinstance(node, Node):
            return False
        if getattr(node, "may_inf", False):
            return True
        args = node.args if isinstance(node.args, (tuple, list)) else [node.args]
        for a in args:
            if isinstance(a, Node) and self.contains_inf(a):
                return True
            if isinstance(a, (list, tuple)):
                for b in a:
                    if isinstance(b, Node) and self.contains_inf(b):
                        return True
        return False

    @staticmethod
    def float_minmax(p):
        """Whether a stage of ``p`` takes a float maximum or minimum (elementwise or a reduction)."""
        def walk(n):
            if isinstance(n, Node):
                if n.dtype in FLOATS and ((n.kind == "bin" and n.args[0] in ("max", "min")) or
                                          (n.kind == "red" and n.args[0] in ("max", "min"))):
                    return True
                args = n.args if isinstance(n.args, (list, tuple)) else [n.args]
                return any(walk(a) for a in args)
            if isinstance(n, (list, tuple)):
                return any(walk(a) for a in n)
            return False
        return any(walk(s.body) for s in p.stages)

    def program(self):
        r, p = self.rng, self.p
        p.wraps = self.modes.random() < 0.3
        sizes = self.universe()
        for _ in range(r.randint(1, 3)):
            self.make_input([r.choice(sizes) for _ in range(r.choice([1, 1, 2, 2, 3]))])
        if r.random() < 0.15:  # an integer division stress stage over extreme values
            shape = [r.choice(sizes)]
            a = self.make_input(shape, "int")
            b = self.make_input(shape, "int")
            a.extreme = True
            a.lo, a.hi = irange(a.dtype)
            b.extreme = True
            b.lo, b.hi = irange(b.dtype)
        for i in range(r.randint(1, 5)):
            t = self.stage(sizes, i)
            if t is not None:
                p.stages.append(t)
        if not p.stages:
            return None
        outs = [s for s in p.stages if s.readers == 0 or r.random() < 0.25]
        p.outputs = outs
        p.name = r.choice(["func", "kernel_a", "fz", "main_fn"])
        used = set()
        reads = {}  # stage name -> names of the tensors it reads

        def walk(n):
            if isinstance(n, Node):
                if n.kind == "load":
                    used.add(n.args[0].name)
                    reads[current].add(n.args[0].name)
                    for ix in n.args[1]:
                        walk(ix)
                args = n.args if isinstance(n.args, (list, tuple)) else [n.args]
                for a in args:
                    walk(a)
            elif isinstance(n, (list, tuple)):
                for a in n:
                    walk(a)
        for s in p.stages:
            current = s.name
            reads[current] = set()
            walk(s.body)
            walk(s.where)
        p.inputs = [t for t in p.inputs if t.name in used]
        # the stages the outputs need (a stage no output reads is not part of the Func: polytile
        # never sees it, so an input only it reads is not missing when left out)
        live, todo = set(), [t.name for t in p.outputs]
        while todo:
            name = todo.pop()
            if name not in live:
                live.add(name)
                todo += [x for x in reads.get(name, ()) if x in reads]
        needed = [t.name for t in p.inputs if any(t.name in reads[s] for s in live)]
        for prm in list(p.params):
            if not any(prm in map(str, t.shape) for t in p.inputs + p.stages):
                if r.random() < 0.5:
                    p.keyword_params.append(prm)
        # NaN inputs where a float maximum or minimum (elementwise or a reduction) must propagate them
        if any(t.dtype in FLOATS for t in p.inputs) and self.float_minmax(p) and self.modes.random() < 0.5:
            p.nans = True
        if r.random() < 0.03 and p.inputs:  # deliberately malformed: an input listed twice
            p.malformed = "duplicate input"
        elif r.random() < 0.03 and len(p.inputs) > 1 and needed:
            p.malformed = "missing input"
            p.missing = needed[0]
        return p


# ----------------------------------------------------------------------------------------------
# polytile construction (and its source text)
# ----------------------------------------------------------------------------------------------

class PTBuild:
    def __init__(self, pt, prog: Program):
        self.pt, self.prog = pt, prog
        self.tensors = {}
        self.params = {name: pt.param(name) for name in prog.params}
        self.lines = ["import numpy as np", "import polytile as pt"]
        for name in prog.params:
            self.lines.append(f"{name} = pt.param({name!r})")

    def shape_src(self, shape):
        return "(" + "".join(f"{s}, " for s in shape) + ")"

    def shape_pt(self, shape):
        return tuple(self.params[s] if isinstance(s, str) else s for s in shape)

    def build_inputs(self):
        pt = self.pt
        for t in self.prog.inputs:
            kw, kws = {}, ""
            if t.value_range is not None:
                kw["value_range"] = t.value_range
                kws += f", value_range={t.value_range}"
            if t.monotonic:
                kw["monotonic"] = True
                kws += ", monotonic=True"
            self.tensors[t.name] = pt.placeholder(self.shape_pt(t.shape), t.dtype, t.name, **kw)
            self.lines.append(f"{t.name} = pt.placeholder({self.shape_src(t.shape)}, {t.dtype!r}, {t.name!r}{kws})")

    def to_pt(self, n: Node, env):
        """The polytile expression of ``n``; its dtype must be the one the generator expects."""
        e = self._to_pt(n, env)
        got = str(getattr(e, "dtype", None)) if not isinstance(e, (int, float)) else None
        if got is not None and n.kind not in ("ix", "ixcmp") and got != n.dtype:
            raise Invalid(f"typing: {self.src(n)} is {got} in polytile, {n.dtype} in the generator")
        return e

    def _to_pt(self, n: Node, env):
        pt, k = self.pt, n.kind
        if k == "ix" or k == "ixcmp":
            return eval(n.args, {}, {**self.params, **env})
        if k == "const":
            return n.args
        if k == "load":
            t, idx = n.args
            ts = self.tensors[t.name]
            if not idx:
                return ts[()]
            return ts[tuple(self.to_pt(i, env) for i in idx)]
        if k == "bin":
            op, a, b = n.args
            x, y = self.to_pt(a, env), self.to_pt(b, env)
            if op == "max":
                return pt.maximum(x, y)
            if op == "min":
                return pt.minimum(x, y)
            return {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y, "/": lambda: x / y,
                    "//": lambda: x // y, "%": lambda: x % y}[op]()
        if k == "call":
            f, *args = n.args
            xs = [self.to_pt(a, env) if isinstance(a, Node) else a for a in args]
            return getattr(pt, f)(*xs)
        if k == "cast":
            return pt.cast(n.args[0], self.to_pt(n.args[1], env))
        if k == "select":
            c, a, b = n.args
            return pt.select(self.to_pt(c, env), self.to_pt(a, env), self.to_pt(b, env))
        if k == "cmp":
            op, a, b = n.args
            x, y = self.to_pt(a, env), self.to_pt(b, env)
            return {"<": lambda: x < y, "<=": lambda: x <= y, ">": lambda: x > y, ">=": lambda: x >= y,
                    "!=": lambda: x != y}[op]()
        if k == "bool":
            op, a, b = n.args
            x, y = self.to_pt(a, env), self.to_pt(b, env)
            return x & y if op == "&" else x | y
        if k == "not":
            return ~self.to_pt(n.args, env)
        if k == "red":
            kind, body, axes, where = n.args
            env2 = dict(env)
            ivs = []
            for name, b in axes:
                if b[0] == "const":
                    ext = b[1]
                elif b[0] == "sym":
                    ext = self.params[b[1]]
                elif b[0] == "tri":
                    ext = (eval(b[1], {}, env2), eval(b[2], {}, env2))
                else:
                    ext = (self.to_pt(b[1], env2), self.to_pt(b[2], env2))
                iv = pt.reduce_axis(ext, name)
                env2[name] = iv
                ivs.append(iv)
            w = self.to_pt(where, env2) if where is not None else None
            return getattr(pt, kind)(self.to_pt(body, env2), axis=ivs if len(ivs) > 1 else ivs[0], where=w)
        raise AssertionError(k)

    def src(self, n: Node) -> str:
        k = n.kind
        if k in ("ix", "ixcmp"):
            return f"({n.args})"
        if k == "const":
            return repr(n.args)
        if k == "load":
            t, idx = n.args
            return f"{t.name}[{', '.join(self.src(i) for i in idx) if idx else '()'}]"
        if k == "bin":
            op, a, b = n.args
            if op in ("max", "min"):
                return f"pt.{op}imum({self.src(a)}, {self.src(b)})"
            return f"({self.src(a)} {op} {self.src(b)})"
        if k == "call":
            f, *args = n.args
            return f"pt.{f}({', '.join(self.src(a) if isinstance(a, Node) else repr(a) for a in args)})"
        if k == "cast":
            return f"pt.cast({n.args[0]!r}, {self.src(n.args[1])})"
        if k == "select":
            return f"pt.select({', '.join(self.src(a) for a in n.args)})"
        if k in ("cmp", "bool"):
            op, a, b = n.args
            return f"({self.src(a)} {op} {self.src(b)})"
        if k == "not":
            return f"~{self.src(n.args)}"
        if k == "red":
            kind, body, axes, where = n.args
            ax = "[" + ", ".join(name for name, _ in axes) + "]"
            w = f", where={self.src(where)}" if where is not None else ""
            return f"pt.{kind}({self.src(body)}, axis={ax}{w})"
        raise AssertionError(k)

    def axes_src(self, n) -> list[str]:
        """The statements defining the reduce axes of the reductions in ``n``, outermost first."""
        if isinstance(n, (list, tuple)):
            return [line for a in n for line in self.axes_src(a)]
        if not isinstance(n, Node):
            return []
        out = []
        if n.kind == "red":
            for name, b in n.args[2]:
                if b[0] in ("const", "sym"):
                    ext = str(b[1])
                elif b[0] == "tri":
                    ext = f"({b[1]}, {b[2]})"
                else:
                    ext = f"({self.src(b[1])}, {self.src(b[2])})"
                out.append(f"{name} = pt.reduce_axis({ext}, {name!r})")
        return out + self.axes_src(n.args)

    def build_stage(self, t: Tensor):
        pt = self.pt
        names = t.iters

        def named(node):  # a lambda whose arguments carry the loop names
            fn = lambda *its: self.to_pt(node, dict(zip(names, its)))  # noqa: E731
            return eval(f"lambda {', '.join(names)}: fn({', '.join(names)}{',' if len(names) == 1 else ''})",
                        {"fn": fn})
        fn = named(t.body)
        kw, kws = {}, ""
        if t.where is not None:
            kw["where"] = named(t.where)
            kws += f", where=lambda {', '.join(names)}: {self.src(t.where)}"
        if t.dtype_kw:
            kw["dtype"] = t.dtype_kw
            kws += f", dtype={t.dtype_kw!r}"
        if t.store_dtype:
            kw["store_dtype"] = t.store_dtype
            kws += f", store_dtype={t.store_dtype!r}"
        axes = self.axes_src(t.body)
        if axes:  # reduce axes whose bounds read the loop variables are made inside the function
            self.lines.append(f"def {t.name}_fn({', '.join(names)}):")
            self.lines += [f"    {line}" for line in axes] + [f"    return {self.src(t.body)}"]
            self.lines.append(f"{t.name} = pt.compute({self.shape_src(t.shape)}, {t.name}_fn, {t.name!r}{kws})")
        else:
            self.lines.append(f"{t.name} = pt.compute({self.shape_src(t.shape)}, lambda {', '.join(names)}: "
                              f"{self.src(t.body)}, {t.name!r}{kws})")
        ts = pt.compute(self.shape_pt(t.shape), fn, t.name, **kw)
        if t.body.kind == "const" and not t.dtype_kw and not t.store_dtype:  # a bare number: polytile's type
            t.dtype = str(ts.dtype)
        elif str(ts.dtype) != t.dtype and not t.store_dtype:
            raise Invalid(f"typing: {t.name} is {ts.dtype} in polytile, {t.dtype} in the generator")
        self.tensors[t.name] = ts
        return ts

    def build_func(self):
        pt, prog = self.pt, self.prog
        self.build_inputs()
        for t in prog.stages:
            self.build_stage(t)
        ins = [self.tensors[t.name] for t in prog.inputs]
        names = [t.name for t in prog.inputs]
        if prog.malformed == "duplicate input":
            ins, names = ins + ins[:1], names + names[:1]
        elif prog.malformed == "missing input":
            k = names.index(prog.missing)
            ins, names = ins[:k] + ins[k + 1:], names[:k] + names[k + 1:]
        outs = [self.tensors[t.name] for t in prog.outputs]
        cons = [self.params[n] >= prog.param_min[n] for n in prog.params]
        cs = ", ".join(f"{n} >= {prog.param_min[n]}" for n in prog.params)
        self.lines.append(f"f = pt.Func([{', '.join(names)}], [{', '.join(t.name for t in prog.outputs)}], "
                          f"constraints=[{cs}], name={prog.name!r})")
        return pt.Func(ins, outs, constraints=cons, name=prog.name)


# ----------------------------------------------------------------------------------------------
# The NumPy reference: values and error bounds
# ----------------------------------------------------------------------------------------------

class Invalid(Exception):
    """The generator's fault (a value outside its integer type): the case says nothing."""


def int_floordiv(a, b, dtype):
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    with np.errstate(all="ignore"):
        safe = np.where(b == 0, 1, b)
        lo, hi = irange(dtype)
        q = np.where(b == 0, 0, np.floor_divide(a, safe))
        q = np.where((a == lo) & (b == -1), lo, q)
        if dtype == "int64":  # int64 MIN // -1 overflows numpy's own division too
            q = np.where((a == lo) & (b == -1), lo, q)
    return q


def int_mod(a, b, dtype):
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    with np.errstate(all="ignore"):
        safe = np.where((b == 0) | (b == -1), 1, b)
        m = np.where((b == 0) | (b == -1), 0, np.mod(a, safe))
    return m


class Ref:
    """Evaluates the program on concrete inputs: per stage (value float64/int64, error bound)."""

    def __init__(self, prog: Program, data: dict, pv: dict):
        self.prog, self.pv = prog, pv
        self.vals = {}
        for t in prog.inputs:
            a = data[t.name]
            self.vals[t.name] = (a.astype(np.float64) if t.dtype in FLOATS else a.astype(np.int64),
                                 np.zeros(a.shape) if t.dtype in FLOATS else None)

    def stage(self, t: Tensor):
        shape = [size_val(s, self.pv) for s in t.shape]
        nred = self.count_axes(t.body) + (self.count_axes(t.where) if t.where else 0)
        nd = len(shape) + nred
        env = {}
        for d, (nm, n) in enumerate(zip(t.iters, shape)):
            sh = [1] * nd
            sh[d] = n
            env[nm] = np.arange(n, dtype=np.int64).reshape(sh)
        self.slot = len(shape)
        self.nd = nd
        self.base = shape
        v, e, amb = self.ev(t.body, env)
        v = np.broadcast_to(v, shape + [1] * nred).reshape(shape)
        dt = t.dtype
        if e is not None:
            e = np.broadcast_to(e, shape + [1] * nred).reshape(shape)
        if t.dtype_kw:
            v, e = self.do_cast(t.body.dtype, dt, v, e)
        if dt in FLOATS:
            with np.errstate(all="ignore"):
                e = e + UNIT[dt] * np.abs(v) + TINY[dt]
        elif dt != "bool":
            lo, hi = irange(dt)
            if v.size and (v.min() < lo or v.max() > hi):
                raise Invalid(f"{t.name} leaves {dt}")
        mask = None
        if t.where is not None:
            self.slot = len(shape)
            w, _, _ = self.ev(t.where, env)
            mask = np.broadcast_to(w, shape + [1] * nred).reshape(shape).astype(bool)
        self.vals[t.name] = (v, e)
        return v, e, mask

    def count_axes(self, n):
        if not isinstance(n, Node):
            if isinstance(n, (list, tuple)):
                return sum(self.count_axes(a) for a in n)
            return 0
        c = len(n.args[2]) if n.kind == "red" else 0
        args = n.args if isinstance(n.args, (list, tuple)) else [n.args]
        return c + sum(self.count_axes(a) for a in args)

    def do_cast(self, src, dt, v, e):
        if dt in FLOATS:
            v = v.astype(np.float64)
            e = (e if e is not None else np.zeros(v.shape)) + UNIT[dt] * np.abs(v) + TINY[dt]
            return v, e
        if src in FLOATS:
            raise Invalid("float to int cast")
        return wrap(v, dt), None

    def ev(self, n: Node, env):
        """(value, error bound or None for exact integers/booleans, ambiguous-boolean mask or None)."""
        k = n.kind
        if k in ("ix", "ixcmp"):
            v = eval(n.args, {}, {**self.pv, **env})
            return np.asarray(v, np.int64 if k == "ix" else bool), None, None
        if k == "const":
            if n.dtype in FLOATS:
                v = float(n.args)
                return np.asarray(v), np.asarray(UNIT[n.dtype] * abs(v)), None
            return np.asarray(n.args, np.int64), None, None
        if k == "load":
            t, idx = n.args
            val, err = self.vals[t.name]
            if not idx:
                return val.reshape([1] * self.nd) if val.ndim == 0 else val, \
                    (err.reshape([1] * self.nd) if err is not None else None), None
            ixs = [np.asarray(self.ev(i, env)[0], np.int64) for i in idx]
            ixs = np.broadcast_arrays(*ixs)
            if val.size == 0:
                z = np.zeros(ixs[0].shape)
                return z, (z if err is not None else None), None
            cl = tuple(np.clip(ix, 0, s - 1) for ix, s in zip(ixs, val.shape))
            return val[cl], (err[cl] if err is not None else None), None
        if k == "cast":
            dt, a = n.args
            v, e, _ = self.ev(a, env)
            if dt in FLOATS:
                # the magnitude as a float: np.abs of int64's MIN is MIN, a negative bound (1130)
                v = v.astype(np.float64)
                return v, (e if e is not None else 0) + UNIT[dt] * np.abs(v), None
            return wrap(v, dt), None, None
        if k == "bin":
            op, a, b = n.args
            x, ex, _ = self.ev(a, env)
            y, ey, _ = self.ev(b, env)
            dt = n.dtype
            if dt not in FLOATS:
                x, y = np.asarray(x, np.int64), np.asarray(y, np.int64)
                with np.errstate(all="ignore"):
                    v = {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y,
                         "max": lambda: np.maximum(x, y), "min": lambda: np.minimum(x, y),
                         "//": lambda: int_floordiv(x, y, dt), "%": lambda: int_mod(x, y, dt)}[op]()
                return wrap(v, dt), None, None
            x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
            ex = np.asarray(ex if ex is not None else 0.0)
            ey = np.asarray(ey if ey is not None else 0.0)
            if a.dtype not in FLOATS:
                ex = ex + UNIT[dt] * np.abs(x)
            if b.dtype not in FLOATS:
                ey = ey + UNIT[dt] * np.abs(y)
            u = UNIT[dt]
            with np.errstate(all="ignore"):
                if op in ("+", "-"):
                    v = x + y if op == "+" else x - y
                    e = ex + ey + u * (np.abs(v) + ex + ey)
                elif op == "*":
                    v = x * y
                    prop = np.abs(x) * ey + np.abs(y) * ex + ex * ey
                    e = prop + u * (np.abs(v) + prop) + TINY[dt]
                elif op == "/":
                    v = x / y
                    den = np.maximum(np.abs(y) - ey, 1e-300)
                    e = (ex + np.abs(v) * ey) / den + u * (np.abs(v) + (ex + np.abs(v) * ey) / den) + TINY[dt]
                else:
                    v = np.maximum(x, y) if op == "max" else np.minimum(x, y)
                    e = np.maximum(ex, ey)
            return v, e, None
        if k == "call":
            f, a, *rest = n.args
            x, ex, _ = self.ev(a, env)
            if n.dtype not in FLOATS:
                v = np.abs(np.asarray(x, np.int64))
                return np.where(v > irange(n.dtype)[1], irange(n.dtype)[0], v), None, None
            x = np.asarray(x, np.float64)
            u = UNIT[n.dtype]
            ex = np.asarray(ex if ex is not None else 0.0)
            if a.dtype not in FLOATS:
                ex = ex + UNIT["float32"] * np.abs(x)
            c, tiny = 8 * u, 8 * TINY[n.dtype]
            with np.errstate(all="ignore"):
                if f == "abs":
                    return np.abs(x), (ex if n.dtype in FLOATS else None), None
                if f == "exp":
                    v = np.exp(x)
                    return v, tiny + v * np.expm1(ex) + c * v * np.exp(ex), None
                if f == "log":
                    v = np.log(x)
                    return v, tiny + ex / np.maximum(x - ex, 1e-300) + c * (np.abs(v) + 1), None
                if f == "sqrt":
                    v = np.sqrt(x)
                    return v, tiny + np.sqrt(x + ex) - np.sqrt(np.maximum(x - ex, 0)) + c * v, None
                if f == "rsqrt":
                    v = 1 / np.sqrt(x)
                    return v, tiny + 1 / np.sqrt(np.maximum(x - ex, 1e-300)) - 1 / np.sqrt(x + ex) + c * v, None
                if f == "tanh":
                    v = np.tanh(x)
                    return v, tiny + ex + c * (np.abs(v) + u), None
                if f == "sigmoid":
                    v = 1 / (1 + np.exp(-x))
                    return v, tiny + ex / 4 + c * v, None
                if f == "erf":
                    v = np.vectorize(math.erf, otypes=[float])(x) if x.size else x
                    return v, tiny + 1.13 * ex + c * (np.abs(v) + u), None
                if f == "pow":
                    p = rest[0]
                    v = x ** p
                    hi, lo = (x + ex) ** p, np.maximum(x - ex, 0) ** p
                    return v, tiny + np.maximum(hi - v, v - lo) + c * v, None
            raise AssertionError(f)
        if k == "select":
            c, a, b = n.args
            cv, _, camb = self.ev(c, env)
            x, ex, _ = self.ev(a, env)
            y, ey, _ = self.ev(b, env)
            cv = np.asarray(cv, bool)
            if n.dtype in FLOATS:
                x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
                u = UNIT[n.dtype]
                ex = np.asarray(ex if ex is not None else 0.0) + (u * np.abs(x) if a.dtype not in FLOATS else 0)
                ey = np.asarray(ey if ey is not None else 0.0) + (u * np.abs(y) if b.dtype not in FLOATS else 0)
                v = np.where(cv, x, y)
                e = np.where(cv, ex, ey)
                if camb is not None:
                    e = np.where(camb, np.maximum(e, np.abs(x - y) + ex + ey), e)
                    # a NaN branch and a number at an undecided comparison: NaN or not, either is right,
                    # and no bound says so (seed 7 case 4636: a float32 > float16 compare within rounding
                    # took the NaN branch here and the number in polytile)
                    if np.any(camb & (np.isnan(x) != np.isnan(y))):
                        raise Invalid("float select between a NaN and a number on a float comparison at a tie")
                return v, e, None
            if camb is not None and np.any(camb & (np.asarray(x) != np.asarray(y))):
                raise Invalid("integer select on a float comparison at a tie")
            return np.where(cv, x, y), None, None
        if k == "cmp":
            op, a, b = n.args
            x, ex, _ = self.ev(a, env)
            y, ey, _ = self.ev(b, env)
            fn = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
                  "!=": np.not_equal}[op]
            v = fn(x, y)
            amb = None
            if n.amb:
                tol = np.asarray(ex if ex is not None else 0.0) + np.asarray(ey if ey is not None else 0.0)
                d = np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))
                amb = d <= 2 * tol + 1e-300
                if a.dtype != b.dtype:
                    amb = amb | (d <= 1e-2 * (np.abs(np.asarray(x, np.float64)) + 1))
            return v, None, amb
        if k == "bool":
            op, a, b = n.args
            x, _, ax = self.ev(a, env)
            y, _, ay = self.ev(b, env)
            v = (x & y) if op == "&" else (x | y)
            amb = None if ax is None and ay is None else \
                (ax if ax is not None else False) | (ay if ay is not None else False)
            return v, None, amb
        if k == "not":
            x, _, ax = self.ev(n.args, env)
            return ~np.asarray(x, bool), None, ax
        if k == "red":
            return self.reduce(n, env)
        raise AssertionError(k)

    def reduce(self, n: Node, env):
        kind, body, axes, where = n.args
        env2 = dict(env)
        mask = True
        ax_ids = []
        for name, b in axes:
            d = self.slot
            self.slot += 1
            ax_ids.append(d)
            if b[0] == "const":
                ext = b[1]
                lo = hi = None
            elif b[0] == "sym":
                ext = self.pv[b[1]]
                lo = hi = None
            elif b[0] == "tri":
                lo = np.asarray(eval(b[1], {}, {**self.pv, **env2}), np.int64)
                hi = np.asarray(eval(b[2], {}, {**self.pv, **env2}), np.int64)
                ext = int(hi.max()) if hi.size else 0
            else:
                lo = np.asarray(self.ev(b[1], env2)[0], np.int64)
                hi = np.asarray(self.ev(b[2], env2)[0], np.int64)
                ext = int(hi.max()) if hi.size else 0
            sh = [1] * self.nd
            sh[d] = max(ext, 0)
            kv = np.arange(max(ext, 0), dtype=np.int64).reshape(sh)
            env2[name] = kv
            if lo is not None:
                mask = mask & (kv >= lo) & (kv < hi)
        v, e, _ = self.ev(body, env2)
        if where is not None:
            w, _, _ = self.ev(where, env2)
            mask = mask & np.asarray(w, bool)
        full = np.broadcast_shapes(np.shape(v), np.shape(mask), *(np.shape(env2[a]) for a, _ in axes))
        v = np.broadcast_to(v, full)
        mask = np.broadcast_to(mask, full)
        dt = n.dtype
        fl = dt in FLOATS
        ident = {"sum": 0, "prod": 1, "max": -np.inf if fl else irange(dt)[0],
                 "min": np.inf if fl else irange(dt)[1]}[kind]
        vv = np.where(mask, v, ident)
        ax = tuple(ax_ids)
        cnt = mask.sum(axis=ax, keepdims=True)
        if kind == "sum":
            out = vv.sum(axis=ax, keepdims=True)
        elif kind == "prod":
            out = vv.prod(axis=ax, keepdims=True)
        elif kind == "max":
            out = vv.max(axis=ax, keepdims=True) if vv.size else np.full(cnt.shape, ident)
        else:
            out = vv.min(axis=ax, keepdims=True) if vv.size else np.full(cnt.shape, ident)
        if not fl:
            return wrap(out, dt), None, None
        e = np.broadcast_to(np.asarray(e if e is not None else 0.0), full)
        if body.dtype not in FLOATS:
            e = e + UNIT[dt] * np.abs(v)
        ee = np.where(mask, e, 0.0)
        u = UNIT[dt]
        with np.errstate(all="ignore"):
            if kind == "sum":
                err = ee.sum(axis=ax, keepdims=True) + \
                    u * np.maximum(cnt - 1, 0) * (np.where(mask, np.abs(v) + ee, 0).sum(axis=ax, keepdims=True))
            elif kind == "prod":
                a = np.where(mask, np.abs(v), 1.0)
                big = np.where(mask, np.abs(v) + ee, 1.0).prod(axis=ax, keepdims=True)
                # each rounding's underflow, carried through the factors after it (at most all of them)
                carried = np.where(mask, np.maximum(np.abs(v) + ee, 1.0), 1.0).prod(axis=ax, keepdims=True)
                err = big - a.prod(axis=ax, keepdims=True) + 2 * u * cnt * big + cnt * TINY[dt] * carried
            else:
                err = ee.max(axis=ax, keepdims=True) if ee.size else np.zeros(cnt.shape)
        return out, err, None


# ----------------------------------------------------------------------------------------------
# Input data
# ----------------------------------------------------------------------------------------------

def make_data(prog: Program, rng: np.random.Generator, pv: dict) -> dict:
    data = {}
    for t in prog.inputs:
        shape = tuple(size_val(s, pv) for s in t.shape)
        if t.monotonic:
            lo, hi = t.value_range
            a = np.sort(rng.integers(lo, hi + 1, size=shape))
            if a.size and rng.random() < 0.3:
                a[0] = lo
            a = a.astype(t.dtype)
        elif t.value_range is not None:
            lo, hi = t.value_range
            a = rng.integers(lo, hi + 1, size=shape).astype(t.dtype)
        elif t.dtype == "bool":
            a = rng.random(shape) < 0.5
        elif t.dtype in FLOATS:
            a = round_to(t.dtype, rng.uniform(-1, 1, shape))
            if prog.nans:
                a[rng.random(shape) < 0.15] = np.nan
            if t.dtype == "bfloat16":
                a = a.astype(np.float32)  # passed as float32 bits? see below
            else:
                a = a.astype(t.dtype)
        elif t.extreme:
            lo, hi = irange(t.dtype)
            pool = np.array([lo, hi, -1, 0, 1, 2, -2, 7, lo + 1, hi - 1, -7], dtype=np.int64)
            pool = pool[(pool >= lo) & (pool <= hi)]
            a = rng.choice(pool, size=shape).astype(t.dtype)
        else:
            a = rng.integers(int(t.lo), int(t.hi) + 1, size=shape).astype(t.dtype)
        data[t.name] = a
    return data


def bf16_array(a: np.ndarray):
    """A bfloat16 array for polytile: torch's, when the documented NumPy spelling is unknown."""
    try:
        import ml_dtypes  # noqa: F401
        return a.astype("bfloat16")
    except ImportError:
        return None


# ----------------------------------------------------------------------------------------------
# Schedules
# ----------------------------------------------------------------------------------------------

FACTORS = [1, 2, 2, 3, 4, 4, 5, 8, 8, 16, 33, 64, 0, -2, 10 ** 6]


class Scheduler:
    def __init__(self, pt, rng: random.Random, func, builder: PTBuild, prog: Program, log):
        self.pt, self.rng, self.func, self.b, self.prog, self.log = pt, rng, func, builder, prog, log
        self.s = pt.create_schedule(func)
        self.comps = list(func.computations)
        self.gpu = False
        self.refused = 0
        self.accepted = 0
        self.skip = False

    def loops(self, t):
        try:
            return list(self.s[t].loops)
        except self.pt.PolytileError:
            return []

    def snapshot(self):
        snap = {}
        for t in self.comps:
            try:
                snap[t.name] = tuple(self.s[t].loops)
            except self.pt.PolytileError as e:
                snap[t.name] = type(e).__name__
        return snap

    def loop(self, loops):
        r = self.rng
        if not loops or r.random() < 0.04:
            return r.choice(["nope", "i", "k", "", "io"])
        return r.choice(loops)

    def factor(self):
        r = self.rng
        if r.random() < 0.02:
            return r.choice([2.5, "4", None, True])
        return r.choice(FACTORS)

    def layout(self, rank):
        """(callable, source) of a random buffer layout over ``rank`` relative indices."""
        r = self.rng
        names = [f"a{d}" for d in range(rank)]
        perm = r.sample(names, rank)
        how = r.random()
        if how < 0.6 or rank == 0:
            body = perm
        elif how < 0.8:
            g = r.choice([2, 4, 8])
            body = [f"{perm[0]} // {g}"] + perm[1:] + [f"{perm[0]} % {g}"]
        elif how < 0.9:
            body = perm[:-1] if rank > 1 else perm  # not one-to-one when rank > 1
        else:
            body = [f"{perm[0]} + {perm[-1]}"] + perm[1:]
        src = f"lambda {', '.join(names)}: ({', '.join(body)}{',' if len(body) == 1 else ''})"
        return eval(src), src

    def step(self):
        r, pt = self.rng, self.pt
        t = r.choice(self.comps)
        if r.random() < 0.02 and self.prog.inputs:  # a placeholder has no loops to schedule
            t = self.b.tensors[r.choice(self.prog.inputs).name]
        st_src = f"s[{t.name}]"
        loops = self.loops(t)
        prim = r.choices(
            ["split", "tile", "reorder", "fuse", "skew", "shift", "reverse", "apply_sch", "after", "before",
             "separate", "tag", "parallel", "vectorize", "unroll", "compute_inline", "reassociate",
             "cache_identity", "cache", "cache_write", "store", "store_at", "set_loc", "bind", "tensorize",
             "pipeline"],
            [8, 4, 4, 3, 2, 2, 1.5, 2, 3, 2, 1.5, 1.5, 3, 2.5, 2, 2.5, 1, 3, 3, 3, 1.5, 1.5, 1, 0.3, 0.3, 0.3])[0]
        args, kw = [], {}
        if prim == "split":
            args = [self.loop(loops), self.factor()]
        elif prim == "tile":
            args = [self.loop(loops), self.loop(loops), self.factor(), self.factor()]
        elif prim == "reorder":
            n = min(len(loops), r.randint(2, 4))
            args = r.sample(loops, n) if n >= 1 else ["i"]
            if r.random() < 0.05 and args:
                args.append(args[0])
        elif prim == "fuse":
            if len(loops) >= 2 and r.random() < 0.8:
                i = r.randrange(len(loops) - 1)
                args = [loops[i], loops[i + 1]]
            else:
                args = [self.loop(loops), self.loop(loops)]
        elif prim == "skew":
            args = [self.loop(loops), self.loop(loops), r.choice([1, 1, 2, -1, 0, 3])]
        elif prim == "shift":
            args = [self.loop(loops), r.choice([1, 2, -1, 3, 0, -4])]
        elif prim in ("reverse", "separate", "parallel", "vectorize", "unroll", "store_at"):
            args = [self.loop(loops)]
        elif prim == "tag":
            args = [self.loop(loops), r.choice(["parallel", "vectorize", "unroll", "serial", "bogus"])]
        elif prim == "tensorize":
            args = [self.loop(loops), r.choice(["mma_m16n8k16", "wgmma_m64nNk16", "nope"])]
            self.gpu = True
        elif prim == "pipeline":
            args = [r.choice([f"{x.name}_local" for x in self.prog.inputs] + ["nope"]), r.choice([2, 3, 0, -1])]
            self.gpu = True
        elif prim == "bind":
            args = [self.loop(loops), r.choice(["blockIdx.x", "threadIdx.x"])]
            self.gpu = True
        elif prim == "apply_sch":
            n = len(loops)
            ins = [f"d{q}" for q in range(n)]
            outs = list(ins)
            how = r.random()
            if how < 0.35 and n >= 2:
                outs = r.sample(ins, n)
            elif how < 0.65 and n >= 2:
                a, b = r.sample(range(n), 2)
                outs[b] = f"{ins[b]} + {r.choice([1, 2, -1])} * {ins[a]}"
            elif how < 0.8 and n >= 1:
                q = r.randrange(n)
                outs[q] = f"-{ins[q]}"
            elif how < 0.9 and n >= 1:
                outs = outs[:-1]  # not one-to-one / wrong arity
            else:
                outs = outs + ["0"]
            m = f"{{ [{', '.join(ins)}] -> [{', '.join(outs)}] }}"
            args = [m]
            if r.random() < 0.5:
                kw["names"] = [f"p{q}" for q in range(len(outs))]
        elif prim in ("after", "before"):
            other = r.choice(self.comps)
            ol = self.loops(other)
            lev = r.choice(ol + [None, None]) if ol else None
            if r.random() < 0.03:
                lev = "nope"
            args = [other, lev]
            srcargs = [f"s[{other.name}]", repr(lev)]
        elif prim in ("compute_inline", "reassociate"):
            args = []
        elif prim in ("cache_identity", "cache"):
            ins = list(self.prog.inputs)
            ten = r.choice([self.b.tensors[x.name] for x in ins] + self.comps) if ins else r.choice(self.comps)
            at = r.choice(loops + [None]) if loops else None
            args = [ten, at]
            srcargs = [ten.name, repr(at)]
            rank = len(ten.shape)
            if prim == "cache" and r.random() < 0.7:
                fn, lsrc = self.layout(rank)
                kw["layout"] = fn
                kws = {"layout": lsrc}
            if prim == "cache" and r.random() < 0.2:
                kw["whole"] = tuple(r.choice([1, 2, 4, 8]) for _ in range(rank))
        elif prim == "cache_write":
            at = r.choice(loops + [None]) if loops else None
            args = [at]
            if r.random() < 0.15:
                kw["whole"] = tuple(r.choice([1, 2, 4]) for _ in range(len(t.shape)))
        elif prim == "store":
            fn, lsrc = self.layout(len(t.shape))
            args = [fn]
            srcargs = [lsrc]
        elif prim == "set_loc":
            loc = r.choice(["stack", "heap", "heap", "stack", "shared", "local", "bogus"])
            args = [loc]
            if loc in ("shared", "local"):
                self.gpu = True
        if prim not in ("after", "before", "cache_identity", "cache", "store"):
            srcargs = [repr(a) for a in args]
        kwsrc = dict((k, repr(v)) for k, v in kw.items())
        if prim == "cache" and "layout" in kw:
            kwsrc["layout"] = kws["layout"]
        call = f"{st_src}.{prim}({', '.join(srcargs + [f'{k}={v}' for k, v in kwsrc.items()])})"
        if self.skip:
            return
        before = self.snapshot()
        lowered = None
        check_lower = r.random() < 0.1
        if check_lower:
            try:
                lowered = str(pt.lower(self.s))
            except pt.PolytileError:
                check_lower = False
        try:
            getattr(self.s[t], prim)(*args, **kw)
        except pt.PolytileError as e:
            self.refused += 1
            self.log.append(f"# {call}  refused: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
            after = self.snapshot()
            if after != before:
                raise NonTransactional(f"{call} refused but changed the loops: {before} -> {after}") from None
            if check_lower:
                now = str(pt.lower(self.s))
                if now != lowered:
                    raise NonTransactional(f"{call} refused but changed the lowered program") from None
            return
        self.accepted += 1
        self.log.append(call)
        if prim == "bind" or (prim == "tag" and "Idx" in str(args[-1])):
            self.gpu = True


class NonTransactional(Exception):
    pass


# ----------------------------------------------------------------------------------------------
# One case (in the child process)
# ----------------------------------------------------------------------------------------------

def case_rngs(seed: int, k: int):
    return random.Random(f"indep/{seed}/{k}"), np.random.default_rng([seed, k, 7])


def compare(prog, t, got, ref, err, mask, sentinel, run):
    """A description of the first wrong element, or None."""
    shape = ref.shape
    got = np.asarray(got)
    if tuple(got.shape) != tuple(shape):
        return f"{t.name} (run {run}): shape {got.shape}, expected {shape}"
    if mask is None:
        mask = np.ones(shape, bool)
    g = got.astype(np.float64) if t.dtype in FLOATS or t.dtype == "bfloat16" else got.astype(np.int64)
    if mask.size and not mask.all():
        outside = g[~mask]
        if not np.all(outside == sentinel):
            bad = np.argwhere((g != sentinel) & ~mask)[0]
            return (f"{t.name} (run {run}): element {tuple(bad)} outside where= is {g[tuple(bad)]}, "
                    f"expected {sentinel} kept")
    if t.dtype in FLOATS:
        with np.errstate(all="ignore"):
            tiny = np.finfo(np.float16).tiny if t.dtype == "float16" else 1e-30
            # the propagated bound can come out negative or NaN (inf - inf, 0 * inf in its terms): its
            # magnitude bounds the error, a NaN bound none (the GPU host's seed-5 campaign flagged
            # equal results as wrong under bounds of -0.225 and NaN)
            tol = 2.0 * np.abs(err) + tiny + 1e-12 * np.abs(ref)
            unbounded = np.isnan(err)
            bad = mask & ~(g == ref) & ~(np.abs(g - ref) <= tol) & ~unbounded & ~(np.isnan(g) & np.isnan(ref))
            bad = bad | (mask & (np.isnan(g) != np.isnan(ref)))  # NaN where NumPy's is, and only there
    else:
        bad = mask & (g != ref)
    if bad.any():
        idx = tuple(np.argwhere(bad)[0])
        n = int(bad.sum())
        e = f" ± {2 * err[idx]:.3g}" if t.dtype in FLOATS else ""
        return f"{t.name} (run {run}): {n} of {bad.size} wrong, first {idx}: got {g[idx]!r}, expected {ref[idx]!r}{e}"
    return None


def to_polytile_array(t, a):
    if t.dtype == "bfloat16":
        b = bf16_array(a)
        return b
    return a


def run_program_case(seed, k, rng, nrng, verbose, script):
    import polytile as pt
    modes = random.Random(f"indep-modes/{seed}/{k}")
    gen = Gen(rng, modes)
    prog = None
    for _ in range(5):
        prog = gen.program()
        if prog is not None:
            break
        gen = Gen(rng, modes)
    if prog is None:
        return {"outcome": "invalid", "detail": "no program"}
    log = []
    b = PTBuild(pt, prog)
    info = {"stages": len(prog.stages), "inputs": len(prog.inputs)}
    try:
        func = b.build_func()
    except Invalid as e:
        return {"outcome": "invalid", "detail": str(e), **info}
    except pt.PolytileError as e:
        if script:
            print("\n".join(b.lines))
        if prog.malformed:
            return {"outcome": "refused", "detail": f"{prog.malformed}: {e}", **info}
        return {"outcome": "refused-program", "detail": f"{type(e).__name__}: {e}", "program": b.lines, **info}
    if prog.malformed:
        return {"outcome": "internal", "detail": f"malformed program accepted: {prog.malformed}",
                "program": b.lines, **info}
    if any(t.dtype == "bfloat16" for t in prog.inputs + prog.outputs) and bf16_array(np.zeros(1)) is None:
        return {"outcome": "invalid", "detail": "no bfloat16 arrays without ml_dtypes", **info}
    sched = Scheduler(pt, rng, func, b, prog, log)
    n_prims = rng.choice([0, 1, 2, 3, 4, 5, 6, 8, 10, 12])
    keep = os.environ.get("INDEP_FUZZ_KEEP")  # minimizing: apply only these primitives ("0,3,4")
    keep = None if keep is None else {int(x) for x in keep.split(",") if x}
    mid_at = rng.randrange(n_prims) if n_prims and rng.random() < 0.15 else None
    mid = None
    try:
        for q in range(n_prims):
            if keep is not None and q not in keep:
                sched.skip = True
            if q == mid_at and not sched.skip:  # a build between primitives must not change the schedule
                log.append("kern_mid = pt.build(s)")
                try:
                    mid = pt.build(sched.s, "cpu")
                except pt.PolytileError as e:
                    log[-1] = f"# kern_mid = pt.build(s)  refused: {type(e).__name__}: {str(e).splitlines()[0][:150]}"
            sched.step()
            sched.skip = False
    except NonTransactional as e:
        return {"outcome": "internal", "detail": f"non-transactional primitive: {e}", "program": b.lines,
                "schedule": log, **info}
    info.update(accepted=sched.accepted, refused=sched.refused)
    if script or verbose:
        print("\n".join(b.lines))
        print("s = pt.create_schedule(f)")
        print("\n".join(log))
    target = rng.choice(["cpu", "cpu", "cpu", "cpu_target"])
    tgt = pt.cpu_target() if target == "cpu_target" else "cpu"
    try:
        kern = pt.build(sched.s, tgt)
    except pt.PolytileError as e:
        msg = f"{type(e).__name__}: {str(e)[:600]}"
        gpu = sched.gpu or any(g in " ".join(log) for g in GPU_ONLY)
        return {"outcome": "late-gpu" if gpu else "refused-late", "detail": msg, "program": b.lines,
                "schedule": log, **info}
    # two calls: given outputs filled with a sentinel, then allocated outputs (other parameter values);
    # sometimes the default schedule's kernel of the same Func too (built in the same process)
    kernels = [(1, kern), (2, kern)] + ([(4, mid)] if mid is not None else [])
    if rng.random() < 0.15:
        try:
            kernels.append((3, pt.build(func, "cpu")))
        except pt.PolytileError as e:
            return {"outcome": "refused-late", "detail": f"default schedule: {type(e).__name__}: {str(e)[:400]}",
                    "program": b.lines, **info}
    for run, kern in kernels:
        pv = {n: v[min(run, 2) - 1] for n, v in prog.params.items()}
        data = make_data(prog, nrng, pv)
        try:
            ref = Ref(prog, data, pv)
            expect = {}
            for t in prog.stages:
                expect[t.name] = ref.stage(t)
        except Invalid as e:
            return {"outcome": "invalid", "detail": str(e), **info}
        args = [to_polytile_array(t, data[t.name]) for t in prog.inputs]
        in_shapes = {str(d) for t in prog.inputs for d in t.shape}
        out_shapes = {str(d) for t in prog.outputs for d in t.shape}
        kwargs = {n: pv[n] for n in prog.params if n not in in_shapes
                  and (run == 2 or n not in out_shapes or n in prog.keyword_params)}
        outs = []
        sentinels = []
        for t in prog.outputs:
            shape = tuple(size_val(s, pv) for s in t.shape)
            sent = 0
            if run != 2:
                sent = True if t.dtype == "bool" else 77 if t.dtype not in FLOATS else -7.5
            dt = t.dtype if t.dtype != "bfloat16" else None
            o = np.full(shape, sent, dtype=dt) if dt else bf16_array(np.full(shape, sent, np.float32))
            outs.append(o)
            sentinels.append(sent)
        try:
            res = kern(*args, *outs, **kwargs) if run != 2 else kern(*args, **kwargs)
        except pt.PolytileError as e:
            return {"outcome": "refused-call", "detail": f"{type(e).__name__}: {str(e)[:400]}",
                    "program": b.lines, "schedule": log, **info}
        if not isinstance(res, tuple):
            res = (res,)
        if len(res) != len(prog.outputs):
            return {"outcome": "wrong", "detail": f"{len(res)} results for {len(prog.outputs)} outputs",
                    "program": b.lines, "schedule": log, **info}
        for t, got, sent in zip(prog.outputs, res, sentinels):
            v, e, mask = expect[t.name]
            if t.dtype == "bool":
                v = np.asarray(v, bool).astype(np.int64)
                got = np.asarray(got).astype(np.int64)
                sent = int(sent)
            bad = compare(prog, t, np.asarray(got, np.float64 if t.dtype == "bfloat16" else None),
                          v, e, mask, sent, run)
            if bad:
                return {"outcome": "wrong", "detail": bad, "program": b.lines, "schedule": log,
                        "data": ({n: a.tolist() for n, a in data.items()}
                                 if sum(a.size for a in data.values()) < 400 else None),
                        **info}
    return {"outcome": "ok", **info}


# ----------------------------------------------------------------------------------------------
# API misuse and command-line cases
# ----------------------------------------------------------------------------------------------

def run_misuse_case(seed, k, rng, nrng, verbose):
    """A kernel called badly, a bad target, or a bad command line: clear errors, never tracebacks."""
    import polytile as pt
    what = rng.choice(["call", "call", "target", "cli", "cli", "lang"])
    if what == "cli":
        tmp = f"/tmp/indep-fuzz-{os.getpid()}"
        os.makedirs(tmp, exist_ok=True)
        notrec = os.path.join(tmp, "notes.txt")
        with open(notrec, "w") as fh:
            fh.write("not a records file\n")
        argv = rng.choice([
            ["run", "nosuchop"], ["run", "matmul", "--shape", "0,4,4"], ["run", "matmul", "--shape", "-3,4,4"],
            ["run", "matmul", "--shape", "a,b,c"], ["run", "matmul", "--shape", "4,4"],
            ["run", "matmul", "--target", "tpu"], ["run", "matmul", "--dtype", "complex64"],
            ["run", "matmul", "--repeat", "0"], ["run", "matmul", "--repeat", "-1"],
            ["run", "matmul", "--shape", "Q=4"], ["run", "softmax", "--shape", "4,4", "--dtype", "int8"],
            ["tune", "matmul", "--shape", "8,8,8", "--trials", "0"],
            ["tune", "matmul", "--shape", "8,8,8", "--trials", "-5"],
            ["tune", "matmul", "--shape", "8,8,8", "--batch", "0"],
            ["tune", "matmul", "--shape", "8,8,8", "--records", notrec, "--trials", "1"],
            ["tune", "matmul", "--shape", "8,8,8", "--records", "/proc/nope/x.jsonl", "--trials", "1"],
            ["tune", "matmul", "--shape", "8,8,8", "--plot", "/nonexistent/dir/p.png", "--trials", "1"],
            ["tune", "matmul", "--shape", "8,8,8", "--plot", tmp + "/p.xyz", "--trials", "1"],
            ["tune", "nosuchop", "--shape", "8"], ["tune", "matmul", "--shape", "8,8,8", "--target", "cuda:sm_1"],
            ["tune", "matmul", "--shape", "8,8,8", "--tuner", "analytical", "--trials", "1"],
            ["fuzz", "--seed", "1", "--cases", "-1"], ["fuzz", "--seed", "x"],
            ["fuzz", "--seed", "1", "--case", "3", "--timeout", "0"],
            ["tune-model", "nosuchmodel", "--records", tmp + "/m.jsonl"],
            ["ops", "--bogus"], ["sass-opt", "/nonexistent.cubin"],
        ])
        code = "import sys; from polytile.cli import main; sys.exit(main())"
        try:
            p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return {"outcome": "hang", "detail": f"polytile {' '.join(argv)} past 60 s"}
        with open(notrec) as fh:
            if fh.read() != "not a records file\n":
                return {"outcome": "internal", "detail": f"polytile {' '.join(argv)} wrote into a non-records file"}
        if "Traceback (most recent call last)" in p.stderr + p.stdout:
            return {"outcome": "internal", "detail": f"polytile {' '.join(argv)}: traceback (exit {p.returncode}): "
                    + (p.stderr or p.stdout)[-800:]}
        if p.returncode < 0:
            return {"outcome": "crash", "detail": f"polytile {' '.join(argv)}: signal {-p.returncode}"}
        return {"outcome": "ok" if p.returncode != 0 else "ok", "detail": f"cli {argv}: exit {p.returncode}"}
    A = pt.placeholder((5, 3), "float32", "A")
    B = pt.placeholder((3,), "int32", "B")
    C = pt.compute((5, 3), lambda i, j: A[i, j] * 2 + B[j], "C")
    f = pt.Func([A, B], [C], name="mis")
    if what == "lang":
        bad = rng.choice([
            lambda: pt.placeholder((3,), "complex64", "Z"), lambda: pt.placeholder((-1,), "float32", "Z"),
            lambda: pt.placeholder((3,), "float32", "for"), lambda: pt.placeholder((3,), "float32", "pt_x"),
            lambda: pt.placeholder((2.5,), "float32", "Z"), lambda: pt.compute((5,), lambda i: A[i + 1, 0], "Z"),
            lambda: pt.compute((5,), lambda i, j: A[i, j], "Z"), lambda: pt.reduce_axis(-3, "k"),
            lambda: pt.Func([A], [C]), lambda: pt.Func([A, B, A], [C]),
            lambda: pt.compute((5,), lambda i: A[i], "NULL"),
            lambda: pt.compute((5,), lambda i: A[i, 0] // 2, "Z"), lambda: pt.compute((5,), lambda i: A[i, 0] % 2, "Z"),
            lambda: pt.placeholder((3,), "float32", "Z", value_range=(5, 1)),
            lambda: pt.compute((3,), lambda i: B[i] / B[i], "Z"), lambda: pt.sum(A[0, 0], axis=[]),
            lambda: pt.compute((5,), lambda i: pt.sum(A[i, 0], axis=pt.reduce_axis(3)), "Z"),
            lambda: pt.Func([A, B], [C], name="y1"), lambda: pt.Func([A, B], [C], name="random"),
            lambda: pt.compute((5,), lambda i: "x", "Z"), lambda: pt.compute((5,), lambda i: None, "Z"),
        ])
        try:
            out = bad()
            if isinstance(out, pt.Func) or hasattr(out, "shape"):
                return {"outcome": "ok", "detail": "accepted"}
        except pt.PolytileError as e:
            return {"outcome": "ok", "detail": f"refused: {e}"}
        except Exception as e:  # noqa: BLE001 - the point: anything else escaping is a finding
            return {"outcome": "internal", "detail": f"language misuse: {type(e).__name__}: {e}"}
        return {"outcome": "ok"}
    if what == "target":
        tgt = rng.choice(["gpu", "cuda:sm_12", "", "CPU", None, 5, "cpu:avx9", "cuda:sm_90b", "llvm"])
        try:
            pt.build(f, tgt)
        except pt.PolytileError as e:
            return {"outcome": "ok", "detail": f"target {tgt!r}: {e}"}
        except Exception as e:  # noqa: BLE001
            return {"outcome": "internal", "detail": f"target {tgt!r}: {type(e).__name__}: {e}"}
        return {"outcome": "ok", "detail": f"target {tgt!r} accepted"}
    kern = pt.build(f, "cpu")
    a = nrng.uniform(-1, 1, (5, 3)).astype(np.float32)
    bb = nrng.integers(-5, 5, 3).astype(np.int32)
    good = a * 2 + bb
    how = rng.choice(["wrong dtype", "wrong shape", "too few", "too many", "overlap", "fortran", "strided",
                      "readonly out", "list", "unknown kw", "0-d", "wrong out dtype", "int64 idx"])
    fine = how in ("fortran", "strided", "list", "int64 idx")
    try:
        if how == "wrong dtype":
            r_ = kern(a.astype(np.float64), bb)
        elif how == "wrong shape":
            r_ = kern(a[:4], bb)
        elif how == "too few":
            r_ = kern(a)
        elif how == "too many":
            r_ = kern(a, bb, np.empty((5, 3), np.float32), a)
        elif how == "overlap":
            r_ = kern(a, bb, a)
        elif how == "fortran":
            r_ = kern(np.asfortranarray(a), bb)
        elif how == "strided":
            big = np.zeros((5, 6), np.float32)
            big[:, ::2] = a
            r_ = kern(big[:, ::2], bb)
        elif how == "readonly out":
            o = np.empty((5, 3), np.float32)
            o.setflags(write=False)
            r_ = kern(a, bb, o)
        elif how == "list":
            r_ = kern(a.tolist(), bb.tolist())
        elif how == "unknown kw":
            r_ = kern(a, bb, N=3)
        elif how == "0-d":
            r_ = kern(np.float32(1), bb)
        elif how == "int64 idx":
            r_ = kern(a, bb.astype(np.int64))
        else:
            r_ = kern(a, bb, np.empty((5, 3), np.float64))
    except pt.PolytileError as e:
        return {"outcome": "ok", "detail": f"{how}: refused: {e}"}
    except Exception as e:  # noqa: BLE001
        return {"outcome": "internal", "detail": f"call {how}: {type(e).__name__}: {e}"}
    if fine and not np.allclose(np.asarray(r_), good, atol=1e-6):
        return {"outcome": "wrong", "detail": f"call {how}: wrong result"}
    if not fine:
        return {"outcome": "ok", "detail": f"call {how}: accepted"}
    return {"outcome": "ok", "detail": f"call {how}"}


def run_case(seed, k, verbose=False, script=False):
    rng, nrng = case_rngs(seed, k)
    try:
        if rng.random() < 0.06:
            return run_misuse_case(seed, k, rng, nrng, verbose)
        return run_program_case(seed, k, rng, nrng, verbose, script)
    except Exception as e:  # noqa: BLE001
        import polytile as pt
        kind = "refused-other" if isinstance(e, pt.PolytileError) else "internal"
        return {"outcome": kind, "detail": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-3000:]}


# ----------------------------------------------------------------------------------------------
# The campaign (parent)
# ----------------------------------------------------------------------------------------------

def child_main(seed, k):
    res = run_case(seed, k)
    sys.stdout.write("\n@@RESULT@@" + json.dumps(res, default=str) + "\n")
    sys.stdout.flush()


def run_one(seed, k, timeout):
    t0 = time.time()
    cmd = [sys.executable, os.path.abspath(__file__), "--child", str(seed), str(k)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"case": k, "outcome": "hang", "detail": f"past {timeout} s", "seconds": timeout}
    res = None
    for line in p.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            res = json.loads(line[len("@@RESULT@@"):])
    if res is None:
        if p.returncode < 0:
            res = {"outcome": "crash", "detail": f"signal {-p.returncode}", "stderr": p.stderr[-1500:]}
        else:
            res = {"outcome": "crash", "detail": f"exit {p.returncode} without a result", "stderr": p.stderr[-1500:]}
    res["case"] = k
    res["seconds"] = round(time.time() - t0, 2)
    return res


def git_commit():
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return None


def campaign(args):
    from concurrent.futures import ThreadPoolExecutor, as_completed
    t0 = time.time()
    print(f"independent fuzzer: seed {args.seed}, cases {args.first}..{args.first + args.cases - 1}, "
          f"jobs {args.jobs}, timeout {args.timeout} s", flush=True)
    counts: dict[str, int] = {}
    findings, results = [], []
    with ThreadPoolExecutor(args.jobs) as ex:
        futs = [ex.submit(run_one, args.seed, k, args.timeout) for k in range(args.first, args.first + args.cases)]
        done = 0
        for fu in as_completed(futs):
            r = fu.result()
            done += 1
            counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
            results.append({"case": r["case"], "outcome": r["outcome"], "seconds": r.get("seconds"),
                            "accepted": r.get("accepted"), "refused": r.get("refused")})
            if r["outcome"] in FINDINGS or r["outcome"] in ("refused-program", "refused-other", "refused-call",
                                                            "invalid"):
                findings.append(r)
                print(f"  case {r['case']}: {r['outcome']}: {str(r.get('detail'))[:300]}", flush=True)
            if done % 50 == 0 or done == args.cases:
                el = time.time() - t0
                print(f"  {done}/{args.cases} in {el:.0f} s: {dict(sorted(counts.items()))}", flush=True)
    el = time.time() - t0
    nfind = sum(counts.get(o, 0) for o in FINDINGS)
    print(f"done: {args.cases} cases in {el:.0f} s; {dict(sorted(counts.items()))}; findings {nfind}")
    for r in sorted(findings, key=lambda r: r["case"]):
        print(f"  replay: python {os.path.relpath(__file__)} --seed {args.seed} --case {r['case']}  # {r['outcome']}")
    if args.json:
        rec = {"fuzzer": "tools/fuzz_independent.py", "seed": args.seed, "first": args.first, "cases": args.cases,
               "jobs": args.jobs, "timeout": args.timeout, "commit": git_commit(), "host": platform.node(),
               "cpus": os.cpu_count(), "seconds": round(el, 1), "counts": counts, "findings": nfind,
               "finding_cases": sorted(findings, key=lambda r: r["case"]),
               "results": sorted(results, key=lambda r: r["case"])}
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(rec, fh, indent=1, default=str)
    return 1 if nfind else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--first", type=int, default=0, help="first case index")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--json", help="write the campaign's record here")
    ap.add_argument("--case", type=int, help="replay one case in this process, verbosely")
    ap.add_argument("--script", action="store_true", help="with --case: print the program and schedule")
    ap.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child_main(*args.child)
        return 0
    if args.case is not None:
        print(f"# independent fuzzer, seed {args.seed}, case {args.case}")
        r = run_case(args.seed, args.case, verbose=True, script=args.script)
        print(json.dumps(r, indent=1, default=str))
        return 1 if r["outcome"] in FINDINGS else 0
    if args.cases < 1 or args.jobs < 1 or args.timeout <= 0:
        ap.error("--cases, --jobs and --timeout must be positive")
    return campaign(args)


if __name__ == "__main__":
    sys.exit(main())
