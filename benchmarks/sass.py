"""SASS schedule optimizer benchmark (issue 6): learned (PPO) and greedy schedules vs the compiler's.

For each workload -- polytile's own fp32 matmul, softmax and layernorm built by its CUDA backend
("polytile-*"), hand-written CUDA C kernels of the same operators from benchmarks/kernels/
("cuda-*"), and Triton's tutorial matmul (fp16), softmax and layernorm ("triton-*") -- it spends the
same number of GPU measurements with each search method, verifies the result on fresh inputs,
confirms the speedup in interleaved timings against the compiler's schedule, and checks the outputs
of both against a float64 numpy reference. A short table goes to stdout, a JSON record to
benchmarks/results/.

    python benchmarks/sass.py                       # everything, 32 measurements per method and kernel
    python benchmarks/sass.py --measurements 100 --methods ppo,greedy,random --kernels polytile-matmul
    python benchmarks/sass.py --build-only          # only build the CUDA C cubins (needs nvcc)

Knobs: --measurements (GPU timings per method and kernel), --reps (launches per timing, median),
--confirm (interleaved re-timing rounds), --methods, --kernels, --seed. Needs a GPU, cuda-bindings,
nvdisasm, sb3-contrib, pyelftools, gymnasium; Triton for the Triton workloads. nvcc builds polytile's
kernels (skipped where it is missing) and the CUDA C ones; where the GPU host has no nvcc, build the
CUDA C cubins here with --build-only and bring benchmarks/kernels/build/ along.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polytile import ops
from polytile.errors import PolytileError
from polytile.sass.api import optimize
from polytile.sass.launch import Buffer, CubinLaunch, Scalar
from polytile.sass.polytile_kernel import polytile_launch
from polytile.sass.runner import Runner, RunnerSettings
from polytile.sass.verify import host_inputs
from polytile.toolchain import arch_flags, find_nvcc

HERE = Path(__file__).parent
KERNELS = HERE / "kernels"
BUILD = KERNELS / "build"
RESULTS = HERE / "results"


@dataclass
class Workload:
    name: str
    launch: CubinLaunch
    reference: Callable[[dict], dict]  # host inputs -> expected outputs (float64)
    tolerance: float  # on ||out - ref|| / ||ref||


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    out = out.astype(np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


# ---- CUDA C workloads ---------------------------------------------------------------------------


def build_cuda() -> dict[str, Path]:
    nvcc = find_nvcc()
    BUILD.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in ("matmul", "softmax", "layernorm"):
        target = BUILD / f"{name}.cubin"
        source = KERNELS / f"{name}.cu"
        if not target.exists() or target.stat().st_mtime < source.stat().st_mtime:
            if nvcc is None:
                raise SystemExit(
                    f"{target} is missing and nvcc is not here: run with --build-only where nvcc is"
                )
            subprocess.run(
                [
                    nvcc,
                    "-cubin",
                    "-O3",
                    *arch_flags("sm_90a"),
                    "-o",
                    str(target),
                    str(source),
                ],
                check=True,
            )
        out[name] = target
    return out


def softmax_ref(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def layernorm_ref(x, w, b, eps):
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def cuda_workloads() -> list[Workload]:
    cubins = build_cuda()
    m = n = k = 1024
    rows, cols, eps = 2048, 4096, 1e-5
    f64 = np.float64
    return [
        Workload(
            "cuda-matmul",
            CubinLaunch(
                cubins["matmul"].read_bytes(),
                "matmul_f32",
                (n // 64, m // 64, 1),
                (256, 1, 1),
                (
                    Buffer("a", "float32", (m, k)),
                    Buffer("b", "float32", (k, n)),
                    Buffer("c", "float32", (m, n), "out"),
                    Scalar("m", "int32", m),
                    Scalar("n", "int32", n),
                    Scalar("k", "int32", k),
                ),
                name="cuda-matmul",
            ),
            lambda h: {"c": h["a"].astype(f64) @ h["b"].astype(f64)},
            1e-5,
        ),
        Workload(
            "cuda-softmax",
            CubinLaunch(
                cubins["softmax"].read_bytes(),
                "softmax_f32",
                (rows, 1, 1),
                (256, 1, 1),
                (
                    Buffer("x", "float32", (rows, cols)),
                    Buffer("y", "float32", (rows, cols), "out"),
                    Scalar("n", "int32", cols),
                ),
                name="cuda-softmax",
            ),
            lambda h: {"y": softmax_ref(h["x"].astype(f64))},
            1e-5,
        ),
        Workload(
            "cuda-layernorm",
            CubinLaunch(
                cubins["layernorm"].read_bytes(),
                "layernorm_f32",
                (rows, 1, 1),
                (256, 1, 1),
                (
                    Buffer("x", "float32", (rows, cols)),
                    Buffer("w", "float32", (cols,)),
                    Buffer("b", "float32", (cols,)),
                    Buffer("y", "float32", (rows, cols), "out"),
                    Scalar("n", "int32", cols),
                    Scalar("eps", "float32", eps),
                ),
                name="cuda-layernorm",
            ),
            lambda h: {"y": layernorm_ref(h["x"].astype(f64), h["w"].astype(f64), h["b"].astype(f64), eps)},
            1e-5,
        ),
    ]


def polytile_workloads() -> list[Workload]:
    """polytile's own fp32 matmul, softmax and layernorm (the sizes of `cuda_workloads`) and its fp16
    tensor-core matmuls at 2048³ — ``mma.sync`` (HMMA, LDSM and LDGSTS, pipelined: `gemm_tensorcore`)
    and, on sm_90a, the default warpgroup-MMA kernel (HGMMA, WARPGROUP fences and LDGSTS, pinned
    but for the copies) — built for the GPU present (sm_90a without one), checked against the
    operator's float64 reference."""
    import polytile as pt
    from polytile.ops.gpu_schedules import gemm_tensorcore, gemm_wgmma, wgmma_gemm_config
    from polytile.target import as_target

    def mma_sync(op: ops.Op):  # noqa: ANN202 - a CUDA kernel
        s = pt.Schedule(op.func)
        gemm_tensorcore(s, "C", "A", "B", bm=128, bn=256, wm=64, wn=64, bk=64, stages=3, reg_stages=2)
        return pt.build(s, "cuda")

    def wgmma_cp_async(op: ops.Op):  # noqa: ANN202 - the default tiles, loaded by cp.async (the SASS
        s = pt.Schedule(op.func)  # optimizer's launches pass no TMA tensor maps)
        cfg = wgmma_gemm_config(*(op.shape[d] for d in "MNK"), target=as_target("cuda"))
        gemm_wgmma(s, "C", "A", "B", **{**cfg, "producer": "threads"})
        return pt.build(s, "cuda")

    rng = np.random.default_rng(0)
    workloads = []
    hopper = as_target("cuda").has("wgmma")
    for name, op, build in (
        ("polytile-matmul", ops.matmul(1024, 1024, 1024, "float32"), None),
        ("polytile-matmul-tc", ops.matmul(2048, 2048, 2048, "float16"), mma_sync),
        ("polytile-matmul-wgmma", ops.matmul(2048, 2048, 2048, "float16"), wgmma_cp_async if hopper else False),
        ("polytile-softmax", ops.softmax(2048, 4096, "float32"), None),
        ("polytile-layernorm", ops.layernorm(2048, 4096, "float32"), None),
    ):
        if build is False:
            continue
        kern = build(op) if build else op.build("cuda")
        launch = polytile_launch(kern, op.make_inputs(rng), name=name)
        workloads.append(Workload(name, launch, _op_reference(op), op.tolerance))
    return workloads


