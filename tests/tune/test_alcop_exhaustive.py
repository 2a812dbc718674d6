"""benchmarks/alcop_search.py --exhaustive: the table of every valid configuration, prebuilt chunks,
resuming from the saved table, and the Fig. 12 summary (CPU only: a simulated or fake measurer)."""

from __future__ import annotations

import json
import lzma
import math
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import alcop_search as bench  # noqa: E402

from polytile.tune import MeasureResult  # noqa: E402
from polytile.tune.workers import Raised, Returned  # noqa: E402


class _Space:
    """Six configurations x = 0..5; x = 4 is invalid."""

    size = 6

    def config_at(self, i: int):  # noqa: ANN201
        return type("C", (), {"values": {"x": i}, "digits": (i,)})()

    def config(self, d):  # noqa: ANN001, ANN201
        return self.config_at(d[0])

    def is_valid(self, d) -> bool:  # noqa: ANN001
        return d[0] != 4


class _Task:
    space = _Space()
    key = "fake"

    def predict(self, configs):  # noqa: ANN001, ANN201
        return [1.0 + c["x"] for c in configs]  # the model ranks x = 0 first


class _Inner:
    """Builds by returning the configuration; a run takes 10 - x seconds (x = 5 is the fastest); x = 3
    fails to build."""

    def __init__(self) -> None:
        self.built: list[int] = []
        self.ran: list[int] = []

    def build(self, task, batch):  # noqa: ANN001, ANN201
        self.built += [v["x"] for v in batch]
        return [Raised("BuildError", "no", True) if v["x"] == 3 else Returned(v["x"]) for v in batch]

    def run_built(self, task, values, built) -> MeasureResult:  # noqa: ANN001
        self.ran.append(values["x"])
        if not isinstance(built, Returned):
            return MeasureResult("build_error", [], "no")
        assert built.value == values["x"]
        return MeasureResult("ok", [10.0 - values["x"]])


def test_table_uses_prebuilt_chunks_builds_the_rest_and_resumes(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(bench, "CHUNK", 2)
    task, inner = _Task(), _Inner()
    assert bench.valid_configs(task) == [{"x": 0}, {"x": 1}, {"x": 2}, {"x": 3}, {"x": 5}]
    (tmp_path / "pre" / "w").mkdir(parents=True)
    # the second chunk ({x: 2}, {x: 3}) was built elsewhere, by these sources
    (tmp_path / "pre" / "w" / "chunk-0001.pkl.xz").write_bytes(lzma.compress(
        pickle.dumps([({"x": 2}, Returned(2)), ({"x": 3}, Raised("BuildError", "no", True))])))
    (tmp_path / "pre" / "w" / bench.STAMP).write_text(bench.sources_digest())
    saved = tmp_path / "w-exhaustive.jsonl"
    table, valid = bench.exhaustive_table("w", task, inner, tmp_path / "pre", saved, math.inf)
    assert valid == 5 and len(table) == 5
    assert sorted(inner.built) == [0, 1, 5]  # not the prebuilt chunk
    assert table[bench.config_key({"x": 3})].status == "build_error"
    assert table[bench.config_key({"x": 5})].cost == 5.0
    assert len(saved.read_text().splitlines()) == 5
    # a table cut short: the chunks done are neither built nor run again
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(line + "\n" for line in saved.read_text().splitlines()[:2]))
    third = _Inner()
    bench.exhaustive_table("w", task, third, None, partial, math.inf)
    assert sorted(third.built) == [2, 3, 5] and sorted(third.ran) == [2, 3, 5]

    again = _Inner()
    table2, _ = bench.exhaustive_table("w", task, again, tmp_path / "pre", saved, math.inf)
    assert again.ran == [] and again.built == []
    assert {k: r.cost for k, r in table2.items()} == {k: r.cost for k, r in table.items()}

    ranked = [(0,), (1,), (2,), (3,), (5,)]  # the model's order
    summary = bench.exhaustive_summary(task, ranked, table, valid)
    assert summary["complete"] and summary["failed"] == 1
    assert summary["best_config"] == {"x": 5}
    assert summary["model_top1_over_best"] == pytest.approx(5.0 / 10.0)
    assert summary["model_top10_over_best"] == 1.0
    assert summary["model_pairwise_accuracy"] == 0.0  # the model has every pair backwards
    assert summary["best_rank_of_model_top1"] == 4


def test_prebuild_writes_the_chunks_asked_for_and_refuses_other_sources(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(bench, "CHUNK", 2)
    task, inner = _Task(), _Inner()
    bench.prebuild("w", task, inner, tmp_path, math.inf, chunks=(1, 3))
    folder = tmp_path / "w"
    assert sorted(p.name for p in folder.glob("chunk-*")) == ["chunk-0001.pkl.xz", "chunk-0002.pkl.xz"]
    assert sorted(inner.built) == [2, 3, 5]
    pairs = pickle.loads(lzma.decompress((folder / "chunk-0002.pkl.xz").read_bytes()))
    assert [v for v, _ in pairs] == [{"x": 5}] and isinstance(pairs[0][1], Returned)

    (folder / bench.STAMP).write_text("0" * 64)  # as if built before a change to polytile
    with pytest.raises(ValueError, match="other polytile sources"):
        bench.exhaustive_table("w", task, _Inner(), tmp_path, tmp_path / "t.jsonl", math.inf)
    with pytest.raises(ValueError, match="other polytile sources"):
        bench.prebuild("w", task, _Inner(), tmp_path, math.inf)


@pytest.mark.parametrize("bad", ["3", "a:b", "5:2", "-1:4"])
def test_bad_chunk_ranges_are_refused(bad: str) -> None:
    import argparse
    assert bench.chunk_range("0:43") == (0, 43)
    with pytest.raises(argparse.ArgumentTypeError):
        bench.chunk_range(bad)


def test_simulated_exhaustive_run(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "alcop_search.py"), "--simulate",
                           "--exhaustive", "--quick", "--tuners", "analytical,grid", "--out", str(out),
                           "--records-dir", str(tmp_path / "rec")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = json.loads(out.read_text())["workloads"]["bert_ffn2"]
    ex = entry["exhaustive"]
    assert ex["complete"] and ex["measured"] == entry["valid_configs"]
    assert 0 < ex["model_top1_over_best"] <= ex["model_top10_over_best"] <= ex["model_top50_over_best"] <= 1
    for t in ("analytical", "grid"):
        got = entry["tuners"][t]["best_vs_exhaustive"]
        assert 0 < got["10"] <= got["16"] <= 1
