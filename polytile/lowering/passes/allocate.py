"""Allocation of intermediate computations: one buffer each, around the whole body."""

from __future__ import annotations

from .. import loopir as ir


def allocate_intermediates(s: ir.Stmt, buffers: list[ir.Buffer]) -> ir.Stmt:
    """Wrap ``s`` in an allocation of every intermediate (non-argument) tensor buffer."""
    for b in reversed(buffers):
        if b.scope != "arg":
            s = ir.Allocate(b, s)
    return s
