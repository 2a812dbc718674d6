"""The CUDA call path against a fake driver and a fake GPU framework (no GPU needed; nvcc builds the
kernels): launches on the caller's stream without synchronizing, outputs from the framework, packed
arguments reused per signature, zero-initialized outputs, device-side index checks that report at
the next call or synchronization, clear errors, the NumPy path's copies, and contexts per thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from call_paths import build_lower_triangle
from fake_gpu import FakeArray, FakeFramework, fake_devices, fake_framework

import polytile as pt
from polytile import ops
from polytile.errors import BuildError
from polytile.runtime import cuda as rc
from polytile.runtime.cuda import CUDAKernel

ARCH = "cuda:sm_90a"


@pytest.fixture
def fw(monkeypatch) -> FakeFramework:
    return fake_framework(monkeypatch)


def declare(driver, kern: CUDAKernel) -> None:
    """Tell the fake driver the argument kinds of ``kern``'s kernels."""
    for k in kern.kernels:
        driver.kinds[k.name] = ["pointer"] * len(k.args) + ["int32" if kern.index32 else "int64"] * len(k.params)


@pytest.fixture(scope="module")
def two_kernels(nvcc) -> CUDAKernel:
    return build_two_kernels()


def build_two_kernels() -> CUDAKernel:
    """C = A * 2 + 1 in two kernels through the global temporary B, with a size parameter N."""
    N = pt.param("N")
    A = pt.placeholder((N,), "float32", "A")
    B = pt.compute((N,), lambda i: A[i] * 2.0, "B")
    C = pt.compute((N,), lambda i: B[i] + 1.0, "C")
    s = pt.create_schedule(pt.Func([A], [C], name="two_kernels"))
    for t in (B, C):
        s[t].split("i", 128, "bx", "tx").bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")
    return pt.build(s, ARCH)


@pytest.fixture(scope="module")
def segsum(nvcc) -> CUDAKernel:
    return ops.segment_sum(rows=50, nnz=400).build(ARCH)


def fresh(kern: CUDAKernel) -> CUDAKernel:
    """The kernel with an empty signature cache (module-scoped builds are shared by tests)."""
    import dataclasses
    return dataclasses.replace(kern, _functions={})


def test_gpu_arrays_enqueue_on_the_current_stream_without_synchronizing(monkeypatch, fw, two_kernels, rng):
    driver = fake_devices(monkeypatch)
    kern = fresh(two_kernels)
    declare(driver, kern)
    a = FakeArray(rng.standard_normal(300).astype("float32"))
    out = kern(a)
    assert isinstance(out, FakeArray) and out.shape == (300,)
    # the output, then the temporary B, both for the current stream
    assert fw.allocations == [((300,), "float32", 0, None), ((1200,), "uint8", 0, None)]
    assert driver.syncs == 0 and driver.memsets == []
    k0, k1 = kern.kernels
    assert [x.name for x in driver.launches] == [k0.name, k1.name]
    assert all(x.stream == 0x5000 and x.grid == (3, 1, 1) for x in driver.launches)
    pointers = {"A": a.data.ctypes.data, "C": out.data.ctypes.data}
    for launch, source in zip(driver.launches, kern.kernels):
        for value, buf in zip(launch.args, source.args):
            if buf.name in pointers:
                assert value == pointers[buf.name]
        assert launch.args[len(source.args):] == [300] * len(source.params)
    b_pointer = {v for x, source in zip(driver.launches, kern.kernels) for v, buf in zip(x.args, source.args)
                 if buf.name == "B"}
    assert len(b_pointer) == 1 and b_pointer != {0}


def test_repeated_calls_reuse_the_packed_arguments_with_new_pointers(monkeypatch, fw, two_kernels, rng):
    driver = fake_devices(monkeypatch)
    kern = fresh(two_kernels)
    declare(driver, kern)
    a1, a2 = (FakeArray(rng.standard_normal(300).astype("float32")) for _ in range(2))
    kern(a1)
    kern(a2, stream=0x5000)  # stream= keeps the call in Python; later plain calls run in C (test_fastcall)
    first, second = driver.launches[0], driver.launches[2]
    assert first.params_address == second.params_address  # packed once per signature
    a_slot = [b.name for b in kern.kernels[0].args].index("A")
    assert first.args[a_slot] == a1.data.ctypes.data and second.args[a_slot] == a2.data.ctypes.data
    assert kern.cache_info() == (1, 1) and driver.loads == 2  # each kernel's module loaded once


