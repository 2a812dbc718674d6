"""The GPU this process uses: whether one is present, its hardware facts as a ``CUDATarget``, and the
shared driver context."""

from __future__ import annotations

import os
from functools import cache, lru_cache

from ..errors import DeviceError
from ..target import CUDATarget

# Datasheet facts for targets named without a GPU present (compiling in CI, cross-compiling).
KNOWN_ARCHS = {
    "sm_80": dict(name="A100 (assumed)", sms=108, shared_per_block=163 * 1024, shared_per_sm=164 * 1024,
                  l2_bytes=40 * 1024 * 1024, dram_bandwidth=1.9e12, clock_hz=1.41e9),
    "sm_90": dict(name="H100 (assumed)", sms=132, shared_per_block=227 * 1024, shared_per_sm=228 * 1024,
                  l2_bytes=50 * 1024 * 1024, dram_bandwidth=3.35e12, clock_hz=1.98e9),
}
KNOWN_ARCHS["sm_90a"] = KNOWN_ARCHS["sm_90"]
KNOWN_ARCHS["sm_86"] = dict(name="RTX (assumed)", sms=84, shared_per_block=99 * 1024, shared_per_sm=100 * 1024,
                            l2_bytes=6 * 1024 * 1024, dram_bandwidth=0.9e12, clock_hz=1.7e9)


@lru_cache(maxsize=1)
def device():  # noqa: ANN201 - a cuda_driver.Device
    """The primary context of GPU 0 (raises DeviceError when there is no usable GPU)."""
    from .cuda_driver import Device
    if os.environ.get("POLYTILE_NO_GPU"):
        raise DeviceError("GPU use is disabled by POLYTILE_NO_GPU")
    return Device(0)


def gpu_available() -> bool:
    try:
        device()
        return True
    except Exception:  # no driver, no device, no bindings: all mean "no GPU here"
        return False


@cache
def cuda_target(arch: str | None = None) -> CUDATarget:
    """The present GPU's facts (compute capability from the device unless ``arch`` overrides it), or
    the datasheet facts of ``arch`` when no GPU is present."""
    if gpu_available():
        dev = device()
        cu = dev.cu
        attr = cu.CUdevice_attribute
        get = dev._attribute
        major, minor = dev.info.compute_capability
        native = f"sm_{major}{minor}{'a' if (major, minor) == (9, 0) else ''}"
        mem_clock = get(attr.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE) * 1e3
        bus = get(attr.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
        return CUDATarget(
            name=dev.info.name.replace(" ", "_"), arch=arch or native,
            sms=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            shared_per_block=get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            shared_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
            registers_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR),
            max_threads_per_block=get(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
            max_threads_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR),
            l2_bytes=dev.info.l2_bytes,
            dram_bandwidth=2 * mem_clock * bus / 8 if mem_clock and bus else 3.35e12,
            clock_hz=get(attr.CU_DEVICE_ATTRIBUTE_CLOCK_RATE) * 1e3)
    arch = arch or "sm_90a"
    if arch not in KNOWN_ARCHS:
        raise DeviceError(f"no GPU is present and {arch!r} is not a known architecture; "
                          f"use one of {', '.join(sorted(KNOWN_ARCHS))}")
    return CUDATarget(arch=arch, **KNOWN_ARCHS[arch])  # type: ignore[arg-type]
