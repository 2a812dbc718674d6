"""benchmarks/tlm.py: the held-out GPU workloads are tensor-core workloads (every tuner it compares,
analytical included, can tune them) never seen in pretraining or fine-tuning."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import tlm as bench  # noqa: E402

from polytile.tune.tlm.finetune import target_of  # noqa: E402


def test_held_out_gpu_workloads_have_analytical_models_and_are_unseen():
    target = target_of(bench.TABLE_TARGET)
    held = bench.gpu_cases(bench.HELD_OUT, 10)
    train = bench.gpu_cases(bench.TRAIN, 12)
    assert len(held) == 10 and len(train) == 12  # the issue asks for at least 8 held-out GPU workloads
    seen = bench.corpus_keys("cuda", list(bench.TRAIN)) | {bench.key_of(c) for c in train}
    for case in held + train:
        task = case.task(target)
        assert len(task.predict([task.space.config_at(0).values])) == 1, case  # the analytical tuner applies
    assert not {bench.key_of(c) for c in held} & seen