def _op_reference(op: ops.Op) -> Callable[[dict], dict]:
    """Host inputs by name -> the operator's float64 reference, by its output's name."""
    (output,) = op.func.outputs
    return lambda h: {output.name: op.reference(*(h[t.name] for t in op.func.inputs))}


# ---- Triton workloads ---------------------------------------------------------------------------


def triton_workloads() -> list[Workload]:
    from triton_kernels import tutorial_launches

    f64 = np.float64
    launches = tutorial_launches()
    matmul, softmax, layernorm = (launches[n] for n in ("triton-matmul-fp16", "triton-softmax", "triton-layernorm"))
    return [
        Workload(
            "triton-matmul-fp16",
            matmul,
            lambda h: {"c_ptr": h["a_ptr"].astype(f64) @ h["b_ptr"].astype(f64)},
            1e-2,
        ),
        Workload(
            "triton-softmax", softmax, lambda h: {"out_ptr": softmax_ref(h["in_ptr"].astype(f64))}, 1e-5
        ),
        Workload(
            "triton-layernorm",
            layernorm,
            lambda h: {
                "y_ptr": layernorm_ref(
                    h["x_ptr"].astype(f64), h["w_ptr"].astype(f64), h["b_ptr"].astype(f64), 1e-5
                )
            },
            1e-2,
        ),
    ]


