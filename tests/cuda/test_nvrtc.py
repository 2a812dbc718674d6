"""NVRTC as the CUDA compiler (``POLYTILE_CUDA_COMPILER=nvrtc``, ``runtime.nvrtc``): wgmma and mma.sync
kernels compiled in the process to sm_90a cubins with ptxas's resource report, kept apart from nvcc's in
the build cache; sources with host headers, a missing NVRTC and a missing nvcc. No GPU: the kernels'
numbers are checked in ``test_nvrtc_gpu.py``."""

from __future__ import annotations

import subprocess
import tempfile

import pytest

import polytile as pt
from polytile import ops
from polytile.errors import BuildError
from polytile.ops.gpu_schedules import gemm_wgmma
from polytile.runtime import cuda
from polytile.runtime.index_checks import DEVICE_SOURCE
from polytile.runtime.nvrtc import nvrtc, nvrtc_can_compile
from polytile.target import CUDATarget
from polytile.toolchain import find_nvrtc

SM90A = CUDATarget(arch="sm_90a")
needs_nvrtc = pytest.mark.skipif(find_nvrtc() is None, reason="needs NVRTC (pip install polytile[nvrtc])")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path / "cache"))


def _wgmma_source(M=97, N=130, K=61) -> str:
    s = pt.Schedule(ops.matmul(M, N, K, "float16").func)
    gemm_wgmma(s, "C", "A", "B", bm=64, bn=128, bk=32, stages=3)
    return _source(s)


def _source(s: pt.Schedule) -> str:
    from polytile.codegen.cuda import cuda_source
    from polytile.lowering.pipeline import lower
    lowered = lower(s, SM90A)
    return cuda_source(lowered, cuda.index32_ok(lowered))[0]


def _sass(cubin: bytes) -> str:
    from polytile.sass.disasm import find_nvdisasm
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([find_nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout


@needs_nvrtc
@pytest.mark.needs_nvcc
def test_nvrtc_compiles_wgmma_to_hgmma_with_its_report(monkeypatch):
    src = _wgmma_source()
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "nvrtc")
    cubin, resources = cuda.compile_cuda(src, "sm_90a")
    assert "HGMMA.64x" in _sass(cubin)
    assert resources and all(r.registers > 0 for r in resources.values())
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "nvcc")
    nvcc_cubin, nvcc_resources = cuda.compile_cuda(src, "sm_90a")
    assert set(nvcc_resources) == set(resources)  # the same kernels, each cached apart (the code differs)
    assert cuda.compile_cuda(src, "sm_90a")[0] == nvcc_cubin
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "nvrtc")
    assert cuda.compile_cuda(src, "sm_90a")[0] == cubin


@needs_nvrtc
@pytest.mark.needs_nvcc
def test_nvrtc_builds_an_mma_sync_kernel(monkeypatch):
    from polytile.ops.gpu_schedules import gemm_tensorcore
    s = pt.Schedule(ops.matmul(100, 72, 40, "float16").func)
    gemm_tensorcore(s, "C", "A", "B")
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "nvrtc")
    kern = pt.build(s, SM90A)
    assert "mma.sync" in kern.source
    assert "HMMA" in _sass(kern.cubin)


def test_sources_with_host_headers_go_to_nvcc():
    assert not nvrtc_can_compile("#include <stdint.h>\n#include <limits>\n__global__ void k() {}\n")
    assert nvrtc_can_compile("#include <cuda_fp16.h>\n#include <stdint.h>\n__global__ void k() {}\n")
    assert not nvrtc_can_compile('#include "mine.h"\n')


@needs_nvrtc
def test_nvrtc_compiles_the_index_checks(monkeypatch):
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "nvrtc")
    assert nvrtc_can_compile(DEVICE_SOURCE)
    assert "pt_check_monotonic_uint8" in cuda.compile_cuda(DEVICE_SOURCE, "sm_90a")[1]


