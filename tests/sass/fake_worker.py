"""A stand-in measurement worker for the runner tests: behaves according to the cubin bytes it gets."""

import os
import sys
import time

from polytile.runtime.cuda_driver import CudaError
from polytile.sass.worker import serve

ORIGINAL = []
TIMED: dict[bytes, int] = {}  # time requests per cubin, in this worker


def changed_words(cubin: bytes) -> int:
    """Instruction words that differ from the original cubin's (the 'schedule mode' time model)."""
    original = ORIGINAL[0]
    return sum(cubin[i : i + 16] != original[i : i + 16] for i in range(0, len(original), 16))


def handle(message):
    kind = message[0]
    if kind == "setup":
        if message[1].cubin == b"broken-original":
            raise RuntimeError("the original kernel faulted")
        ORIGINAL[:] = [message[1].cubin]
        return {"device": "fake GPU", "pid": os.getpid()}
    cubin = message[1]
    flaky_above = int(os.environ.get("FAKE_FLAKY_ABOVE", "-1"))
    if flaky_above >= 0 and kind == "time" and changed_words(cubin) > flaky_above:
        # a variant that times (and verifies) once, then faults when re-timed in the same worker
        TIMED[cubin] = TIMED.get(cubin, 0) + 1
        if TIMED[cubin] > 1:
            raise CudaError("cuModuleUnload failed: CUDA_ERROR_ILLEGAL_ADDRESS")
    reject_above = int(os.environ.get("FAKE_REJECT_ABOVE", "-1"))
    if reject_above >= 0:
        # Schedule mode: more moved words run faster; too many moved words compute wrong results.
        if kind == "time":
            return 100.0 - changed_words(cubin)
        return None if changed_words(cubin) <= reject_above else "seed 11: output 'y' differs in 1 elements"
    if cubin == b"crash":
        os._exit(7)
    if cubin == b"hang":
        time.sleep(3600)
    if cubin == b"fault":
        raise CudaError("cuEventSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS")
    if cubin == b"wrong":
        raise ValueError("wrong results on the timing inputs")
    if kind == "time":
        print("noise on stdout must not break the protocol")
        return float(len(cubin))
    if kind == "verify":
        return None if cubin != b"subtly-wrong" else "seed 2: output 'y' differs in 3 elements"
    return os.getpid()


if __name__ == "__main__":
    sys.exit(serve(handle))
