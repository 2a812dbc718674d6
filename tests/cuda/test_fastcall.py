"""The C call path of CUDA kernels (``polytile.runtime.fastcall``) without a GPU: the extension builds
here; behind the fake driver and framework a repeated call runs in C with the Python path's launches,
byte for byte; every argument the C path does not take for granted returns to the Python path (its
errors unchanged); and when the extension cannot be built, calls take the Python path."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest
from call_paths import build_lower_triangle
from fake_gpu import FakeArray, fake_devices, fake_framework
from test_call_path_fake import ARCH, build_two_kernels, declare, fresh

import polytile as pt
from polytile.errors import BuildError, DeviceError
from polytile.runtime import fastcall, frameworks
from polytile.runtime.cuda import CUDAKernel
from polytile.toolchain import cuda_include


@pytest.fixture
def c_path() -> None:
    """Skip the test where the C call path's extension cannot be built."""
    if fastcall.module() is None:
        pytest.skip("the C call path cannot be built here (a C compiler, Python.h and cuda.h are needed)")


@pytest.fixture
def setup(monkeypatch, c_path, matmul, rng):  # noqa: ANN201 - (driver, framework, kernel, a, b)
    fw = fake_framework(monkeypatch)
    driver = fake_devices(monkeypatch, count=2)
    kern = fresh(matmul)
    declare(driver, kern)
    a = FakeArray(rng.standard_normal((70, 30)).astype("float32"))
    b = FakeArray(rng.standard_normal((30, 50)).astype("float32"))
    return driver, fw, kern, a, b


@pytest.fixture
def rebuilt(monkeypatch):  # noqa: ANN201
    """``fastcall.module`` forgets its build for the test and afterwards."""
    fastcall.module.cache_clear()
    yield
    monkeypatch.undo()
    fastcall.module.cache_clear()


def c_calls(kern: CUDAKernel) -> int:
    return sum(call.calls for call in kern._c_calls)


def test_the_extension_builds_with_the_system_compiler():
    if cuda_include() is None or shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler or no CUDA headers")
    path = fastcall.build()
    assert path.name.startswith("pt_fastcall_") and path.exists()
    assert fastcall.build() == path  # cached by source, compiler and Python
    assert fastcall.module() is not None and hasattr(fastcall.module(), "Call")


def test_the_extension_compiles_without_warnings(tmp_path):
    if cuda_include() is None:
        pytest.skip("no CUDA headers")
    try:
        cc = fastcall.c_compiler()
    except BuildError:
        pytest.skip("no C compiler")
    fastcall.compile_command(cc, tmp_path / "x.so", [*fastcall.FLAGS, "-Wall", "-Wextra", "-Werror"])


def test_a_repeated_call_runs_in_c_with_the_python_paths_launch_bytes(setup):
    driver, fw, kern, a, b = setup
    first = kern(a, b)
    assert driver.c_launches == 0 and len(kern._c_calls) == 1  # the Python path ran and left a C call
    second = kern(a, b)
    assert driver.c_launches == 1 and c_calls(kern) == 1
    assert isinstance(second, FakeArray) and second.shape == (70, 50) and second is not first
    assert fw.allocations[-1] == ((70, 50), "float32", 0, None)  # the framework's allocator, for the current stream
    py, c = driver.launches
    assert (c.name, c.grid, c.block, c.shared, c.stream, c.context) == (py.name, py.grid, py.block, py.shared, 0x5000,
                                                                        0x1000)
    # the same pointers in the same slots: the only bytes that differ are the outputs'
    out_slot = [buf.name for buf in kern.kernels[0].args].index("C")
    assert c.args[out_slot] == second.data.ctypes.data and py.args[out_slot] == first.data.ctypes.data
    same = [k for k in range(len(c.raw)) if k != out_slot]
    assert [c.raw[k] for k in same] == [py.raw[k] for k in same] and c.params_address != py.params_address
    kern(a, b, first)  # outputs given: a signature of its own, first in Python ...
    assert kern(a, b, first) is first  # ... then in C, returning the given output
    assert driver.launches[-1].raw == driver.launches[-2].raw and driver.c_launches == 2
    assert kern.cache_info() == (2, 2)


