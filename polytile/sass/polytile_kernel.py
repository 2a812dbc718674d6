"""A polytile GPU function (`pt.build(..., "cuda")`) as a CubinLaunch, so the SASS optimizer can take it.

polytile already compiles to a cubin and launches from it through the driver, so the launch is read
off the built function without a GPU, through the compiler's public `pt.launch_plan`: shape
parameters are bound from the example inputs' shapes (as a call binds them), the arguments are the
kernel's pointers in its parameter order, then one index-typed integer per size parameter; the grid,
block and dynamic shared memory are those a call launches. The optimizer's
worker runs one kernel alone, so a kernel that reads what an earlier kernel of the same function
wrote cannot be taken: its inputs would not exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from polytile import KernelLaunch, LaunchBuffer, launch_plan
from polytile.errors import InputError
from polytile.sass.launch import Buffer, CubinLaunch, LaunchError, Scalar, Scratch, storage_dtype
from polytile.sass.triton_kernel import as_host_array

# Float atomics add in a different order on every run; two runs of the same cubin then differ in
# the last bits, so such kernels are compared with a relative tolerance instead of bit for bit.
ATOMIC_RTOL = 1e-5


def polytile_launch(
    kernel,
    example_inputs: Sequence,
    *,
    kernel_name: str | None = None,
    name: str | None = None,
    params: Mapping[str, int] | None = None,
) -> CubinLaunch:
    """The launch of one kernel of the built GPU function `kernel` on inputs shaped like `example_inputs`.

    `example_inputs` are the function's input arrays (numpy arrays or torch tensors), optionally
    followed by its outputs, as for a call; only their shapes and types are used, except for inputs
    whose values matter (integer inputs, index arrays with `value_range` or `monotonic`), which the
    optimizer then passes as given so indices stay valid. `params` binds size parameters that no
    array shape determines. `kernel_name` picks the kernel of a function that launches several.
    """
    func = kernel.func
    arrays = _host_arrays(kernel, example_inputs)
    try:
        plan = launch_plan(kernel, arrays, params)
    except InputError as exc:
        raise LaunchError(f"{func.name}: {exc}") from exc
    source = _pick_kernel(kernel, plan, kernel_name)
    if any(k.name == source.kernel and k.tensor_maps for k in kernel.kernels):
        raise LaunchError(f"{func.name}: kernel {source.kernel} reads its operands through TMA tensor maps, which the "
                          "SASS optimizer's launches do not pass; optimize a build with pipeline(..., "
                          "producer='threads')")
    later_reads = _check_data_flow(kernel, plan, source)
    given = {t.name: a for t, a in zip(func.inputs, arrays, strict=False)}
    args: list[Buffer | Scalar | Scratch] = [_argument(b, given, later_reads) for b in source.buffers]
    args += [Scalar(*scalar) for scalar in source.scalars]
    if 0 in source.grid:
        raise LaunchError(
            f"{func.name}: kernel {source.kernel} has the empty grid {source.grid} for these inputs, so a call "
            "skips it; give example inputs for which it runs"
        )
    launch = CubinLaunch(
        cubin=kernel.cubin,
        kernel=source.kernel,
        grid=source.grid,
        block=source.block,
        args=tuple(args),
        shared_bytes=source.shared_bytes,
        name=name or source.kernel,
        rtol=ATOMIC_RTOL if "atomic" in kernel.source else 0.0,
    )
    launch.check()
    return launch


def _argument(b: LaunchBuffer, given: Mapping[str, np.ndarray], later_reads: set[str]) -> Buffer | Scratch:
    """The optimizer's argument for pointer ``b``: fresh random inputs, the caller's values where they
    matter, zeros where a call zeroes an output, what later kernels read compared as an output."""
    if b.role == "input":
        if b.init == "random":
            return Buffer(b.name, b.dtype, b.shape)
        return Buffer(b.name, b.dtype, b.shape, init="data", data=given[b.name])  # indices, offsets
    if b.role == "output" and b.init == "zeros":  # computed only where a condition holds: zeros elsewhere
        zeros = np.zeros(b.shape, storage_dtype(b.dtype))
        return Buffer(b.name, b.dtype, b.shape, role="inout", init="data", data=zeros)
    if b.role == "output" or b.name in later_reads:  # what the later kernels read: compared as an output
        return Buffer(b.name, b.dtype, b.shape, role="out")
    nbytes = int(np.prod(b.shape, dtype=np.int64)) * np.dtype(storage_dtype(b.dtype)).itemsize
    return Scratch(b.name, nbytes)


def _pick_kernel(kernel, plan: list[KernelLaunch], kernel_name: str | None) -> KernelLaunch:
    names = [k.kernel for k in plan]
    if kernel_name is None:
        if len(names) == 1:
            return plan[0]
        raise LaunchError(
            f"{kernel.func.name} launches {len(names)} kernels ({', '.join(names)}); the optimizer "
            "patches one: pass kernel_name=..."
        )
    if kernel_name not in names:
        raise LaunchError(
            f"{kernel.func.name} has no kernel {kernel_name!r}; its kernels are {', '.join(names)}"
        )
    return plan[names.index(kernel_name)]


def _host_arrays(kernel, example_inputs: Sequence) -> list[np.ndarray]:
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


def _check_data_flow(kernel, plan: list[KernelLaunch], source: KernelLaunch) -> set[str]:
    """Refuse `source` when it reads a buffer an earlier kernel writes; else the buffers later kernels read."""
    order = [k.kernel for k in plan]

    def written_before(launch: KernelLaunch) -> list[tuple[str, str]]:
        """(buffer, earlier kernel writing it) for what `launch` reads."""
        earlier = plan[: order.index(launch.kernel)]
        return [(b, w.kernel) for w in earlier for b in sorted(w.writes & launch.reads)]

    produced = written_before(source)
    if produced:
        takeable = [k.kernel for k in plan if not written_before(k)]
        raise LaunchError(
            f"{kernel.func.name}: kernel {source.kernel} reads "
            + ", ".join(f"{b} (written by {w})" for b, w in produced)
            + "; the optimizer runs one kernel alone, so it takes only a kernel that reads nothing an "
            f"earlier kernel writes: {', '.join(takeable)}"
        )
    return set().union(*(k.reads for k in plan[order.index(source.kernel) + 1 :]))