# ---- running ------------------------------------------------------------------------------------


def check_outputs(workload: Workload, cubin: bytes, runner: Runner, seed: int = 99) -> float:
    """Largest ||out - ref|| / ||ref|| over the outputs of `cubin` with a reference, on fresh inputs."""
    outputs = runner.outputs(cubin, seed)
    expected = workload.reference(host_inputs(workload.launch, seed))
    return max(relative_error(outputs[name], ref) for name, ref in expected.items())


def run(args, save: Callable[[dict], None] = lambda record: None) -> dict:
    """Run the workloads; `save(record)` after each one, so a run cut short keeps what it measured."""
    settings = RunnerSettings(reps=args.reps, timeout_s=args.timeout)
    workloads = []
    try:
        workloads += polytile_workloads()
    except PolytileError as exc:  # no nvcc here: the CUDA C and Triton workloads still run
        print(f"skipping polytile's workloads: {exc}", file=sys.stderr)
    workloads += cuda_workloads()
    if not args.no_triton:
        try:
            workloads += triton_workloads()
        except ImportError as exc:
            print(f"skipping the Triton workloads: {exc}", file=sys.stderr)
    if args.kernels:
        wanted = set(args.kernels.split(","))
        workloads = [w for w in workloads if w.name in wanted]
    record = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": datetime.datetime.now().isoformat(),
        "host": platform.node(),
        "measurements": args.measurements,
        "reps": args.reps,
        "methods": args.methods,
        "workloads": [],
    }
    for workload in workloads:
        entry = {"name": workload.name, "methods": {}}
        record["workloads"].append(entry)
        try:
            with Runner(workload.launch, settings) as runner:
                entry["baseline_rel_error"] = check_outputs(workload, workload.launch.cubin, runner)
                for method in args.methods.split(","):
                    run_method(workload, method, args, runner, entry)
        except Exception as exc:  # one broken workload must not end the benchmark run
            entry["error"] = f"{type(exc).__name__}: {exc}"
            print(f"{workload.name}: {entry['error']}", file=sys.stderr)
        save(record)
    return record


