"""The backend's ``cudnn_fusion`` option (``polytile.torch.folding``): convolution + inference batch norm
(+ residual) + ReLU chains with constant weights become one fused convolution with the batch norm folded
into its weight and bias — the rewritten graph checked on the CPU (torch's operations stand in for
cuDNN's fused kernel) against eager, with weights changed in place; on a GPU against eager."""

from __future__ import annotations

import pytest
from torch_helpers import assert_close

import polytile.torch as ptt
from polytile.errors import PolytileError
from polytile.torch.folding import conv_bias_relu, fuse_conv_bn_relu

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _bn(c: int) -> torch.nn.BatchNorm2d:
    b = torch.nn.BatchNorm2d(c)
    with torch.no_grad():
        b.running_mean.uniform_(-1, 1)
        b.running_var.uniform_(0.5, 2)
        b.weight.uniform_(0.5, 2)
        b.bias.uniform_(-1, 1)
    return b


class Block(torch.nn.Module):
    """A stem (conv + bn + relu, a conv bias), a bottleneck's end with a downsampling branch
    (relu(bn(conv(y)) + bn_d(conv_d(y))): the branch's batch norm folded into its convolution, its shift
    into the fused call's bias), and a batch norm also returned (read outside its chain)."""

    def __init__(self) -> None:
        super().__init__()
        self.c0, self.b0 = torch.nn.Conv2d(3, 8, 3, padding=1), _bn(8)
        self.c1, self.b1 = torch.nn.Conv2d(8, 16, 3, padding=1, stride=2, bias=False), _bn(16)
        self.cd, self.bd = torch.nn.Conv2d(8, 16, 1, stride=2, bias=False), _bn(16)
        self.c2, self.b2 = torch.nn.Conv2d(16, 16, 1, bias=False), _bn(16)
        self.eval()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = F.relu(self.b0(self.c0(x)))
        z = F.relu(self.b1(self.c1(y)) + self.bd(self.cd(y)))
        t = self.b2(self.c2(z))
        return F.relu(t), t


def test_chains_fold_into_fused_convolutions_that_match_eager() -> None:
    from torch._dynamo.backends.common import aot_autograd

    from polytile.torch.packing import constant_inputs
    model = Block()
    seen: dict[str, object] = {}

    def compiler(gm: torch.fx.GraphModule, _: list[object]) -> object:
        seen["caches"] = fuse_conv_bn_relu(gm, constant_inputs(gm))
        seen["fused"] = [n for n in gm.graph.nodes if n.target is conv_bias_relu]
        seen["ops"] = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        return gm.forward

    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=compiler), dynamic=False)
    with torch.no_grad():
        for k in range(3):
            x = torch.randn(2, 3, 9, 11)
            if k == 2:  # written in place: folded again
                model.b1.running_var.mul_(1.5)
                model.c1.weight.mul_(-1)
            assert_close(compiled(x), model(x), 1e-4)
    fused = seen["fused"]
    assert len(fused) == 2, seen["ops"]  # the stem, the residual sum; bn2 is read outside its chain
    assert sorted(n.args[3] is None for n in fused) == [False, True]  # type: ignore[attr-defined]
    assert sum("aten._native_batch_norm" in op for op in seen["ops"]) == 1  # bn2's; the branch's folded too
    assert [c.packs for c in seen["caches"]] == [1, 2]  # type: ignore[attr-defined]


def test_cudnn_fusion_option_is_checked() -> None:
    with pytest.raises(PolytileError, match="cudnn_fusion"):
        ptt.backend(cudnn_fusion="yes")


@pytest.mark.gpu
def test_cudnn_fusion_resnet_on_the_gpu_matches_eager() -> None:
    from polytile.torch import zoo
    model, inputs = zoo.model("resnet50", size="tiny", batch=3, device="cuda", dtype=torch.float16)
    report = ptt.Report()
    compiled = torch.compile(model, backend=ptt.backend(report=report, cudnn_fusion=True), dynamic=False)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for k in range(5):
            x = torch.randn_like(inputs[0])
            if k == 4:  # written in place between CUDA-graph replays: the replay reads the weights folded again
                bns[0].running_var.mul_(2)
                bns[-1].weight.mul_(-1)
            assert_close(compiled(x).float(), model(x).float(), 3e-2)
    assert any("cudnn_fusion" in n for n in report.notes), report.notes
    assert report.cuda_graph_replays >= 3, report


@pytest.mark.needs_nvcc
def test_the_backend_runs_the_folded_graph(nvcc: str) -> None:
    # a CUDA target on CPU tensors: the chains fold (torch's operations stand in for cuDNN's kernel), the
    # groups left (bn2, its ReLU) are built for the GPU and fail on the CPU inputs, so torch runs them
    model, x = Block(), torch.randn(2, 3, 9, 11)
    report = ptt.Report()
    compiled = torch.compile(model, backend=ptt.backend(report=report, target="cuda:sm_90a", channels_last=True,
                                                        cudnn_fusion=True), dynamic=False)
    with torch.no_grad():
        assert_close(compiled(x), model(x), 1e-4)
    assert any("cudnn_fusion: 2 " in n for n in report.notes), report.notes
    assert list(report.reasons()["convolution"]).count(
        "cuDNN's fused convolution + bias (+ residual) + ReLU, a batch norm folded in") == 1, report.reasons()
