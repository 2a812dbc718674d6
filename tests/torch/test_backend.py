"""The backend on graphs it cannot take whole: operations left to torch, dynamic shapes, dtypes it lacks,
records of another machine, bad options, a kernel whose result differs, training graphs; the
cost-based choice."""

from __future__ import annotations

import warnings

import pytest
from torch_helpers import assert_close, compile_and_compare

import polytile.torch as ptt
from polytile.errors import PolytileError

torch = pytest.importorskip("torch")
F = torch.nn.functional


def mixed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = F.gelu(x @ w) + 1.0
    return torch.cumsum(h, dim=-1) * torch.sigmoid(h)      # cumsum: not imported


def test_unsupported_operations_fall_back_and_explain_lists_both() -> None:
    x, w = torch.randn(9, 14), torch.randn(14, 11)
    report = compile_and_compare(mixed, x, w)
    assert {"mm", "gelu", "add", "sigmoid"} <= set(report.taken_ops)
    reasons = report.reasons()
    assert "cumsum" in reasons and "not an operation polytile imports" in next(iter(reasons["cumsum"]))
    text = str(ptt.explain(mixed, x, w, choose="always"))
    assert "taken:" in text and "left to torch:" in text and "cumsum" in text and "mm + gelu" in text


def test_the_groups_of_repeated_layers_are_scheduled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from polytile.torch import compiler
    monkeypatch.setattr(compiler, "_KERNELS", {})
    scheduled: list[str] = []

    def schedule_group(func: object, target: object, knobs: object = None) -> object:
        scheduled.append(func.name)  # type: ignore[attr-defined]
        return original(func, target, knobs)
    original = compiler.schedule_group
    monkeypatch.setattr(compiler, "schedule_group", schedule_group)
    layers = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(13, 13), torch.nn.Tanh()) for _ in range(3)])
    report = compile_and_compare(layers.eval(), torch.randn(6, 13))
    assert [g.ops for g in report.taken] == [["addmm", "tanh"]] * 3 and len(scheduled) == 1, scheduled


def test_dynamic_shapes_fall_back_with_a_clear_warning() -> None:
    report = ptt.Report()
    compiled = torch.compile(lambda x: torch.softmax(x * 2, -1), backend=ptt.backend(report=report, choose="always"),
                             dynamic=True)
    x = torch.randn(5, 7)
    with pytest.warns(UserWarning, match="dynamic sizes"):
        got = compiled(x)
    assert_close(got, torch.softmax(x * 2, -1))
    assert not report.taken and "dynamic=False" in report.left[0].reason


def test_bfloat16_on_the_cpu_is_left_to_torch_with_the_reason() -> None:
    x = torch.randn(6, 10).bfloat16()
    report = compile_and_compare(lambda x: torch.softmax(x, -1) * 3, x)
    assert not report.taken
    assert all("bfloat16" in r.reason for r in report.left)


def test_records_of_another_target_warn_and_use_default_schedules(tmp_path: object) -> None:
    from polytile.tune import Record, RecordLog
    path = tmp_path / "other.jsonl"  # type: ignore[operator]
    RecordLog(path).append(Record("torch_group_cuda/func:torch_reduce:0/x", "cuda:NVIDIA A100:sm_80",
                                  "torch_group_cuda", {"row_threads": 64}, "ok", [1e-5]))
    x = torch.randn(8, 33)
    with pytest.warns(UserWarning, match="records for cuda:NVIDIA A100:sm_80 only"):
        report = compile_and_compare(lambda x: torch.softmax(x, -1), x, records=str(path))
    assert [g.schedule for g in report.taken] == ["default"] and "default schedule" in report.notes[0]