@pytest.mark.needs_nvcc
def test_without_nvrtc_nvcc_builds_the_same_cubin(monkeypatch):
    src = _wgmma_source(64, 128, 32)
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "nvcc")
    expected = cuda.compile_cuda(src, "sm_90a")[0]
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "nvrtc")
    monkeypatch.setenv("POLYTILE_NVRTC", "/nonexistent/libnvrtc.so.13")
    assert nvrtc() is None
    assert cuda.compile_cuda(src, "sm_90a")[0] == expected


def test_neither_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "nvrtc")
    monkeypatch.setenv("POLYTILE_NVRTC", "/nonexistent/libnvrtc.so.13")
    monkeypatch.setattr(cuda, "find_nvcc", lambda: None)
    monkeypatch.setattr("polytile.toolchain.find_nvcc", lambda: None)
    with pytest.raises(BuildError, match="neither NVRTC .* nor nvcc"):
        cuda.compile_cuda("#include <stdint.h>\n__global__ void k(int32_t* p) { *p = 1; }\n", "sm_90a")


def test_an_unknown_compiler_is_refused(monkeypatch):
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "clang")
    with pytest.raises(BuildError, match="POLYTILE_CUDA_COMPILER='clang'.*nvcc, nvrtc"):
        cuda.compile_cuda("__global__ void k() {}\n", "sm_90a")


@needs_nvrtc
def test_nvrtc_rejection_shows_its_log(monkeypatch):
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "nvrtc")
    with pytest.raises(BuildError, match="(?s)NVRTC rejected the generated CUDA.*undefined_name"):
        cuda.compile_cuda("#include <stdint.h>\n__global__ void k(int32_t* p) { *p = undefined_name; }\n",
                          "sm_90a")


@needs_nvrtc
@pytest.mark.needs_nvcc
def test_the_records_name_the_compiler(monkeypatch):
    """NVRTC's kernels are not nvcc's: the result cache's key and each record's toolkit say which built them."""
    from polytile.tune.hygiene import toolkit_version
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "nvcc")
    assert toolkit_version("cuda").startswith("nvcc ")
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "nvrtc")
    assert toolkit_version("cuda") == "nvrtc {}.{}".format(*nvrtc().version)
    monkeypatch.setenv("POLYTILE_NVRTC", "/nonexistent/libnvrtc.so.13")
    assert toolkit_version("cuda").startswith("nvcc ")  # fallen back to nvcc, which builds them then


@pytest.mark.needs_nvcc
def test_a_cubins_registers_are_ptxas_reports(monkeypatch):
    """``cubin_registers`` reads what ptxas reported (EIATTR_REGCOUNT), for nvcc cubins of one kernel and
    of two (a split K's partial sums and their sum)."""
    from polytile.runtime.nvrtc import cubin_registers
    from polytile.tune import make_task
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "nvcc")
    task = make_task("matmul", "cuda:sm_90a", M=512, N=768, K=3072, dtype="float16")
    two = _source(task.schedule(dict(bm=64, bn=64, bk=32, stages=1, inflight=0, group=8, producer="threads",
                                     persistent=False, store="threads", split=24)))
    for src in (_wgmma_source(), two):
        cubin, resources = cuda.compile_cuda(src, "sm_90a")
        assert resources and cubin_registers(cubin) == {name: r.registers for name, r in resources.items()}
    assert len(resources) == 2
    assert cubin_registers(b"not an ELF") == {}


@needs_nvrtc
def test_nvrtc_without_a_report_in_its_log_reads_the_registers_from_the_cubin(monkeypatch):
    """NVRTC 13.0 of the H200 host logged no ptxas report: the registers (which warp-specialized kernels
    are checked against) come from the cubin then."""
    from polytile.runtime import nvrtc as nvrtc_module
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "nvrtc")
    src = _wgmma_source()
    reported = cuda.compile_cuda(src, "sm_90a")[1]
    monkeypatch.setattr(nvrtc_module, "OPTIONS", ("-std=c++17",))  # no -Xptxas=-v
    monkeypatch.setattr(nvrtc_module, "options_key", lambda lib, arch: ["no report"])
    _, log = nvrtc().compile(src, "sm_90a")
    assert "read from the cubin" in log
    assert {k: r.registers for k, r in cuda.compile_cuda(src, "sm_90a")[1].items()} == \
        {k: r.registers for k, r in reported.items()}
