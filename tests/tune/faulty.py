"""A workload and template whose configurations misbehave on purpose (crash, hang, wrong result,
device error), for the measurement tests. Module-level so worker processes can import it."""

from __future__ import annotations

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
    if mode == "crash":
        # a real fault of a generated kernel: the whole input copied into a stack buffer
        sched["C"].cache_identity("X", None, loc="stack")
    return sched


def misbehave(task, values) -> None:  # noqa: ANN001 - the runner's test hook
    """Hang forever, or raise a device error, for the configurations that ask for it."""
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
