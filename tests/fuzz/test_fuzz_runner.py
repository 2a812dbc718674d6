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


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "polytile.cli", "fuzz", *args], capture_output=True, text=True,
                          timeout=600, **kw)


def test_cli_help_and_argument_errors():
    help_ = _cli("--help")
    assert help_.returncode == 0
    for option in ("--seed", "--cases", "--budget", "--case", "--minimize", "--jobs", "--target", "--json",
                   "--record"):
        assert option in help_.stdout
    for args, message in ((["--minimize"], "--minimize needs --case"), (["--jobs", "0"], "--jobs must be at least 1"),
                          (["--cases", "-3"], "--cases must be at least 1"),
                          (["--budget", "0"], "--budget must be a positive number of seconds")):
        bad = _cli(*args)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr)


def test_campaign_record_counts_every_case(tmp_path):
    """--json and --record write the same record: the case range, where it ran, what it found."""
    env = {**os.environ, "POLYTILE_CACHE_DIR": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = _cli("--seed", "4", "--first", "2", "--cases", "3", "--jobs", "2", "--json", str(tmp_path / "fuzz.json"),
                "--record", "--no-progress", env=env, cwd=tmp_path)
    assert proc.stdout.startswith("cases 3, accepted ")
    data = json.loads((tmp_path / "fuzz.json").read_text())
    (recorded,) = (tmp_path / "benchmarks" / "results").glob("fuzz-*.json")
    assert json.loads(recorded.read_text()) == data
    assert (data["seed"], data["first"], data["last"], data["jobs"]) == (4, 2, 4, 2)
    assert data["cases"] == 3 and sum(data["counts"].values()) == 3
    assert len(data["commit"]) >= 40 and data["host"] and data["seconds"] > 0 and data["cases_per_min_per_core"] > 0
    assert data["command"] == f"polytile fuzz --seed 4 --first 2 --cases 3 --jobs 2 --json {tmp_path / 'fuzz.json'} " \
                              "--record --no-progress"
    assert proc.returncode == (1 if data["findings"] else 0)
