"""The pipelining pass gives the same kernel in every process. It used to key the loops it had
pipelined by ``id()`` without keeping them alive, so a later statement could reuse a freed id and be
fused with the wrong pipeline: in the exhaustive tuning run 17 of 2706 ResNet-50 convolution
configurations (256×64 or 256×32 block tiles, 16-row warp tiles, register stages 2) referenced an
undefined loop variable in about four processes of five."""

import os
import subprocess
import sys

import pytest
from source_text import body

from polytile import ops
from polytile.ops.gpu_schedules import igemm_tensorcore

CONFIG = dict(bm=256, bn=64, bk=32, wm=16, wn=64, stages=3, reg_stages=2)
SOURCE = f"""
import hashlib, polytile as pt
from polytile import ops
from polytile.build import lower
from polytile.codegen.cuda import cuda_source
from polytile.ops.gpu_schedules import igemm_tensorcore
op = ops.conv2d_igemm(32, 14, 14, 256, 256, 3, 3, 1, 1)
s = pt.Schedule(op.func)
igemm_tensorcore(s, "O", "col", "Wt", ["r", "s"], **{CONFIG!r})
print(hashlib.sha256(cuda_source(lower(s, pt.target.as_target("cuda:sm_90a")))[0].encode()).hexdigest())
"""


def test_the_same_kernel_in_every_process() -> None:
    digests = set()
    for seed in range(5):
        env = dict(os.environ, PYTHONHASHSEED=str(seed))
        proc = subprocess.run([sys.executable, "-c", SOURCE], capture_output=True, text=True, env=env,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        digests.add(proc.stdout.strip())
    assert len(digests) == 1


@pytest.mark.needs_nvcc
def test_the_kernel_compiles() -> None:
    import polytile as pt
    op = ops.conv2d_igemm(32, 14, 14, 256, 256, 3, 3, 1, 1)
    s = pt.Schedule(op.func)
    igemm_tensorcore(s, "O", "col", "Wt", ["r", "s"], **CONFIG)
    kern = pt.build(s, "cuda:sm_90a")
    assert "pt_cp_async_wait<" in body(kern.source)
