"""Each model of the zoo (tiny configurations on the CPU, fp16 on the GPU) compiled with the backend
matches eager torch; the distinct workloads of a model are deduplicated and weighted."""

from __future__ import annotations

import pytest
from torch_helpers import assert_close, compile_and_compare

from polytile.torch import zoo

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

MODELS = ["bert-base", "gpt2-prefill", "gpt2-decode", "llama", "resnet50"]


@pytest.mark.filterwarnings("error:.*deprecated:FutureWarning")  # the zoo calls transformers as it asks
@pytest.mark.parametrize("name", MODELS)
def test_a_tiny_model_compiled_matches_eager(name: str) -> None:
    model, inputs = zoo.model(name, size="tiny", batch=2, **({"seq": 16} if name != "resnet50" else {}))
    report = compile_and_compare(model, *inputs)
    assert report.taken, report
    kinds = {g.kind for g in report.taken}
    assert ("conv" if name == "resnet50" else "gemm") in kinds


@pytest.mark.gpu
@pytest.mark.parametrize("name", MODELS)
def test_a_model_compiled_on_the_gpu_matches_eager(name: str) -> None:
    import polytile.torch as ptt
    model, inputs = zoo.model(name, size="tiny", batch=2, device="cuda")
    report = ptt.Report()
    compiled = torch.compile(model, backend=ptt.backend(choose="always", report=report), dynamic=False)
    with torch.no_grad():
        assert_close(compiled(*inputs).float(), model(*inputs).float(), 3e-2)
    assert report.taken


def test_unknown_models_and_sizes_are_refused() -> None:
    from polytile.errors import PolytileError
    with pytest.raises(PolytileError, match="unknown model 'vgg'"):
        zoo.model("vgg")
    with pytest.raises(PolytileError, match="size must be"):
        zoo.model("bert-base", size="huge")


@pytest.mark.gpu
def test_bert_base_at_batch_1_compiled_on_the_gpu_matches_eager() -> None:
    # full widths: the linear layers' transposed weights on warpgroup MMA (K-major B, TMA tiles)
    import polytile.torch as ptt
    model, inputs = zoo.model("bert-base", batch=1, device="cuda")
    report = ptt.Report()
    compiled = torch.compile(model, backend=ptt.backend(choose="always", report=report, cuda_graphs=False),
                             dynamic=False)
    with torch.no_grad():
        assert_close(compiled(*inputs).float(), model(*inputs).float(), 3e-2)
    assert sum(g.kind == "gemm" for g in report.taken) >= 48, report


@pytest.mark.gpu
def test_attention_with_heads_split_by_views_compiled_on_the_gpu_matches_eager() -> None:
    from test_importer import heads_attention, heads_inputs
    inputs = heads_inputs(128, 12, 64, torch.float16, "cuda")
    report = compile_and_compare(lambda *a: heads_attention(*a, heads=12), *inputs, tol=3e-2)
    assert report.taken_ops["bmm"] == 2, report
