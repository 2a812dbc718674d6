"""Float16 / bfloat16 outputs (``out_dtype``) without a GPU: every template's kernel compiled by nvcc
(sm_90a, and sm_90 for mma.sync) stores the output type, converts the float32 accumulators once,
stores the tensor cores' accumulators as whole sectors (the lanes of a quad exchange packed pairs:
``pt_store_packed``, 16-byte stores where the rows are 16-byte aligned, 8-byte ones where only 8; the
partial tiles' last columns included) and keeps everything in registers (no local memory)."""

import re
import subprocess
import tempfile

import pytest
from half_output_cases import CASES

from polytile.target import CUDATarget

pytestmark = pytest.mark.needs_nvcc
SM90A = CUDATarget(arch="sm_90a")
# the tensor-core results stored whole: (output, the widest store in bytes), 16 for rows of a multiple of 8
# elements, 8 for a multiple of 4 (rows of an odd length are stored element by element: every other row
# starts at an odd, misaligned element); a split product pairs its float32 partial sums (a sector per quad
# row already), its final sum is one per thread
WHOLE = {"mma": ("C", 16), "mma-template": ("C", 16), "wgmma": ("C", 16), "batch-default": ("C", 16),
         "batch-mma": ("C", 16), "igemm-3x3": ("O", 16), "igemm-3x3-mma": ("O", 16), "igemm-1x1": ("O", 16),
         "igemm-3d": ("O", 16), "mma-m17-n100": ("C", 8), "wgmma-m17": ("C", 16), "wgmma-m17-n100": ("C", 8),
         "batch-default-m17": ("C", 16), "igemm-1x1-k100": ("O", 8)}
PAIRED = {"split-k-mma": "P"}
STORAGE = {"float16": "__half", "bfloat16": "__nv_bfloat16"}


def _sass(cubin: bytes) -> str:
    from polytile.sass.disasm import find_nvdisasm
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([find_nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout


PARAMS = [(c, "float16") for c in CASES] + [(c, "bfloat16") for c in CASES if c[0] in ("mma", "wgmma", "igemm-1x1")]


@pytest.mark.parametrize("case,dtype", PARAMS, ids=[f"{c[0]}-{d}" for c, d in PARAMS])
def test_half_output_kernel(case, dtype):
    name, make, build = case
    op = make(dtype)
    kern = build(op, SM90A)
    out = op.func.outputs[0].name
    src = kern.source
    assert re.search(rf"{STORAGE[dtype]}\* __restrict__ {out}\b", src), "the output is stored as the 16-bit type"
    assert "pt_f16_round(" not in src and "pt_bf16_round(" not in src  # the store's conversion rounds, once
    if name in PAIRED:
        assert f"pt_store_pair(&{PAIRED[name]}[" in src
    text = _sass(kern.cubin)
    if name in WHOLE:
        whole, width = WHOLE[name]
        assert f"pt_store_packed(&{whole}[" in src and "pt_shfl_xor(" in src
        assert re.search(rf"\bSTG\.E\.{8 * width}\b", text)
    if name != "conv2d-nchw":  # the direct NCHW convolution's CUDA schedule spills for any output type
        assert not re.search(r"\bLDL\b|\bSTL\b", text)
    assert "F2FP" in text  # float32 → 16-bit conversions (paired: F2FP.*PACK_AB)


@pytest.mark.parametrize("name,dims", [("matmul", dict(M=300, N=264, K=200)), ("matmul", dict(M=4, N=1000, K=512)),
                                       ("conv2d_igemm", dict(N=2, H=13, W=11, C=64, K=72, R=3, S=3, padding=1))])
def test_cuda_template_configurations_store_half(name, dims):
    """The tuning templates (tensor cores, warpgroup MMA, GEMV, split reductions) schedule the float16
    output like the float32 one: a few valid configurations build, store __half, and use no more
    local memory than the same configuration storing float32 (a random point of a space may spill)."""
    import numpy as np

    from polytile.build import build
    from polytile.tune import make_task
    task = make_task(name, SM90A, dtype="float16", out_dtype="float16", **dims)
    wide = make_task(name, SM90A, dtype="float16", **dims)
    rng = np.random.default_rng(7)
    seen = 0
    for row in task.space.random_digits(rng, 400):
        if not task.space.is_valid(list(row)):
            continue
        values = task.space.config(list(row)).values
        kern = build(task.schedule(values), SM90A)
        out = task.op.func.outputs[0].name
        assert re.search(rf"__half\* __restrict__ {out}\b", kern.source)
        kernels = (kern, build(wide.schedule(values), SM90A))
        local = [len(re.findall(r"\bLDL\b|\bSTL\b", _sass(k.cubin))) for k in kernels]
        assert local[0] <= local[1], values
        seen += 1
        if seen == 2:
            break
    assert seen
