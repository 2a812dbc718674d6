"""Search spaces: tunable decisions, configurations, and the space a template defines by running.

A template is a function ``fn(cfg, *args) -> Schedule``. It declares its decisions on ``cfg``
(``cfg.split``, ``cfg.knob``, ``cfg.tag``, ``cfg.reorder``, ``cfg.integer``), states its
constraints and resource use (``cfg.require``, ``cfg.resources``), and then asks ``cfg.schedule(func)``
for a schedule to transform. The tuner runs it in three modes:

* **define** — every decision returns its first choice and is recorded: this gives the space;
* **check** — decisions return a configuration's values; the template stops at ``cfg.schedule`` so
  constraints and resource limits are evaluated without touching the compiler (cheap);
* **apply** — the template runs to the end and returns the schedule of that configuration.

Decisions are declared before ``cfg.schedule``; their choices may depend on the arguments, not on
other decisions (relations between decisions are written with ``cfg.require``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Iterator, Sequence, Set
from dataclasses import dataclass, field

import numpy as np

from ..errors import PolytileError
from ..target import CPUTarget, CUDATarget

Value = object  # a decision's value: an int, a string, a bool or a tuple of them (JSON-serializable)


class TuneError(PolytileError):
    """A template, space, configuration or records file is unusable; the message says which and why."""


class InvalidConfig(TuneError):
    """A configuration breaks a template's constraint or a resource limit of the target."""


class _StopTemplate(Exception):
    """Raised by ``cfg.schedule`` in define and check modes: the rest of the template is not needed."""


# --- decisions ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """One tunable choice: a name and its candidate values (the first is the default)."""

    name: str
    choices: tuple[Value, ...]

    kind = "decision"

    def features(self, value: Value) -> list[float]:
        """Numeric knob features of one value (fixed length for this decision)."""
        return [float(self.choices.index(value))]

    def feature_names(self) -> list[str]:
        return [self.name]

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "name": self.name, "choices": [_jsonable(c) for c in self.choices]}


@dataclass(frozen=True)
class Knob(Decision):
    """Explicit choices (numbers, strings, booleans); numeric knobs are featured by value, others one-hot."""

    kind = "knob"

    def _numeric(self) -> bool:
        return all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in self.choices)

    def features(self, value: Value) -> list[float]:
        if self._numeric():
            return [_slog(float(value))]  # type: ignore[arg-type]
        return [1.0 if value == c else 0.0 for c in self.choices]

    def feature_names(self) -> list[str]:
        if self._numeric():
            return [self.name]
        return [f"{self.name}={c}" for c in self.choices]


@dataclass(frozen=True)
class Tag(Knob):
    """A loop annotation to choose ("serial", "unroll", "vectorize", "parallel", …); one-hot features."""

    loop: str = ""
    kind = "tag"

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "loop": self.loop}

    def features(self, value: Value) -> list[float]:
        return [1.0 if value == c else 0.0 for c in self.choices]

    def feature_names(self) -> list[str]:
        return [f"{self.name}={c}" for c in self.choices]


@dataclass(frozen=True)
class Integer(Knob):
    """An integer in a range (pipeline stages, unroll depth, …); featured by value."""

    kind = "integer"


@dataclass(frozen=True)
class Split(Decision):
    """Split a loop of ``extent`` into ``n`` nested loops; a value lists the n extents, outermost first.

    The outermost extent is ``ceil(extent / product of the others)``: tiles need not divide the extent.
    """

    extent: int = 1
    n: int = 2
    policy: str = "factors"
    kind = "split"

    def features(self, value: Value) -> list[float]:
        return [_slog(float(v)) for v in value]  # type: ignore[union-attr]

    def feature_names(self) -> list[str]:
        return [f"{self.name}[{k}]" for k in range(self.n)]

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "extent": self.extent, "n": self.n, "policy": self.policy}


@dataclass(frozen=True)
class Reorder(Decision):
    """An order of some loops (a permutation); featured by each loop's position."""

    loops: tuple[str, ...] = ()
    kind = "reorder"

    def features(self, value: Value) -> list[float]:
        return [float(list(value).index(name)) for name in self.loops]  # type: ignore[arg-type]

    def feature_names(self) -> list[str]:
        return [f"{self.name}.pos({n})" for n in self.loops]


