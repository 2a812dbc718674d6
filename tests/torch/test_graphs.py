"""The backend's CUDA-graph replay (``polytile.torch.graphs``) without a GPU: torch.cuda's graph,
stream and capture calls replaced by fakes that record what runs where, so that the control flow —
first call as compiled, capture on the second, inputs copied in, parameters used in place, outputs
cloned, a new parameter recaptured, a failed capture run as compiled with a note — is checked here;
the GPU tests of test_backend replay real models."""

from __future__ import annotations

import contextlib

import pytest

import polytile.torch as ptt
from polytile.torch.graphs import GraphedForward

torch = pytest.importorskip("torch")


class FakeGraph:
    def __init__(self) -> None:
        self.recorded: list = []

    def replay(self) -> None:
        for fn in self.recorded:
            fn()


class Fakes:
    """torch.cuda's graph API: a capture records the forward as a closure over its tensors."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.capturing: FakeGraph | None = None
        self.captures = 0
        fakes = self

        class Stream:
            def wait_stream(self, other: object) -> None:
                pass

        @contextlib.contextmanager
        def graph(g: FakeGraph):
            fakes.capturing = g
            fakes.captures += 1
            try:
                yield
            finally:
                fakes.capturing = None

        monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def forward_of(fakes: Fakes, weight: torch.Tensor, runs: list[str]):
    """out = x @ w + 1, written into a buffer; under a capture, recorded for the replays."""
    def forward(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        out = torch.empty(x.shape[0], w.shape[1])

        def run() -> None:
            torch.matmul(x, w, out=out)
            out.add_(1)

        if fakes.capturing is not None:
            fakes.capturing.recorded.append(run)
            runs.append("captured")
        else:
            run()
            runs.append("eager")
        return (out,)
    return forward


def test_first_call_as_compiled_then_one_capture_and_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = Fakes(monkeypatch)
    w = torch.nn.Parameter(torch.randn(5, 3), requires_grad=False)
    runs: list[str] = []
    report = ptt.Report()
    g = GraphedForward(forward_of(fakes, w, runs), report)
    outs, xs = [], [torch.randn(4, 5) for _ in range(5)]
    for x in xs:
        outs.append(g(x, w)[0])
    # call 1 as compiled; call 2 warms up and captures, then replays; calls 3-5 replay only
    assert runs == ["eager", "eager", "captured"] and fakes.captures == 1
    assert report.cuda_graph_replays == 4
    for x, out in zip(xs, outs):  # each result its own (cloned), computed on its own input
        torch.testing.assert_close(out, x @ w.detach() + 1)
    assert xs[1].data_ptr() != g.inputs[0].data_ptr()  # the user's input is copied, never written


def test_new_parameters_are_captured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = Fakes(monkeypatch)
    w = torch.nn.Parameter(torch.randn(5, 3), requires_grad=False)
    runs: list[str] = []
    g = GraphedForward(forward_of(fakes, w, runs), ptt.Report())
    x = torch.randn(4, 5)
    g(x, w), g(x, w)
    w2 = torch.nn.Parameter(torch.randn(5, 3), requires_grad=False)
    torch.testing.assert_close(g(x, w2)[0], x @ w2.detach() + 1)
    assert fakes.captures == 2
    before = w2.detach().clone()
    g(torch.randn(4, 5), w2)
    torch.testing.assert_close(w2.detach(), before)  # a parameter is used in place, never overwritten


def _replayed(monkeypatch: pytest.MonkeyPatch) -> tuple[Fakes, GraphedForward, torch.Tensor, list[torch.Tensor]]:
    """A forward of three parameters (the first used), called twice: captured, replayed once."""
    fakes = Fakes(monkeypatch)
    ws = [torch.nn.Parameter(torch.randn(5, 3), requires_grad=False) for _ in range(3)]
    inner = forward_of(fakes, ws[0], [])
    g = GraphedForward(lambda x, *w: inner(x, w[0]), ptt.Report())
    x = torch.randn(4, 5)
    g(x, *ws), g(x, *ws)
    return fakes, g, x, ws


def test_a_replay_checks_only_the_parameters_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    # comparing every parameter's shape and strides before each replay cost BERT-base b1 0.3-1.6 ms a
    # call (200 parameters; its kernels take 0.8 ms): dynamo guards them, the replay checks addresses
    fakes, g, x, ws = _replayed(monkeypatch)

    def no_metadata(self: torch.Tensor, *args: object) -> object:
        raise AssertionError("a parameter's strides read before a replay")
    monkeypatch.setattr(torch.nn.Parameter, "stride", no_metadata)
    torch.testing.assert_close(g(x, *ws)[0], x @ ws[0].detach() + 1)
    assert fakes.captures == 1
    monkeypatch.setattr(torch.nn.Parameter, "stride", torch.Tensor.stride)
    w2 = torch.nn.Parameter(torch.randn(5, 3), requires_grad=False)
    torch.testing.assert_close(g(x, ws[0], ws[1], w2)[0], x @ ws[0].detach() + 1)  # another address: captured again
    assert fakes.captures == 2


def test_a_replay_checks_the_addresses_in_one_call_of_torchs_check(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch's C++ check (CUDA builds) in place of the Python loop: its contract written here in Python
    import polytile.torch.graphs as graphs
    calls: list[list[int]] = []

    def ptrs_equal(tensors: list, ptrs: list, indices: list) -> bool:
        assert type(tensors) is list and type(ptrs) is list and type(indices) is list  # pybind11's py::list
        calls.append(indices)
        for i in indices:
            if not isinstance(tensors[i], torch.Tensor):
                raise RuntimeError("Unable to cast Python instance to C++ type")
            if tensors[i].data_ptr() != ptrs[i]:
                return False
        return True

    monkeypatch.setattr(graphs, "DATA_PTRS_EQUAL", ptrs_equal)
    fakes, g, x, ws = _replayed(monkeypatch)
    calls.clear()
    torch.testing.assert_close(g(x, *ws)[0], x @ ws[0].detach() + 1)
    assert calls == [[1, 2, 3]] and fakes.captures == 1
    w2 = torch.nn.Parameter(torch.randn(5, 3), requires_grad=False)
    torch.testing.assert_close(g(x, w2, ws[1], ws[2])[0], x @ w2.detach() + 1)  # another address: captured again
    assert fakes.captures == 2
    assert not g._static_in_place([x, 1.0, ws[1], ws[2]])  # a number where a parameter was


def test_a_converted_weight_written_in_place_is_converted_again_before_a_replay(monkeypatch: pytest.MonkeyPatch
                                                                              ) -> None:
    # the channels_last option's weights: the graph reads a converted copy (here 2·w), which a replay
    # must see change when the weight is written in place (same address: no new capture)
    from polytile.torch.packing import PackCache
    fakes = Fakes(monkeypatch)
    w = torch.nn.Parameter(torch.randn(5, 3), requires_grad=False)
    cache = PackCache(lambda t: t * 2)
    runs: list[str] = []
    inner = forward_of(fakes, w, runs)
    refreshed: list[bool] = []

    def forward(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        refreshed.append(cache.refreshed)
        return inner(x, cache(w))
    g = GraphedForward(forward, ptt.Report(), [cache])
    x = torch.randn(4, 5)
    g(x, w), g(x, w)
    assert refreshed == [False, False, True] and not cache.refreshed  # the capture reads the cache's copy
    with torch.no_grad():
        w.mul_(-3)
    torch.testing.assert_close(g(x, w)[0], x @ (2 * w.detach()) + 1)
    assert fakes.captures == 1 and runs[-1] == "captured"
    monkeypatch.setattr(cache, "refresh", lambda: False)  # the weight converted last is gone: capture again
    torch.testing.assert_close(g(x, w)[0], x @ (2 * w.detach()) + 1)
    assert fakes.captures == 2


def test_a_forward_that_cannot_be_captured_runs_as_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = Fakes(monkeypatch)
    runs: list[str] = []
    w = torch.nn.Parameter(torch.randn(5, 3), requires_grad=False)
    inner = forward_of(fakes, w, runs)

    def syncing(x: torch.Tensor, w: torch.Tensor):
        if fakes.capturing is not None:
            raise RuntimeError("operation not permitted when stream is capturing")
        return inner(x, w)

    report = ptt.Report()
    g = GraphedForward(syncing, report)
    x = torch.randn(4, 5)
    with pytest.warns(UserWarning, match="could not be captured as a CUDA graph"):
        for _ in range(3):
            torch.testing.assert_close(g(x, w)[0], x @ w.detach() + 1)
    assert report.cuda_graph_replays == 0 and len(report.notes) == 1


def test_inside_the_callers_own_capture_the_forward_runs_as_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = Fakes(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    runs: list[str] = []
    w = torch.nn.Parameter(torch.randn(5, 3), requires_grad=False)
    g = GraphedForward(forward_of(fakes, w, runs), ptt.Report())
    for _ in range(3):
        g(torch.randn(4, 5), w)
    assert fakes.captures == 0 and runs == ["eager"] * 3
