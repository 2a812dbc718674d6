"""Rebuild the Triton cubins next to this file (needs Triton; no GPU): `python build.py`.

The CPU tests keep these cubins so that they do not need Triton: fma3 is the kernel of
tests/sass/test_sass_gpu.py (whose random schedules broke on an H100 before the scoreboard setup
rule), the others are benchmarks/triton_kernels.py with the launch options of benchmarks/sass.py.
They were built with Triton 3.6.0 for sm_90a (compute capability 90).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import triton
import triton.language as tl

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[3] / "benchmarks"))

from triton_kernels import layernorm_kernel, matmul_kernel, softmax_kernel  # noqa: E402

from polytile.sass.triton_kernel import triton_launch  # noqa: E402


@triton.jit
def fma3(x_ptr, y_ptr, z_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    z = tl.load(z_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * y + z * x - y, mask=mask)


def main() -> None:
    cc = {"compute_capability": 90}
    n = 1 << 20
    launches = {
        "fma3": triton_launch(
            fma3,
            [*(np.zeros(n, np.float32) for _ in range(4)), n],
            grid=(n // 1024,),
            constexprs={"BLOCK": 1024},
            outputs=["out_ptr"],
            **cc,
        ),
    }
    m = 2048
    a = np.zeros((m, m), np.float16)
    launches["matmul"] = triton_launch(
        matmul_kernel,
        [a, a, a, m, m, m, m, 1, m, 1, m, 1],
        grid=((m // 128) ** 2,),
        constexprs={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8},
        outputs=["c_ptr"],
        num_warps=8,
        num_stages=3,
        **cc,
    )
    rows, cols = 2048, 4096
    x = np.zeros((rows, cols), np.float32)
    launches["softmax"] = triton_launch(
        softmax_kernel,
        [np.zeros_like(x), x, cols, cols, rows, cols],
        grid=(rows,),
        constexprs={"BLOCK_SIZE": cols},
        outputs=["out_ptr"],
        num_warps=8,
        num_stages=2,
        **cc,
    )
    xh, w, stats = np.zeros((rows, cols), np.float16), np.zeros(cols, np.float16), np.zeros(rows, np.float32)
    launches["layernorm"] = triton_launch(
        layernorm_kernel,
        [xh, xh, w, w, stats, stats, cols, cols, 1e-5],
        grid=(rows,),
        constexprs={"BLOCK_SIZE": 1024},
        outputs=["y_ptr", "mean_ptr", "rstd_ptr"],
        num_warps=8,
        **cc,
    )
    for name, launch in launches.items():
        (HERE / f"{name}.cubin").write_bytes(launch.cubin)
        print(
            f"{name}.cubin: kernel {launch.kernel}, {len(launch.cubin)} bytes (Triton {triton.__version__})"
        )


if __name__ == "__main__":
    main()
