"""Rebuild the Triton cubins next to this file (needs Triton; no GPU): `python build.py`.

The CPU tests keep these cubins so that they do not need Triton: fma3 (the kernel of
tests/sass/test_sass_gpu.py, whose random schedules broke on an H100 before the scoreboard setup
rule) and the tutorial kernels, launched as benchmarks/triton_kernels.py's `fma3_launch` and
`tutorial_launches` (the SASS benchmark's options) describe.
They were built with Triton 3.6.0 for sm_90a (compute capability 90).
"""

from __future__ import annotations

import sys
from pathlib import Path

import triton

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[3] / "benchmarks"))

from triton_kernels import fma3_launch, tutorial_launches  # noqa: E402


def main() -> None:
    cc = {"compute_capability": 90}
    launches = {"fma3": fma3_launch(**cc)}
    launches.update({name.removeprefix("triton-").removesuffix("-fp16"): launch
                     for name, launch in tutorial_launches(**cc).items()})
    for name, launch in launches.items():
        (HERE / f"{name}.cubin").write_bytes(launch.cubin)
        print(
            f"{name}.cubin: kernel {launch.kernel}, {len(launch.cubin)} bytes (Triton {triton.__version__})"
        )


if __name__ == "__main__":
    main()
