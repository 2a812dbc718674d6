"""The result cache: a trial's outcome kept under (workload, target, toolkit, configuration), so a
configuration measured once on this machine is not built and timed again by a later run, whatever
records file that run writes (or none).

The key also holds a digest of polytile's own sources (a changed compiler makes other kernels) and the
measurement options that change an outcome (checks, threads, cache flushing, the test hook). Only
outcomes that repeat are kept: successes, configurations the template rejects, build errors and wrong
results; crashes, timeouts and device errors may come from the machine's state and are measured again.
Entries are files in ``<cache dir>/results`` (``POLYTILE_CACHE_DIR``), written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

KEPT = ("ok", "invalid", "build_error", "wrong_result")


@cache
def sources_digest() -> str:
    """A digest of polytile's Python sources and C/CUDA headers (the compiler that makes the kernels)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".h") and p.is_file()):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


class ResultCache:
    """Outcomes of trials by key; ``folder`` defaults to ``<cache dir>/results``."""

    def __init__(self, folder: str | os.PathLike[str] | None = None):
        if folder is None:
            from ..runtime.cpu import cache_dir
            folder = cache_dir() / "results"
        self.folder = Path(folder)

    @staticmethod
    def key(workload: str, target: str, toolkit: str, config: dict[str, object], options: dict[str, object]) -> str:
        text = json.dumps({"workload": workload, "target": target, "toolkit": toolkit, "config": config,
                           "options": options, "polytile": sources_digest()}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.folder / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None

    def put(self, key: str, result: dict[str, Any]) -> None:
        if result.get("status") not in KEPT:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(result, f)
        os.replace(tmp, self.folder / f"{key}.json")
