"""A `@triton.jit` kernel as a CubinLaunch: compiled by Triton, launched straight from its cubin.

The kernel is compiled with `triton.compile` for an explicit signature (pointer and scalar types
from the example arguments, constexprs as given), so the parameter list is known exactly: the
non-constexpr arguments in order, specialized as Triton's JIT specializes them (pointers and
multiples of 16 marked 16-divisible, integers equal to 1 turned into constants and dropped from the
parameters, except for the kernel's `do_not_specialize` arguments), then the hidden pointers Triton
appends (global scratch, and in newer versions profile scratch), which the cubin's parameter table
counts. Without the specialization on 1 a unit stride stays a runtime value and Triton cannot
vectorize the accesses it governs: the tutorial matmul then loads A one element at a time and
runs about 20 times slower than what `kernel[grid](...)` gives a user. The optimizer then
loads the patched cubin through the CUDA driver; Triton's launcher is not involved, which keeps
this independent of Triton's runtime internals. Only single-CTA programs (num_ctas=1) are supported.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from polytile.sass.cubin import Cubin
from polytile.sass.launch import Buffer, CubinLaunch, LaunchError, Scalar, Scratch

_POINTER_TYPES = {
    "float16": "*fp16",
    "float32": "*fp32",
    "float64": "*fp64",
    "bfloat16": "*bf16",
    "int8": "*i8",
    "int16": "*i16",
    "int32": "*i32",
    "int64": "*i64",
    "uint8": "*u8",
    "uint16": "*u16",
    "uint32": "*u32",
}


def as_host_array(value) -> tuple[np.ndarray, str] | None:
    """(numpy array, element type name) for a numpy array or a torch tensor, else None."""
    if isinstance(value, np.ndarray):
        return value, value.dtype.name
    if hasattr(value, "detach") and hasattr(value, "dtype"):  # a torch tensor, without importing torch
        tensor = value.detach().cpu().contiguous()
        if str(tensor.dtype) == "torch.bfloat16":
            import torch

            return tensor.view(torch.int16).numpy().view(np.uint16), "bfloat16"
        array = tensor.numpy()
        return array, array.dtype.name
    return None


def _current_target(compute_capability: int | None):
    from triton.backends.compiler import GPUTarget

    if compute_capability is None:
        try:
            import triton

            return triton.runtime.driver.active.get_current_target()
        except Exception as exc:  # no GPU here: the caller must say which architecture to build for
            raise LaunchError(
                f"cannot ask Triton for the current GPU ({exc}); pass compute_capability=90"
            ) from exc
    return GPUTarget("cuda", int(compute_capability), 32)


def _do_not_specialize(fn) -> set[str]:
    """Names of the arguments `@triton.jit(do_not_specialize=...)` exempts (given by name or index)."""
    names = set()
    for entry in getattr(fn, "do_not_specialize", ()) or ():
        if isinstance(entry, int | np.integer):
            if 0 <= int(entry) < len(fn.arg_names):
                names.add(fn.arg_names[int(entry)])
        else:
            names.add(str(entry))
    return names


def triton_launch(
    fn,
    args: Sequence,
    grid: tuple[int, ...],
    constexprs: dict | None = None,
    *,
    outputs: Sequence[str] = (),
    num_warps: int = 4,
    num_stages: int = 3,
    compute_capability: int | None = None,
    name: str = "",
    rtol: float = 0.0,
) -> CubinLaunch:
    """Compile `fn` for `args` (non-constexpr arguments in order) and describe its launch.

    `outputs` names the pointer arguments the kernel writes; the rest are inputs. `grid` is the
    number of programs along up to three axes.
    """
    import triton

    constexprs = dict(constexprs or {})
    names = [n for n in fn.arg_names if n not in constexprs]
    if len(names) != len(args):
        raise LaunchError(
            f"Triton kernel {fn.__name__!r} takes {len(names)} non-constexpr arguments "
            f"({', '.join(names)}); got {len(args)}"
        )
    unknown = set(outputs) - set(names)
    if unknown:
        raise LaunchError(f"outputs {sorted(unknown)} are not arguments of {fn.__name__!r}")
    signature, launch_args, attrs = {}, [], {}
    unspecialized = _do_not_specialize(fn)
    for arg_name, value in zip(names, args, strict=True):
        aligned = [["tt.divisibility", 16]]  # what Triton's JIT assumes for 16-aligned pointers and ints
        index = (fn.arg_names.index(arg_name),)
        specialize = arg_name not in unspecialized
        host = as_host_array(value)
        if host is not None:
            array, dtype = host
            if dtype not in _POINTER_TYPES:
                raise LaunchError(f"argument {arg_name!r} has element type {dtype}, which Triton cannot take")
            signature[arg_name] = _POINTER_TYPES[dtype]
            role = "out" if arg_name in outputs else "in"
            attrs[index] = aligned
            launch_args.append(Buffer(arg_name, dtype, tuple(array.shape), role=role))
        elif isinstance(value, int | np.integer) and not isinstance(value, bool) and int(value) == 1 and specialize:
            constexprs[arg_name] = 1  # Triton's JIT: an integer argument equal to 1 becomes a constant
        elif isinstance(value, bool | int | np.integer):
            kind = "i32" if -(2**31) <= int(value) < 2**31 else "i64"
            signature[arg_name] = kind
            launch_args.append(Scalar(arg_name, "int32" if kind == "i32" else "int64", int(value)))
            if int(value) % 16 == 0 and specialize:
                attrs[index] = aligned
        elif isinstance(value, float | np.floating):
            signature[arg_name] = "fp32"
            launch_args.append(Scalar(arg_name, "float32", float(value)))
        else:
            raise LaunchError(
                f"argument {arg_name!r} is a {type(value).__name__}; pass arrays, ints or floats"
            )
    signature = {n: signature.get(n, "constexpr") for n in fn.arg_names}  # in parameter order
    source = triton.compiler.ASTSource(fn, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(
        source,
        target=_current_target(compute_capability),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )
    meta = compiled.metadata
    if getattr(meta, "num_ctas", 1) != 1:
        raise LaunchError(f"{fn.__name__!r} compiled with num_ctas={meta.num_ctas}; only 1 is supported")
    cubin = compiled.asm["cubin"]
    kernel_name = meta.name
    grid3 = tuple(grid) + (1,) * (3 - len(grid))
    programs = int(np.prod(grid3))
    hidden = len(Cubin(cubin).kernel(kernel_name).params) - len(launch_args)
    scratch_sizes = [getattr(meta, "global_scratch_size", 0), getattr(meta, "profile_scratch_size", 0)]
    if hidden < 0 or hidden > len(scratch_sizes):
        raise LaunchError(
            f"{fn.__name__!r}: the cubin has {hidden} parameters beyond the arguments; this "
            "Triton version appends something polytile does not know"
        )
    for k in range(hidden):
        launch_args.append(
            Scratch(("global_scratch", "profile_scratch")[k], int(scratch_sizes[k] or 0) * programs)
        )
    launch = CubinLaunch(
        cubin=cubin,
        kernel=kernel_name,
        grid=grid3,
        block=(32 * meta.num_warps, 1, 1),
        args=tuple(launch_args),
        shared_bytes=int(meta.shared),
        name=name or fn.__name__,
        rtol=rtol,
    )
    launch.check()
    return launch
