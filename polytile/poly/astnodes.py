"""Plain data produced by the polyhedral layer (no isl objects): AST nodes and integer expressions.

The lowering layer turns these into loop IR; nothing outside ``poly/`` needs islpy.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True)
class AExpr:
    """An integer expression: ``op`` is "int", "id", or an operation over ``args``.

    Operations: add sub mul neg min max fdiv_q (floor division) pdiv_q pdiv_r zdiv_r (C-style, operands
    known non-negative), select, eq le lt ge gt and or.
    """

    op: str
    args: tuple[AExpr, ...] = ()
    value: int = 0
    name: str = ""

    def __str__(self) -> str:
        if self.op == "int":
            return str(self.value)
        if self.op == "id":
            return self.name
        return f"{self.op}({', '.join(str(a) for a in self.args)})"


def aint(v: int) -> AExpr:
    return AExpr("int", value=int(v))


def aid(name: str) -> AExpr:
    return AExpr("id", name=name)


def reads_any(e: AExpr, names: Collection[str]) -> bool:
    """Whether ``e`` reads one of the identifiers ``names``."""
    return e.name in names if e.op == "id" else any(reads_any(a, names) for a in e.args)


@dataclass(frozen=True)
class AstFor:
    iterator: str
    init: AExpr
    cond: AExpr  # a comparison of the iterator with an upper bound
    step: int
    body: AstNode
    dim: int  # the schedule dimension this loop scans
    degenerate: bool = False


@dataclass(frozen=True)
class AstIf:
    cond: AExpr
    then: AstNode
    orelse: AstNode | None


@dataclass(frozen=True)
class AstBlock:
    body: tuple[AstNode, ...]


@dataclass(frozen=True)
class AstUser:
    stmt: str
    args: tuple[AExpr, ...]  # the statement's domain coordinates, in its dimension order


@dataclass(frozen=True)
class AstMark:
    name: str
    body: AstNode


AstNode = AstFor | AstIf | AstBlock | AstUser | AstMark
