"""Targets: features by architecture, facts from the datasheet or from the device, the records key, and
what the lowering refuses when a schedule needs a feature the target lacks."""

import re
from types import SimpleNamespace

import pytest

import polytile as pt
from polytile import ops
from polytile.errors import PolytileError
from polytile.intrinsics import INTRINSICS
from polytile.ops.gpu_schedules import gemm_tensorcore, wgmma_gemm_config
from polytile.runtime.cuda_device import device_target
from polytile.target import FEATURES, CPUTarget, CUDATarget, as_target


def test_cpu_features():
    cpu = CPUTarget(flags=("sse2", "avx2", "fma"))
    assert cpu.has("openmp") and cpu.has("simd") and cpu.has("avx2") and cpu.has("fma")
    assert not cpu.has("avx512f") and not cpu.has("gpu") and not cpu.has("mma.sync")
    assert cpu.tensor_intrinsics == []
    assert pt.cpu_target().has("simd")


@pytest.mark.parametrize("arch, present, absent", [
    ("sm_75", {"gpu", "fp16", "ldmatrix"}, {"bf16", "mma.sync", "cp.async", "tma", "wgmma"}),
    ("sm_80", {"gpu", "bf16", "ldmatrix", "mma.sync", "cp.async"}, {"tma", "wgmma", "simd", "openmp"}),
    ("sm_90", {"mma.sync", "cp.async", "tma"}, {"wgmma"}),
    ("sm_90a", {"mma.sync", "cp.async", "tma", "wgmma"}, set()),
])
def test_cuda_features_follow_the_architecture(arch, present, absent):
    t = CUDATarget(arch=arch)
    assert all(t.has(f) for f in present), [f for f in present if not t.has(f)]
    assert not any(t.has(f) for f in absent), [f for f in absent if t.has(f)]
    assert t.features <= set(FEATURES)


def test_tensor_intrinsics_are_facts_of_the_target():
    assert [i.name for i in CUDATarget(arch="sm_75").tensor_intrinsics] == []
    assert [i.name for i in CUDATarget(arch="sm_80").tensor_intrinsics] == ["mma_m16n8k16"]
    assert [i.name for i in CUDATarget(arch="sm_90a").tensor_intrinsics] == ["mma_m16n8k16", "wgmma_m64nNk16"]
    for intr in INTRINSICS.values():
        assert set(intr.features) <= set(FEATURES)


def test_unknown_feature_is_refused():
    with pytest.raises(PolytileError, match="unknown target feature 'wgma'"):
        CUDATarget().has("wgma")


def test_facts_come_from_the_datasheet_of_the_architecture():
    a100 = CUDATarget(arch="sm_80")
    assert (a100.sms, a100.shared_per_block, a100.l2_bytes) == (108, 163 * 1024, 40 * 1024 * 1024)
    h100 = CUDATarget()
    assert (h100.arch, h100.sms, h100.shared_per_block, h100.max_blocks_per_sm) == ("sm_90a", 132, 227 * 1024, 32)
    assert CUDATarget(arch="sm_86").max_threads_per_sm == 1536
    assert CUDATarget(arch="sm_90a", sms=114).sms == 114  # a fact given overrides the datasheet
    with pytest.raises(PolytileError, match="sm_120 has no datasheet here: pass sms, shared_per_block"):
        CUDATarget(arch="sm_120")
    t = CUDATarget(arch="sm_120", sms=84, shared_per_block=99 * 1024, shared_per_sm=100 * 1024, max_threads_per_sm=1536,
                   max_blocks_per_sm=24, l2_bytes=1 << 25, dram_bandwidth=1e12, clock_hz=2e9)
    assert t.has("tma") and not t.has("wgmma")
    with pytest.raises(PolytileError, match="not of the form sm_80"):
        CUDATarget(arch="ampere")


def test_records_keys_are_unchanged():
    assert CUDATarget(arch="sm_80").key == "cuda:unknown:sm_80"
    assert CUDATarget(name="NVIDIA_H100", arch="sm_90a").key == "cuda:NVIDIA_H100:sm_90a"
    assert CPUTarget(cores=2, model="here", vector_bits=512).key == "cpu:here:2c:512b"
    assert as_target("cpu") is pt.cpu_target()


