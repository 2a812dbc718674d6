"""The protocol of every built kernel, CPU and CUDA alike, and the signature cache that makes a
repeated call cheap.

A kernel has ``source`` (the generated C++ or CUDA), ``ir`` (the final loop IR as text),
``resources`` (what the compiler reports), ``target`` (the target object it was built for),
``func`` and ``lowered``; it is called on arrays, inputs first, optionally followed by every output
(outputs are allocated when not given; the outputs are returned, one array or a tuple), with keyword
values for the parameters that no shape fixes; ``benchmark()`` times it; ``synchronize()`` waits
for its work and raises what its device-side checks found.

Everything that the arguments' shapes, dtypes, strides, device and framework decide (parameter
values, output shapes, which arrays must be copied or checked, launch configurations, argument
packing) is worked out by the first call with that *signature* and kept; later calls look it up in a
dict. ``cache_info()`` counts the misses.
"""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, NamedTuple

from ..errors import InputError
from ..lang.func import Func
from ..lowering import loopir as ir
from .args import Signature

MAX_SIGNATURES = 256
"""Signatures a kernel keeps; the oldest is dropped first beyond this."""


class SignatureCacheInfo(NamedTuple):
    misses: int  # calls that worked out a new signature
    size: int  # signatures kept


class Plan:
    """What one signature of one kernel needs at call time."""

    __slots__ = ()
    signature: Signature


class Kernel(ABC):
    """A built function (see the module docstring)."""

    func: Func
    lowered: ir.LoweredFunc
    source: str
    target: Any  # CPUTarget or CUDATarget
    # what the compiler reports: the library on the CPU, ptxas's registers, shared memory and spills
    # per kernel on a GPU
    resources: Mapping[str, object]
    _plans: dict[Hashable, Plan]
    _misses: int

    @property
    def ir(self) -> str:
        return str(self.lowered)

    @abstractmethod
    def __call__(self, *arrays: object, **params: object) -> Any:
        """Run on ``arrays`` (inputs, optionally followed by all outputs); returns the outputs."""

    @abstractmethod
    def benchmark(self, *arrays: object, repeat: int = 20, warmup: int = 3, min_time: float = 0.0,
                  flush_cache: bool = False, **params: object) -> float:
        """Median seconds of one run after ``warmup`` runs: at least ``repeat`` timed runs, more
        until they add up to ``min_time`` seconds; ``flush_cache`` evicts the caches before each."""

    def _check_timing(self, repeat: object, warmup: object, min_time: object) -> None:
        """``benchmark``'s counts are integers (``repeat`` at least 1) and ``min_time`` is a number of
        seconds, none negative (``repeat=-1`` used to end in statistics' error on no runs)."""
        def count(v: object) -> bool:
            return isinstance(v, numbers.Integral) and not isinstance(v, bool)
        if not (count(repeat) and repeat >= 1 and count(warmup) and warmup >= 0  # type: ignore[operator]
                and isinstance(min_time, numbers.Real) and not isinstance(min_time, bool) and min_time >= 0):
            raise InputError(f"benchmark of {self.lowered.name}: repeat must be an integer >= 1, warmup >= 0 and "
                             f"min_time a number of seconds >= 0; got repeat={repeat!r}, warmup={warmup!r}, "
                             f"min_time={min_time!r}")

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for this kernel's queued work; raise what its device-side checks found."""

    def signature(self, *arrays: object, **params: object) -> Signature:
        """What a call on these arguments binds (parameters, output shapes, checks), from the cache."""
        return self._plan(self._key(arrays, params), arrays, params).signature

    def cache_info(self) -> SignatureCacheInfo:
        return SignatureCacheInfo(self._misses, len(self._plans))

    # --- the signature cache ------------------------------------------------------------------------

    def _init_signatures(self) -> None:
        self._plans = {}
        self._misses = 0

    @abstractmethod
    def _key(self, arrays: Sequence[object], params: Mapping[str, object]) -> Hashable:
        """The signature of a call (None when an argument is no array at all: the plan explains)."""

    @abstractmethod
    def _new_plan(self, arrays: Sequence[object], params: Mapping[str, object]) -> Plan:
        """Check the arguments and work out what calls of this signature need."""

    def _plan(self, key: Hashable, arrays: Sequence[object], params: Mapping[str, object]) -> Plan:
        try:
            plan = self._plans.get(key)
        except TypeError:  # an unhashable parameter value: the new plan says what is wrong
            key, plan = None, None
        if plan is None:
            plan = self._new_plan(arrays, params)
            self._misses += 1
            if key is not None:
                if len(self._plans) >= MAX_SIGNATURES:
                    del self._plans[next(iter(self._plans))]
                self._plans[key] = plan
        return plan