def test_bad_options_are_polytile_errors(tmp_path: object) -> None:
    with pytest.raises(PolytileError, match="choose='fastest'"):
        ptt.backend(choose="fastest")
    with pytest.raises(PolytileError, match="attention='fused'"):
        ptt.backend(attention="fused")
    with pytest.raises(PolytileError, match="no such file"):
        ptt.backend(records=str(tmp_path / "missing.jsonl"))  # type: ignore[operator]
    weights = tmp_path / "weights.txt"  # type: ignore[operator]
    weights.write_text("0.25 0.5\n")
    with pytest.raises(PolytileError, match="is not a polytile records file"):
        ptt.backend(records=str(weights))
    with pytest.raises(PolytileError, match="is a directory"):
        ptt.backend(records=str(tmp_path))
    # an unknown target or option name (a TypeError of the options' class, and a target refused only
    # when the first graph compiled: independent fuzzer's probes)
    with pytest.raises(PolytileError, match="backend option target='tpu': unknown target"):
        ptt.backend(target="tpu")
    with pytest.raises(PolytileError, match="unknown backend option.*'bogus'.*the options are target"):
        ptt.backend(bogus=1)


def test_a_group_whose_result_differs_is_left_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from polytile.torch import importer
    monkeypatch.setitem(importer._UNARY, torch.ops.aten.exp, lambda v: v)  # a wrong importer rule
    x = torch.randn(6, 20)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = compile_and_compare(lambda x: torch.exp(x) * 2, x)
    assert not report.taken and "differs" in report.left[0].reason
    assert any("differs" in str(w.message) for w in caught)


def test_the_epilogue_of_a_product_that_does_not_import_is_fused_on_its_own() -> None:
    # BERT's attention products (operands in layouts the importer refused) took their scale, mask add
    # and casts down with them: 170 µs a forward of torch's elementwise kernels on an H100
    x = torch.randn(16, 16)
    report = compile_and_compare(lambda x: torch.sigmoid(x @ x * 2 + 1), x)
    assert [g.ops for g in report.taken] == [["mul", "add", "sigmoid"]]
    assert [r.op for r in report.left] == ["mm"] and "not imported" in report.left[0].reason


def test_measure_keeps_only_what_is_faster() -> None:
    x, w = torch.randn(16, 24), torch.randn(24)
    report = compile_and_compare(lambda x, w: F.layer_norm(x * w + 1, (24,)) * torch.sigmoid(x), x, w,
                                 choose="measure")
    for g in report.taken:
        assert g.polytile_us < g.torch_us
    for x_ in report.left:
        assert "torch is faster" in x_.reason or "not" in x_.reason


@pytest.mark.gpu
def test_the_gpu_choice_times_kernels_not_host_calls() -> None:
    # torch's side of BERT-base b1's addmm + _to_copy + mul measured 109 µs as enqueued from Python
    # (its kernels: 7 µs): both sides are now timed as CUDA-graph replays
    import time

    from polytile.torch.compiler import Options, _time_pair
    x = torch.randn(4096, device="cuda")

    def slow_host() -> torch.Tensor:
        time.sleep(0.002)
        return x + 1
    ours, theirs = _time_pair(lambda: x * 2, slow_host, True, Options(min_time=0.002, rounds=3))
    assert ours < 1e-4 and theirs < 1e-4, (ours, theirs)


def test_a_side_that_cannot_be_captured_times_both_as_enqueued(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    from polytile.torch import compiler

    @contextlib.contextmanager
    def failing(_graph: object) -> object:
        yield
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", failing)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    calls: list[str] = []
    assert compiler._captured((lambda: calls.append("a"), lambda: calls.append("b")), 3) is None
    assert calls == ["a"] * 3


def test_a_training_graph_runs_forward_kernels_and_torch_gradients() -> None:
    lin = torch.nn.Linear(12, 7)
    x = torch.randn(5, 12, requires_grad=True)
    report = ptt.Report()
    compiled = torch.compile(lambda x: F.relu(lin(x)).sum(-1), backend=ptt.backend(report=report, choose="always"))
    got = compiled(x)
    (gx,) = torch.autograd.grad(got.sum(), x)
    want = F.relu(lin(x)).sum(-1)
    (wx,) = torch.autograd.grad(want.sum(), x)
    assert_close(got.detach(), want.detach())
    assert_close(gx, wx)
    assert report.taken


@pytest.mark.gpu
def test_cuda_graph_replay_of_a_compiled_model() -> None:
    pytest.importorskip("transformers")
    from polytile.torch import zoo
    model, inputs = zoo.model("bert-base", size="tiny", batch=2, device="cuda")
    compiled = torch.compile(model, backend=ptt.backend(choose="always"), dynamic=False)
    static = [x.clone() for x in inputs]
    with torch.no_grad():
        compiled(*static)  # compiles and loads every kernel
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = compiled(*static)
        fresh = torch.randint(0, 500, static[0].shape, device="cuda")
        static[0].copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out.float(), model(fresh).float(), 2e-2)


