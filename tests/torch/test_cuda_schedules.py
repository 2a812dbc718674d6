"""The CUDA schedules of imported groups compile with nvcc (no GPU needed): matrix products on tensor
cores (16-bit, row-major operands) and on CUDA cores (a transposed weight), row reductions, elementwise
groups and convolutions, for an H100; a graph's groups are compiled by nvcc in parallel."""

from __future__ import annotations

import threading

import pytest

import polytile as pt

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _groups(fn: object, *inputs: torch.Tensor) -> list[object]:
    """The groups of ``fn``'s aten graph (traced on the CPU) imported as for a GPU (products with their
    epilogues fused, as the backend writes them)."""
    from torch._dynamo.backends.common import aot_autograd

    from polytile.torch.compiler import _graph_outputs
    from polytile.torch.importer import import_group
    from polytile.torch.partition import group_outputs, partition
    found: list[object] = []

    def collect(gm: torch.fx.GraphModule, _: list[object]) -> object:
        outs = _graph_outputs(gm)
        found.extend(import_group(g.nodes, group_outputs(g, outs), g.kind, fuse_epilogue=True)
                     for g in partition(gm, "cpu").groups)
        return gm.forward

    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=collect), dynamic=False)(*inputs)
    return found


def _sources(fn: object, *inputs: torch.Tensor) -> dict[str, list[str]]:
    """The CUDA source of each imported group's default schedule, by group kind (built as the backend
    builds a graph's groups)."""
    from polytile.torch.compiler import build_groups
    groups = _groups(fn, *inputs)
    built = build_groups([imp.func for imp in groups], pt.CUDATarget(arch="sm_90a"))  # type: ignore[attr-defined]
    out: dict[str, list[str]] = {}
    for imp, (kern, origin) in zip(groups, built):
        assert origin == "default", kern
        out.setdefault(imp.kind, []).append(kern.source)  # type: ignore[attr-defined]
    return out


@pytest.mark.needs_nvcc
def test_cuda_schedules_of_products_reductions_and_elementwise_groups_compile(
        nvcc: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from polytile.runtime import cuda
    compile_cuda, calls, together = cuda.compile_cuda, [], threading.Barrier(2, timeout=60)

    def compile_in_parallel(*args: object, **kwargs: object) -> object:
        calls.append(args)
        if len(calls) <= 2:  # the first two compilations must run at the same time
            together.wait()
        return compile_cuda(*args, **kwargs)
    monkeypatch.setattr(cuda, "compile_cuda", compile_in_parallel)
    x, w, b = torch.randn(70, 64).half(), torch.randn(64, 48).half(), torch.randn(48).half()
    wt = torch.randn(40, 64)

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, wt: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = F.gelu(x @ w + b)                                   # fp16: tensor cores (wgmma on sm_90a)
        z = F.linear(x.float(), wt)                             # fp32, transposed weight: CUDA cores
        rms = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).half()  # a prologue and epilogue
        return F.layer_norm(y, (48,)), torch.softmax(z * 0.5 + wt[0, :40], -1), torch.sigmoid(x) * 2, rms
    sources = _sources(fn, x, w, b, wt)
    assert {"gemm", "reduce", "elementwise"} <= set(sources) and len(sources["reduce"]) == 3
    assert len(sources["gemm"]) == 2 and sum("wgmma" in s for s in sources["gemm"]) == 1


@pytest.mark.needs_nvcc
def test_cuda_schedule_of_a_convolution_with_its_epilogue_compiles(nvcc: str) -> None:
    conv = torch.nn.Conv2d(8, 16, 3, padding=1).eval()
    sources = _sources(lambda x, r: F.relu(conv(x) + r), torch.randn(1, 8, 10, 10), torch.randn(1, 16, 10, 10))
    assert "conv" in sources and "__global__" in sources["conv"][0]


