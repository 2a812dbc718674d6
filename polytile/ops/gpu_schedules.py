"""Default CUDA schedules of the operators, by operator kind (filled in by the CUDA backend)."""

from __future__ import annotations

from collections.abc import Callable

SCHEDULES: dict[str, Callable[..., None]] = {}
