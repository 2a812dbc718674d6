"""The GPU this process uses: whether one is present, its hardware facts as a ``CUDATarget``, and the
shared driver context."""

from __future__ import annotations

import os
from functools import cache, lru_cache

from ..errors import DeviceError
from ..target import DATASHEETS, CUDATarget


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
    the datasheet facts of ``arch`` (default sm_90a) when no GPU is present."""
    if gpu_available():
        return device_target(device(), arch)
    arch = arch or "sm_90a"
    if arch not in DATASHEETS:
        raise DeviceError(f"no GPU is present and {arch!r} is not a known architecture; "
                          f"use one of {', '.join(sorted(DATASHEETS))}")
    return CUDATarget(arch=arch, name=str(DATASHEETS[arch]["name"]))


def device_target(dev, arch: str | None = None) -> CUDATarget:  # noqa: ANN001 - a cuda_driver.Device
    """The facts of GPU ``dev`` as its driver reports them; ``arch`` overrides the architecture that
    code is built for (the native one: sm_XY, sm_90a on Hopper, whose wgmma needs the "a" target)."""
    attr = dev.cu.CUdevice_attribute
    get = dev._attribute
    major, minor = dev.info.compute_capability
    native = f"sm_{major}{minor}{'a' if (major, minor) == (9, 0) else ''}"
    mem_clock = get(attr.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE) * 1e3  # kHz
    bus = get(attr.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)  # bits
    clock = get(attr.CU_DEVICE_ATTRIBUTE_CLOCK_RATE) * 1e3
    # a fact the driver does not report (0) comes from the datasheet of the architecture, if known
    sheet = DATASHEETS.get(native, {})
    rates = dict(dram_bandwidth=2 * mem_clock * bus / 8 if mem_clock and bus else sheet.get("dram_bandwidth"),
                 clock_hz=clock or sheet.get("clock_hz"))  # memory: double data rate
    return CUDATarget(
        name=dev.info.name.replace(" ", "_"), arch=arch or native,
        sms=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        shared_per_block=get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        shared_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
        registers_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR),
        registers_per_block=get(attr.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK),
        max_threads_per_block=get(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
        max_threads_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR),
        max_blocks_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR),
        warp_size=get(attr.CU_DEVICE_ATTRIBUTE_WARP_SIZE),
        l2_bytes=dev.info.l2_bytes, **rates)  # type: ignore[arg-type]
