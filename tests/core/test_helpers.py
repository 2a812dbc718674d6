"""Generated sources define only the helpers their functions call (and what those call), so that a
test looking for a helper in a kernel's body tests the kernel."""

import re

import pytest
from source_text import body, header

import polytile as pt
from polytile import ops
from polytile.codegen import cpu, cuda
from polytile.codegen.cuda import cuda_source
from polytile.codegen.helpers import Helper, Helpers, mentioned


def _defined(source: str) -> set[str]:
    """The helper names a source's header defines (functions and structs)."""
    return set(re.findall(r"\b(pt_\w+)\s*(?:\(|<[^>]*>\s*\(|\{)", header(source)))


@pytest.mark.parametrize("table", [cpu.HELPERS, cuda.HELPERS], ids=["cpu", "cuda"])
def test_helpers_are_registered_after_what_they_call(table):
    seen: set[str] = set()
    for name, helper in table.table.items():
        assert name in helper.text, name
        calls = mentioned(helper.text) & set(table.table) - {name}
        assert calls <= seen, f"{name} calls {calls - seen}, registered after it"
        seen.add(name)


def test_needed_closes_over_calls_and_keeps_the_registered_order():
    table = Helpers([Helper("pt_a", "a\n"), Helper("pt_b", "b calls pt_a\n"), Helper("pt_c", "c\n")],
                    generate=lambda name: "g calls pt_b\n" if name == "pt_g16" else None)
    assert table.needed("x = pt_b(1) + pt_v;") == ["pt_a", "pt_b"]
    assert table.needed("pt_g16(); pt_c();") == ["pt_a", "pt_b", "pt_c", "pt_g16"]
    assert table.header("pt_c(pt_c())") == "c\n"


def _source(op, target):
    t = pt.target.as_target(target)
    return cuda_source(pt.lower(op.schedule(t), t))[0]


def test_a_cuda_source_defines_what_its_kernels_call():
    softmax = _source(ops.softmax(37, 1000), "cuda:sm_80")
    assert {"pt_block_allreduce_max", "pt_block_allreduce_sum"} <= _defined(softmax)
    assert not re.search(r"pt_(mma|ldmatrix|cp_async|wgmma|store_pair|floordiv|block_allreduce_prod)", header(softmax))
    mma = _source(ops.matmul(256, 256, 256, "bfloat16"), "cuda:sm_80")
    assert {"pt_mma_m16n8k16_bf16", "pt_ldmatrix_a", "pt_cp_async16", "pt_smem"} <= _defined(mma)
    assert not re.search(r"pt_(mma_m16n8k16_f16|wgmma|block_allreduce)", header(mma))
    wgmma = _source(ops.matmul(256, 256, 256, "float16"), "cuda:sm_90a")
    assert {"pt_wgmma_m64n64k16_f16", "pt_wgmma_desc", "pt_wgmma_fence", "pt_fence_proxy_async"} <= _defined(wgmma)
    assert not re.search(r"pt_(mma_|ldmatrix|wgmma_m64n\d+k16_bf16|wgmma_m64n(?!64k)\d+)", header(wgmma))


@pytest.mark.parametrize("target", ["cpu", "cuda:sm_80", "cuda:sm_90a"])
@pytest.mark.parametrize("op", [ops.matmul(100, 70, 50, "float16"), ops.layernorm(29, 77), ops.spmm(30, 40, 20, 200),
                                ops.conv2d(1, 3, 9, 9, 4, 3, 3, padding=1)], ids=["matmul", "layernorm", "spmm",
                                                                                 "conv2d"])
def test_every_helper_a_body_calls_is_defined(op, target):
    t = pt.target.as_target(target)
    lowered = pt.lower(op.schedule(t), t)
    source = cpu.cpu_source(lowered) if target == "cpu" else cuda_source(lowered)[0]
    table = cpu.HELPERS if target == "cpu" else cuda.HELPERS
    called = {n for n in mentioned(body(source)) if table.definition(n) is not None}
    assert called and called <= _defined(source)
    assert _defined(source) == set(table.needed(body(source)))  # nothing else


def test_a_cpu_source_defines_what_its_function_calls():
    src = pt.build(ops.softmax(8, 33).func).source
    assert "pt_alloc" not in src and "pt_bf16" not in src and "pt_floordiv" not in src
    A = pt.placeholder((10,), "bfloat16", "A")
    B = pt.compute((10,), lambda i: (A[i].astype("float32") * 2.0).astype("bfloat16"), "B")
    src = pt.build(pt.Func([A], [B])).source
    assert {"pt_bf16_to_f32", "pt_f32_to_bf16"} <= _defined(src)
