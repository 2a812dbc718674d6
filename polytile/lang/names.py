"""Which names a user may give tensors, parameters and functions: they become identifiers of the
generated C++ and CUDA as they are, so each must be one that code can declare and use."""

from __future__ import annotations

import ctypes
import functools
import re

from ..errors import LanguageError

_KEYWORDS = frozenset("""
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t
    class compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield
    decltype default delete do double dynamic_cast else enum explicit export extern false float for friend
    goto if inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private
    protected public register reinterpret_cast requires restrict return short signed sizeof static
    static_assert static_cast struct switch template this thread_local throw true try typedef typeid
    typename union unsigned using virtual void volatile wchar_t while xor xor_eq
""".split())
"""C and C++ keywords and alternative tokens."""

_GENERATED = frozenset("""
    int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t size_t half nv_bfloat16
    char2 char4 short2 short4 int2 int4 uint2 uint4 float2 float4 double2 longlong2 dim3
    threadIdx blockIdx blockDim gridDim warpSize
    exp expf log logf sqrt sqrtf tanh tanhf erf erff sin sinf cos cosf floor floorf ceil ceilf exp2 exp2f
    log2 log2f pow powf fma fmaf fabs fabsf fmin fminf fmax fmaxf min max abs free memcpy memset
    make_int2 make_uint2 make_uint4 make_float2 make_float4 atomicAdd atomicMax atomicMin
    INFINITY NAN NULL EOF INT64_MIN
""".split())
"""Types, CUDA built-in variables, functions and constants that generated code names."""

_MACROS = frozenset("""
    BIG_ENDIAN BUFSIZ BYTE_ORDER CLOCKS_PER_SEC CUDARTAPI CUDARTAPI_CDECL FD_SETSIZE HUGE_VAL HUGE_VALF
    HUGE_VALL LITTLE_ENDIAN L_ctermid L_cuserid L_tmpnam MAXFLOAT MAX_CANON MAX_INPUT NFDBITS NZERO
    PDP_ENDIAN PIPE_BUF P_tmpdir TIMER_ABSTIME WCONTINUED WEXITED WNOHANG WNOWAIT WSTOPPED WUNTRACED
    TIME_UTC MATH_ERRNO MATH_ERREXCEPT EXIT_SUCCESS EXIT_FAILURE RENAME_EXCHANGE RENAME_NOREPLACE
    RENAME_WHITEOUT linux unix i386 math_errhandling stderr stdin stdout errno
""".split())
_MACRO_FAMILIES = re.compile(
    r"(cuda[A-Z]\w*|(CUDART|CUDA|CU|NV|M|ADJ|MOD|STA|CLOCK|FP|SEEK|HUGE_VAL|NL|PTHREAD)_[A-Z0-9]\w*"
    r"|[A-Z][A-Z0-9]*(_[A-Z0-9]+)*_(MAX|MIN|WIDTH|BIT)|SNAN[A-Z0-9]*)")
"""Object-like macros of the headers generated code includes (C library and CUDA runtime): a
parameter or pointer of that name would be replaced by the preprocessor. The families cover the
numeric limits (``INT32_MAX``), mathematical constants (``M_PI``) and CUDA's enumerators."""

_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def reserved_reason(name: str) -> str | None:
    """Why ``name`` cannot name a tensor, parameter or function in generated code (None: it can)."""
    if not _IDENTIFIER.fullmatch(name):
        if name.startswith("_") and _IDENTIFIER.fullmatch(name.lstrip("_")):
            return "names starting with an underscore are reserved (by C++ and for polytile's own variables)"
        return "it is not an identifier (ASCII letters, digits and underscores, starting with a letter)"
    if name.startswith("pt_"):
        return "the prefix pt_ is reserved for polytile's helper functions"
    if name in _KEYWORDS:
        return "it is a C++ keyword"
    if name in _GENERATED:
        return "generated C++/CUDA code uses it (a type, built-in, math function or constant)"
    if name in _MACROS or _MACRO_FAMILIES.fullmatch(name):
        return "it is a macro of the C or CUDA headers that generated code includes"
    return None


def check_name(name: object, what: str) -> str:
    """``name`` if it can name ``what`` (e.g. "tensor", "parameter") in generated code; else a LanguageError."""
    if not isinstance(name, str):
        raise LanguageError(f"the name of a {what} must be a string, got {name!r}")
    reason = reserved_reason(name)
    if reason is not None:
        raise LanguageError(f"{what} name {name!r} cannot be used: {reason}; choose another name")
    return name


def check_function_name(name: object) -> str:
    """A Func's name: also the C symbol of the kernel's entry point, so not a C library function."""
    check_name(name, "Func")
    if hasattr(_c_library(), str(name)):
        raise LanguageError(f"Func name {name!r} cannot be used: the kernel's entry point is a C function of "
                            "that name and the C library has one; choose another name")
    return str(name)


@functools.cache
def _c_library() -> ctypes.CDLL:
    """The symbols loaded in this process: the C and math libraries among them."""
    return ctypes.CDLL(None)