def test_global_temporaries_are_made_in_c_like_outputs(monkeypatch, c_path, nvcc, rng):
    fw = fake_framework(monkeypatch)
    driver = fake_devices(monkeypatch)
    kern = build_two_kernels()
    declare(driver, kern)
    a = FakeArray(rng.standard_normal(300).astype("float32"))
    kern(a)
    out = kern(a)
    assert driver.c_launches == 2  # both kernels, from C
    # the output, then the temporary B: the framework's arrays for the current stream, as in Python
    assert fw.allocations[2:] == fw.allocations[:2] == [((300,), "float32", 0, None), ((1200,), "uint8", 0, None)]
    names = [[buf.name for buf in k.args] for k in kern.kernels]
    (b_first,) = {x.args[n.index("B")] for x, n in zip(driver.launches[2:], names)}  # one B for both kernels
    assert b_first not in (0, a.data.ctypes.data, out.data.ctypes.data)
    for py, c, n in zip(driver.launches[:2], driver.launches[2:], names):
        assert [c.raw[k] for k, name in enumerate(n) if name == "A"] == [py.raw[k] for k, name in enumerate(n)
                                                                         if name == "A"]
        assert c.raw[len(n):] == py.raw[len(n):]  # the size parameter


@pytest.mark.parametrize("change", ["shape", "dtype", "strides", "device", "type", "stream", "parameter"])
def test_what_does_not_match_takes_the_python_path(setup, change):
    driver, fw, kern, a, b = setup
    kern(a, b)
    kern(a, b)
    assert c_calls(kern) == 1

    class Subclass(FakeArray):
        pass

    if change == "shape":
        with pytest.raises(pt.InputError, match=r"must have shape \(30, 50\), got \(31, 50\)"):
            kern(a, FakeArray(np.zeros((31, 50), "float32")))
    elif change == "dtype":
        with pytest.raises(pt.InputError, match="dtype float32, got float64"):
            kern(FakeArray(a.data.astype("float64")), b)
    elif change == "strides":
        with pytest.raises(pt.InputError, match=r"argument A of matmul is not contiguous.*A\.contiguous\(\)"):
            kern(FakeArray(np.asfortranarray(a.data)), b)
    elif change == "device":
        kern(FakeArray(a.data, device=1), FakeArray(b.data, device=1))
        assert driver.launches[-1].stream == 0x5001 and driver.launches[-1].context == 0x1001
    elif change == "type":
        frameworks.register(Subclass, fw)
        try:
            kern(Subclass(a.data), Subclass(b.data))  # same signature key, another type: not the C call's
        finally:
            frameworks.register(Subclass, None)
    elif change == "stream":
        kern(a, b, stream=0x6666)
        assert driver.launches[-1].stream == 0x6666
    else:
        with pytest.raises(pt.InputError, match="matmul has no parameter 'K'"):
            kern(a, b, K=30)
    assert c_calls(kern) == 1  # none of these ran in C


def test_overlapping_and_misaligned_arrays_are_refused_by_the_python_path(setup):
    driver, fw, kern, a, b = setup
    out = FakeArray(np.empty((70, 50), "float32"))
    kern(a, b, out)
    kern(a, b, out)
    assert c_calls(kern) == 1
    big = np.zeros(70 * 50 + 70 * 30, "float32")
    overlapping = FakeArray(big[:70 * 50].reshape(70, 50))
    with pytest.raises(pt.InputError, match="output C of matmul shares memory with input A"):
        kern(FakeArray(big[70 * 50 - 4:70 * 50 - 4 + 70 * 30].reshape(70, 30)), b, overlapping)
    raw = np.zeros(70 * 30 + 1, "float32")
    with pytest.raises(pt.InputError, match="argument A of matmul starts at an address that is not a multiple of 16"):
        kern(FakeArray(raw[1:].reshape(70, 30)), b, out)
    assert c_calls(kern) == 1


def test_another_current_context_takes_the_python_path(setup):
    driver, fw, kern, a, b = setup
    kern(a, b)
    driver.cuCtxPushCurrent(0x1001)  # the caller works on GPU 1
    try:
        kern(a, b)
        assert driver.launches[-1].context == 0x1000 and driver.current() == 0x1001  # pushed and popped
    finally:
        driver.cuCtxPopCurrent()
    assert c_calls(kern) == 0
    kern(a, b)
    assert c_calls(kern) == 1


