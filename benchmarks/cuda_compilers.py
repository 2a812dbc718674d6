"""nvcc against NVRTC (``POLYTILE_CUDA_COMPILER``) on the candidates of ``tuning_throughput.py``'s wgmma
GEMM template (fp16 512×768×3072): the CPU seconds of each compile, whether the two cubins' SASS is the
same (labels aside), the ptxas registers of each, and, on a GPU, each kernel's time (interleaved, the
same random inputs, the result checked against a float64 reference).

    python benchmarks/cuda_compilers.py --candidates 10              # compile times and SASS; no GPU needed
    python benchmarks/cuda_compilers.py --candidates 10 --run        # + the kernels' times on this GPU

The candidates are the first valid draws of the space (``--seed``, default 0), lowered once; each
compiler builds them into a fresh cache of its own. A compile's CPU time is the process's and its
children's (nvcc's processes; NVRTC runs in this one: on the H200 host, where ptxas seems to run on
a thread whose time ``os.times`` did not count, only the wall seconds tell). Disassembly needs
``nvdisasm`` (the ``sass`` extra); without it the SASS columns are left out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _threads  # noqa: F401 - sets the thread variables before NumPy loads its BLAS

# isort: split
import numpy as np  # noqa: E402
from tuning_throughput import WORKLOADS  # noqa: E402

COMPILERS = ("nvcc", "nvrtc")


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def sass_lines(cubin: bytes) -> list[str] | None:
    """The instructions of every function (names of the candidate's labels dropped), or None without nvdisasm."""
    try:
        from polytile.sass.disasm import find_nvdisasm
        tool = find_nvdisasm()
    except Exception:  # noqa: BLE001 - no disassembler: the column is left out
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
    return [re.sub(r"\.L_x_\d+", "L", line.split(";")[0]).strip() for line in text.splitlines()
            if re.search(r"/\*[0-9a-f]{4}\*/", line)]


def compile_all(sources: list[str], arch: str, compiler: str) -> list[dict]:
    from polytile.runtime.cuda import compile_cuda
    os.environ["POLYTILE_CUDA_COMPILER"] = compiler
    os.environ["POLYTILE_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"pt-compilers-{compiler}-")
    out = []
    for src in sources:
        c0, w0 = cpu_seconds(), time.perf_counter()
        cubin, res = compile_cuda(src, arch)
        out.append({"cpu_s": cpu_seconds() - c0, "wall_s": time.perf_counter() - w0, "cubin": cubin,
                    "registers": {k: r.registers for k, r in sorted(res.items())},
                    "spills": sum(r.spill_stores + r.spill_loads for r in res.values())})
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--candidates", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=2, help="compile rounds, the compilers' order alternating")
    p.add_argument("--run", action="store_true", help="time the kernels on this GPU")
    p.add_argument("--out", help="result JSON")
    args = p.parse_args(argv)
    from polytile.codegen.cuda import cuda_source
    from polytile.lowering.pipeline import lower
    from polytile.runtime.cuda import index32_ok
    from polytile.toolchain import find_nvrtc
    from polytile.tune import make_task
    if find_nvrtc() is None:
        print("NVRTC was not found (pip install polytile[nvrtc], or POLYTILE_NVRTC=/path/to/libnvrtc.so.13)")
        return 1
    (op, shape), = WORKLOADS["cuda"].values()
    task = make_task(op, "cuda" if args.run else "cuda:sm_90a", **shape)
    configs, sources = [], []
    for digits in task.space.sample_valid(np.random.default_rng(args.seed), args.candidates):
        values = task.space.config(digits).values
        lowered = lower(task.schedule(values), task.target)
        configs.append(values)
        sources.append(cuda_source(lowered, index32_ok(lowered))[0])
    rounds: dict[str, list[list[dict]]] = {c: [] for c in COMPILERS}
    for rnd in range(args.rounds):
        for comp in COMPILERS if rnd % 2 == 0 else reversed(COMPILERS):
            rounds[comp].append(compile_all(sources, task.target.arch, comp))
    rows = []
    for k, values in enumerate(configs):
        row: dict[str, object] = {"values": values}
        for comp in COMPILERS:
            builds = [r[k] for r in rounds[comp]]
            row[f"{comp}_cpu_s"] = round(statistics.median(b["cpu_s"] for b in builds), 3)
            row[f"{comp}_wall_s"] = round(statistics.median(b["wall_s"] for b in builds), 3)
            row[f"{comp}_registers"] = builds[0]["registers"]
            row[f"{comp}_spills"] = builds[0]["spills"]
        a, b = sass_lines(rounds["nvcc"][0][k]["cubin"]), sass_lines(rounds["nvrtc"][0][k]["cubin"])
        if a is not None and b is not None:
            row["same_sass"] = a == b
            row["instructions"] = [len(a), len(b)]
        rows.append(row)
        print(f"nvcc {row['nvcc_cpu_s']:.2f} s, NVRTC {row['nvrtc_cpu_s']:.2f} s CPU (wall {row['nvcc_wall_s']:.2f}, "
              f"{row['nvrtc_wall_s']:.2f} s); registers "
              f"{row['nvcc_registers']} / {row['nvrtc_registers']}; same SASS {row.get('same_sass')} "
              f"{row.get('instructions')} {values}", flush=True)
    if args.run:
        time_kernels(task, configs, rows)
    total = {c: round(sum(r[f"{c}_cpu_s"] for r in rows), 2) for c in COMPILERS}
    wall = {c: round(sum(r[f"{c}_wall_s"] for r in rows), 2) for c in COMPILERS}
    print(f"CPU seconds of {len(rows)} compiles: nvcc {total['nvcc']}, NVRTC {total['nvrtc']}; wall seconds: "
          f"nvcc {wall['nvcc']}, NVRTC {wall['nvrtc']}")
    result = {"benchmark": "cuda_compilers", "date": datetime.datetime.now(datetime.UTC).isoformat(),
              "command": " ".join(["cuda_compilers.py", *argv]), "host": platform.node(), "nvrtc": find_nvrtc(),
              "load": os.getloadavg(), "workload": {"op": op, **shape}, "candidates": rows, "cpu_s_total": total,
              "wall_s_total": wall}
    out = Path(args.out or f"benchmarks/results/cuda_compilers-{datetime.datetime.now():%Y%m%d-%H%M%S}.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"written to {out}")
    return 0


def time_kernels(task: object, configs: list[dict], rows: list[dict]) -> None:
    """Each candidate's kernel of each compiler checked and timed, the compilers interleaved."""
    import polytile as pt
    from polytile.ops import rel_error
    from polytile.tune.measure import _operator, _reference, trial_seed  # the tuner's inputs and reference
    for values, row in zip(configs, rows):
        arrays, ref = _reference(_operator(task), trial_seed(values), None)
        kerns = {}
        for comp in COMPILERS:
            os.environ["POLYTILE_CUDA_COMPILER"] = comp
            kerns[comp] = pt.build(task.schedule(values), task.target)  # type: ignore[attr-defined]
            row[f"{comp}_error"] = float(rel_error(np.asarray(kerns[comp](*arrays)), np.asarray(ref)))
        times: dict[str, list[float]] = {c: [] for c in COMPILERS}
        for rnd in range(3):
            for comp in COMPILERS if rnd % 2 == 0 else reversed(COMPILERS):
                times[comp].append(kerns[comp].benchmark(*arrays, repeat=30, min_time=0.05))
        for comp in COMPILERS:
            row[f"{comp}_ms"] = round(statistics.median(times[comp]) * 1e3, 5)
        print(f"  nvcc {row['nvcc_ms']:.4f} ms, NVRTC {row['nvrtc_ms']:.4f} ms (errors {row['nvcc_error']:.1e}, "
              f"{row['nvrtc_error']:.1e}) {values}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
