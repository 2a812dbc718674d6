"""A tuning run killed mid-way (SIGKILL to its whole process group) loses no record, and the restarted
run measures nothing twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = Path(__file__).with_name("resume_child.py")
TRIALS = 12


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _valid(lines: list[str]) -> list[dict]:
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def test_killed_run_resumes_without_loss_or_repeats(tmp_path):
    records = tmp_path / "r.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, str(CHILD), str(records), str(TRIALS)], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    try:
        while len(_valid(_lines(records))) < 4:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the tuning run wrote no records"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run, its builders and its runner
        proc.wait()
    before = _valid(_lines(records))
    assert 4 <= len(before) < TRIALS
    again = subprocess.run([sys.executable, str(CHILD), str(records), str(TRIALS)], env=env,
                           capture_output=True, timeout=300)
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    after = _valid(_lines(records))
    assert after[:len(before)] == before  # nothing lost or rewritten
    assert len(after) == TRIALS
    keys = [json.dumps(r["config"], sort_keys=True) for r in after]
    assert len(set(keys)) == TRIALS  # nothing measured twice
    assert all(r["status"] == "ok" for r in after)
