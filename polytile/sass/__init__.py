"""SASS schedule optimizer: reorder memory instructions in a cubin's kernels, rewarded by measured speed.

Pipeline: `cubin` (ELF words) + `disasm` (nvdisasm) -> `isa` / `analysis` (dependences, pinned
instructions, stall distances) -> `schedule` (legal moves, patched words) -> `game` (a gymnasium
environment) -> `agent` (MaskablePPO, greedy, random search) -> `runner` / `verify` (timing and
differential checks in an isolated worker) -> `api.optimize`. Kernels come as a `launch.CubinLaunch`,
from polytile's CUDA backend (`polytile_kernel`) or from Triton (`triton_kernel`).
"""

from polytile.sass.agent import METHODS, SearchResult, search
from polytile.sass.analysis import KernelAnalysis
from polytile.sass.api import OptimizationReport, OptimizedKernel, analyse, optimize
from polytile.sass.cubin import Control, Cubin, CubinError
from polytile.sass.game import AssemblyGame, MeasurementFailed, MeasurementLog, Measurer
from polytile.sass.launch import Buffer, CubinLaunch, LaunchError, Scalar, Scratch, launch_from_spec
from polytile.sass.polytile_kernel import polytile_launch
from polytile.sass.runner import Runner, RunnerSettings
from polytile.sass.schedule import IllegalMove, Move, Schedule
from polytile.sass.triton_kernel import triton_launch

__all__ = [
    "METHODS", "AssemblyGame", "Buffer", "Control", "Cubin", "CubinError", "CubinLaunch", "IllegalMove",
    "KernelAnalysis", "LaunchError", "MeasurementFailed", "MeasurementLog", "Measurer", "Move",
    "OptimizationReport", "OptimizedKernel", "Runner", "RunnerSettings", "Scalar", "Schedule", "Scratch",
    "SearchResult", "analyse", "launch_from_spec", "optimize", "polytile_launch", "search", "triton_launch",
]  # fmt: skip
