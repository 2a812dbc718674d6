"""A polytile CUDA kernel (`CUDAKernel`) as a CubinLaunch, so the SASS optimizer can take it.

polytile already compiles to a cubin and launches from it through the driver, so the launch is read
off the built function without a GPU: shape parameters are bound from the example inputs' shapes
(as a call binds them), and the arguments follow a call's launches (`CUDAKernel._launch`) --
pointers for the kernel's buffers in its parameter order, then one index-typed integer per size
parameter; the grid comes from its host expressions, block and dynamic shared memory are as built.
The optimizer's worker runs one kernel alone, so a kernel that reads what an earlier kernel of the
same function wrote cannot be taken: its inputs would not exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from polytile.codegen.cuda import KernelSource, kernels_of
from polytile.errors import InputError
from polytile.lowering import loopir as ir
from polytile.lowering.passes.pair_stores import memory_accesses
from polytile.runtime.args import bind_params, check_index_arrays, check_shapes, expected_shape, needs_zero_init
from polytile.runtime.cuda import CUDAKernel, eval_expr
from polytile.sass.launch import Buffer, CubinLaunch, LaunchError, Scalar, Scratch, storage_dtype
from polytile.sass.triton_kernel import as_host_array

# Float atomics add in a different order on every run; two runs of the same cubin then differ in
# the last bits, so such kernels are compared with a relative tolerance instead of bit for bit.
ATOMIC_RTOL = 1e-5


def polytile_launch(
    kernel: CUDAKernel,
    example_inputs: Sequence,
    *,
    kernel_name: str | None = None,
    name: str | None = None,
    params: Mapping[str, int] | None = None,
) -> CubinLaunch:
    """The launch of one kernel of the built CUDA function `kernel` on inputs shaped like `example_inputs`.

    `example_inputs` are the function's input arrays (numpy arrays or torch tensors), optionally
    followed by its outputs, as for a call; only their shapes and types are used, except for inputs
    whose values matter (integer inputs, index arrays with `value_range` or `monotonic`), which the
    optimizer then passes as given so indices stay valid. `params` binds size parameters that no
    array shape determines. `kernel_name` picks the kernel of a function that launches several.
    """
    func = kernel.func
    source = _pick_kernel(kernel, kernel_name)
    arrays = _host_arrays(kernel, example_inputs)
    try:
        bound = bind_params(func, arrays, dict(params or {}))
        check_shapes(func, arrays, bound)
        check_index_arrays(func, arrays[: len(func.inputs)], bound)
    except InputError as exc:
        raise LaunchError(f"{func.name}: {exc}") from exc
    later_reads = _check_data_flow(kernel, source)
    inputs = {t.name: (t, a) for t, a in zip(func.inputs, arrays, strict=False)}
    outputs = {t.name: t for t in func.outputs}
    temporaries = {b.name: b for b in kernel.temporaries}
    args: list[Buffer | Scalar | Scratch] = []
    for b in source.args:
        dtype = b.dtype.name
        if b.name in inputs:
            tensor, array = inputs[b.name]
            if tensor.dtype.is_float and tensor.value_range is None and not tensor.monotonic:
                args.append(Buffer(b.name, dtype, array.shape))
            else:  # the values matter (indices, offsets): pass the example as it is
                args.append(Buffer(b.name, dtype, array.shape, init="data", data=array))
        elif b.name in outputs:
            shape = expected_shape(outputs[b.name], bound)
            if needs_zero_init(outputs[b.name]):  # computed only where a condition holds: zeros elsewhere
                zeros = np.zeros(shape, storage_dtype(dtype))
                args.append(Buffer(b.name, dtype, shape, role="inout", init="data", data=zeros))
            else:
                args.append(Buffer(b.name, dtype, shape, role="out"))
        elif b.name in temporaries:
            shape = tuple(max(0, eval_expr(d, bound)) for d in temporaries[b.name].shape)
            if b.name in later_reads:  # what the later kernels read: compare it as an output
                args.append(Buffer(b.name, dtype, shape, role="out"))
            else:
                args.append(Scratch(b.name, int(np.prod(shape, dtype=np.int64)) * b.dtype.itemsize))
        else:
            raise LaunchError(
                f"{func.name}: kernel {source.name} takes buffer {b.name!r}, which is neither an input, "
                "an output nor a temporary of the function; rebuild it with pt.build"
            )
    index_type = "int32" if kernel.index32 else "int64"
    args += [Scalar(p.name, index_type, bound[p.name]) for p in source.params]
    grid = tuple(max(0, eval_expr(g, bound)) for g in source.grid)
    if 0 in grid:
        raise LaunchError(
            f"{func.name}: kernel {source.name} has the empty grid {grid} for these inputs, so a call "
            "skips it; give example inputs for which it runs"
        )
    launch = CubinLaunch(
        cubin=kernel.cubin,
        kernel=source.name,
        grid=grid,
        block=tuple(source.block),
        args=tuple(args),
        shared_bytes=source.dynamic_shared,
        name=name or source.name,
        rtol=ATOMIC_RTOL if "atomic" in kernel.source else 0.0,
    )
    launch.check()
    return launch


def _pick_kernel(kernel: CUDAKernel, kernel_name: str | None) -> KernelSource:
    names = [k.name for k in kernel.kernels]
    if kernel_name is None:
        if len(names) == 1:
            return kernel.kernels[0]
        raise LaunchError(
            f"{kernel.func.name} launches {len(names)} kernels ({', '.join(names)}); the optimizer "
            "patches one: pass kernel_name=..."
        )
    if kernel_name not in names:
        raise LaunchError(
            f"{kernel.func.name} has no kernel {kernel_name!r}; its kernels are {', '.join(names)}"
        )
    return kernel.kernels[names.index(kernel_name)]


def _host_arrays(kernel: CUDAKernel, example_inputs: Sequence) -> list[np.ndarray]:
    """The example arrays on the host, checked against the function's inputs (then outputs)."""
    func = kernel.func
    n_in, n_out = len(func.inputs), len(func.outputs)
    names = ", ".join(t.name for t in func.inputs)
    if as_host_array(example_inputs) is not None or not isinstance(example_inputs, Sequence):
        raise LaunchError(f"{func.name}: pass example_inputs as a list of arrays ({names}), e.g. [x]")
    if len(example_inputs) not in (n_in, n_in + n_out):
        raise LaunchError(
            f"{func.name} takes {n_in} input array(s) ({names}), optionally followed by {n_out} "
            f"output array(s); got {len(example_inputs)} example inputs"
        )
    arrays = []
    for tensor, value in zip([*func.inputs, *func.outputs], example_inputs, strict=False):
        host = as_host_array(value)
        if host is None:
            raise LaunchError(
                f"{func.name}: example input {tensor.name} is a {type(value).__name__}; pass numpy "
                "arrays or torch tensors"
            )
        array, dtype = host
        if dtype != tensor.dtype.name:
            raise LaunchError(f"{func.name}: example input {tensor.name} must have dtype {tensor.dtype}, got {dtype}")
        arrays.append(np.ascontiguousarray(array))
    return arrays