@pytest.mark.gpu
def test_a_compiled_model_replays_as_one_cuda_graph() -> None:
    # the default on a GPU for inference: captured on the second call, replayed after; every call
    # with fresh inputs matches eager and an earlier result stays valid after the next call
    pytest.importorskip("transformers")
    from polytile.torch import zoo
    model, inputs = zoo.model("bert-base", size="tiny", batch=2, device="cuda")
    report = ptt.Report()
    compiled = torch.compile(model, backend=ptt.backend(choose="always", report=report), dynamic=False)
    outs, wants = [], []
    with torch.no_grad():
        for _ in range(4):
            x = torch.randint(0, 500, inputs[0].shape, device="cuda")
            outs.append(compiled(x, *inputs[1:]))
            wants.append(model(x, *inputs[1:]))
    torch.cuda.synchronize()
    for got, want in zip(outs, wants):
        assert_close(got.float(), want.float(), 3e-2)
    assert report.cuda_graphs >= 1 and report.cuda_graph_replays >= 2, report
    assert not [n for n in report.notes if "CUDA graph" in n], report.notes


@pytest.mark.gpu
def test_without_cuda_graphs_no_graph_is_captured() -> None:
    pytest.importorskip("transformers")
    from polytile.torch import zoo
    model, inputs = zoo.model("bert-base", size="tiny", batch=2, device="cuda")
    report = ptt.Report()
    compiled = torch.compile(model, backend=ptt.backend(choose="always", report=report, cuda_graphs=False),
                             dynamic=False)
    with torch.no_grad():
        for _ in range(3):
            assert_close(compiled(*inputs).float(), model(*inputs).float(), 3e-2)
    assert report.cuda_graphs == 0 and report.cuda_graph_replays == 0


def test_cuda_graphs_only_for_inference_on_a_cuda_target() -> None:
    from polytile.target import as_target
    from polytile.torch.compiler import Options, _graphs_wanted
    assert not _graphs_wanted(Options(), as_target("cpu"), grad=False)
    assert not _graphs_wanted(Options(cuda_graphs=True), as_target("cuda"), grad=True)
    assert not _graphs_wanted(Options(cuda_graphs=False), as_target("cuda"), grad=False)
    assert _graphs_wanted(Options(), as_target("cuda"), grad=False) == torch.cuda.is_available()
    with pytest.raises(PolytileError, match="cuda_graphs='yes': use True, False or None"):
        Options(cuda_graphs="yes")


def test_the_registered_backend_name_with_options() -> None:
    x = torch.randn(4, 9)
    compiled = torch.compile(lambda x: torch.tanh(x) * 3, backend="polytile", options={"choose": "always"})
    with torch.no_grad():
        assert_close(compiled(x), torch.tanh(x) * 3)


@pytest.mark.parametrize("model", [None, 3, "relu"])
def test_explain_of_a_non_callable_names_the_argument(model) -> None:
    # torch.compile's own check of its argument is a bare AssertionError
    with pytest.raises(PolytileError, match=r"explain: model must be a torch.nn.Module or a function, got"):
        ptt.explain(model, torch.ones(3))
