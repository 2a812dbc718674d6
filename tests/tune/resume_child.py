"""Run by test_resume in a subprocess: tune softmax into a records file (argv: path, trials)."""

from __future__ import annotations

import sys

from polytile.tune import MeasureOptions, make_task, tune_task

if __name__ == "__main__":
    path, trials = sys.argv[1], int(sys.argv[2])
    task = make_task("softmax", "cpu", M=64, N=96)
    tune_task(task, trials, path, tuner="xgb", batch_size=2, progress=False, verify=False, build_best=False,
              measure=MeasureOptions(builders=2, repeat=3, min_time=0.0),
              tuner_options={"min_train": 4, "plan_size": 16, "chains": 16, "steps": 40})
