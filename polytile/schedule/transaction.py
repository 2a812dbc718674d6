"""Primitives apply fully or not at all: one that raises leaves every part of the schedule as it was
(stages, caches, pipelines, inlined computations, the polyhedral program), not only its stage.

``@transactional`` wraps a primitive; ``snapshot``/``restore`` are the whole-schedule copy it takes
before and puts back on an exception.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .state import Schedule

P = TypeVar("P", bound=Callable[..., Any])


def snapshot(sched: Schedule) -> dict[str, object]:
    """The schedule's attributes, copied down to what primitives change in place (lists, dicts,
    sets and the dataclasses in them: stage states, cache specifications); what they only replace
    (loop schedules, expressions, the polyhedral program) is shared."""
    return {key: _copied(value) for key, value in vars(sched).items()}


def restore(sched: Schedule, saved: dict[str, object]) -> None:
    """Put back a snapshot: the schedule is exactly what it was when the snapshot was taken."""
    vars(sched).clear()
    vars(sched).update({key: _copied(value) for key, value in saved.items()})


def _copied(value: object) -> object:
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copied(v) for v in value]
    if isinstance(value, set):
        return set(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _copied(getattr(value, f.name))
                                             for f in dataclasses.fields(value) if f.init})
    return value


def transactional(primitive: P) -> P:
    """Make a primitive of a ``Stage`` all-or-nothing over its whole schedule."""
    @functools.wraps(primitive)
    def apply(stage: Any, *args: Any, **kwargs: Any) -> Any:
        sched = stage.schedule
        saved = snapshot(sched)
        try:
            return primitive(stage, *args, **kwargs)
        except BaseException:
            restore(sched, saved)
            raise
    return apply  # type: ignore[return-value]
