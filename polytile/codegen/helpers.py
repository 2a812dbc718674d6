"""The helpers a generated source defines: only those its kernels call, and what those call.

A backend registers its helper functions (``Helper``: the name the printed code calls and the C++
text defining it, overloads included) in dependency order. ``Helpers.header(body)`` collects the
helper names the printed body mentions, closes them over the names each definition mentions, and
emits those definitions in the registered order — so a kernel's source holds what it uses, and a
test that looks for a helper in it tests the kernel. Helpers of a family of instructions (one per
shape) are generated on demand by the backend's ``generate`` function.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

_NAME = re.compile(r"\bpt_\w+")  # every helper is named pt_...


@dataclass(frozen=True)
class Helper:
    """A helper function: the name code calls, and its definition (C++ text ending in a newline; a
    leading newline is dropped, so that a definition can start on the line after its quotes)."""

    name: str
    text: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", self.text.removeprefix("\n"))


def mentioned(text: str) -> set[str]:
    """The helper-like names (``pt_...``) that ``text`` mentions."""
    return set(_NAME.findall(text))


def _natural(name: str) -> list[object]:
    """Sort key that orders numbers inside names by value (n64 before n128)."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


class Helpers:
    """The helpers of one backend, in dependency order (a helper only calls helpers before it)."""

    def __init__(self, helpers: Iterable[Helper], generate: Callable[[str], str | None] = lambda name: None):
        self.table = {h.name: h for h in helpers}
        self.generate = generate  # the definition of a generated helper, None for other names

    def definition(self, name: str) -> str | None:
        """The text defining helper ``name`` (None: not a helper)."""
        helper = self.table.get(name)
        return helper.text if helper is not None else self.generate(name)

    def needed(self, body: str) -> list[str]:
        """The helpers ``body`` calls and those they call, each once: the registered ones in their
        order, then the generated ones (which may call registered ones) by name."""
        found: set[str] = set()
        todo = sorted(mentioned(body))
        while todo:
            name = todo.pop()
            text = self.definition(name)
            if text is None or name in found:
                continue
            found.add(name)
            todo += sorted(mentioned(text) - found)
        registered = [n for n in self.table if n in found]
        return registered + sorted(found - set(registered), key=_natural)

    def header(self, body: str) -> str:
        """The definitions of the helpers ``body`` needs."""
        return "".join(self.definition(n) for n in self.needed(body))  # type: ignore[misc]
