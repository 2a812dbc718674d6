"""SASS schedule optimizer: reorder memory instructions in a cubin's kernels, rewarded by measured speed.

Pipeline: `cubin` (ELF words) + `disasm` (nvdisasm) -> `isa` / `analysis` (dependences, pinned
instructions, stall distances) -> `schedule` (legal moves, patched words) -> `game` (a gymnasium
environment) -> `agent` (MaskablePPO, greedy, random search) -> `runner` / `verify` (timing and
differential checks in an isolated worker) -> `api.optimize`.
"""
