"""A bound on the work isl may spend answering one question (a legality check, an AST), so that a
schedule too complex for the polyhedral machinery is a clear error, not a hang."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import islpy as isl

from ..errors import PolytileError

ISL_OPERATIONS = 20_000_000
"""isl's operation budget per question: about 20 s of its work (it counts the steps of its integer
programming, from about a million a second down to a quarter of that on huge coefficients). The
heaviest schedule of the test suite needs 4.4 million (the AST of a bfloat16 batched GEMM on
tensor cores), its legality check 2.7 million."""

_depth = [0]


@contextmanager
def isl_budget(error: type[PolytileError], what: str) -> Iterator[None]:
    """Run the enclosed isl calls within ``ISL_OPERATIONS``; past it, raise ``error`` saying that
    ``what`` is too complex. Nested uses share the outermost budget."""
    ctx = isl.DEFAULT_CONTEXT
    outermost = _depth[0] == 0
    if outermost:
        ctx.reset_operations()
        ctx.set_max_operations(ISL_OPERATIONS)
    _depth[0] += 1
    try:
        yield
    except isl.Error:
        if not budget_spent():
            raise
        raise error(f"{what} is too complex for the polyhedral analysis (isl gave up after "
                    f"{ISL_OPERATIONS} operations); simplify it: fewer nested splits or fusions of one loop, "
                    "or a simpler apply_sch map") from None
    finally:
        _depth[0] -= 1
        if outermost:
            ctx.set_max_operations(0)


def budget_spent() -> bool:
    """Whether isl has used up its operations (it then fails in any call, some of which report it
    as another error: its parser says "syntax error")."""
    try:
        isl.BasicSet("{ [i] : 0 <= i }")
    except isl.Error:
        return True
    return False