def test_facts_are_read_from_the_device():
    reported = dict(MULTIPROCESSOR_COUNT=114, MAX_SHARED_MEMORY_PER_BLOCK_OPTIN=227 * 1024,
                    MAX_SHARED_MEMORY_PER_MULTIPROCESSOR=228 * 1024, MAX_REGISTERS_PER_MULTIPROCESSOR=65536,
                    MAX_REGISTERS_PER_BLOCK=65536, MAX_THREADS_PER_BLOCK=1024, MAX_THREADS_PER_MULTIPROCESSOR=2048,
                    MAX_BLOCKS_PER_MULTIPROCESSOR=32, WARP_SIZE=32, MEMORY_CLOCK_RATE=1_593_000,
                    GLOBAL_MEMORY_BUS_WIDTH=5120, CLOCK_RATE=1_755_000)
    attrs = SimpleNamespace(**{f"CU_DEVICE_ATTRIBUTE_{k}": k for k in reported})
    dev = SimpleNamespace(cu=SimpleNamespace(CUdevice_attribute=attrs), _attribute=reported.__getitem__,
                          info=SimpleNamespace(name="NVIDIA H100 PCIe", compute_capability=(9, 0), l2_bytes=50 << 20))
    t = device_target(dev)
    assert (t.name, t.arch, t.sms, t.clock_hz) == ("NVIDIA_H100_PCIe", "sm_90a", 114, 1.755e9)
    assert t.dram_bandwidth == pytest.approx(2 * 1.593e9 * 5120 / 8)  # 2.04 TB/s
    assert t.has("wgmma") and device_target(dev, "sm_80").arch == "sm_80"
    reported.update(MEMORY_CLOCK_RATE=0, CLOCK_RATE=0)  # not reported: the datasheet's
    assert (device_target(dev).dram_bandwidth, device_target(dev).clock_hz) == (3.35e12, 1.98e9)


def test_default_wgmma_tiles_follow_the_number_of_multiprocessors():
    assert wgmma_gemm_config(2048, 2048, 512, sms=132)["bn"] == 128  # 128 tiles of 128×256 leave SMs idle
    assert wgmma_gemm_config(2048, 2048, 512, sms=114)["bn"] == 256  # they fill a 114-SM GPU
    op = ops.matmul(2048, 2048, 512, "float16")
    grids = set()
    for sms in (132, 114):
        t = CUDATarget(arch="sm_90a", sms=sms)
        grids.add(re.search(r"grid=\(([^)]*)\)", str(pt.lower(op.schedule(t), t))).group(1))
    assert grids == {"16, 16, 1", "8, 16, 1"}


def _tensor_core_schedule(stages=3):
    s = pt.Schedule(ops.matmul(256, 256, 256, "float16").func)
    gemm_tensorcore(s, "C", "A", "B", bm=64, bn=64, wm=32, wn=32, bk=32, stages=stages)
    return s


def test_an_intrinsic_the_target_lacks_is_refused():
    with pytest.raises(pt.LoweringError, match="mma_m16n8k16 at loop .*needs mma.sync .*sm_80 and newer.*no "
                                               "tensor-core instructions"):
        pt.lower(_tensor_core_schedule(), CUDATarget(arch="sm_75"))
    with pytest.raises(pt.LoweringError, match="needs mma.sync"):
        pt.lower(_tensor_core_schedule(), "cpu")
    pt.lower(_tensor_core_schedule(), CUDATarget(arch="sm_80"))


def test_asynchronous_copies_need_cp_async():
    s = pt.Schedule(ops.matmul(256, 256, 256).func)
    from polytile.ops.gpu_schedules import gemm_cuda
    gemm_cuda(s, "C", "A", "B", stages=3)
    with pytest.raises(pt.LoweringError, match="pipeline of .* cp.async, which the target .*sm_75.* lacks"):
        pt.lower(s, CUDATarget(arch="sm_75"))
    assert "pt_cp_async" in str(pt.lower(s, CUDATarget(arch="sm_80")))


@pytest.mark.gpu
def test_the_gpu_present_is_read_from_the_driver():
    import subprocess
    name, cap = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                               capture_output=True, text=True, check=True).stdout.strip().split(", ")
    t = as_target("cuda")
    assert t.name == name.replace(" ", "_") and t.capability == int(cap.replace(".", "")) and t.has("gpu")
    assert t.has("wgmma") == (cap == "9.0")  # Hopper: built for sm_90a
    assert t.l2_bytes > 0 and t.dram_bandwidth > 1e11 and t.clock_hz > 1e8 and t.max_blocks_per_sm >= 16
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        assert t.sms == torch.cuda.get_device_properties(0).multi_processor_count