def run_method(workload: Workload, method: str, args, runner: Runner, entry: dict) -> None:
    """Optimize `workload` with `method` and add its numbers (or its error) to `entry`."""
    start = time.monotonic()
    try:
        result = optimize(
            workload.launch,
            budget=args.measurements,
            method=method,
            seed=args.seed,
            confirm_rounds=args.confirm,
            runner=runner,
        )
        rel_error = check_outputs(workload, result.cubin, runner)
    except Exception as exc:  # report and go on with the next method
        entry["methods"][method] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"{workload.name} {method}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    report = result.report
    entry["device"] = report.device
    entry["methods"][method] = {
        "baseline_ms": report.baseline_ms,
        "optimized_ms": report.optimized_ms,
        "speedup": report.speedup,
        "verified": report.verified,
        "measurements": report.measurements,
        "failures": report.failures,
        "rejected": report.rejected,
        "moves": report.moves,
        "notes": report.notes,
        "rel_error": rel_error,
        "seconds": round(time.monotonic() - start, 1),
    }
    print(report.format(), file=sys.stderr)


def table(record: dict, methods: list[str]) -> str:
    head = f"{'workload':<22}{'compiler us':>12}" + "".join(f"{m + ' us':>12}{m + ' x':>9}" for m in methods)
    lines = [head + f"{'rel err':>10}  ok", "-" * (len(head) + 14)]
    speedups = {m: [] for m in methods}
    all_ok = True
    for w in record["workloads"]:
        if "error" in w:
            lines.append(f"{w['name']:<22}  error: {w['error'][:80]}")
            all_ok = False
            continue
        results = [w["methods"].get(m, {}) for m in methods]
        base = next((r["baseline_ms"] for r in results if "baseline_ms" in r), float("nan"))
        row = f"{w['name']:<22}{base * 1e3:>12.2f}"
        errors = [w["baseline_rel_error"]]
        for m, r in zip(methods, results, strict=True):
            if "speedup" in r:
                row += f"{r['optimized_ms'] * 1e3:>12.2f}{r['speedup']:>9.3f}"
                speedups[m].append(r["speedup"])
                errors.append(r["rel_error"])
            else:
                row += f"{'error':>12}{'':>9}"
        ok = all(e < 1e-2 for e in errors)
        all_ok &= ok
        lines.append(row + f"{max(errors):>10.1e}  {'yes' if ok else 'NO'}")
    means = "".join(
        f"{'':>12}{np.exp(np.mean(np.log(s))) if s else float('nan'):>9.3f}" for s in speedups.values()
    )
    lines.append(f"{'geomean speedup':<22}{'':>12}" + means)
    lines.append(f"every workload ran with correct outputs: {'yes' if all_ok else 'NO'}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--measurements", type=int, default=32, help="GPU timings per method and kernel")
    parser.add_argument("--methods", default="ppo,greedy", help="comma-separated: ppo, greedy, random")
    parser.add_argument("--kernels", default="", help="comma-separated workload names (default: all)")
    parser.add_argument("--reps", type=int, default=20, help="launches per timing (median)")
    parser.add_argument("--confirm", type=int, default=5, help="interleaved re-timing rounds of the winner")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds before a variant counts as hung")
    parser.add_argument("--no-triton", action="store_true", help="skip the Triton workloads")
    parser.add_argument("--build-only", action="store_true", help="build the CUDA C cubins and stop")
    args = parser.parse_args()
    if args.build_only:
        for name, path in build_cuda().items():
            print(f"{name}: {path}")
        return 0
    sys.path.insert(0, str(HERE))
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = RESULTS / f"sass-{stamp}.json"
    cuda_version = _cuda_version()

    def save(record: dict) -> None:
        device = next((w["device"] for w in record["workloads"] if "device" in w), {})
        record["device"] = device.get("device")
        record["driver_version"] = device.get("driver_version")
        record["cuda_version"] = cuda_version
        path.write_text(json.dumps(record, indent=2, default=str))

    record = run(args, save)
    save(record)
    print(f"record: {path}")
    print(table(record, args.methods.split(",")))
    return 0


def _cuda_version() -> str:
    nvcc = find_nvcc()
    if nvcc:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
        return out.strip().splitlines()[-1] if out.strip() else "unknown"
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        return f"driver API {version}" if int(err) == 0 else "unknown"
    except Exception:  # the version is informational only
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
