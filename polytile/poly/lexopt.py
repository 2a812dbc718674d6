"""Lexicographic optima (isl's lexmin and lexmax) that do not fail on how a set happens to be stored.

isl's parametric lexopt raises "affine expression involves some of the domain dimensions" on some
sets with existentially quantified variables (a ``mod``), depending only on the form it holds them
in: a dependence of fuzz seed 7 case 5182 failed as built (its equalities implicit) and succeeds
with them detected; one of seed 31 case 6536 succeeds as built and failed with its equalities
detected (the fix of 5182), yet succeeds once its redundant constraints are dropped too, or once
printed and parsed again. isl's lexmin also answered an empty set for a non-empty dependence with
three ``mod`` conditions as built (fuzz seed 67 cases 3236 and 9274), and the right point once
printed and parsed again. No one form is safe, so every lexopt of the polyhedral layer goes
through ``lexopt``, which asks again on equal forms of the set before it gives up."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import islpy as isl

S = TypeVar("S", isl.Set, isl.Map, isl.BasicSet, isl.BasicMap)

_FORMS: tuple[tuple[str, Callable], ...] = (
    ("as built", lambda s: s),
    # equalities explicit (5182), then the redundant constraints dropped (6536: detect_equalities
    # alone gave a form isl's lexopt fails on)
    ("simplified", lambda s: s.detect_equalities().remove_redundancies()),
    # a fresh form, as isl normalizes text it parses
    ("reparsed", lambda s: type(s).read_from_str(s.get_ctx(), str(s))),
)


def lexopt(s: S, which: str) -> S:
    """``s.lexmin()`` or ``s.lexmax()`` (``which`` is "min" or "max"), asked again on equal forms of
    ``s`` where isl fails on the form it has (the first error is raised when every form fails; a
    spent operation budget fails them all, and ``isl_budget`` still reports it as such)."""
    first: isl.Error | None = None
    for _, form in _FORMS:
        try:
            out = getattr(form(s), "lex" + which)()
        except isl.Error as err:
            first = first or err
            continue
        # isl's answer on one form may lose every point (seed 67 cases 3236, 9274): ask the next one
        if not out.is_empty() or s.is_empty():
            return out
    raise first or isl.Error(f"isl's lex{which} of a non-empty set came out empty in every form: {s}")


def lexmin(s: S) -> S:
    return lexopt(s, "min")


def lexmax(s: S) -> S:
    return lexopt(s, "max")


def first_point(s: isl.Set) -> isl.Point:
    """A point of the non-empty ``s`` that is lexicographically first for the parameters it has
    (a stable example for a message)."""
    return lexmin(s).sample_point()
