"""Ctrl-C in timing loops: a loop of many runs stops at its next run once Ctrl-C came, even where
the KeyboardInterrupt that Python raised for it was lost.

Python raises KeyboardInterrupt in whatever Python code runs when it handles the signal, and some
callers from C drop it: in ``polytile run``, about one Ctrl-C in 40 (on a loaded machine) came while
``np.random.default_rng`` imported ``numpy.random`` lazily, was raised in ``ABCMeta.register``
during that import and never seen again, and the 100,000 timed runs that followed went on for
minutes. Here the signal is also remembered, and the loops ask after every run."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_came: list[int] = []  # the Ctrl-Cs seen while watched
_watching = [False]


@contextmanager
def watching_ctrl_c() -> Iterator[None]:
    """Within the block, a Ctrl-C (SIGINT) raises KeyboardInterrupt as before and is remembered for
    ``raise_if_interrupted``. Only where Python's default handler is in place, in the main thread: a
    handler of the caller's, or SIGINT ignored (a background job), stays as it is. Nested blocks
    share the outermost one."""
    if (_watching[0] or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return

    def remembered(signum: int, frame: object) -> None:
        _came.append(signum)
        raise KeyboardInterrupt

    _came.clear()
    _watching[0] = True
    signal.signal(signal.SIGINT, remembered)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _watching[0] = False
        _came.clear()


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt if Ctrl-C came within the watched block (its own KeyboardInterrupt
    may have been lost)."""
    if _came:
        raise KeyboardInterrupt
