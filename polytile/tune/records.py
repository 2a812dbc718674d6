"""Tuning records: an append-only JSON-lines log of every trial, safe against a killed process.

One line per trial: workload key, target key, template, configuration, status, costs, error,
timestamps and the tuner that proposed it. Lines are appended under an exclusive lock, flushed and
fsynced before the next trial starts, so a killed run loses at most the trial in flight; a torn last
line (the process died mid-write) is skipped when reading. The best configuration is looked up by
workload *and* target: records of another machine are never applied.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .space import TuneError

FORMAT_VERSION = 1


@dataclass
class Record:
    """One trial. ``cost`` is the median time in seconds of a successful trial (inf otherwise)."""

    workload: str
    target: str
    template: str
    config: dict[str, object]
    status: str
    costs: list[float] = field(default_factory=list)
    error: str = ""
    tuner: str = ""
    trial: int = 0
    started: float = 0.0
    build_s: float = 0.0
    run_s: float = 0.0
    flops: float = 0.0
    version: int = FORMAT_VERSION

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.costs)

    @property
    def cost(self) -> float:
        if not self.ok:
            return float("inf")
        c = sorted(self.costs)
        return c[len(c) // 2]

    @property
    def config_key(self) -> str:
        return json.dumps(self.config, sort_keys=True, separators=(",", ":"))

    def to_line(self) -> str:
        d = asdict(self)
        d["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started or time.time()))
        return json.dumps(d, separators=(",", ":"))

    @staticmethod
    def from_dict(d: dict[str, object]) -> Record:
        known = {f for f in Record.__dataclass_fields__}
        return Record(**{k: v for k, v in d.items() if k in known})  # type: ignore[arg-type]


class RecordLog:
    """The records file at ``path`` (created on first append)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def append(self, rec: Record) -> None:
        """Add one record durably (locked, flushed and fsynced)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = rec.to_line() + "\n"
        with open(self.path, "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.seek(0, os.SEEK_END)
                if f.tell() > 0:
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":  # a torn line from a killed writer: end it
                        f.write(b"\n")
                f.write(line.encode())
                f.flush()
                os.fsync(f.fileno())
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def __iter__(self) -> Iterator[Record]:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    d = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn line from a killed run
                if not isinstance(d, dict) or "workload" not in d or "target" not in d:
                    raise TuneError(f"{self.path}:{lineno} is not a polytile tuning record")
                if int(d.get("version", 1)) > FORMAT_VERSION:
                    raise TuneError(f"{self.path}:{lineno} was written by a newer polytile (format "
                                    f"{d['version']}); upgrade polytile to read it")
                yield Record.from_dict(d)

    def select(self, workload: str, target: str) -> list[Record]:
        """The records of one workload on one target, in the order they were written."""
        return [r for r in self if r.workload == workload and r.target == target]

    def best(self, workload: str, target: str) -> Record | None:
        """The fastest successful record of ``workload`` on ``target`` (None if there is none)."""
        ok = [r for r in self.select(workload, target) if r.ok]
        return min(ok, key=lambda r: r.cost) if ok else None

    def targets_of(self, workload: str) -> set[str]:
        return {r.target for r in self if r.workload == workload}
