"""The intrinsic registry: intrinsics and their device functions are looked up by exact name, and the
lowering emits only registered instructions for tensorized nests."""

import re

import pytest

import polytile as pt
from polytile import ops
from polytile.errors import PolytileError
from polytile.intrinsics import (
    INTRINSICS,
    MMA_M16N8K16,
    WGMMA_M64NNK16,
    instruction,
    intrinsic,
    tensor_intrinsic,
    tensor_intrinsics,
)
from polytile.target import CUDATarget


def test_lookups_are_by_exact_name():
    assert intrinsic("mma_m16n8k16") is MMA_M16N8K16 and tensor_intrinsic("wgmma_m64nNk16") is WGMMA_M64NNK16
    assert tensor_intrinsic("ldmatrix") is None and tensor_intrinsic("unroll") is None  # not a tensor intrinsic
    assert [t.name for t in tensor_intrinsics()] == ["mma_m16n8k16", "wgmma_m64nNk16"]
    with pytest.raises(PolytileError, match="unknown intrinsic 'wmma'"):
        intrinsic("wmma")
    mma = instruction("pt_mma_m16n8k16_f16")
    assert mma.intrinsic == "mma_m16n8k16" and mma.warp and mma.addresses and not mma.async_proxy
    assert instruction("pt_mma_m16n8k16") is None and instruction("pt_wgmma_m64n") is None  # no prefixes
    assert instruction("pt_wgmma_m64n256k16_bf16").shape == (64, 256, 16)
    assert instruction("pt_wgmma_m64n260k16_f16") is None  # N is a multiple of 8 up to 256
    assert instruction("pt_cp_async_wait").constant_arg and instruction("pt_ldmatrix_a").loads_fragment


def test_products_by_operand_type():
    assert MMA_M16N8K16.product("bfloat16").name == "pt_mma_m16n8k16_bf16"
    assert WGMMA_M64NNK16.product("float16", 40).name == "pt_wgmma_m64n40k16_f16"
    with pytest.raises(PolytileError, match="no instruction for float32 operands"):
        MMA_M16N8K16.product("float32")
    for intr in INTRINSICS.values():
        for ins in intr.instructions:
            assert instruction(ins.name) is ins and ins.intrinsic == intr.name


@pytest.mark.parametrize("dtype, arch", [("float16", "sm_90a"), ("bfloat16", "sm_80")])
def test_tensorized_kernels_call_registered_instructions(dtype, arch):
    t = CUDATarget(arch=arch)
    text = str(pt.lower(ops.matmul(256, 192, 64, dtype).schedule(t), t))
    calls = set(re.findall(r"\b(pt_(?:mma|wgmma|ldmatrix|cp_async|fence)\w*)\(", text))
    assert calls and all(instruction(c) is not None for c in calls), calls
    products = {c for c in calls if instruction(c).shape is not None}
    intr = t.tensor_intrinsics[-1]  # the default schedule uses the newest the target has
    assert products and {instruction(c).intrinsic for c in products} == {intr.name}
    assert {instruction(c).dtype for c in products} == {dtype}