def test_a_failed_launch_in_c_raises_the_python_paths_error(setup):
    driver, fw, kern, a, b = setup
    kern(a, b)
    driver.fail_launches = 700
    with pytest.raises(DeviceError, match=rf"kernel {kern.kernels[0].name} could not be launched: cuLaunchKernel "
                                          "failed: CUDA_ERROR_UNKNOWN"):
        kern(a, b)
    assert driver.c_launches == 1


def test_zero_initialized_outputs_are_cleared_in_c_too(monkeypatch, c_path, nvcc, rng):
    fake_framework(monkeypatch)
    driver = fake_devices(monkeypatch)
    kern = build_lower_triangle(ARCH)
    declare(driver, kern)
    a = FakeArray(rng.standard_normal((20, 20)).astype("float32"))
    kern(a)
    out = kern(a)
    assert driver.c_launches == 1
    assert driver.memsets[-1] == (out.data.ctypes.data, 0, 20 * 20 * 4, 0x5000) and len(driver.memsets) == 2
    assert not out.data.any()


def test_calls_take_the_python_path_when_the_extension_cannot_be_built(monkeypatch, rebuilt, matmul, tmp_path,
                                                                       caplog, rng):
    broken = tmp_path / "_fastcall.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(fastcall, "SOURCE", broken)
    with caplog.at_level(logging.DEBUG, logger="polytile"):
        assert fastcall.module() is None
        assert fastcall.module() is None  # found out once
    notes = [r for r in caplog.records if "C call path is unavailable" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.DEBUG and "rejected _fastcall.c" in notes[0].getMessage()
    fake_framework(monkeypatch)
    driver = fake_devices(monkeypatch)
    kern = fresh(matmul)
    declare(driver, kern)
    a = FakeArray(rng.standard_normal((70, 30)).astype("float32"))
    b = FakeArray(rng.standard_normal((30, 50)).astype("float32"))
    for _ in range(3):
        kern(a, b)
    assert len(driver.launches) == 3 and driver.c_launches == 0 and kern._c_calls == []


@pytest.mark.parametrize("how", ["no compiler", "switched off"])
def test_no_compiler_or_the_switch_leaves_the_python_path(monkeypatch, rebuilt, how, tmp_path):
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path))  # no earlier build to reuse
    if how == "no compiler":
        monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    else:
        monkeypatch.setenv(fastcall.VARIABLE, "0")
    assert fastcall.module() is None


def test_torch_tensors_match_by_the_attributes_of_torchs_signature_key(c_path):
    """A C call recorded from CPU torch tensors with torch's probes: the same tensors' signature runs, any
    other shape, dtype, strides, device or type does not (the launch is a fake driver's)."""
    torch = pytest.importorskip("torch")
    from fake_gpu import FakeDriver

    from polytile.runtime.cuda_driver import KernelParams
    from polytile.runtime.frameworks import TorchFramework
    driver = FakeDriver()
    (f,) = driver.cuModuleGetFunction(None, b"k")[1:]
    driver.kinds["k"] = ["pointer", "pointer", "pointer", "int32"]
    values, offsets = KernelParams([("pointer", 0)] * 3 + [("int32", 36)], per_call=[2, 0, 1]).packed()
    a, b = torch.randn(6, 6), torch.randn(6, 6)
    call = fastcall.call_for((a, b), 2, TorchFramework.c_probes, TorchFramework.c_pointer,
                             [(0, torch.empty_like)], lambda device: 0x77, 0, (), (144, 144, 144), (), 0,
                             [(int(f), (1, 1, 1), (36, 1, 1), 0, values, offsets, (2, 0, 1))],
                             lambda k, status: None, None, driver)
    a2 = torch.randn(6, 6)
    out = call(a2, b)
    assert out.shape == (6, 6) and out.dtype == torch.float32 and len(driver.launches) == 1
    launch = driver.launches[0]  # argument 2 is written first, from the output (array 2)
    assert launch.args == [a2.data_ptr(), b.data_ptr(), out.data_ptr(), 36]
    assert launch.stream == 0x77 and launch.block == (36, 1, 1)
    for other in (torch.randn(6, 5), a.double(), a.t(), torch.nn.Parameter(a), torch.randn(6, 6)[::1, ::1].t()):
        assert call(other, b) is None
    assert call(a) is None and call(a, b, out) is None and call.calls == 1
