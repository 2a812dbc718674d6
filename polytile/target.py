"""Targets: the hardware facts that code generation, the cost models and the tuner read."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache

from .errors import PolytileError


@dataclass(frozen=True)
class CPUTarget:
    """A CPU: cores, SIMD width and cache sizes (read from the machine by ``cpu_target()``)."""

    kind: str = "cpu"
    cores: int = 1
    vector_bits: int = 256
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    l3_bytes: int = 8 * 1024 * 1024
    flags: tuple[str, ...] = ()
    model: str = "unknown"

    def vector_lanes(self, itemsize: int) -> int:
        return max(1, self.vector_bits // (8 * itemsize))

    @property
    def key(self) -> str:
        """Identifies the machine for tuning records: same key, same best schedule."""
        return f"cpu:{self.model}:{self.cores}c:{self.vector_bits}b"


@dataclass(frozen=True)
class CUDATarget:
    """An NVIDIA GPU: compute capability and the limits the compiler and cost models need."""

    kind: str = "cuda"
    name: str = "unknown"
    arch: str = "sm_90a"
    sms: int = 132
    shared_per_block: int = 227 * 1024
    shared_per_sm: int = 228 * 1024
    registers_per_sm: int = 65536
    max_threads_per_block: int = 1024
    max_threads_per_sm: int = 2048
    l2_bytes: int = 50 * 1024 * 1024
    dram_bandwidth: float = 3.35e12
    clock_hz: float = 1.98e9
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def capability(self) -> int:
        return int(re.sub(r"\D", "", self.arch))

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
        m = re.search(r"^flags\s*:\s*(.*)$", info, re.M)
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
    if isinstance(target, (CPUTarget, CUDATarget)):
        return target
    if target in (None, "cpu", "c", "llvm"):
        return cpu_target()
    if isinstance(target, str) and target.startswith("cuda"):
        from .runtime.cuda_device import cuda_target
        arch = target.split(":", 1)[1] if ":" in target else None
        return cuda_target(arch)
    raise PolytileError(f"unknown target {target!r}; use 'cpu', 'cuda' or 'cuda:sm_80'")
