"""Where the host time of one GPU kernel call goes (issue 15): each piece of polytile's call path on
torch tensors timed alone (the signature key, the pointers, the current stream, the output's
allocation and its alternatives, the context check, the launch through cuda-bindings and, for
comparison, through ctypes on libcuda; the C call path (``runtime.fastcall``) whole and built up piece by
piece: pointers, stream and launch alone, then with the signature check, then with the output's allocation),
beside the whole call (C), the same call through the Python path and torch's own op, then a cProfile of the
whole call (the pieces' Python frames). Host time only: the median over 101 loops of 100 calls of the
time until the loop's last call returns, each loop followed by a synchronize outside the timed part
(100 launches stay under what the launch queue holds, so the host never waits for the GPU).

    python benchmarks/launch_breakdown.py [--out FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import datetime
import io
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from launch_overhead import add_func  # noqa: E402

import polytile as pt  # noqa: E402
from polytile.runtime import fastcall  # noqa: E402
from polytile.runtime.cuda import eval_expr  # noqa: E402
from polytile.runtime.cuda_driver import KernelParams  # noqa: E402
from polytile.runtime.frameworks import KEY_OF  # noqa: E402


def host_time(fn: Callable[[], object], sync: Callable[[], None], calls: int = 100, rounds: int = 101) -> float:
    """Median host seconds per call of ``fn`` (see the module docstring)."""
    for _ in range(10):
        fn()
    sync()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
        sync()
    return statistics.median(times)


def ctypes_launcher(function: object, grid: tuple[int, ...], block: tuple[int, ...],
                    params: KernelParams) -> Callable[[int], int]:
    """cuLaunchKernel through ctypes on libcuda (the alternative to the bindings' wrapper)."""
    fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
    vp, u = ctypes.c_void_p, ctypes.c_uint
    fn.argtypes, fn.restype = [vp, u, u, u, u, u, u, u, vp, vp, vp], ctypes.c_int
    handle, address = int(function), params.address  # type: ignore[call-overload]
    return lambda stream: fn(handle, *grid, *block, 0, stream, address, None)


def c_call_of(plan, arrays: tuple, probes: tuple) -> object:  # noqa: ANN001 - a _CUDAPlan
    """A C call of ``plan``'s signature on ``arrays`` (inputs and outputs, nothing allocated) that checks only
    ``probes`` of each array: the C path's pieces, timed alone."""
    sig = plan.signature
    return fastcall.call_for(arrays, sig.n_inputs, probes, plan.framework.c_pointer, (), plan.current_stream,
                             plan.ordinal, (), sig.nbytes, (), plan.device._context, [x.for_c() for x in plan.launches],
                             lambda k, status: None, plan.launches, plan.device.cu)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", help="also write the numbers and the profile as JSON here")
    args = parser.parse_args()
    import torch
    sync = torch.cuda.synchronize
    kern = pt.build(add_func(1024, gpu=True), "cuda")
    rng = np.random.default_rng(0)
    a, b = (torch.from_numpy(rng.standard_normal(1024).astype("float32")).cuda() for _ in range(2))
    out = kern(a, b)
    torch.testing.assert_close(out, a + b)
    key = tuple(KEY_OF[type(x)](x) for x in (a, b)), ()
    plan = kern._plans[key]
    launch, (k, make) = plan.launches[0], plan.allocators[0]
    pointers = [a.data_ptr(), b.data_ptr(), out.data_ptr()]
    stream = plan.current_stream(0)
    source = kern.kernels[0]
    grid = tuple(eval_expr(g, plan.signature.params) for g in source.grid)
    function = kern._functions[(0, source.name)]
    index = {name: n for n, name in enumerate(plan.signature.names)}
    scalar = "int32" if kern.index32 else "int64"
    params = KernelParams([("pointer", pointers[index[buf.name]]) for buf in source.args]
                          + [(scalar, plan.signature.params[p.name]) for p in source.params])

    ctypes_launch = ctypes_launcher(function, grid, source.block, params)
    python_path = lambda: kern._plans[tuple([KEY_OF[type(x)](x) for x in (a, b)]), ()].call((a, b), None)  # noqa: E731
    pieces = {
        "torch.add (torch's op)": lambda: torch.add(a, b),
        "kern(a, b) (whole call)": lambda: kern(a, b),
        "kern(a, b, out) (outputs given)": lambda: kern(a, b, out),
        "kern(a, b) through the Python path": python_path,
        "signature key and lookup": lambda: kern._plans[tuple([KEY_OF[type(x)](x) for x in (a, b)]), ()],
        "3 x data_ptr()": lambda: (a.data_ptr(), b.data_ptr(), out.data_ptr()),
        "current stream": lambda: plan.current_stream(0),
        "output: the plan's allocation": lambda: make((a, b)[k]),
        "output: torch.empty(tuple, dtype, device)": lambda: torch.empty((1024,), dtype=torch.float32, device="cuda"),
        "output: a.new_empty(shape)": lambda: a.new_empty((1024,)),
        "output: torch.empty_like(a)": lambda: torch.empty_like(a),
        "context check (Device.enter)": plan.device.enter,
        "launch (pointers written, bindings)": lambda: launch.run(pointers, stream),
        "launch alone (bindings)": lambda: launch.start(stream),
        "launch alone (ctypes on libcuda)": lambda: ctypes_launch(stream),
        "bind (pointers, output, stream)": lambda: plan.bind((a, b), None),
    }
    if plan.c_call:
        c_bare = c_call_of(plan, (a, b, out), ())
        c_checked = c_call_of(plan, (a, b, out), plan.framework.c_probes)
        pieces.update({
            "C: pointers, stream, launch (outputs given)": lambda: c_bare(a, b, out),
            "C: + the signature check": lambda: c_checked(a, b, out),
            "C: + the output's allocation (the plan's C call)": lambda: plan.c_call(a, b),
        })
    rows = {name: host_time(fn, sync) * 1e6 for name, fn in pieces.items()}
    sync()
    pt.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(20):
        for _ in range(200):
            kern(a, b)
        sync()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(14)
    width = max(map(len, rows))
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, call path: {fastcall.describe()}: "
          "host µs per call")
    for name, us in rows.items():
        print(f"  {name:<{width}}  {us:7.2f}")
    print(text.getvalue()[-3500:])
    if args.out:
        record = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                  "command": " ".join([Path(sys.executable).name, *sys.argv]), "gpu": torch.cuda.get_device_name(),
                  "torch": torch.__version__, "call_path": fastcall.describe(), "host_us": rows,
                  "profile": text.getvalue()}
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
