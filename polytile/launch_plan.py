"""What a call of a built GPU function launches, read off the function without a GPU.

``launch_plan(kernel, arrays)`` binds the size parameters from the arrays' shapes as a call does,
checks the arrays as a call does (``InputError``), and describes each kernel launch in order: its
grid, block and dynamic shared memory, its pointer arguments in parameter order (inputs, outputs and
device temporaries, with their shapes and what they must hold before the launch), the integer size
parameters after them, and the device buffers it reads and writes. Tools that run one kernel of a
function on their own (the SASS optimizer) build their launches from this; ``with_cubin`` gives the
function back with another cubin for the same kernels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import InputError
from .target import Target


@dataclass(frozen=True)
class LaunchBuffer:
    """A pointer argument of a kernel.

    ``role``: "input", "output" or "temporary" (device memory the function allocates for a call).
    ``init``, what it must hold before the launch: "random" (any values: floating-point inputs),
    "given" (the caller's values matter: integer inputs, index arrays with a value range or order),
    "zeros" (an output computed only where a condition holds: a call allocates it zeroed) or "none"
    (written before it is read)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str
    init: str


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch of a call: the kernel's name in the cubin, its launch shape, its pointer
    arguments then its size parameters (name, "int32" or "int64", value), and the device buffers it
    reads and writes (inputs, outputs, temporaries, by name)."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    buffers: tuple[LaunchBuffer, ...]
    scalars: tuple[tuple[str, str, int], ...]
    reads: frozenset[str]
    writes: frozenset[str]


def is_gpu_function(obj: object) -> bool:
    """Whether ``obj`` is a function built for a GPU (``pt.build(..., "cuda")``)."""
    target = getattr(obj, "target", None)
    return isinstance(target, Target) and target.has("gpu") and hasattr(obj, "cubin")


def launch_plan(kernel: object, arrays: Sequence[np.ndarray], params: Mapping[str, int] | None = None
                ) -> list[KernelLaunch]:
    """The launches a call of GPU function ``kernel`` makes on ``arrays`` (its inputs, optionally
    followed by its outputs: NumPy arrays, of which only the shapes count); ``params`` binds size
    parameters that no array's shape determines."""
    from .codegen.cuda import kernels_of
    from .lowering.passes.pair_stores import memory_accesses
    from .runtime.args import bind_params, check_index_arrays, check_shapes, expected_shape, needs_zero_init
    from .runtime.cuda import eval_expr

    if not is_gpu_function(kernel):
        raise TypeError(f"launch_plan takes a function built for a GPU (pt.build(..., 'cuda')), not a "
                        f"{type(kernel).__name__}")
    func = kernel.func  # type: ignore[attr-defined]
    n_in, n_out = len(func.inputs), len(func.outputs)
    if len(arrays) not in (n_in, n_in + n_out):
        raise InputError(f"{func.name} takes {n_in} input array(s), optionally followed by {n_out} output array(s); "
                         f"got {len(arrays)}")
    bound = bind_params(func, arrays, dict(params or {}))
    check_shapes(func, arrays, bound)
    check_index_arrays(func, list(arrays[:n_in]), bound)

    buffers: dict[str, LaunchBuffer] = {}
    for t, a in zip(func.inputs, arrays):
        random = t.dtype.is_float and t.value_range is None and not t.monotonic
        buffers[t.name] = LaunchBuffer(t.name, t.dtype.name, tuple(a.shape), "input", "random" if random else "given")
    for t in func.outputs:
        buffers[t.name] = LaunchBuffer(t.name, t.dtype.name, expected_shape(t, bound), "output",
                                       "zeros" if needs_zero_init(t) else "none")
    for b in kernel.temporaries:  # type: ignore[attr-defined]
        shape = tuple(max(0, eval_expr(d, bound)) for d in b.shape)
        buffers[b.name] = LaunchBuffer(b.name, b.dtype.name, shape, "temporary", "none")

    bodies = {k.name: k.body for k in kernels_of(kernel.lowered.body)}  # type: ignore[attr-defined]
    index = "int32" if kernel.index32 else "int64"  # type: ignore[attr-defined]
    plan = []
    for k in kernel.kernels:  # type: ignore[attr-defined]
        written, read = memory_accesses(bodies[k.name])
        grid = tuple(max(0, eval_expr(g, bound)) for g in k.grid)
        plan.append(KernelLaunch(k.name, grid, tuple(k.block), k.dynamic_shared,  # type: ignore[arg-type]
                                 tuple(buffers[b.name] for b in k.args),
                                 tuple((p.name, index, bound[p.name]) for p in k.params),
                                 frozenset(read), frozenset(written)))
    return plan


def with_cubin(kernel: object, cubin: bytes) -> object:
    """GPU function ``kernel`` running ``cubin`` instead of its own: the same kernels (names, launch
    shapes, arguments) in machine code changed by another tool, e.g. reordered by the SASS optimizer."""
    if not is_gpu_function(kernel):
        raise TypeError(f"with_cubin takes a function built for a GPU, not a {type(kernel).__name__}")
    return dataclasses.replace(kernel, cubin=cubin, _functions={})  # type: ignore[type-var]