def split_choices(extent: int, n: int, policy: str = "factors", max_factor: int | None = None,
                  inner: Sequence[int] | None = None) -> tuple[tuple[int, ...], ...]:
    """The values of an n-way split: inner extents are divisors of ``extent`` ("factors"), powers of two
    up to it ("pow2"), or taken from ``inner``; their product never exceeds the extent."""
    if extent < 1 or n < 1:
        raise TuneError(f"split of extent {extent} into {n} loops: both must be positive")
    if inner is not None:
        cand = sorted({int(v) for v in inner if 1 <= int(v) <= extent})
    elif policy == "factors":
        cand = [d for d in range(1, extent + 1) if extent % d == 0]
    elif policy == "pow2":
        cand = [1 << e for e in range(extent.bit_length()) if (1 << e) <= extent]
    else:
        raise TuneError(f"unknown split policy {policy!r}; use 'factors' or 'pow2'")
    if max_factor is not None:
        cand = [c for c in cand if c <= max_factor]
    out: list[tuple[int, ...]] = []
    for inner_f in itertools.product(cand, repeat=n - 1):
        prod = math.prod(inner_f)
        if prod > extent or (policy == "factors" and inner is None and extent % prod):
            continue
        out.append((-(-extent // prod), *inner_f))
    return tuple(out)


# --- configurations -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One point of a space: a value for every decision, by name. ``digits`` index the choices."""

    values: dict[str, Value]
    digits: tuple[int, ...] = ()

    def __getitem__(self, name: str) -> Value:
        return self.values[name]

    def to_json(self) -> dict[str, object]:
        return {k: _jsonable(v) for k, v in self.values.items()}

    @property
    def key(self) -> str:
        """A stable text key (records and caches compare configurations by it)."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.to_json().items())


def _jsonable(v: Value) -> object:
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def _from_json(v: object) -> Value:
    if isinstance(v, list):
        return tuple(_from_json(x) for x in v)
    return v


def _slog(x: float) -> float:
    return math.copysign(math.log2(abs(x) + 1.0), x)


# --- resource limits ------------------------------------------------------------------------------------


def resource_limits(target: CPUTarget | CUDATarget) -> dict[str, float]:
    """The hard limits a configuration must respect on ``target`` (names used by ``cfg.resources``)."""
    if target.has("gpu"):
        return {"threads_per_block": target.max_threads_per_block, "shared_bytes": target.shared_per_block,
                "registers_per_block": target.registers_per_block, "registers_per_thread": target.registers_per_thread,
                "vector_bytes": target.vector_bits // 8}
    return {"vector_registers": 32 if target.vector_bits >= 512 else 16,
            "vector_lanes_fp32": target.vector_lanes(4), "threads": max(1, target.cores) * 64,
            "stack_bytes": 4 * 1024 * 1024}


# --- the object templates receive ---------------------------------------------------------------------


class TemplateConfig:
    """What a template's ``cfg`` is: records decisions (define), or gives a configuration's values."""

    def __init__(self, mode: str, target: CPUTarget | CUDATarget, values: dict[str, Value] | None = None):
        self.mode = mode  # "define", "check" or "apply"
        self.target = target
        self.values = values or {}
        self.decisions: list[Decision] = []
        self.used: dict[str, float] = {}

    # --- declaring decisions ---------------------------------------------------------------------------
    def _declare(self, d: Decision) -> Value:
        """Record decision ``d`` (define mode; the other modes read the configuration's value before
        making the choices: a check runs the template once per configuration the search meets)."""
        if not d.choices:
            raise TuneError(f"decision {d.name!r} has no choices; widen its range or drop it")
        if any(x.name == d.name for x in self.decisions):
            raise TuneError(f"the template declares decision {d.name!r} twice; give each a distinct name")
        self.decisions.append(d)
        return d.choices[0]

    def _value(self, name: str) -> Value:
        if name not in self.values:
            raise TuneError(f"configuration has no value for decision {name!r}; was it made for another "
                            "template or an older version of this one?")
        return self.values[name]

    def split(self, name: str, extent: int, n: int = 2, *, policy: str = "factors",
              max_factor: int | None = None, inner: Sequence[int] | None = None,
              keep: Callable[[tuple[int, ...]], bool] | None = None,
              default: Sequence[int] | None = None) -> tuple[int, ...]:
        """Declare an n-way split of a loop of ``extent``; returns the n extents, outermost first.
        ``default`` (the n-1 inner extents) puts that choice first."""
        if self.mode != "define":
            return self._value(name)  # type: ignore[return-value]
        choices = split_choices(int(extent), n, policy, max_factor, inner)
        if keep is not None:
            choices = tuple(c for c in choices if keep(c))
        if default is not None:
            choices = tuple(sorted(choices, key=lambda c: tuple(c[1:]) != tuple(default)))
        return self._declare(Split(name, choices, int(extent), n, policy))  # type: ignore[return-value]

    def knob(self, name: str, choices: Sequence[Value]) -> Value:
        """Declare a choice among explicit values (the first is the default); TuneError for a value given
        twice (a configuration would have two digits, and a tensor sentence two words alike)."""
        if self.mode != "define":  # the choices were checked when the space was defined
            return self._value(name)
        values = tuple(_from_json(c) for c in choices)
        twice = [v for k, v in enumerate(values) if v in values[:k]]
        if twice:
            raise TuneError(f"knob {name!r}: the choice {twice[0]!r} is given twice in {list(values)!r}; give each "
                            "value once")
        return self._declare(Knob(name, values))

    def tag(self, name: str, loop: str, kinds: Sequence[str] = ("serial", "unroll")) -> str:
        """Declare which annotation loop ``loop`` gets; ``apply_tag`` applies it."""
        if self.mode != "define":
            return self._value(name)  # type: ignore[return-value]
        return self._declare(Tag(name, tuple(kinds), loop))  # type: ignore[return-value]

    def integer(self, name: str, lo: int, hi: int, step: int = 1, default: int | None = None) -> int:
        """Declare an integer in ``[lo, hi]`` (pipeline stages, unroll depth, …); ``default`` first."""
        if self.mode != "define":
            return self._value(name)  # type: ignore[return-value]
        values = list(range(lo, hi + 1, step))
        if default in values:
            values.remove(default)
            values.insert(0, default)  # type: ignore[arg-type]
        return self._declare(Integer(name, tuple(values)))  # type: ignore[return-value]

    def reorder(self, name: str, loops: Sequence[str], orders: Sequence[Sequence[str]] | None = None
                ) -> tuple[str, ...]:
        """Declare an order of ``loops``: any permutation, or one of ``orders``."""
        if self.mode != "define":
            return self._value(name)  # type: ignore[return-value]
        perms = [tuple(o) for o in orders] if orders is not None else list(itertools.permutations(loops))
        for p in perms:
            if sorted(p) != sorted(loops):
                raise TuneError(f"reorder {name!r}: {list(p)} is not a permutation of {list(loops)}")
        return self._declare(Reorder(name, tuple(perms), tuple(loops)))  # type: ignore[return-value]

    # --- constraints -----------------------------------------------------------------------------------
    def require(self, condition: bool, reason: str) -> None:
        """Reject configurations for which ``condition`` is false (checked before anything is built)."""
        if self.mode != "define" and not condition:
            raise InvalidConfig(reason)

    def resources(self, **amounts: float) -> None:
        """Declare what this configuration uses (``threads_per_block``, ``shared_bytes``,
        ``vector_registers``, …); a use above the target's limit rejects the configuration."""
        limits = resource_limits(self.target)
        for name, amount in amounts.items():
            if name not in limits:
                raise TuneError(f"unknown resource {name!r} for a {self.target.kind} target; "
                                f"known: {', '.join(limits)}")
            self.used[name] = float(amount)
            if self.mode != "define" and amount > limits[name]:
                raise InvalidConfig(f"{name} {amount:g} exceeds the target's limit {limits[name]:g}")

    # --- the schedule ----------------------------------------------------------------------------------
    def schedule(self, func: object) -> object:
        """A fresh schedule of ``func`` to transform (stops the template in define and check modes)."""
        if self.mode != "apply":
            raise _StopTemplate
        from .. import create_schedule
        return create_schedule(func)  # type: ignore[arg-type]


# --- the space --------------------------------------------------------------------------------------


@dataclass
class ConfigSpace:
    """The decisions of a template for one workload; configurations are digit vectors over them."""

    decisions: list[Decision]
    check: Callable[[dict[str, Value]], str | None] = field(repr=False, default=lambda v: None)

    def __post_init__(self) -> None:
        self.radix = np.array([len(d.choices) for d in self.decisions], dtype=np.int64)
        self._valid: dict[tuple[int, ...], str | None] = {}
        self._tables = [np.array([d.features(c) for c in d.choices], dtype=np.float32)
                        for d in self.decisions]

    @property
    def size(self) -> int:
        return math.prod(int(r) for r in self.radix)

    def __len__(self) -> int:
        return self.size

    @property
    def signature(self) -> str:
        """A short hash of the decisions and their choices: records of another space never mix."""
        text = json.dumps([d.describe() for d in self.decisions], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    @property
    def default(self) -> Config:
        """The first choice of every decision. Templates of ``polytile.ops`` operators put the
        operator's default schedule for the workload and target there, so this configuration is the
        default schedule (the tuners measure it first: ``Tuner.propose``)."""
        return self.config((0,) * len(self.decisions))

    def config(self, digits: Sequence[int]) -> Config:
        digits = tuple(int(x) for x in digits)
        return Config(self._values(digits), digits)

    def _values(self, digits: Sequence[int]) -> dict[str, Value]:
        return {d.name: d.choices[k] for d, k in zip(self.decisions, digits, strict=False)}

    def config_at(self, index: int) -> Config:
        """The configuration of a flat index (mixed radix, last decision fastest)."""
        digits = []
        for r in reversed(self.radix.tolist()):
            index, k = divmod(index, r)
            digits.append(k)
        return self.config(reversed(digits))

    def index_of(self, digits: Sequence[int]) -> int:
        index = 0
        for r, k in zip(self.radix.tolist(), digits, strict=False):
            index = index * r + int(k)
        return index

    def from_values(self, values: dict[str, object]) -> Config:
        """The configuration with these values (from JSON); TuneError if one is not a choice."""
        digits = []
        for d in self.decisions:
            if d.name not in values:
                raise TuneError(f"configuration {values} lacks decision {d.name!r}")
            v = _from_json(values[d.name])
            if v not in d.choices:
                raise TuneError(f"value {values[d.name]!r} of decision {d.name!r} is not one of its choices")
            digits.append(d.choices.index(v))
        return self.config(digits)

    def reason_invalid(self, digits: Sequence[int]) -> str | None:
        """Why a configuration is rejected before measuring (constraints, resources), or None."""
        key = digits if type(digits) is tuple else tuple(int(x) for x in digits)
        if key not in self._valid:
            self._valid[key] = self.check(self._values(key))
        return self._valid[key]

    def is_valid(self, digits: Sequence[int]) -> bool:
        return self.reason_invalid(digits) is None

    def random_digits(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return (rng.random((n, len(self.decisions))) * self.radix).astype(np.int64)

    def sample_valid(self, rng: np.random.Generator, n: int, exclude: Set[tuple[int, ...]] = frozenset(),
                     max_tries: int = 200) -> list[tuple[int, ...]]:
        """Up to ``n`` distinct valid configurations not in ``exclude``, drawn uniformly."""
        out: list[tuple[int, ...]] = []
        seen = set(exclude)
        if self.size <= 4 * max(n, 1) * max_tries:
            pool = [self.config_at(i).digits for i in rng.permutation(self.size)]
            for d in pool:
                if d not in seen and self.is_valid(d):
                    out.append(d)
                    seen.add(d)
                    if len(out) == n:
                        break
            return out
        for _ in range(max_tries):
            for row in self.random_digits(rng, 4 * n):
                d = tuple(int(x) for x in row)
                if d not in seen and self.is_valid(d):
                    out.append(d)
                    seen.add(d)
                    if len(out) == n:
                        return out
        return out

    def neighbor(self, digits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Each row with one decision changed to another of its choices (the annealing move)."""
        out = digits.copy()
        movable = np.flatnonzero(self.radix > 1)
        if movable.size == 0:
            return out
        cols = movable[rng.integers(0, movable.size, size=len(out))]
        shift = 1 + (rng.random(len(out)) * (self.radix[cols] - 1)).astype(np.int64)
        out[np.arange(len(out)), cols] = (out[np.arange(len(out)), cols] + shift) % self.radix[cols]
        return out

    def knob_features(self, digits: np.ndarray) -> np.ndarray:
        """Knob features of rows of digits: every decision's features, concatenated (fixed length)."""
        digits = np.atleast_2d(digits)
        return np.concatenate([t[digits[:, k]] for k, t in enumerate(self._tables)], axis=1)

    def knob_feature_names(self) -> list[str]:
        return [n for d in self.decisions for n in d.feature_names()]

    def __iter__(self) -> Iterator[Config]:
        for i in range(self.size):
            yield self.config_at(i)
