"""Inputs and errors of the GPU numeric tests: random non-zero values (magnitudes 0.5-1.5, random signs,
so no sum cancels to zero by construction) and the relative error against a float64 reference; the
skip of tests that need a Hopper GPU."""

from __future__ import annotations


def signed_inputs(torch, shapes, dtype: str, seed: int):  # noqa: ANN001, ANN201 - torch is the test's import
    """One CUDA tensor of ``dtype`` per shape, drawn from a generator seeded with ``seed``."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    tdt = getattr(torch, dtype)
    out = []
    for s in shapes:
        mag = torch.rand(s, device="cuda", generator=g) + 0.5
        sign = torch.randint(0, 2, s, device="cuda", generator=g) * 2 - 1
        out.append((mag * sign).to(tdt))
    return out


def rel_error(out, ref) -> float:  # noqa: ANN001
    """``|out - ref| / |ref|`` in float64; every value of ``out`` must be finite."""
    assert bool(out.isfinite().all())
    return float((out.double() - ref).norm() / ref.norm())


def skip_unless_hopper(torch, what: str) -> None:  # noqa: ANN001 - torch is the test's import
    """Skip the calling test unless an sm_90 GPU (H100/H200) is present: ``what`` needs one."""
    import pytest
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"{what} need an sm_90 GPU (H100/H200)")
