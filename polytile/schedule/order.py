"""Ordering of computations: fusion into a shared loop (``after``/``before`` at a level) and fission."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ScheduleError
from .transaction import transactional

if TYPE_CHECKING:
    from .state import Stage


def _place(self: Stage, other: Stage | object, level: str | None, after: bool) -> Stage:
    from .state import Anchor, Stage
    if not isinstance(other, Stage):
        other = self.schedule[other]  # type: ignore[index]
    if other.schedule is not self.schedule:
        raise ScheduleError(f"{self.name} and {other.name} belong to different schedules")
    if other.name == self.name:
        raise ScheduleError(f"computation {self.name} cannot be placed relative to itself")
    if level is not None:
        other.state.loops.index(level)
    st = self.schedule.state_copy(self.name)
    st.anchor = Anchor(other.name, level, after)
    self.schedule.commit(self.name, st)
    return self


@transactional
def after(self: Stage, other: Stage | object, level: str | None = None) -> Stage:
    """Run this computation after ``other``, sharing ``other``'s loops down to ``level`` (fusion);
    ``level=None`` places it after ``other`` at the top (fission)."""
    return _place(self, other, level, True)


@transactional
def before(self: Stage, other: Stage | object, level: str | None = None) -> Stage:
    """Run this computation before ``other``, sharing ``other``'s loops down to ``level``."""
    return _place(self, other, level, False)
