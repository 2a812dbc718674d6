"""Generated sources in tests: the functions apart from the header of helper definitions before them,
so that a test looking for a call or a statement finds it in the code that runs."""


def body(source: str) -> str:
    """The functions of a generated source (CUDA kernels, or the C++ function and its entry point)."""
    for first in ('extern "C" __global__', "static void "):
        start = source.find(first)
        if start >= 0:
            return source[start:]
    raise AssertionError(f"no function in the generated source:\n{source[:2000]}")


def header(source: str) -> str:
    """What a generated source defines before its functions (includes, helpers, vector types)."""
    return source[: len(source) - len(body(source))]
