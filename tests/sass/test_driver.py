"""The CUDA driver layer against a fake driver: every status is checked and named."""

from __future__ import annotations

import types

import pytest

from polytile.runtime.cuda_driver import CudaError, Device, KernelParams


class FakeDriver:
    CUdevice_attribute = types.SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76,
        CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE=38,
    )
    CUfunction_attribute = types.SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8)

    def __init__(self, fail=None):
        self.fail = fail
        self.calls = []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, args))
            if name == self.fail:
                return (700,) if name != "cuInit" else 100
            return {
                "cuInit": 0,
                "cuDeviceGet": (0, 0),
                "cuDevicePrimaryCtxRetain": (0, 0x1000),
                "cuCtxSetCurrent": (0,),
                "cuDeviceGetName": (0, b"Fake H100\0\0"),
                "cuDeviceGetAttribute": (0, {75: 9, 76: 0, 38: 50 << 20}.get(args[0] if args else None, 0)),
                "cuDriverGetVersion": (0, 13000),
                "cuGetErrorName": (0, b"CUDA_ERROR_ILLEGAL_ADDRESS"),
                "cuModuleLoadData": (0, "module"),
                "cuModuleGetFunction": (0, "function"),
            }.get(name, (0,))

        return call


def test_device_reads_its_facts():
    device = Device(driver=FakeDriver())
    assert device.info.name == "Fake H100" and device.info.compute_capability == (9, 0)
    assert device.info.l2_bytes == 50 << 20


def test_failures_name_the_call_and_the_error():
    device = Device(driver=FakeDriver(fail="cuModuleLoadData"))
    with pytest.raises(CudaError, match="cuModuleLoadData failed: CUDA_ERROR_ILLEGAL_ADDRESS"):
        device.load(b"cubin", "k", 0)
    with pytest.raises(CudaError, match="cuInit"):
        Device(driver=FakeDriver(fail="cuInit"))


def test_large_shared_memory_raises_the_limit_and_params_point_at_values():
    fake = FakeDriver()
    device = Device(driver=fake)
    device.load(b"cubin", "k", 100 * 1024)
    assert ("cuFuncSetAttribute", ("function", 8, 100 * 1024)) in fake.calls
    params = KernelParams([("pointer", 0x1000), ("int32", 7), ("float32", 0.5)])
    device.launch("function", (1, 1, 1), (32, 1, 1), 0, params)
    name, args = fake.calls[-1]
    assert name == "cuLaunchKernel" and args[-2] == params.address