def test_signature_cache_misses_on_shape_stride_and_device(monkeypatch, fw, matmul, rng):
    driver = fake_devices(monkeypatch, count=2)
    kern = fresh(matmul)
    declare(driver, kern)
    a = rng.standard_normal((70, 30)).astype("float32")
    b = rng.standard_normal((30, 50)).astype("float32")
    kern(FakeArray(a), FakeArray(b))
    kern(FakeArray(a.copy()), FakeArray(b.copy()))
    assert kern.cache_info() == (1, 1)
    kern(FakeArray(a, device=1), FakeArray(b, device=1))  # another GPU: its own plan, context and stream
    assert kern.cache_info() == (2, 2)
    assert driver.launches[-1].stream == 0x5001 and driver.launches[-1].context == 0x1001
    assert driver.current() == 0x1000  # the caller's context is back
    kern(FakeArray(a), FakeArray(b), FakeArray(np.empty((70, 50), "float32")))  # outputs given
    assert kern.cache_info() == (3, 3)
    with pytest.raises(pt.InputError, match="dtype float32, got float64"):  # a new dtype is checked
        kern(FakeArray(a.astype("float64")), FakeArray(b))
    with pytest.raises(pt.InputError, match=r"argument A of matmul is not contiguous.*A\.contiguous\(\)"):
        kern(FakeArray(np.asfortranarray(a)), FakeArray(b))  # new strides: checked, refused
    with pytest.raises(pt.InputError, match=r"must have shape \(30, 50\), got \(31, 50\)"):
        kern(FakeArray(a), FakeArray(np.zeros((31, 50), "float32")))
    assert kern.cache_info() == (3, 3)


def test_explicit_stream_is_used_for_launches_and_allocations(monkeypatch, fw, matmul, rng):
    driver = fake_devices(monkeypatch)
    kern = fresh(matmul)
    declare(driver, kern)
    a = FakeArray(rng.standard_normal((70, 30)).astype("float32"))
    b = FakeArray(rng.standard_normal((30, 50)).astype("float32"))

    class TorchLikeStream:
        cuda_stream = 0x7777

    class CudaStreamProtocol:
        def __cuda_stream__(self):
            return (0, 0x8888)

    for stream, handle in ((0x6666, 0x6666), (TorchLikeStream(), 0x7777), (CudaStreamProtocol(), 0x8888)):
        kern(a, b, stream=stream)
        assert driver.launches[-1].stream == handle and fw.allocations[-1][3] == handle
    with pytest.raises(pt.InputError, match="stream= takes a CUDA stream"):
        kern(a, b, stream="default")


def test_zero_initialized_outputs_are_cleared_on_the_call_stream(monkeypatch, fw, nvcc, rng):
    driver = fake_devices(monkeypatch)
    kern = build_lower_triangle(ARCH)
    declare(driver, kern)
    a = FakeArray(rng.standard_normal((20, 20)).astype("float32"))
    out = kern(a)
    assert driver.memsets == [(out.data.ctypes.data, 0, 20 * 20 * 4, 0x5000)]
    assert not out.data.any()  # the fake kernel writes nothing: the memset's zeros
    kern(a, FakeArray(np.ones((20, 20), "float32")))  # given outputs keep their values
    assert len(driver.memsets) == 1


def test_device_side_index_checks_report_at_the_next_call_and_synchronize(monkeypatch, fw, segsum, rng):
    driver = fake_devices(monkeypatch)
    kern = fresh(segsum)
    declare(driver, kern)
    op = ops.segment_sum(rows=50, nnz=400)
    offsets, x = op.make_inputs(rng)
    kern(FakeArray(offsets), FakeArray(x))
    names = [launch.name for launch in driver.launches]
    assert names == ["pt_check_range_int32", "pt_check_monotonic_int32", kern.kernels[0].name]
    assert all(launch.stream == 0x5000 for launch in driver.launches)
    check_range, check_monotonic = driver.launches[:2]
    assert check_range.args[:4] == [offsets.ctypes.data, 51, 0, 400] and check_monotonic.args[:2] == [
        offsets.ctypes.data, 51]
    assert driver.syncs == 0
    pt.synchronize()  # nothing broken
    bad = offsets.copy()
    bad[20], bad[21] = bad[21] + 1, bad[20]  # offsets[20] > offsets[21]
    kern(FakeArray(bad), FakeArray(x))  # enqueued: no error yet
    with pytest.raises(pt.InputError, match=r"index array offsets of kernel segment_sum broke its promise "
                                            r"monotonic=True at \(flat\) position 20"):
        kern(FakeArray(offsets), FakeArray(x))
    kern(FakeArray(offsets), FakeArray(x))  # reported once, then clear
    over = offsets.copy()
    over[-1] = 401
    kern(FakeArray(over), FakeArray(x))
    with pytest.raises(pt.InputError, match=r"offsets of kernel segment_sum broke its promise "
                                            r"value_range=\(0, NNZ\) at \(flat\) position 50"):
        pt.synchronize()
    pt.synchronize()
    kern(FakeArray(over), FakeArray(x))
    with pytest.raises(pt.InputError, match="value_range"):
        kern.synchronize()


