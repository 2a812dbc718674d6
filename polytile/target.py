"""Targets: what the compiler, the cost models and the tuner know about the machine code is built for.

A target is a set of *features* (``target.has("wgmma")``) and *facts* (``target.sms``,
``target.l2_bytes``, …). Features decide what the compiler may emit — the lowering's pass list is
guarded by them, and a schedule that uses an instruction the target lacks is refused with the
reason; facts size tiles, launch limits and the models. Both are read from the machine where
possible (``cpu_target()``; ``runtime.cuda_device.cuda_target()`` on a GPU) and come from the
architecture's datasheet otherwise (``CUDATarget(arch="sm_80")``: compiling without a GPU).

``kind`` names the backend ("cpu": C++ and OpenMP; "cuda": CUDA C++ and the driver API); it selects
the code generator and keys the per-backend tables (default schedules, tuning templates), and is not
for telling capabilities apart: ask ``has``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property, lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

from .errors import PolytileError

if TYPE_CHECKING:
    from .intrinsics import TensorIntrinsic

FEATURES: Mapping[str, str] = MappingProxyType({
    # backends
    "gpu": "kernels on a grid of thread blocks: blockIdx/threadIdx bindings, shared memory, barriers",
    "openmp": "parallel loops on several CPU threads (#pragma omp parallel for)",
    "simd": "vectorized loops become vector instructions (GCC vector extensions)",
    # CPU instruction sets (from /proc/cpuinfo)
    "avx2": "x86 AVX2: 256-bit integer and floating-point vectors",
    "fma": "fused multiply-add instructions",
    "avx512f": "x86 AVX-512 foundation: 512-bit vectors",
    "neon": "Arm Advanced SIMD: 128-bit vectors",
    # NVIDIA GPUs (from the compute capability)
    "fp16": "half-precision arithmetic (sm_53 and newer)",
    "bf16": "bfloat16 conversions and tensor-core operands (sm_80 and newer)",
    "ldmatrix": "ldmatrix: a warp loads 8x8 matrices of 16-bit values from shared memory (sm_75 and newer)",
    "mma.sync": "mma.sync.m16n8k16: warp-level tensor-core products of fp16/bf16 (sm_80 and newer)",
    "cp.async": "cp.async: asynchronous global-to-shared copies in commit groups (sm_80 and newer)",
    "tma": "cp.async.bulk.tensor: the tensor memory accelerator's bulk copies (sm_90 and newer)",
    "clusters": "thread-block clusters: blocks of a cluster run together and read each other's shared memory "
                "(distributed shared memory, cluster barriers; sm_90 and newer)",
    "wgmma": "wgmma.mma_async: warpgroup tensor-core products from shared memory (sm_90a only)",
    "setmaxnreg": "setmaxnreg: a warpgroup gives registers to (or takes them from) the others (sm_90a only)",
})
"""Every feature a target may have, with what it means. ``has`` refuses names not listed here."""


class Target:
    """What every target offers: its backend (``kind``), features (``has``) and a records ``key``."""

    kind: str
    vector_bits: int

    @property
    def features(self) -> frozenset[str]:
        raise NotImplementedError

    @property
    def key(self) -> str:
        """Identifies the machine for tuning records: same key, same best schedule."""
        raise NotImplementedError

    def has(self, feature: str) -> bool:
        """Whether the target has ``feature`` (one of ``FEATURES``)."""
        if feature not in FEATURES:
            raise PolytileError(f"unknown target feature {feature!r}; the features are {', '.join(FEATURES)}")
        return feature in self.features

    def vector_lanes(self, itemsize: int) -> int:
        """Elements of ``itemsize`` bytes in one vector register (CPU) or one vector access (GPU)."""
        return max(1, self.vector_bits // (8 * itemsize))

    @property
    def tensor_intrinsics(self) -> list[TensorIntrinsic]:
        """The tensor-core instructions ``tensorize`` can use on this target (``polytile.intrinsics``)."""
        from .intrinsics import tensor_intrinsics
        return [t for t in tensor_intrinsics() if all(self.has(f) for f in t.features)]


@dataclass(frozen=True)
class CPUTarget(Target):
    """A CPU: cores, SIMD width and cache sizes (read from the machine by ``cpu_target()``)."""

    kind: str = "cpu"
    cores: int = 1
    vector_bits: int = 256
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    l3_bytes: int = 8 * 1024 * 1024
    flags: tuple[str, ...] = ()  # /proc/cpuinfo's
    model: str = "unknown"

    # where a computation's buffer may live (schedule locations) and the buffer scope each becomes
    locations: ClassVar[Mapping[str, str]] = MappingProxyType({"auto": "auto", "heap": "heap", "stack": "stack"})

    @cached_property  # a frozen target's fields never change; ``has`` reads this many times per check
    def features(self) -> frozenset[str]:
        isa = {"avx2": "avx2", "fma": "fma", "avx512f": "avx512f", "asimd": "neon", "neon": "neon"}
        return frozenset({"openmp", "simd", *(isa[f] for f in self.flags if f in isa)})

    @property
    def key(self) -> str:
        return f"cpu:{self.model}:{self.cores}c:{self.vector_bits}b"


_SHEETS: dict[str, dict[str, object]] = {
    "sm_75": dict(name="T4 (assumed)", sms=40, shared_per_block=64 * 1024, shared_per_sm=64 * 1024,
                  max_threads_per_sm=1024, max_blocks_per_sm=16, l2_bytes=4 * 1024 * 1024, dram_bandwidth=0.32e12,
                  clock_hz=1.59e9),
    "sm_80": dict(name="A100 (assumed)", sms=108, shared_per_block=163 * 1024, shared_per_sm=164 * 1024,
                  max_threads_per_sm=2048, max_blocks_per_sm=32, l2_bytes=40 * 1024 * 1024, dram_bandwidth=1.9e12,
                  clock_hz=1.41e9),
    "sm_86": dict(name="RTX (assumed)", sms=84, shared_per_block=99 * 1024, shared_per_sm=100 * 1024,
                  max_threads_per_sm=1536, max_blocks_per_sm=16, l2_bytes=6 * 1024 * 1024, dram_bandwidth=0.9e12,
                  clock_hz=1.7e9),
    "sm_89": dict(name="L4 (assumed)", sms=58, shared_per_block=99 * 1024, shared_per_sm=100 * 1024,
                  max_threads_per_sm=1536, max_blocks_per_sm=24, l2_bytes=48 * 1024 * 1024, dram_bandwidth=0.3e12,
                  clock_hz=2.04e9),
    "sm_90": dict(name="H100 (assumed)", sms=132, shared_per_block=227 * 1024, shared_per_sm=228 * 1024,
                  max_threads_per_sm=2048, max_blocks_per_sm=32, l2_bytes=50 * 1024 * 1024, dram_bandwidth=3.35e12,
                  clock_hz=1.98e9),
}
_SHEETS["sm_90a"] = _SHEETS["sm_90"]
DATASHEETS: Mapping[str, Mapping[str, object]] = MappingProxyType({a: MappingProxyType(f) for a, f in _SHEETS.items()})
"""Datasheet facts of GPU architectures, for targets named without a GPU present (compiling in CI,
cross-compiling); a GPU present is read from the driver instead (``runtime.cuda_device.cuda_target``)."""

# the first compute capability with each feature
_SINCE = {"fp16": 53, "ldmatrix": 75, "bf16": 80, "mma.sync": 80, "cp.async": 80, "tma": 90, "clusters": 90}
# features of one architecture only (the "a" targets: code built for them runs on that one)
_ARCH_SPECIFIC = {"sm_90a": ("wgmma", "setmaxnreg")}

_GPU_LOCATIONS = MappingProxyType({"auto": "auto", "global": "global", "shared": "shared", "local": "local",
                                   "heap": "global", "fragment": "fragment"})


@dataclass(frozen=True)
class CUDATarget(Target):
    """An NVIDIA GPU: the architecture (``arch``, whose compute capability gives the features) and
    the limits the compiler and cost models need. Facts left out come from the architecture's
    datasheet (``DATASHEETS``): ``CUDATarget(arch="sm_80")`` is an A100, ``CUDATarget()`` an H100."""

    kind: str = "cuda"
    name: str = "unknown"
    arch: str = "sm_90a"
    sms: int = None  # type: ignore[assignment]  # None: the datasheet's (see __post_init__)
    shared_per_block: int = None  # type: ignore[assignment]  # opt-in maximum of dynamic shared memory
    shared_per_sm: int = None  # type: ignore[assignment]
    registers_per_sm: int = 65536
    registers_per_block: int = 65536
    registers_per_thread: int = 255
    max_threads_per_block: int = 1024
    max_threads_per_sm: int = None  # type: ignore[assignment]
    max_blocks_per_sm: int = None  # type: ignore[assignment]
    warp_size: int = 32
    max_cluster_blocks: int = 8  # the portable cluster size (16 needs the non-portable attribute); with "clusters"
    vector_bits: int = 128  # the widest load or store of one thread (16 bytes)
    l2_bytes: int = None  # type: ignore[assignment]
    dram_bandwidth: float = None  # type: ignore[assignment]  # bytes per second
    clock_hz: float = None  # type: ignore[assignment]
    extra: dict[str, float] = field(default_factory=dict)  # further facts for the cost models

    # where a computation's buffer may live (schedule locations) and the buffer scope each becomes
    locations: ClassVar[Mapping[str, str]] = _GPU_LOCATIONS

    def __post_init__(self) -> None:
        if not re.fullmatch(r"sm_\d+a?", self.arch):
            raise PolytileError(f"CUDA architecture {self.arch!r} is not of the form sm_80 or sm_90a")
        missing = [f.name for f in fields(self) if getattr(self, f.name) is None]
        if not missing:
            return
        sheet = DATASHEETS.get(self.arch)
        if sheet is None:
            raise PolytileError(f"{self.arch} has no datasheet here: pass {', '.join(missing)} to CUDATarget "
                                f"(known architectures: {', '.join(DATASHEETS)})")
        for name in missing:
            object.__setattr__(self, name, sheet[name])

    @cached_property
    def capability(self) -> int:
        """The compute capability as a number: 80 for sm_80, 90 for sm_90a."""
        return int(re.sub(r"\D", "", self.arch))

    @cached_property
    def features(self) -> frozenset[str]:
        common = {f for f, since in _SINCE.items() if self.capability >= since}
        return frozenset({"gpu", *common, *_ARCH_SPECIFIC.get(self.arch, ())})

    @property
    def key(self) -> str:
        return f"cuda:{self.name}:{self.arch}"


def _cache_size(text: str) -> int:
    m = re.match(r"(\d+)\s*([KMG]?)", text.strip())
    if not m:
        return 0
    scale = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}[m.group(2)]
    return int(m.group(1)) * scale


@lru_cache(maxsize=1)
def cpu_target() -> CPUTarget:
    """The CPU this process runs on."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    flags: tuple[str, ...] = ()
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        m = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", info, re.M)
        flags = tuple(m.group(1).split()) if m else ()
        m = re.search(r"^model name\s*:\s*(.*)$", info, re.M)
        model = re.sub(r"\s+", "_", m.group(1).strip()) if m else "unknown"
    except OSError:
        pass
    bits = 512 if "avx512f" in flags else 256 if "avx2" in flags else 128
    sizes = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    for k in range(8):
        try:
            with open(f"{base}/index{k}/level") as f:
                level = int(f.read())
            with open(f"{base}/index{k}/type") as f:
                kind = f.read().strip()
            with open(f"{base}/index{k}/size") as f:
                size = _cache_size(f.read())
        except OSError:
            break
        if kind in ("Data", "Unified"):
            sizes[level] = size
    return CPUTarget(cores=cores, vector_bits=bits, l1_bytes=sizes.get(1, 32 * 1024),
                     l2_bytes=sizes.get(2, 1024 * 1024), l3_bytes=sizes.get(3, 8 * 1024 * 1024), flags=flags,
                     model=model)


def as_target(target: object) -> CPUTarget | CUDATarget:
    """``"cpu"``, ``"cuda"``, ``"cuda:sm_80"`` or a target object."""
    if isinstance(target, Target):
        return target  # type: ignore[return-value]
    if target in (None, "cpu", "c", "llvm"):
        return cpu_target()
    if isinstance(target, str) and target.startswith("cuda"):
        from .runtime.cuda_device import cuda_target
        arch = target.split(":", 1)[1] if ":" in target else None
        return cuda_target(arch)
    raise PolytileError(f"unknown target {target!r}; use 'cpu', 'cuda' or 'cuda:sm_80'")
