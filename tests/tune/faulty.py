"""A workload and template whose configurations misbehave on purpose (crash, hang, wrong result,
device error), for the measurement tests. Module-level so worker processes can import it."""

from __future__ import annotations

import os
import signal
import time

import polytile as pt
from polytile.tune import template

ROWS, COLS = 4, 2 * 1024 * 1024  # 32 MiB: a stack copy of it overflows the default 8 MiB stack


def make_func(scale: float = 2.0) -> pt.Func:
    X = pt.placeholder((ROWS, COLS), "float32", "X")
    k = pt.reduce_axis(COLS, "k")
    C = pt.compute((ROWS,), lambda i: pt.sum(X[i, k] * scale, axis=k), "C")
    return pt.Func([X], [C], name="rowsum")


@template("func", "cpu", name="faulty_test")
def faulty(cfg, op):  # noqa: ANN001, ANN201 - a template
    mode = cfg.knob("mode", ["ok", "crash", "hang", "wrong", "device"])
    if mode == "wrong":
        sched = cfg.schedule(make_func(scale=3.0))  # a legal schedule of another program
        return sched
    sched = cfg.schedule(op.func)
    return sched


def misbehave(task, values) -> None:  # noqa: ANN001 - the runner's test hook
    """Crash, hang forever, or raise a device error, for the configurations that ask for it. (The crash
    was a generated kernel's stack overflow — the whole input in a stack buffer — until stack buffers
    past 1 MB moved to the heap; the runner process now dies of the same signal here.)"""
    if values.get("mode") == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if values.get("mode") == "hang":
        while True:
            time.sleep(1)
    if values.get("mode") == "device":
        raise pt.DeviceError("kernel rowsum: CUDA_ERROR_ILLEGAL_ADDRESS (simulated by a test)")


def _never(op, target) -> bool:  # noqa: ANN001 - chosen only by name
    return False


@template("softmax", "cpu", name="failing_softmax_test", applies=_never)
def failing_softmax(cfg, op):  # noqa: ANN001, ANN201 - a template
    """Every configuration fails: one does not build, two compute another function."""
    mode = cfg.knob("mode", ["no_such_loop", "doubled", "tripled"])
    if mode == "no_such_loop":
        sched = cfg.schedule(op.func)
        sched["Y"].split("no_such_loop", 4, "a", "b")
        return sched
    shape = (op.shape["M"], op.shape["N"])
    X = pt.placeholder(shape, "float32", "X")
    scale = 2.0 if mode == "doubled" else 3.0
    return cfg.schedule(pt.Func([X], [pt.compute(shape, lambda i, j: X[i, j] * scale, "Y")], name="scaled"))


KILL_MARKER = "POLYTILE_TEST_KILL_MARKER"


def kill_dask_worker_once(task, values) -> None:  # noqa: ANN001 - the runner's test hook
    """The first time any runner gets here (a marker file records it), kill the Dask worker that owns
    this runner (its parent) mid-trial, as a lost host would; later runs go on."""
    import os
    import signal
    marker = os.environ.get(KILL_MARKER)
    if not marker:
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)  # killed with its worker meanwhile


TRAP_SOURCE = 'extern "C" __global__ void pt_test_trap() { asm volatile("trap;"); }\n'


def trap_on_gpu(task, values) -> None:  # noqa: ANN001 - the runner's test hook (GPU tests)
    """For the first valid configuration of ``task.space`` (the grid tuner's first), run a kernel that
    traps on the runner's GPU: a real device fault, which leaves the runner's CUDA context unusable
    (CUDA_ERROR_LAUNCH_FAILED)."""
    if values != first_valid(task).values:
        return
    from polytile.runtime.cuda import compile_cuda
    from polytile.runtime.cuda_device import cuda_target, device
    from polytile.runtime.cuda_driver import KernelParams
    dev = device()
    cubin, _ = compile_cuda(TRAP_SOURCE, cuda_target().arch)
    _, fn = dev.load(cubin, "pt_test_trap", 0)
    dev.launch(fn, (1, 1, 1), (32, 1, 1), 0, KernelParams([]))
    dev.synchronize()  # raises the fault as a DeviceError


def first_valid(task):  # noqa: ANN001, ANN201 - a Config
    return next(c for c in task.space if task.space.is_valid(c.digits))


RUNNERS_FILE = "POLYTILE_TEST_RUNNERS_FILE"


def note_runner(task, values) -> None:  # noqa: ANN001 - the runner's test hook
    """Append this runner's GPU (``CUDA_VISIBLE_DEVICES``) to the file the test names, and take a while,
    so that the measurements of a batch overlap."""
    import os
    with open(os.environ[RUNNERS_FILE], "a") as f:
        f.write(os.environ.get("CUDA_VISIBLE_DEVICES", "-") + "\n")
    time.sleep(0.3)