def test_first_call_during_graph_capture_is_refused_clearly(monkeypatch, fw, matmul, rng):
    driver = fake_devices(monkeypatch)
    kern = fresh(matmul)
    declare(driver, kern)
    a = FakeArray(rng.standard_normal((70, 30)).astype("float32"))
    b = FakeArray(rng.standard_normal((30, 50)).astype("float32"))
    driver.capturing = True
    with pytest.raises(pt.InputError, match="during CUDA graph capture.*call it once before capturing"):
        kern(a, b)
    driver.capturing = False
    kern(a, b)  # warmed up: a later capture needs no driver work
    driver.capturing = True
    kern(a, b)
    kern(FakeArray(rng.standard_normal((70, 30)).astype("float32")), b)
    assert len(driver.launches) == 3


def test_bad_arguments_are_clear(monkeypatch, fw, matmul, rng):
    driver = fake_devices(monkeypatch, count=2)
    kern = fresh(matmul)
    declare(driver, kern)
    a = rng.standard_normal((70, 30)).astype("float32")
    b = rng.standard_normal((30, 50)).astype("float32")
    with pytest.raises(pt.InputError, match="argument A of matmul is a CPU fake tensor; move it to the GPU"):
        kern(FakeArray(a, device=None), FakeArray(b))
    with pytest.raises(pt.InputError, match=r"arguments A \(cuda:0\) and B \(cuda:1\) of matmul are on different GPUs"):
        kern(FakeArray(a), FakeArray(b, device=1))
    with pytest.raises(pt.InputError, match=r"arguments A \(fake\) and B \(NumPy\) of matmul come from different"):
        kern(FakeArray(a), b)
    with pytest.raises(pt.InputError, match="must be a GPU array"):
        kern(FakeArray(a), [[1.0]])
    with pytest.raises(pt.InputError, match="output C of matmul shares memory with input A"):
        buf = np.zeros(70 * 50 + 8, "float32")
        kern(FakeArray(buf[:70 * 30].reshape(70, 30)), FakeArray(b), FakeArray(buf[:70 * 50].reshape(70, 50)))
    raw = np.zeros(70 * 30 + 1, "float32")
    with pytest.raises(pt.InputError, match="argument A of matmul starts at an address that is not a multiple of 16"):
        kern(FakeArray(raw[1:].reshape(70, 30)), FakeArray(b))
    assert driver.launches == []


def test_cpu_torch_tensor_is_refused_before_any_gpu_work(nvcc, matmul, rng):
    torch = pytest.importorskip("torch")
    kern = fresh(matmul)
    a = torch.from_numpy(rng.standard_normal((70, 30)).astype("float32"))
    b = torch.from_numpy(rng.standard_normal((30, 50)).astype("float32"))
    with pytest.raises(pt.InputError, match=r"argument A of matmul is a CPU torch tensor; move it to the GPU"):
        kern(a, b)


def test_numpy_arrays_are_copied_and_the_call_is_synchronous(monkeypatch, two_kernels, rng):
    driver = fake_devices(monkeypatch)
    kern = fresh(two_kernels)
    declare(driver, kern)
    k0, k1 = kern.kernels
    slots0 = {b.name: i for i, b in enumerate(k0.args)}
    slots1 = {b.name: i for i, b in enumerate(k1.args)}

    def view(ptr: int, n: int) -> np.ndarray:
        import ctypes
        return np.frombuffer((ctypes.c_float * n).from_address(ptr), dtype=np.float32)

    def first(args: list[int]) -> None:  # B = A * 2, as the real kernel does
        n = args[-1]
        view(args[slots0["B"]], n)[:] = view(args[slots0["A"]], n) * 2

    def second(args: list[int]) -> None:  # C = B + 1
        n = args[-1]
        view(args[slots1["C"]], n)[:] = view(args[slots1["B"]], n) + 1

    driver.behaviour = {k0.name: first, k1.name: second}
    a = rng.standard_normal(300).astype("float32")
    out = kern(a)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, a * 2 + 1, rtol=1e-6)
    assert driver.syncs == 1 and all(x.stream == 0 for x in driver.launches)
    given = np.full(300, np.nan, "float32")
    assert kern(a, given) is given
    np.testing.assert_allclose(given, a * 2 + 1, rtol=1e-6)


