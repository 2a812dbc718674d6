"""Run by test_cluster in a subprocess: tune softmax of M rows on a Dask cluster into a records file
(argv: scheduler address, records path, M, trials)."""

from __future__ import annotations

import sys

from polytile.tune import MeasureOptions, make_task, tune_task

if __name__ == "__main__":
    address, path, rows, trials = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    task = make_task("softmax", "cpu", M=rows, N=72)
    tune_task(task, trials, path, tuner="random", batch_size=2, progress=False, verify=False, build_best=False,
              measure=MeasureOptions(repeat=3, min_time=0.0, result_cache=False), cluster=address)
