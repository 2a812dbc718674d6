"""The analytical tuners: "analytical" measures in the model's order, never twice, and resumes from
records; "analytical+xgboost" starts from the model and beats plain XGBoost at small budgets when the
model is good; both run through tune_task and the CLI (with a stand-in measurer: no GPU here)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polytile.target import CUDATarget
from polytile.tune import (
    AnalyticalTuner,
    AnalyticalXGBTuner,
    ConfigSpace,
    MeasureResult,
    ModelTuner,
    TemplateConfig,
    TuneError,
    make_task,
    make_tuner,
    tune_task,
)
from polytile.tune.cli import parse_shape, tune_main

H100 = CUDATarget(name="H100", arch="sm_90a")


def _space() -> ConfigSpace:
    cfg = TemplateConfig("define", CUDATarget())
    cfg.split("a", 1024, 3, policy="pow2")
    cfg.split("b", 512, 2, policy="pow2")
    cfg.knob("c", [1, 2, 3, 4, 5, 6])
    cfg.tag("t", "x", ["serial", "unroll", "vectorize"])
    return ConfigSpace(cfg.decisions, lambda v: None if v["c"] != 5 else "c=5 is invalid")


def _cost(space: ConfigSpace, d) -> float:  # noqa: ANN001
    v = space.config(d).values
    a, b = v["a"], v["b"]
    return float((np.log2(a[1]) - 5) ** 2 + (np.log2(a[2]) - 3) ** 2 + (np.log2(b[1]) - 6) ** 2
                 + (v["c"] - 4) ** 2 + (0 if v["t"] == "unroll" else 3) + 1)


def _predictor(space: ConfigSpace, noise: float = 0.0, seed: int = 0):  # noqa: ANN202
    rng = np.random.default_rng(seed)
    table: dict[tuple[int, ...], float] = {}

    def predict(ds):  # noqa: ANN001, ANN202
        out = []
        for d in ds:
            if d not in table:
                table[d] = _cost(space, d) * float(rng.lognormal(0, noise)) if noise else _cost(space, d)
            out.append(table[d])
        return np.array(out)
    return predict


def test_analytical_tuner_measures_in_model_order_and_never_twice():
    space = _space()
    predict = _predictor(space, noise=0.3)
    tuner = AnalyticalTuner(space, predict=predict)
    proposed = []
    while batch := tuner.next_batch(64):
        tuner.update(batch, [1.0] * len(batch))
        proposed += batch
    valid = [c.digits for c in space if space.is_valid(c.digits)]
    assert len(proposed) == len(set(proposed)) == len(valid) < space.size  # every valid one, once
    times = predict(proposed)
    assert np.all(np.diff(times) >= 0)  # fastest predicted first
    assert tuner.next_batch(8) == []


def test_analytical_tuner_skips_what_the_records_hold():
    space = _space()
    predict = _predictor(space)
    order = AnalyticalTuner(space, predict=predict).next_batch(20)
    resumed = AnalyticalTuner(space, predict=predict)
    resumed.update(order[:5] + order[10:12], [1.0] * 7)  # records of an interrupted run
    assert resumed.next_batch(13) == order[5:10] + order[12:20]


def test_analytical_tuner_anneals_a_space_too_large_to_rank():
    space = _space()
    predict = _predictor(space)
    tuner = AnalyticalTuner(space, predict=predict, exhaustive_limit=100, chains=64, steps=200)
    seen = set()
    for _ in range(3):
        batch = tuner.next_batch(8)
        assert len(batch) == 8 and not seen & set(batch)
        tuner.update(batch, predict(batch).tolist())
        seen |= set(batch)
    assert min(predict(list(seen))) == 1.0  # annealing on the model finds its optimum


def test_model_tuners_need_a_model():
    with pytest.raises(TuneError, match="needs the template's analytical model"):
        make_tuner("analytical", _space())
    with pytest.raises(TuneError, match="has no analytical model"):
        tune_task(make_task("softmax", "cpu", M=8, N=8), 2, tuner="analytical+xgboost", progress=False)


def _search(tuner, space: ConfigSpace, trials: int, batch: int = 8) -> float:  # noqa: ANN001
    best = np.inf
    seen: set = set()
    while len(seen) < trials:
        ds = tuner.next_batch(batch)
        assert ds and not seen & set(ds)
        seen |= set(ds)
        costs = [_cost(space, d) for d in ds]
        tuner.update(ds, costs)
        best = min(best, *costs)
    return best


def test_pretrained_xgboost_beats_plain_xgboost_at_small_budgets():
    space = _space()
    assisted = [_search(AnalyticalXGBTuner(space, s, predict=_predictor(space, 0.2, s), pretrain_size=512,
                                           chains=64, steps=150), space, 16) for s in range(3)]
    plain = [_search(ModelTuner(space, s), space, 16) for s in range(3)]
    assert np.mean(assisted) < np.mean(plain)
    assert max(assisted) <= 2.0  # at or next to the optimum (1.0) among 11880 configurations


def test_the_analytical_prior_fades_with_measurements():
    space = _space()
    tuner = AnalyticalXGBTuner(space, predict=_predictor(space), pretrain_size=256)
    first = tuner.next_batch(8)
    assert tuner.base is not None and tuner.discount() == 1.0
    tuner.update(first, [_cost(space, d) for d in first])
    assert tuner.discount() == pytest.approx(2 ** (-8 / 64))
    more = space.sample_valid(np.random.default_rng(0), 300, set(first))
    tuner.update(more, [_cost(space, d) for d in more])
    tuner.next_batch(8)
    assert tuner.base is None  # 2^(-308/64) < 0.05: dropped, as AutoTVM drops a base model


class _FakeMeasurer:
    """Stands in for the GPU: a configuration's 'time' is the model's prediction times a fixed
    per-configuration factor; one configuration in seven fails to build."""

    def __init__(self) -> None:
        self.measured: list[str] = []

    def measure(self, task, batch, on_result=None):  # noqa: ANN001, ANN201
        out = []
        for k, values in enumerate(batch):
            key = json.dumps(values, sort_keys=True)
            self.measured.append(key)
            h = sum(map(ord, key))
            if h % 7 == 0:
                res = MeasureResult("build_error", error="simulated ptxas failure")
            else:
                res = MeasureResult("ok", [float(task.predict([values])[0]) * (1 + (h % 13) / 50)])
            if on_result is not None:
                on_result(k, res)
            out.append(res)
        return out


@pytest.mark.parametrize("tuner", ["analytical", "analytical+xgboost"])
def test_tune_task_records_and_resumes_with_the_analytical_tuners(tmp_path, tuner):
    task = make_task("matmul", H100, template="matmul_tensorcore", M=512, N=768, K=3072, dtype="float16")
    assert task.template.name == "matmul_tensorcore"
    path = tmp_path / "r.jsonl"
    fake = _FakeMeasurer()
    first = tune_task(task, 12, path, tuner=tuner, batch_size=4, progress=False, build_best=False,
                      measurer=fake, tuner_options={"pretrain_size": 256} if "xgb" in tuner else None)
    assert len(first.records) == 12 and first.best is not None
    rest = tune_task(task, 20, path, tuner=tuner, batch_size=4, progress=False, build_best=False,
                     measurer=fake, tuner_options={"pretrain_size": 256} if "xgb" in tuner else None)
    assert rest.new_trials == 8
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 20 and {r["tuner"] for r in lines} == {tuner}
    keys = [json.dumps(r["config"], sort_keys=True) for r in lines]
    assert len(set(keys)) == 20 and keys == fake.measured  # nothing measured twice, every trial kept
    assert 0 < sum(r["status"] == "build_error" for r in lines) < 10  # failures cost a trial each
    if tuner == "analytical":  # the model's ranking, resumed where it stopped
        space = task.space
        ranking = AnalyticalTuner(space, predict=lambda ds: task.predict([space.config(d).values
                                                                          for d in ds])).next_batch(20)
        assert [space.from_values(r["config"]).digits for r in lines] == ranking


def test_tensor_core_templates_are_chosen_by_data_type():
    half = make_task("matmul", H100, M=256, N=256, K=256, dtype="float16")
    assert half.template.name == "matmul_wgmma" and half.has_model  # Hopper: warpgroup MMA first
    ampere = CUDATarget(name="A100", arch="sm_80")
    assert make_task("matmul", ampere, M=256, N=256, K=256, dtype="float16").template.name == "matmul_tensorcore"
    assert make_task("matmul", H100, M=256, N=256, K=256).template.name == "matmul_cuda"
    older = CUDATarget(arch="sm_75")
    assert make_task("matmul", older, M=256, N=256, K=256, dtype="float16").template.name == "matmul_cuda"
    with pytest.raises(TuneError, match="applies to conv2d_igemm"):
        make_task("conv2d_igemm", H100, N=1, H=8, W=8, C=16, K=16, R=3, S=3, dtype="float32")
    from polytile import ops
    op = ops.matmul(256, 256, 256, "bfloat16")  # an operator object keeps its data type
    assert make_task(op, H100).workload.key == "matmul(K=256,M=256,N=256,dtype=bfloat16)"


def test_cli_takes_the_new_tuners_and_a_dtype(capsys):
    assert parse_shape("matmul", "512,768,3072,dtype=float16") == {"M": 512, "N": 768, "K": 3072,
                                                                   "dtype": "float16"}
    assert tune_main(["softmax", "--shape", "M=8,N=8", "--tuner", "analytical", "--trials", "1",
                      "--quiet"]) == 2
    assert "has no analytical model" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("tuner", ["analytical", "analytical+xgboost"])
def test_analytical_tuners_on_the_gpu(tmp_path, tuner):
    from polytile.tune import MeasureOptions
    task = make_task("matmul", "cuda", template="matmul_tensorcore", M=512, N=768, K=768, dtype="float16")
    result = tune_task(task, 8, tmp_path / "gpu.jsonl", tuner=tuner, batch_size=4, progress=False,
                       measure=MeasureOptions(repeat=10, min_time=0.02))
    assert result.best is not None and result.kernel is not None and result.verified
    assert {r.tuner for r in result.records} == {tuner}


@pytest.mark.gpu
def test_wgmma_template_tunes_on_hopper(tmp_path):
    from polytile.tune import MeasureOptions
    task = make_task("matmul", "cuda", M=512, N=768, K=768, dtype="float16")
    if task.template.name != "matmul_wgmma":
        pytest.skip("not an sm_90a GPU")
    result = tune_task(task, 12, tmp_path / "wgmma.jsonl", tuner="xgb", batch_size=6, progress=False,
                       measure=MeasureOptions(repeat=10, min_time=0.02))
    assert result.best is not None and result.kernel is not None and result.verified
    assert sum(r.ok for r in result.records) >= 6


@pytest.mark.gpu
@pytest.mark.parametrize("tuner", ["analytical", "analytical+xgboost"])
def test_analytical_tuners_on_the_wgmma_template(tmp_path, tuner):
    """The README's `polytile tune matmul --target cuda ... --tuner analytical+xgboost` on Hopper."""
    plot = tmp_path / "curve.png"
    rc = tune_main(["matmul", "--target", "cuda", "--shape", "512,768,3072,dtype=float16", "--tuner", tuner,
                    "--trials", "8", "--batch", "4", "--quiet", "--records", str(tmp_path / "r.jsonl"),
                    "--plot", str(plot)])
    assert rc == 0 and plot.exists()
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(lines) == 8 and {r["tuner"] for r in lines} == {tuner}
    if lines[0]["template"] != "matmul_wgmma":
        pytest.skip("not an sm_90a GPU")
    assert sum(r["status"] == "ok" for r in lines) >= 6
