"""Schedule primitives on named loops, checked against exact dependences."""

from .state import Schedule, Stage

__all__ = ["Schedule", "Stage"]
