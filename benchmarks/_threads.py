"""``--threads N`` for the CPU benchmarks: applied to OpenMP, OpenBLAS and MKL before NumPy loads its
BLAS (import this module first), so polytile's kernels and the vendor library run on as many threads."""

import os
import sys


def thread_count(argv: list[str]) -> int:
    for k, a in enumerate(argv):
        if a == "--threads" and k + 1 < len(argv):
            return int(argv[k + 1])
        if a.startswith("--threads="):
            return int(a.split("=", 1)[1])
    return 0


THREADS = thread_count(sys.argv[1:])
if THREADS:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(THREADS)
