"""Bisect random legal SASS schedules of the sample fp32 matmul on a GPU: which move first breaks it.

Run on the GPU host from the repo root (wheels carried in .whl installed to /tmp/site):
    PYTHONPATH=$PWD:/tmp/site python3 scripts/sass_bisect.py
Prints, per schedule seed, the verification result and for a failing schedule the first failing
prefix of its moves (2026-11-22, H100: seeds 1 and 3 failed, both first at moving
`0x04e0 @!P4 LDG.E.CONSTANT R27, [R16.64]` down, until latencies were keyed by the consumer's pipe;
see docs/sass.md). scripts/sass_audit.py does the same for the benchmark's workloads."""
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, ".")
from polytile.sass.api import analyse
from polytile.sass.cubin import Cubin
from polytile.sass.disasm import find_nvdisasm
from polytile.sass.launch import Buffer, CubinLaunch, Scalar
from polytile.sass.runner import Runner, RunnerSettings
from polytile.sass.schedule import Schedule, random_legal
from polytile.toolchain import arch_flags, nvcc

print("nvdisasm", find_nvdisasm())
out = Path(tempfile.mkdtemp()) / "sample.cubin"
subprocess.run([nvcc(), "-cubin", *arch_flags("sm_90a"), "-o", str(out), "tests/sass/kernels/sample.cu"], check=True)
n = 256
launch = CubinLaunch(out.read_bytes(), "matmul", (n // 32, n // 32, 1), (256, 1, 1),
                     (Buffer("a", "float32", (n, n)), Buffer("b", "float32", (n, n)), Buffer("c", "float32", (n, n), "out"),
                      Scalar("m", "int32", n), Scalar("n", "int32", n), Scalar("k", "int32", n)))
analysis = analyse(launch)
cubin = Cubin(launch.cubin)
print("words hash", hashlib.sha1(str(cubin.kernel("matmul").words).encode()).hexdigest()[:12])

with Runner(launch, RunnerSettings(reps=3, warmup=1)) as runner:
    for seed in (0, 1, 2, 3):
        s = random_legal(analysis, 30, seed)
        bad = runner.verify(cubin.with_words("matmul", s.words()), seeds=(1, 2, 3))
        print("schedule seed", seed, "->", bad, flush=True)
        if bad is None:
            continue
        path = s.path
        for m in range(1, len(path) + 1):
            p = Schedule.original(analysis)
            for mv in path[:m]:
                p = p.apply(mv)
            r = runner.verify(cubin.with_words("matmul", p.words()), seeds=(1, 2, 3))
            if r is not None:
                print("  first failing prefix", m, "move:", path[m - 1].describe(analysis), flush=True)
                print("  moves:", [mv.describe(analysis) for mv in path[:m]])
                print("  order around:", p.order[max(0, 60):200])
                print("  extra stalls:", getattr(p, "extra", None))
                break
