"""Isolation of cases: a signal, a hang or a fuzzer failure costs one child process; replays print
runnable scripts."""

import ctypes
import json
import os
import subprocess
import sys
import time

from polytile.fuzz import runner
from polytile.fuzz.execute import Outcome


def _segfault(report):
    report({"phase": "run"})
    ctypes.string_at(0)


def _sleep(report):
    report({"phase": "build"})
    time.sleep(60)


def _fuzzer_bug(report):
    raise ZeroDivisionError("a bug of the fuzzer")


def _fine(report):
    report({"call": 's["T"].split("i", 2)', "outcome": "accepted"})
    return Outcome("ok", "check")


def test_crash_hang_and_fuzzer_failure_are_contained():
    r = runner.run_one(_segfault, (0, 0), timeout=30)
    assert (r.kind, r.phase) == ("crash", "run") and "SIGSEGV" in r.detail
    r = runner.run_one(_sleep, (0, 1), timeout=2)
    assert (r.kind, r.phase) == ("hang", "build")
    r = runner.run_one(_fuzzer_bug, (0, 2), timeout=30)
    assert r.kind == "invalid" and "ZeroDivisionError" in r.detail
    r = runner.run_one(_fine, (0, 3), timeout=30)
    assert r.kind == "ok" and [c.text for c in r.calls] == ['s["T"].split("i", 2)']


def test_pool_runs_cases_side_by_side():
    pool = runner.Pool(2, timeout=30)
    pool.start((0, 0), _fine)
    pool.start((0, 1), _segfault)
    assert pool.free == 0
    done = []
    while len(done) < 2:
        done += pool.finished()
    pool.close()
    assert sorted(r.kind for r in done) == ["crash", "ok"]


def test_replay_prints_a_script_that_reproduces_the_outcome(tmp_path):
    """The script of a replayed case runs on its own and ends as the case did (a right result
    prints "ok", a refusal at build "refused")."""
    env = {**os.environ, "POLYTILE_CACHE_DIR": str(tmp_path)}
    for k in range(6):
        proc = subprocess.run([sys.executable, "-m", "polytile.cli", "fuzz", "--seed", "4", "--case", str(k)],
                              capture_output=True, text=True, timeout=300, env=env)
        outcome = proc.stdout.strip().splitlines()[-1]
        if outcome.startswith("# outcome: ok") or outcome.startswith("# outcome: refused-late"):
            break
    else:
        raise AssertionError("no case of seed 4 among 0-5 runs cleanly")
    script = tmp_path / "case.py"
    script.write_text(proc.stdout)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1].startswith("ok" if "ok" in outcome else "refused")


def test_cli_help_and_argument_errors():
    help_ = subprocess.run([sys.executable, "-m", "polytile.cli", "fuzz", "--help"], capture_output=True, text=True,
                           timeout=120)
    assert help_.returncode == 0
    for option in ("--seed", "--cases", "--budget", "--case", "--minimize", "--jobs", "--target", "--json"):
        assert option in help_.stdout
    bad = subprocess.run([sys.executable, "-m", "polytile.cli", "fuzz", "--minimize"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--minimize needs --case" in bad.stderr


def test_campaign_summary_counts_every_case(tmp_path):
    out = tmp_path / "fuzz.json"
    proc = subprocess.run([sys.executable, "-m", "polytile.cli", "fuzz", "--seed", "4", "--cases", "3", "--json",
                           str(out), "--no-progress"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "POLYTILE_CACHE_DIR": str(tmp_path)})
    assert proc.stdout.startswith("cases 3, accepted ")
    data = json.loads(out.read_text())
    assert data["cases"] == 3 and sum(data["counts"].values()) == 3
    assert proc.returncode == (1 if data["findings"] else 0)
