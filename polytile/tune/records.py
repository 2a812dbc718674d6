"""Tuning records: an append-only JSON-lines log of every trial, safe against a killed process.

One line per trial: workload key, target key, template, configuration, status, costs, error,
timestamps, the tuner that proposed it and the conditions it was timed under (clocks, power, toolkit
and driver versions). When a run declares its winner (the best configurations timed again in a fresh
process), one more line with ``role`` "winner" holds the winner and its re-timed costs: it is not a
trial, and ``best`` returns it until a later trial of the workload is written. Lines are appended
under an exclusive lock, flushed and fsynced before the next trial starts, so a killed run loses at
most the trial in flight, and several tuners may append to one file; a torn last line (the process
died mid-write) is skipped when reading. The best configuration is looked up by
workload *and* target: records of another machine are never applied. A file that is not a records
file (any line neither a record nor the torn start of one), a directory or a path that cannot be
written is refused before the first trial (``RecordLog.check``), and nothing is appended to it.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .space import TuneError

FORMAT_VERSION = 1
LINE_START = '{"workload":'  # how every line ``Record.to_line`` writes begins (its first field)


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
    conditions: dict[str, object] = field(default_factory=dict)
    cached: bool = False
    role: str = "trial"
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


def append_line(path: Path, line: str) -> None:
    """Append ``line`` and a newline to the JSON-lines file ``path`` (its folders made) under an
    exclusive lock, flushed and fsynced: several processes may append to one file, and a torn line
    left by a killed writer is ended first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":  # a torn line from a killed writer: end it
                    f.write(b"\n")
            f.write((line + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class RecordLog:
    """The records file at ``path`` (its folders made by ``check(writable=True)``, the file on first append)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def check(self, writable: bool = False) -> None:
        """Raise ``TuneError`` unless ``path`` is a records file or absent (and, with ``writable``, can be
        appended to): checked before tuning starts, so a user's other file is never touched."""
        what = f"records file {self.path}"
        if self.path.is_dir():
            raise TuneError(f"{what} is a directory; give the path of a file in it, e.g. {self.path / 'tune.jsonl'}")
        if self.path.exists():
            if not self.path.is_file():
                raise TuneError(f"{what} is not a regular file; give the path of a JSON-lines records file")
            for _ in self:  # reading validates every line
                pass
        if writable:
            self._check_writable(what)

    def _check_writable(self, what: str) -> None:
        if self.path.exists():
            try:
                with open(self.path, "ab"):  # appends nothing: the file is unchanged
                    pass
            except OSError as err:
                raise TuneError(f"{what} cannot be written ({err.strerror}); make it writable or give "
                                "another path") from None
            return
        folder = self.path.parent
        while not folder.exists():
            folder = folder.parent
        if not folder.is_dir():
            raise TuneError(f"{what} cannot be created: {folder} is not a directory")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise TuneError(f"{what} cannot be created: folder {folder} is not writable; give another path")
        # permissions do not tell everything (root passes os.access; /proc or a read-only mount refuse
        # anyway): the file's folders are made now and a scratch file written there and removed
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.path.parent):
                pass
        except OSError as err:
            raise TuneError(f"{what} cannot be created in {self.path.parent} ({err.strerror}); give another "
                            "path") from None

    def append(self, rec: Record) -> None:
        """Add one record durably (locked, flushed and fsynced); a file that cannot be written (a full
        disk, a folder removed during the run) raises ``TuneError``: the records written so far stay."""
        try:
            self._append(rec)
        except OSError as err:
            raise TuneError(f"records file {self.path} could not be written ({err.strerror}): the records "
                            "written before are kept; free space or give another path and run again to "
                            "resume") from None

    def _append(self, rec: Record) -> None:
        append_line(self.path, rec.to_line())

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
                    if line.startswith(LINE_START) or LINE_START.startswith(line):
                        continue  # a torn line from a killed run
                    d = None
                if not isinstance(d, dict) or "workload" not in d or "target" not in d:
                    excerpt = line if len(line) <= 60 else line[:57] + "..."
                    raise TuneError(f"{self.path} is not a polytile records file (line {lineno} reads "
                                    f"{excerpt!r}); it was left untouched: give a new path or a records file "
                                    "written by polytile tune")
                if int(d.get("version", 1)) > FORMAT_VERSION:
                    raise TuneError(f"{self.path}:{lineno} was written by a newer polytile (format "
                                    f"{d['version']}); upgrade polytile to read it")
                yield Record.from_dict(d)

    def select(self, workload: str, target: str, role: str = "trial") -> list[Record]:
        """The records of one workload on one target with ``role`` (the trials unless told), in the order
        they were written."""
        return [r for r in self if r.workload == workload and r.target == target and r.role == role]

    def best(self, workload: str, target: str) -> Record | None:
        """The winner of ``workload`` on ``target``: the last declared winner when no trial was written
        after it, else the fastest successful trial (None if there is none)."""
        latest: Record | None = None
        trials: list[Record] = []
        for r in self:
            if r.workload != workload or r.target != target:
                continue
            if r.role == "winner":
                latest, trials = r, []
            elif r.role == "trial":
                trials.append(r)
        if latest is not None and not trials:
            return latest
        ok = [r for r in self.select(workload, target) if r.ok]
        return min(ok, key=lambda r: r.cost) if ok else None

    def targets_of(self, workload: str) -> set[str]:
        return {r.target for r in self if r.workload == workload}
