"""Measurement hygiene: the conditions each trial was timed under, recorded with it.

On a GPU: which GPU of the host measured (its PCI bus id, ``gpu_bus_id``), the SM clock and the
board's power draw sampled right after the timed runs (NVML, the driver's management library, found
by that bus id so that it names the GPU the runner uses whatever ``CUDA_VISIBLE_DEVICES`` says), the
driver's version and the CUDA toolkit (``nvcc``) that built the kernel. On a CPU: the current clock
of the cores (cpufreq or ``/proc/cpuinfo``), the load average and the C++ compiler's version. A fact
that cannot be read here is left out, never guessed.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from functools import cache
from typing import Any

NVML_CLOCK_SM = 1


def conditions(target: Any) -> dict[str, object]:
    """What this process can read now about the machine a kernel of ``target`` was just timed on."""
    if getattr(target, "kind", "cpu") == "cuda":
        return {**_gpu_now(), "driver": _driver_version(), "toolkit": toolkit_version("cuda")}
    return {**_cpu_now(), "toolkit": toolkit_version("cpu")}


def toolkit_version(kind: str) -> str:
    """The compiler that builds kernels of a target ``kind`` ("cuda": nvcc's release line, or NVRTC's
    version where ``POLYTILE_CUDA_COMPILER=nvrtc`` builds with it: its kernels are not nvcc's; "cpu": the
    C++ compiler and its version), or "" when it cannot be run. Part of the result cache's key."""
    if kind == "cuda":
        from ..toolchain import cuda_compiler
        if cuda_compiler() == "nvrtc":
            from ..runtime.nvrtc import nvrtc
            lib = nvrtc()
            if lib is not None:
                return f"nvrtc {lib.version[0]}.{lib.version[1]}"
    return _compiler_version(kind)


@cache
def _compiler_version(kind: str) -> str:
    try:
        if kind == "cuda":
            from ..toolchain import find_nvcc
            cc = find_nvcc()
            if cc is None:
                return ""
            text = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
            lines = [ln for ln in text.splitlines() if ln.startswith("Cuda compilation tools")]
            return f"nvcc {lines[0].split('release', 1)[1].strip()}" if lines else ""
        from ..runtime.cpu import compiler
        cxx = compiler()
        version = subprocess.run([cxx, "-dumpfullversion", "-dumpversion"], capture_output=True, text=True,
                                 timeout=60).stdout.strip()
        return f"{os.path.basename(cxx)} {version}"
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""
    except Exception:  # noqa: BLE001 - a missing compiler (BuildError) means: unknown
        return ""


def _cpu_now() -> dict[str, object]:
    out: dict[str, object] = {"load": round(os.getloadavg()[0], 2)}
    mhz = _cpu_mhz()
    if mhz:
        out["cpu_mhz"] = mhz
    return out


def _cpu_mhz() -> float | None:
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq") as f:
            return round(int(f.read()) / 1e3, 1)
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            rates = [float(ln.split(":", 1)[1]) for ln in f if ln.startswith("cpu MHz")]
        return round(sum(rates) / len(rates), 1) if rates else None
    except (OSError, ValueError):
        return None


@cache
def _nvml() -> Any:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    return lib if lib.nvmlInit_v2() == 0 else None


@cache
def _bus_id() -> str | None:
    """The PCI bus id of the GPU this process's CUDA context is on (which GPU of the host measured)."""
    try:
        from ..runtime.cuda_device import device
        dev = device()
        err, bus = dev.cu.cuDeviceGetPCIBusId(32, dev.device)
        if int(err) != 0:
            return None
        return (bus.split(b"\0", 1)[0] if isinstance(bus, bytes) else str(bus).encode()).decode()
    except Exception:  # noqa: BLE001 - no GPU or no bindings: nothing to read
        return None


@cache
def _nvml_handle() -> Any:
    """The NVML handle of the GPU this process's CUDA context is on (by PCI bus id)."""
    lib, bus_id = _nvml(), _bus_id()
    if lib is None or bus_id is None:
        return None
    handle = ctypes.c_void_p()
    if lib.nvmlDeviceGetHandleByPciBusId_v2(ctypes.c_char_p(bus_id.encode()), ctypes.byref(handle)) != 0:
        return None
    return handle


def _gpu_now() -> dict[str, object]:
    bus_id = _bus_id()
    out: dict[str, object] = {"gpu_bus_id": bus_id} if bus_id else {}
    lib, handle = _nvml(), _nvml_handle()
    if lib is None or handle is None:
        return out
    clock, power = ctypes.c_uint(), ctypes.c_uint()
    if lib.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM, ctypes.byref(clock)) == 0:
        out["sm_clock_mhz"] = clock.value
    if lib.nvmlDeviceGetPowerUsage(handle, ctypes.byref(power)) == 0:
        out["power_w"] = round(power.value / 1e3, 1)  # milliwatts
    return out


@cache
def _driver_version() -> str:
    lib = _nvml()
    if lib is not None:
        buf = ctypes.create_string_buffer(96)
        if lib.nvmlSystemGetDriverVersion(buf, 96) == 0:
            return buf.value.decode()
    try:
        from ..runtime.cuda_device import device
        version = device().info.driver_version  # CUDA's form: 12040 for 12.4
        return f"CUDA {version // 1000}.{version % 1000 // 10}"
    except Exception:  # noqa: BLE001 - no GPU here
        return ""
