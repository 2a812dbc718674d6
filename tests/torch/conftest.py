"""The torch tests: a seeded torch generator per test and a fresh dynamo cache."""

from __future__ import annotations

import zlib

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _seed_and_reset(request: pytest.FixtureRequest) -> None:
    """A fixed seed per test (printed on failure) and a fresh dynamo cache (each test compiles anew)."""
    seed = zlib.crc32(request.node.nodeid.encode())
    request.node.user_properties.append(("torch_seed", seed))
    torch.manual_seed(seed)
    torch._dynamo.reset()
