"""pt.tune and the CLI: tune, return the best kernel, reuse complete records without measuring."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import polytile as pt
from polytile import ops
from polytile.tune import MeasureOptions, TuneError, tune
from polytile.tune.cli import parse_shape, tune_main

FAST = MeasureOptions(repeat=3, min_time=0.0)


def test_tune_returns_a_correct_kernel_and_reuses_complete_records(tmp_path):
    path = tmp_path / "r.jsonl"
    kern = tune("layernorm", M=48, N=80, trials=3, records=path, batch_size=3, measure=FAST, progress=False)
    res = kern.tune_result
    assert res.new_trials == 3 and res.verified and len(path.read_text().splitlines()) == 3
    op = ops.get("layernorm", M=48, N=80)
    x = op.make_inputs(np.random.default_rng(5))
    assert ops.rel_error(kern(*x), op.reference(*x)) < op.tolerance
    again = tune("layernorm", M=48, N=80, trials=3, records=path, measure=FAST, progress=False, verify=False)
    assert again.tune_result.new_trials == 0 and again.tune_result.best.config == res.best.config
    assert len(path.read_text().splitlines()) == 3


def test_tune_a_plain_func_with_the_generic_template():
    A = pt.placeholder((40, 24), "float32", "A")
    k = pt.reduce_axis(24, "k")
    S = pt.compute((40,), lambda i: pt.sum(A[i, k] * A[i, k], axis=k), "S")
    kern = tune(pt.Func([A], [S], name="sumsq"), trials=2, batch_size=2, measure=FAST, progress=False,
                verify=False)
    a = np.random.default_rng(0).uniform(-1, 1, (40, 24)).astype("float32")
    assert np.allclose(kern(a), (a.astype(np.float64) ** 2).sum(axis=1), rtol=1e-5)


def test_errors_name_the_problem():
    with pytest.raises(TuneError, match="no tuning template for operator 'spmm'"):
        tune("spmm", rows=8, cols=8, nnz=8, trials=1)
    with pytest.raises(TuneError, match="unknown tuner"):
        tune("softmax", M=8, N=8, trials=1, tuner="genetic")
    with pytest.raises(pt.PolytileError, match="takes 3 sizes"):
        parse_shape("matmul", "1,2,3,4")
    assert parse_shape("matmul", "512,256,K=64") == {"M": 512, "N": 256, "K": 64}


def test_cli_tunes_prints_a_table_and_plots(tmp_path, capsys):
    plot = tmp_path / "curve.png"
    rc = tune_main(["softmax", "--shape", "M=32,N=64", "--trials", "2", "--batch", "2", "--quiet",
                    "--records", str(tmp_path / "r.jsonl"), "--plot", str(plot), "--no-verify"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "polytile tuned" in out and "numpy" in out and "× vendor time" in out
    assert plot.stat().st_size > 1000
    assert tune_main(["nosuchop", "--shape", "1"]) == 2


def test_pt_tune_is_callable_and_the_package():
    import polytile.tune as package
    assert pt.tune is package and callable(pt.tune)
    assert pt.tune.MeasureOptions is MeasureOptions and pt.tune.template is package.template


@pytest.mark.parametrize("attribute", ["apply_best", "MeasureOptions", "template", "TuneError"])
def test_pt_tune_attributes_work_on_first_access_in_a_fresh_interpreter(attribute):
    # as a user writes it: nothing imported polytile.tune before the first `pt.tune.<attribute>`
    code = f"import polytile as pt; x = pt.tune.{attribute}; assert callable(pt.tune); print(x.__name__)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == attribute


def test_tuning_a_16_bit_softmax_checks_it_with_the_16_bit_tolerance():
    kern = tune("softmax", M=24, N=40, dtype="float16", trials=2, batch_size=2, measure=FAST, progress=False)
    res = kern.tune_result
    assert res.failures == 0 and res.verified
    op = ops.get("softmax", M=24, N=40, dtype="float16")
    x = op.make_inputs(np.random.default_rng(3))
    assert kern(*x).dtype == np.float16 and ops.rel_error(kern(*x), op.reference(*x)) <= op.tolerance
