"""How to launch a kernel straight from its cubin: `CubinLaunch`, the contract with kernel producers.

polytile's CUDA backend, the Triton adapter and hand-written nvcc kernels all describe their
kernels this way; the optimizer loads the (patched) cubin through the CUDA driver and never needs
the producer again. Arguments are listed in the kernel's parameter order: device buffers (passed
as 8-byte pointers), scalars (passed by value), and scratch allocations (zeroed, never compared).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from polytile.sass.cubin import Cubin

ROLES = ("in", "out", "inout")
_SCALAR_TYPES = {
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float32",
    "float64",
    "int16",
    "uint16",
    "int8",
    "uint8",
}


class LaunchError(ValueError):
    """A launch description that does not fit its kernel."""


def storage_dtype(dtype: str) -> np.dtype:
    """The numpy dtype holding elements of `dtype` (bfloat16 is stored as its uint16 bits)."""
    if dtype == "bfloat16":
        return np.dtype(np.uint16)
    try:
        return np.dtype(dtype)
    except TypeError as exc:
        raise LaunchError(f"unknown element type {dtype!r}; use a numpy dtype name or 'bfloat16'") from exc


@dataclass(frozen=True)
class Buffer:
    """A device buffer argument.

    `init` says how verification and timing fill it: "normal" (standard normal; integers: uniform
    in [-64, 64)), "uniform" ([-1, 1); integers: [0, 64)), "randint:LO:HI", or "data" (always the
    array in `data`, e.g. indices that must stay valid). Outputs ("out") are poisoned with 0xFF bytes
    before every run and compared afterwards; "inout" buffers are filled and compared.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str = "in"
    init: str = "normal"
    data: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * storage_dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Scalar:
    """A by-value argument."""

    name: str
    dtype: str
    value: int | float

    @property
    def nbytes(self) -> int:
        return np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Scratch:
    """A zero-filled device allocation the kernel needs (a null pointer when `nbytes` is 0)."""

    name: str
    nbytes: int


@dataclass(frozen=True)
class CubinLaunch:
    """A kernel in a cubin and everything needed to run, time and verify it."""

    cubin: bytes = field(repr=False)
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[Buffer | Scalar | Scratch, ...]
    shared_bytes: int = 0
    name: str = ""
    rtol: float = 0.0  # 0: outputs must match the original bit for bit

    @property
    def label(self) -> str:
        return self.name or self.kernel

    def buffers(self) -> list[Buffer]:
        return [a for a in self.args if isinstance(a, Buffer)]

    def outputs(self) -> list[Buffer]:
        return [a for a in self.args if isinstance(a, Buffer) and a.role in ("out", "inout")]

    def with_cubin(self, cubin: bytes) -> CubinLaunch:
        return replace(self, cubin=bytes(cubin))

    def check(self) -> None:
        """Raise LaunchError unless the arguments match the kernel's parameters in the cubin."""
        kernel = Cubin(self.cubin, source=f"cubin of {self.label}").kernel(self.kernel)
        if len(self.grid) != 3 or len(self.block) != 3 or min(self.grid + self.block) < 1:
            raise LaunchError(
                f"{self.label}: grid {self.grid} and block {self.block} need three positive sizes"
            )
        if not self.outputs():
            raise LaunchError(
                f"{self.label}: no argument has role 'out' or 'inout'; nothing could be verified"
            )
        for arg in self.args:
            if isinstance(arg, Buffer):
                if arg.role not in ROLES:
                    raise LaunchError(f"{self.label}: buffer {arg.name!r} has role {arg.role!r}; use {ROLES}")
                storage_dtype(arg.dtype)
                if arg.init == "data" and (arg.data is None or arg.data.nbytes != arg.nbytes):
                    raise LaunchError(
                        f"{self.label}: buffer {arg.name!r} has init='data' but no matching data"
                    )
            if isinstance(arg, Scalar) and arg.dtype not in _SCALAR_TYPES:
                raise LaunchError(
                    f"{self.label}: scalar {arg.name!r} has type {arg.dtype!r}; use one of "
                    f"{sorted(_SCALAR_TYPES)}"
                )
        if not kernel.params:
            return
        sizes = [8 if isinstance(a, Buffer | Scratch) else a.nbytes for a in self.args]
        expected = [p.size for p in kernel.params]
        if sizes != expected:
            names = [a.name for a in self.args]
            raise LaunchError(
                f"{self.label}: kernel {self.kernel!r} takes {len(expected)} parameters of sizes "
                f"{expected} bytes, the launch gives {len(sizes)} ({', '.join(names)}) of sizes {sizes}; "
                "list the arguments in the kernel's order (pointers are 8 bytes)"
            )


def launch_from_spec(cubin: bytes, spec: dict) -> CubinLaunch:
    """A CubinLaunch from a JSON-style description (the `polytile sass-opt --launch` file).

    {"kernel": "matmul", "grid": [16, 16, 1], "block": [256, 1, 1], "shared_bytes": 0, "rtol": 0,
     "args": [{"buffer": "a", "dtype": "float32", "shape": [1024, 1024], "role": "in", "init": "normal"},
              {"scalar": "n", "dtype": "int32", "value": 1024}, {"scratch": "tmp", "nbytes": 0}]}
    """
    args: list[Buffer | Scalar | Scratch] = []
    for i, item in enumerate(spec.get("args", [])):
        if "buffer" in item:
            args.append(
                Buffer(
                    item["buffer"],
                    item["dtype"],
                    tuple(item["shape"]),
                    item.get("role", "in"),
                    item.get("init", "normal"),
                )
            )
        elif "scalar" in item:
            args.append(Scalar(item["scalar"], item["dtype"], item["value"]))
        elif "scratch" in item:
            args.append(Scratch(item["scratch"], int(item.get("nbytes", 0))))
        else:
            raise LaunchError(f"launch argument {i} names no 'buffer', 'scalar' or 'scratch': {item}")
    try:
        launch = CubinLaunch(
            cubin=cubin,
            kernel=spec["kernel"],
            grid=tuple(spec["grid"]),
            block=tuple(spec["block"]),
            args=tuple(args),
            shared_bytes=int(spec.get("shared_bytes", 0)),
            name=spec.get("name", ""),
            rtol=float(spec.get("rtol", 0.0)),
        )
    except KeyError as exc:
        raise LaunchError(f"the launch description needs {exc.args[0]!r}") from exc
    launch.check()
    return launch
