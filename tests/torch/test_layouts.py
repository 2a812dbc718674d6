"""The backend's ``channels_last`` option (``polytile.torch.layouts``): convolutions left to torch take
channels-last weights converted once, activations stay channels-last between them with no layout copy
in polytile's groups, the graph's outputs keep eager's strides, weights written in place are converted
again (also between CUDA-graph replays), and polytile's own convolutions read the weights themselves."""

from __future__ import annotations

import pytest
from torch_helpers import assert_close

import polytile.torch as ptt
from polytile.torch import compiler, importer
from polytile.torch.importer import InputAdapter
from polytile.torch.layouts import to_channels_last
from polytile.torch.packing import PackCache

torch = pytest.importorskip("torch")
fx = pytest.importorskip("torch.fx")


class ConvNet(torch.nn.Module):
    """Three convolutions (3×3, 3×3, 1×1) with batch norms, ReLUs and a residual sum, a mean and a linear
    layer; ``feature_map``: the last activation is returned too (a 4-D output)."""

    def __init__(self, feature_map: bool = False) -> None:
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.c2, self.b2 = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.c3, self.b3 = torch.nn.Conv2d(8, 8, 1), torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)
        self.feature_map = feature_map
        with torch.no_grad():
            for b in (self.b1, self.b2, self.b3):
                b.running_mean.uniform_(-1, 1)
                b.running_var.uniform_(0.5, 2)
                b.weight.uniform_(0.5, 2)
        self.eval()

    def forward(self, x: torch.Tensor) -> object:
        y = torch.relu(self.b1(self.c1(x)))
        z = torch.relu(self.b2(self.c2(y)))
        z = torch.relu(self.b3(self.c3(z)) + y)
        out = self.fc(z.mean((2, 3)))
        return (out, z) if self.feature_map else out


def _cl(t: torch.Tensor) -> bool:
    """The strides of a channels-last tensor of ``t``'s shape (a 1×1 filter's too, whose memory both layouts
    order alike)."""
    return t.ndim == 4 and t.stride() == torch.empty_like(t, memory_format=torch.channels_last).stride()