def test_numpy_index_arrays_are_checked_on_the_host(monkeypatch, segsum, rng):
    driver = fake_devices(monkeypatch)
    kern = fresh(segsum)
    declare(driver, kern)
    op = ops.segment_sum(rows=50, nnz=400)
    offsets, x = op.make_inputs(rng)
    bad = offsets.copy()
    bad[20], bad[21] = bad[21] + 1, bad[20]
    with pytest.raises(pt.InputError, match=r"offsets must not decrease, but offsets\[20\]"):
        kern(bad, x)
    assert driver.launches == []
    kern(offsets, x)
    assert [launch.name for launch in driver.launches] == [kern.kernels[0].name]  # no device-side checks


def test_a_thread_without_a_context_gets_the_device_one(monkeypatch, fw, matmul, rng):
    driver = fake_devices(monkeypatch)
    kern = fresh(matmul)
    declare(driver, kern)
    a = FakeArray(rng.standard_normal((70, 30)).astype("float32"))
    b = FakeArray(rng.standard_normal((30, 50)).astype("float32"))
    errors: list[BaseException] = []

    def work() -> None:
        try:
            kern(a, b)
        except BaseException as err:  # noqa: BLE001 - reported to the test below
            errors.append(err)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not errors and driver.launches[-1].context == 0x1000


def test_benchmark_times_on_the_call_stream(monkeypatch, fw, matmul, rng):
    driver = fake_devices(monkeypatch)
    kern = fresh(matmul)
    declare(driver, kern)
    a = FakeArray(rng.standard_normal((70, 30)).astype("float32"))
    b = FakeArray(rng.standard_normal((30, 50)).astype("float32"))
    t = kern.benchmark(a, b, repeat=4, warmup=1, flush_cache=False)
    assert t == pytest.approx(0.25e-3)
    assert set(driver.events) == {0x5000} and len(driver.launches) == 5
    kern.benchmark(a, b, repeat=2, warmup=0, flush_cache=False, stream=0x6000)
    assert driver.events[-1] == 0x6000


def test_parameter_named_stream_is_refused(nvcc):
    S = pt.param("stream")
    A = pt.placeholder((S,), "float32", "A")
    B = pt.compute((S,), lambda i: A[i] * 2.0, "B")
    s = pt.create_schedule(pt.Func([A], [B], name="named"))
    s[B].split("i", 32, "bx", "tx").bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")
    with pytest.raises(BuildError, match="the parameter name 'stream' is taken"):
        pt.build(s, ARCH)


def test_synchronize_without_a_gpu_does_nothing(monkeypatch):
    monkeypatch.setattr(rc, "_DEVICES", {})
    pt.synchronize()


def test_reports_outlive_their_kernel(monkeypatch, fw, segsum, rng):
    """A captured graph may replay a kernel's checks after the kernel object is gone: its report
    words stay allocated and pt.synchronize() still raises what they say."""
    import ctypes
    import gc
    driver = fake_devices(monkeypatch)
    kern = fresh(segsum)
    declare(driver, kern)
    offsets, x = ops.segment_sum(rows=50, nnz=400).make_inputs(rng)
    kern(FakeArray(offsets), FakeArray(x))
    word = driver.launches[1].args[-1]  # where the monotonic check reports
    del kern
    gc.collect()
    ctypes.c_int64.from_address(word).value = 5 + 1  # what a replayed check writes
    with pytest.raises(pt.InputError, match=r"offsets of kernel segment_sum broke its promise monotonic=True at "
                                            r"\(flat\) position 5"):
        pt.synchronize()


def test_a_repeated_call_asks_the_driver_only_for_the_context_and_the_launch(monkeypatch, fw, matmul, rng):
    driver = fake_devices(monkeypatch)
    kern = fresh(matmul)
    declare(driver, kern)
    a = FakeArray(rng.standard_normal((70, 30)).astype("float32"))
    b = FakeArray(rng.standard_normal((30, 50)).astype("float32"))
    kern(a, b)  # the first call of a signature loads its kernel and packs its arguments

    def refused(*args: object) -> None:
        raise AssertionError("a repeated call made a driver call beyond the context check and the launch")

    for name in dir(type(driver)):
        if name[:2] == "cu" and name[2:3].isupper() and name not in ("cuCtxGetCurrent", "cuLaunchKernel"):
            monkeypatch.setattr(driver, name, refused)
    slots = {buf.name: n for n, buf in enumerate(kern.kernels[0].args)}
    for _ in range(3):
        a, b = (FakeArray(x.data.copy()) for x in (a, b))
        out = kern(a, b)
        last = driver.launches[-1]
        assert [last.args[slots[x]] for x in "ABC"] == [p.data.ctypes.data for p in (a, b, out)]
        assert last.stream == 0x5000 and fw.allocations[-1] == ((70, 50), "float32", 0, None)
