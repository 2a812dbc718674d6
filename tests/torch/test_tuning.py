"""Model-level tuning: distinct workloads deduplicated and weighted, Ansor's gradient task scheduler, one
records file that the backend then uses, resumed runs, and `polytile tune-model`."""

from __future__ import annotations

import math

import pytest

import polytile.torch as ptt
from polytile.cli import main
from polytile.torch.tuning import ModelTask, _next_task, gradient

torch = pytest.importorskip("torch")


def _task(weight: int, curve: list[float]) -> ModelTask:
    return ModelTask(task=None, weight=weight, kind="gemm", ops=["mm"], curve=curve)


def test_the_scheduler_tries_every_task_then_follows_the_gradient() -> None:
    tasks = [_task(1, [1e-3] * 8), _task(5, []), _task(2, [])]
    assert _next_task(tasks, set()) == 1  # untried, heaviest first
    tasks[1].curve, tasks[2].curve = [2e-3] * 8, [1e-3] * 8
    # all flat: the forward term (-g/t) weighted by occurrences decides: 5 × 2 ms dominates
    assert _next_task(tasks, set()) == 1
    tasks[0].curve = [4e-3, 3e-3, 2e-3, 1e-3]  # still improving fast: the backward difference pulls it up
    assert gradient(tasks[0]) < gradient(_task(1, [1e-3] * 4))
    assert _next_task(tasks, {0, 1, 2}) is None
    assert gradient(_task(3, [math.inf] * 4)) == 0.0  # every trial failed: no gain expected


class Layers(torch.nn.Module):
    """Three identical linear + ReLU layers: one workload that occurs three times."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def test_distinct_workloads_are_weighted_by_occurrences() -> None:
    tasks = ptt.extract_tasks(Layers().eval(), [torch.randn(5, 16)])
    assert [(t.weight, t.kind, t.ops) for t in tasks] == [(3, "gemm", ["addmm", "relu"])]


def test_tune_writes_one_records_file_the_backend_uses_and_resumes(tmp_path: object) -> None:
    model = Layers().eval()
    x = torch.randn(5, 16)
    records = str(tmp_path / "model.jsonl")  # type: ignore[operator]
    rep = ptt.tune(model, [x], trials=2, records=records, tuner="random", progress=False, batch_size=2)
    assert rep.new_trials == 2 and math.isfinite(rep.tasks[0].best) and rep.tasks[0].weight == 3
    again = ptt.tune(model, [x], trials=2, records=records, tuner="random", progress=False)
    assert again.new_trials == 0 and again.tasks[0].trials == 2
    report = ptt.Report()
    compiled = torch.compile(model, backend=ptt.backend(records=records, choose="always", report=report))
    with torch.no_grad():
        assert torch.allclose(compiled(x), model(x), atol=1e-5)
    assert [g.schedule for g in report.taken] == ["tuned"] * 3


def test_a_plain_func_keeps_the_generic_template_after_importing_the_backend() -> None:
    """The groups' templates apply to imported Funcs only, also when they are registered before the
    built-in generic template (a fresh process importing polytile.torch first)."""
    import subprocess
    import sys
    script = ("import polytile.torch, polytile as pt\n"
              "from polytile.tune import make_task\n"
              "A = pt.placeholder((40, 24), 'float32', 'A')\n"
              "S = pt.compute((40,), lambda i: A[i, 3] * 2.0, 'S')\n"
              "print(make_task(pt.Func([A], [S], name='twice'), 'cpu').template.name)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not proc.stdout.strip().startswith("torch_group"), proc.stdout


def test_bad_budgets_are_refused(tmp_path: object) -> None:
    from polytile.tune import TuneError
    with pytest.raises(TuneError, match="one of trials="):
        ptt.tune(Layers(), [torch.randn(2, 16)], records=str(tmp_path / "r.jsonl"))  # type: ignore[operator]
    with pytest.raises(TuneError, match="trials_per_task must be a positive integer"):
        ptt.tune(Layers(), [torch.randn(2, 16)], trials_per_task=0, records=str(tmp_path / "r.jsonl"))  # type: ignore[operator]


def test_the_tune_model_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune-model", "resnet50", "--size", "tiny", "--list"]) == 0
    out = capsys.readouterr().out
    assert "resnet50:" in out and "conv" in out and "×" in out
    with pytest.raises(SystemExit) as stop:
        main(["tune-model", "resnet50"])
    assert stop.value.code == 2 and "--records is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tune-model", "vgg", "--list"])
    for bad in (["--tuner", "annealing"], ["--device", "tpu"]):
        with pytest.raises(SystemExit) as stop:
            main(["tune-model", "resnet50", "--records", "r.jsonl", *bad])
        assert stop.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_tune_model_tunes_into_records_and_resumes(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    records = str(tmp_path / "llama.jsonl")  # type: ignore[operator]
    command = ["tune-model", "llama", "--size", "tiny", "--records", records, "--trials", "2", "--tuner", "random"]
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "2 trial(s) in" in out and "(2 new" in out and "best" in out
    assert main(command) == 0
    assert "(0 new" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_tune_model_on_cuda_without_a_gpu_is_a_clear_error(tmp_path: object,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune-model", "resnet50", "--size", "tiny", "--device", "cuda", "--list"]) == 2
    assert "torch finds no CUDA GPU here" in capsys.readouterr().err


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_a_linear_layers_few_rows_are_dot_products_and_the_templates_default(rows: int) -> None:
    """A linear layer's weight is B transposed: few rows take dot products over K (W read in place,
    not packed), and the group template's first configuration is that default schedule."""
    from polytile.build import build
    from polytile.torch.schedules import schedule_group
    model = torch.nn.Sequential(torch.nn.Linear(29, 37), torch.nn.ReLU()).eval()
    (mt,) = ptt.extract_tasks(model, [torch.randn(rows, 29)])
    task = mt.task
    default = build(schedule_group(task.op.func, task.target), task.target).source
    assert "C_lanes" in default and "B_C_local" not in default
    assert build(task.schedule(task.space.default.values), task.target).source == default