@pytest.mark.needs_nvcc
def test_channels_last_batch_norms_compile_and_read_and_write_nhwc(nvcc: str) -> None:
    # the channels_last option's activations: a batch norm, residual sum and ReLU between convolutions
    # left to torch, read and written channels-last as they lie (no layout copy), compiled for an H100
    from polytile.torch.compiler import build_groups
    mean, var, g, b = (torch.randn(24).half() for _ in range(4))
    var = var.abs() + 0.5
    x, r = (torch.randn(1, 24, 7, 9).half().contiguous(memory_format=torch.channels_last) for _ in range(2))

    def fn(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return F.relu(F.batch_norm(x, mean, var, g, b, False, 0.1, 1e-5) + r)
    (imp,) = _groups(fn, x, r)
    assert imp.kind == "elementwise" and imp.out_orders == [(0, 2, 3, 1)]
    for ad, t in zip(imp.adapters, imp.inputs):
        if t.meta["val"].ndim == 4:
            assert ad.perm == (0, 2, 3, 1) and not ad.narrowed
            assert ad(x).data_ptr() == x.data_ptr()  # a view, no copy
    ((built, origin),) = build_groups([imp.func], pt.CUDATarget(arch="sm_90a"))  # type: ignore[attr-defined]
    assert "__global__" in built.source, built


def _bert_layer(x: torch.Tensor, wq: torch.Tensor, bq: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor,
                w2: torch.Tensor, b2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A BERT layer's linear layers (weights [out, in]: the product reads them transposed) with their
    epilogues: bias and scale, bias and GELU, bias and residual add."""
    q = F.linear(x, wq, bq) * 0.125
    h = F.gelu(F.linear(x, w1, b1))
    return q, h, F.linear(h, w2, b2) + x


def _bert_inputs() -> list[torch.Tensor]:
    return [t.half() for t in (torch.randn(128, 96), torch.randn(96, 96), torch.randn(96), torch.randn(192, 96),
                               torch.randn(192), torch.randn(96, 192), torch.randn(96))]


@pytest.mark.parametrize("arch,kernel,call", [("sm_90a", "wgmma", "pt_wgmma_m64n"),
                                              ("sm_80", "mma", "pt_mma_m16n8k16_f16(")])
def test_linear_layers_with_epilogues_take_the_tensor_cores(arch: str, kernel: str, call: str) -> None:
    # BERT's linear layers at batch 1 ran on the CUDA cores (135 µs each on an H100; cuBLAS 5-8 µs):
    # a transposed weight was not taken by the tensor-core schedules
    from polytile.torch.schedules import gemm_cuda_kernel, group_info
    target = pt.CUDATarget(arch=arch)  # type: ignore[attr-defined]
    groups = [g for g in _groups(_bert_layer, *_bert_inputs()) if g.kind == "gemm"]  # type: ignore[attr-defined]
    assert len(groups) == 3
    for g in groups:
        (st,) = group_info(g.func).of_kind("gemm")  # type: ignore[attr-defined]
        assert st["b_transposed"] and gemm_cuda_kernel(g.func, st, target) == kernel  # type: ignore[attr-defined]


@pytest.mark.needs_nvcc
def test_linear_layers_with_epilogues_compile_to_hgmma(nvcc: str) -> None:
    import re
    import subprocess
    import tempfile

    from source_text import body

    from polytile.sass.disasm import find_nvdisasm
    from polytile.torch.compiler import build_groups
    groups = [g for g in _groups(_bert_layer, *_bert_inputs()) if g.kind == "gemm"]  # type: ignore[attr-defined]
    for kern, origin in build_groups([g.func for g in groups], pt.CUDATarget(arch="sm_90a")):  # type: ignore[attr-defined]
        assert origin == "default"
        assert re.search(r"pt_wgmma_m64n\d+k16_f16\(.*, 0\);", body(kern.source))  # B read K-major
        assert all(r.spill_stores == 0 and r.stack_bytes == 0 for r in kern.resources.values())
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kern.cubin)
            f.flush()
            sass = subprocess.run([find_nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout
        assert "HGMMA.64x" in sass and not re.search(r"\bLDL\b|\bSTL\b", sass)


@pytest.mark.needs_nvcc
def test_attention_products_on_warpgroup_mma(nvcc: str) -> None:
    # BERT-base's heads (128 tokens, 12 heads of 64): the scores read K [tokens][heads · 64] K-major,
    # the context reads V N-major, each head a batch (blockIdx.z) at its columns of the width
    import re

    from source_text import body
    from test_importer import heads_attention, heads_inputs

    from polytile.torch.compiler import build_groups
    groups = [g for g in _groups(lambda *a: heads_attention(*a, heads=12), *heads_inputs(128, 12, 64, torch.half))
              if g.kind == "gemm" and len(g.func.tensor("C").shape) == 3]  # type: ignore[attr-defined]
    assert len(groups) == 2
    built = build_groups([g.func for g in groups], pt.CUDATarget(arch="sm_90a"))  # type: ignore[attr-defined]
    for (kern, _), trans_b in zip(built, (0, 1)):
        src = body(kern.source)  # type: ignore[attr-defined]
        assert re.search(rf"pt_wgmma_m64n\d+k16_f16\(.*, {trans_b}\);", src), src
        assert all(r.spill_stores == 0 and r.stack_bytes == 0 for r in kern.resources.values())  # type: ignore[attr-defined]
