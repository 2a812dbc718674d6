"""Audit the SASS legality rules on a GPU with the workloads of benchmarks/sass.py: verify every
single legal move from the compiler's order and WALKS random 40-move legal schedules, then bisect
each failing schedule to its first failing move and print the instructions around it.

Run on the GPU host from the repo root (wheels in .whl installed to /tmp/site, CUDA C cubins built):
    PYTHONPATH=$PWD:/tmp/site python3 scripts/sass_audit.py triton-layernorm,polytile-matmul [WALKS=32]
(2026-11-22, H100: found Triton's layernorm's unguarded-load moves; after the rule, 0 failures.)"""
import sys, time
sys.path.insert(0, "."); sys.path.insert(0, "benchmarks")
from polytile.sass.api import analyse
from polytile.sass.cubin import Cubin
from polytile.sass.runner import Runner, RunnerSettings
from polytile.sass.schedule import Schedule, Move, UP, DOWN, random_legal
from polytile.sass.game import MeasurementFailed
import sass as bench
names = sys.argv[1].split(",")
walks = int(sys.argv[2]) if len(sys.argv) > 2 else 32
ws = {w.name: w for w in bench.triton_workloads() + (bench.polytile_workloads() or []) + bench.cuda_workloads() if w.name in names}
for name, w in ws.items():
    t0 = time.time()
    launch = w.launch
    a = analyse(launch); cub = Cubin(launch.cubin)
    def check(runner, s):
        try:
            return runner.verify(cub.with_words(launch.kernel, s.words()), seeds=(1, 2))
        except MeasurementFailed as e:
            return "FAILED: " + str(e)[:200]
    bad = []
    with Runner(launch, RunnerSettings(reps=3, warmup=1)) as r:
        orig = Schedule.original(a)
        singles = 0
        for i in a.movable:
            for d in (UP, DOWN):
                s, why = orig.check(Move(i, d))
                if s is None: continue
                singles += 1
                res = check(r, s)
                if res: bad.append(("single", s, res))
        for seed in range(walks):
            s = random_legal(a, 40, seed)
            res = check(r, s)
            if res: bad.append((f"walk{seed}", s, res))
        print(f"AUDIT {name}: {len(a.movable)} movable, {singles} single moves, {walks} walks: {len(bad)} bad ({time.time()-t0:.0f}s)", flush=True)
        for tag, s, res in bad[:3]:
            print("  BAD", tag, res[:160], flush=True)
            for m in range(1, len(s.path) + 1):
                p = Schedule.original(a)
                for mv in s.path[:m]: p = p.apply(mv)
                rr = check(r, p)
                if rr:
                    mv = s.path[m - 1]
                    print(f"   first failing prefix {m}: {mv.describe(a)} :: {rr[:120]}", flush=True)
                    pos = p.position[mv.instruction]
                    for q in range(max(0, pos - 6), min(len(p.order), pos + 7)):
                        i = p.order[q]; ins = a.instructions[i]
                        print(f"     {q*16:#06x} <- {ins.offset:#06x} st{p.stall(i):2d}(+{p.extra.get(i,0)}) {a.controls[i]} {ins.text}", flush=True)
                    break
