"""``polytile tlm``: a corpus, a tiny pretrained model, fine-tuning on records and an evaluation, each
from the command line, and one-line errors for bad arguments."""

from __future__ import annotations

import json

import pytest

from polytile.cli import main
from polytile.tune.tlm.corpus import read_corpus
from polytile.tune.tlm.model import TLM


def test_corpus_pretrain_finetune_evaluate(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    assert main(["tlm", "corpus", "--out", str(corpus), "--networks", "llama-7b", "--size", "400",
                 "--quiet"]) == 0
    header, texts = read_corpus(corpus)
    assert len(texts) >= 400 and header["networks"] == ["llama-7b"] and header["target_kind"] == "cpu"
    assert {"matmul_cpu", "batch_matmul_cpu", "softmax_cpu", "layernorm_cpu", "generic_cpu"} <= set(header["templates"])
    model = tmp_path / "m"
    assert main(["tlm", "pretrain", str(corpus), "--out", str(model), "--layers", "1", "--width", "32",
                 "--heads", "2", "--threads", "1", "--quiet"]) == 0
    assert "parameters" in capsys.readouterr().out
    tlm = TLM.load(model, device="cpu")
    assert tlm.kind == "cpu" and tlm.meta["training"][0]["sentences"] == len(texts)
    out = tmp_path / "eval.json"
    records = tmp_path / "rec"
    assert main(["tlm", "evaluate", str(model), "softmax", "--shape", "M=30,N=40", "--trials", "2", "--batch", "2",
                 "--tuners", "tlm,random@1", "--records-dir", str(records), "--out", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    tuners = report["workloads"]["softmax"]["tuners"]
    assert len(tuners["tlm"]["curve"]) == 2 and len(tuners["random@1"]["curve"]) == 1
    assert tuners["tlm"]["best_after"]["1"] > 0
    tuned = tmp_path / "tuned"
    assert main(["tlm", "finetune", str(model), "--records", str(records / "tlm.jsonl"), "--out", str(tuned),
                 "--epochs", "2", "--quiet"]) == 0
    assert "fine-tuned on 2 sentences of 1 workload(s)" in capsys.readouterr().out
    assert TLM.load(tuned, device="cpu").meta["training"][-1]["stage"] == "finetune"


@pytest.mark.parametrize("argv, message", [
    (["tlm", "pretrain", "nothing.txt", "--out", "m"], "corpus nothing.txt does not exist"),
    (["tlm", "corpus", "--out", "c.txt", "--networks", "alexnet"], "unknown network 'alexnet'"),
    (["tlm", "evaluate", "nothing"], "give either an operator with --shape, or --network"),
    (["tlm", "evaluate", "nothing", "softmax", "--shape", "M=8,N=8"], "TLM model nothing does not exist"),
    (["tlm", "finetune", "nothing", "--records", "r.jsonl", "--out", "m"], "TLM model nothing does not exist"),
    (["tune", "softmax", "--shape", "30,40", "--tuner", "tlm", "--trials", "1"], "needs a trained model"),
    (["tune", "softmax", "--shape", "30,40", "--tuner", "tlm", "--model", "nothing"], "nothing does not exist"),
    (["tune", "softmax", "--shape", "30,40", "--model", "m"], "options of tuner='tlm', not of 'xgb'"),
    (["tlm", "evaluate", "default", "matmul", "--shape", "64,64,64,dtype=float16", "--target", "cuda:sm_90a",
      "--tuners", "random"], "no GPU found"),
])
def test_bad_arguments_are_one_line_errors(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POLYTILE_NO_GPU", "1")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