class Watch:
    """Records, per call of the compiled graph, the strides of each convolution's input and weight (the
    rewritten graph run by an interpreter) and the group inputs that polytile's adapters copied."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.convs: list[tuple[bool, bool]] = []
        self.copies = 0
        watch = self

        class Interp(fx.Interpreter):
            def call_function(self, target, args, kwargs):  # type: ignore[no-untyped-def]
                if target is torch.ops.aten.convolution.default:
                    watch.convs.append((_cl(args[0]), _cl(args[1])))
                return super().call_function(target, args, kwargs)

        real_cache = compiler.cache_weights

        def cache_weights(gm: fx.GraphModule) -> list[PackCache]:
            caches = real_cache(gm)
            gm.forward = lambda *args: Interp(gm).run(*args)  # what compile_graph returns calls this
            return caches

        real_adapter = InputAdapter.__call__

        def adapter(self: InputAdapter, x: torch.Tensor) -> torch.Tensor:
            y = real_adapter(self, x)
            watch.copies += y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
            return y

        monkeypatch.setattr(compiler, "cache_weights", cache_weights)
        monkeypatch.setattr(InputAdapter, "__call__", adapter)

    def reset(self) -> None:
        self.convs, self.copies = [], 0


def _compile(model: torch.nn.Module, channels_last: bool, report: ptt.Report | None = None) -> object:
    return torch.compile(model, backend=ptt.backend(choose="always", channels_last=channels_last, report=report),
                         dynamic=False)


@pytest.fixture
def convs_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """polytile leaves every convolution to torch, as on a GPU where cuDNN wins."""
    monkeypatch.setattr(importer, "CONVS", set())


def test_activations_stay_channels_last_between_convolutions_left_to_torch(monkeypatch: pytest.MonkeyPatch,
                                                                            convs_left: None) -> None:
    model, x = ConvNet(), torch.randn(2, 3, 11, 13)
    watch = Watch(monkeypatch)
    report = ptt.Report()
    with torch.no_grad():
        want = model(x)
        compiled = _compile(model, True, report)
        compiled(x)
        watch.reset()
        x2 = torch.randn(2, 3, 11, 13)
        got = compiled(x2)
        assert_close(got, model(x2))
    assert got.stride() == want.stride()
    # the image is NCHW; every weight and every later activation is channels-last
    assert watch.convs == [(False, True), (True, True), (True, True)], watch.convs
    assert watch.copies == 0  # polytile's batch norms read and write channels-last as they are
    assert {g.kind for g in report.taken} >= {"elementwise"}, report
    assert any("3 convolution weight(s) passed channels-last" in n for n in report.notes), report.notes
    assert "clone" not in report.left_ops  # the weights' copies are no operations of the model


def test_without_the_option_the_convolutions_read_nchw(monkeypatch: pytest.MonkeyPatch, convs_left: None) -> None:
    model, x = ConvNet(), torch.randn(2, 3, 11, 13)
    watch = Watch(monkeypatch)
    with torch.no_grad():
        compiled = _compile(model, False)
        compiled(x)
        watch.reset()
        assert_close(compiled(x), model(x))
    assert watch.convs == [(False, False)] * 3


def test_a_weight_written_in_place_is_converted_again(convs_left: None) -> None:
    model, x = ConvNet(), torch.randn(1, 3, 7, 5)
    with torch.no_grad():
        compiled = _compile(model, True)
        assert_close(compiled(x), model(x))
        model.c2.weight.mul_(-1.5)
        model.c3.weight.add_(0.25)
        assert_close(compiled(x), model(x))


def test_outputs_keep_eager_strides(convs_left: None) -> None:
    model, x = ConvNet(feature_map=True), torch.randn(2, 3, 9, 6)
    with torch.no_grad():
        want = model(x)
        got = _compile(model, True)(x)
    assert_close(got, want)
    assert got[1].stride() == want[1].stride() and got[1].is_contiguous()


def test_a_view_that_channels_last_strides_do_not_allow_keeps_the_layouts(convs_left: None) -> None:
    class Flat(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = torch.nn.Conv2d(3, 4, 3)
            self.fc = torch.nn.Linear(4 * 3 * 5, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.relu(self.c(x)).view(x.shape[0], -1))

    model, x = Flat().eval(), torch.randn(2, 3, 5, 7)
    report = ptt.Report()
    with torch.no_grad():
        assert_close(_compile(model, True, report)(x), model(x))
    assert any(n.startswith("channels_last: the graph keeps its layouts") for n in report.notes), report.notes


def test_polytile_convolutions_read_the_weights_themselves() -> None:
    model, x = ConvNet(), torch.randn(2, 3, 11, 13)
    plain, nhwc = ptt.Report(), ptt.Report()
    with torch.no_grad():
        assert_close(_compile(model, False, plain)(x), model(x))
        torch._dynamo.reset()
        assert_close(_compile(model, True, nhwc)(x), model(x))
    convs = [g for g in nhwc.taken if g.kind == "conv"]
    assert len(convs) == 3 and all(g.packed == 1 for g in convs), nhwc  # the weights, packed once
    assert [g.ops for g in nhwc.taken] == [g.ops for g in plain.taken]


def test_channels_last_by_default_on_a_cuda_target_for_inference_only() -> None:
    from polytile.errors import PolytileError
    from polytile.target import as_target
    from polytile.torch.compiler import Options, channels_last_wanted
    assert channels_last_wanted(Options(), as_target("cuda"), grad=False)
    assert not channels_last_wanted(Options(), as_target("cpu"), grad=False)  # polytile's CPU convolutions read NCHW
    assert channels_last_wanted(Options(channels_last=True), as_target("cpu"), grad=False)
    assert not channels_last_wanted(Options(channels_last=True), as_target("cuda"), grad=True)
    assert not channels_last_wanted(Options(channels_last=False), as_target("cuda"), grad=False)
    with pytest.raises(PolytileError, match="channels_last='yes': use True, False or None"):
        Options(channels_last="yes")


def test_the_cpu_default_keeps_the_layouts(monkeypatch: pytest.MonkeyPatch, convs_left: None) -> None:
    model, x = ConvNet(), torch.randn(1, 3, 5, 4)
    watch = Watch(monkeypatch)
    report = ptt.Report()
    with torch.no_grad():
        compiled = torch.compile(model, backend=ptt.backend(choose="always", report=report), dynamic=False)
        assert_close(compiled(x), model(x))
    assert watch.convs == [(False, False)] * 3 and not report.notes


def test_tuning_extracts_the_channels_last_workloads(convs_left: None) -> None:
    # records tuned for the option's groups (NHWC arrays) are the ones its compile looks up
    model, x = ConvNet(), torch.randn(2, 3, 11, 13)

    def shapes(channels_last: bool) -> set[tuple[int, ...]]:
        tasks = ptt.extract_tasks(model, [x], channels_last=channels_last)
        return {tuple(int(d.value) for d in t.shape) for mt in tasks for t in mt.task.workload.func.inputs
                if len(t.shape) == 4}

    assert shapes(True) == {(2, 11, 13, 8)} and shapes(False) == {(2, 8, 11, 13)}


def test_a_refresh_converts_into_the_same_tensor() -> None:
    w = torch.randn(4, 3, 3, 2)
    cache = PackCache(to_channels_last)
    first = cache(w)
    assert _cl(first) and torch.equal(first, w)
    assert cache.refresh() and cache.packs == 1  # unchanged: nothing converted
    with torch.no_grad():
        w.mul_(2)
    assert cache.refresh() and cache.packs == 2
    assert cache(w) is first and torch.equal(first, w)  # the same tensor, the new values
    del w
    assert not cache.refresh()  # the weight is gone: a new call must convert its successor
    with torch.inference_mode():
        w = torch.randn(4, 3, 3, 2)  # no version counter: converted by every call, captured ones too
    assert torch.equal(cache(w), w) and cache(w) is not cache(w)
    assert cache.refresh()


def test_inside_the_callers_own_capture_the_conversion_is_captured(monkeypatch: pytest.MonkeyPatch) -> None:
    # a CUDA graph of the caller's (not refreshed before its replays) must convert the weight as it is
    # at each replay; a refreshing replayer's capture (GraphedForward) reads the converted copy
    from polytile.torch import packing
    w = torch.randn(4, 3, 3, 2)
    cache = PackCache(to_channels_last)
    first = cache(w)
    monkeypatch.setattr(packing, "capturing", lambda x: True)
    inside = cache(w)
    assert inside is not first and _cl(inside) and torch.equal(inside, w) and cache.packs == 1
    cache.refreshed = True
    assert cache(w) is first


@pytest.mark.gpu
@pytest.mark.parametrize("left", [True, False], ids=["convolutions-in-torch", "convolutions-in-polytile"])
def test_channels_last_resnet_on_the_gpu_matches_eager_across_replays(monkeypatch: pytest.MonkeyPatch,
                                                                      left: bool) -> None:
    from polytile.torch import zoo
    if left:
        monkeypatch.setattr(importer, "CONVS", set())
    model, inputs = zoo.model("resnet50", size="tiny", batch=2, device="cuda", dtype=torch.float16)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    report = ptt.Report()
    compiled = _compile(model, True, report)
    with torch.no_grad():
        for k in range(5):
            x = torch.randn_like(inputs[0])
            if k == 4:  # written in place between replays: the replay reads the new weights
                convs[0].weight.mul_(-1)
                convs[2].weight.add_(0.05)
            assert_close(compiled(x).float(), model(x).float(), 3e-2)
    assert report.cuda_graph_replays >= 3, report
    assert any("passed channels-last" in n for n in report.notes), report.notes


@pytest.mark.gpu
def test_a_callers_cuda_graph_of_a_channels_last_model_sees_weights_written_in_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from polytile.torch import zoo
    monkeypatch.setattr(importer, "CONVS", set())
    model, inputs = zoo.model("resnet50", size="tiny", batch=1, device="cuda", dtype=torch.float16)
    compiled = _compile(model, True)
    static = inputs[0].clone()
    with torch.no_grad():
        compiled(static)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = compiled(static)
        next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d)).weight.mul_(-1)
        static.copy_(torch.randn_like(static))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out.float(), model(static).float(), 3e-2)