@pytest.mark.parametrize("size", [7, 16])
def test_a_convolutions_default_schedule_is_the_group_templates_first_configuration(size: int) -> None:
    """Channel vectors on a 7×7 map, column vectors on a 16-wide one: either default is the first
    configuration of the group's template."""
    from polytile.build import build
    from polytile.torch.schedules import schedule_group
    model = torch.nn.Sequential(torch.nn.Conv2d(5, 19, 3, padding=1), torch.nn.ReLU()).eval()
    (mt,) = ptt.extract_tasks(model, [torch.randn(1, 5, size, size)])
    task = mt.task
    default = build(schedule_group(task.op.func, task.target), task.target).source
    assert build(task.schedule(task.space.default.values), task.target).source == default


@pytest.mark.parametrize("K", [131, 3079])
def test_a_linear_layers_whole_k_product_is_the_templates_default(K: int) -> None:
    """Many rows with an epilogue: K in one block (the column block sized for it, A read in place);
    the group template's first configuration is that default schedule (at K = 3079 the column block
    of K in one block is narrower than the one of K blocks: 300 columns do not fit beside it)."""
    from polytile.build import build
    from polytile.torch.schedules import schedule_group
    model = torch.nn.Sequential(torch.nn.Linear(K, 300), torch.nn.GELU()).eval()
    (mt,) = ptt.extract_tasks(model, [torch.randn(67, K)])
    task = mt.task
    default = build(schedule_group(task.op.func, task.target), task.target).source
    # W (a parameter) comes packed once as the panels the kernel reads (polytile.torch.packing): no copy
    # of it inside the kernel; A read in place
    assert task.op.func.tensor("B").ndim == 3 and "B_C_local" not in default and "A_C_local" not in default
    # the register tile is as wide as the packed panels
    (widths,) = [d.choices for d in task.space.decisions if d.name == "nr_vecs"]
    assert len(widths) == 1 and widths[0] * task.target.vector_lanes(4) == task.op.func.tensor("B").shape[-1].value
    assert build(task.schedule(task.space.default.values), task.target).source == default
