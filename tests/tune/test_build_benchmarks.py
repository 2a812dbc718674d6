"""benchmarks/build_cost.py (a candidate's build CPU seconds, Python and compiler apart) and
benchmarks/cuda_compilers.py (nvcc against NVRTC on the wgmma template's candidates, no GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import build_cost  # noqa: E402
import cuda_compilers  # noqa: E402

from polytile.toolchain import find_nvrtc  # noqa: E402


def test_build_cost_splits_python_and_the_compiler(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path / "cache"))
    assert build_cost.main(["--target", "cpu", "--candidates", "2", "--label", "t"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["label"] == "t" and line["candidates"] == 2
    assert line["total"]["python_s"] > 0 and line["total"]["compiler_s"] > 0  # g++ is a child process


@pytest.mark.needs_nvcc
@pytest.mark.skipif(find_nvrtc() is None, reason="needs NVRTC (pip install polytile[nvrtc])")
def test_cuda_compilers_compares_both_on_a_candidate(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "nvcc")  # the benchmark sets both: put back after the test
    out = tmp_path / "compilers.json"
    assert cuda_compilers.main(["--candidates", "1", "--rounds", "1", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["candidates"]
    assert row["nvcc_cpu_s"] > 0 and row["nvrtc_cpu_s"] > 0
    assert set(row["nvcc_registers"]) == set(row["nvrtc_registers"])
