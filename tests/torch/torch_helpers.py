"""Compile a function or module with the polytile backend and compare it with eager torch."""

from __future__ import annotations

from typing import Any

import torch


def compile_and_compare(fn: Any, *inputs: Any, tol: float | None = None, **options: Any) -> Any:
    """Compile ``fn`` with the polytile backend (``choose="always"`` unless given: every group polytile
    can take is taken), check its result against eager torch on ``inputs`` and return the report."""
    import polytile.torch as ptt
    report = ptt.Report()
    options.setdefault("choose", "always")
    compiled = torch.compile(fn, backend=ptt.backend(report=report, **options), dynamic=False)
    with torch.no_grad():
        want = fn(*inputs)
        got = compiled(*inputs)
    assert_close(got, want, tol)
    return report


def assert_close(got: Any, want: Any, tol: float | None = None) -> None:
    if isinstance(want, (tuple, list)):
        for g, w in zip(got, want, strict=True):
            assert_close(g, w, tol)
        return
    assert got.shape == want.shape and got.dtype == want.dtype
    if tol is None:
        tol = 2e-2 if want.dtype in (torch.float16, torch.bfloat16) else 1e-4
    w, g = want.double(), got.double()
    err = (torch.linalg.vector_norm(g - w) / torch.linalg.vector_norm(w).clamp_min(1e-30)).item()
    assert err <= tol, f"relative error {err:.2e} > {tol:.0e}"