def _accesses(body: ir.Stmt) -> tuple[set[str], set[str]]:
    """Names of the device-memory buffers (arguments, global temporaries) `body` writes and reads."""
    written, read = memory_accesses(body)  # shared and register buffers are private to each kernel
    return set(written), set(read)


def _check_data_flow(kernel: CUDAKernel, source: KernelSource) -> set[str]:
    """Refuse `source` when it reads a buffer an earlier kernel writes; else the buffers later kernels read."""
    access = {k.name: _accesses(k.body) for k in kernels_of(kernel.lowered.body)}
    order = [k.name for k in kernel.kernels]

    def written_before(name: str) -> list[tuple[str, str]]:
        """(buffer, earlier kernel writing it) for what kernel `name` reads."""
        reads = access[name][1]
        return [(b, w) for w in order[: order.index(name)] for b in sorted(access[w][0] & reads)]

    produced = written_before(source.name)
    if produced:
        takeable = [n for n in order if not written_before(n)]
        raise LaunchError(
            f"{kernel.func.name}: kernel {source.name} reads "
            + ", ".join(f"{b} (written by {w})" for b, w in produced)
            + "; the optimizer runs one kernel alone, so it takes only a kernel that reads nothing an "
            f"earlier kernel writes: {', '.join(takeable)}"
        )
    return set().union(*(access[n][1] for n in order[order.index(source.name) + 1 :]))
