"""Training the tensor language model: next-word prediction on tensor sentences, with torch.

Pretraining (random valid sentences, ``corpus``) and fine-tuning (the best measured sentences,
``finetune``) are the same loop with other settings, as in TLM (``gen/train_clm.py`` run by
``gen/run_train_clm.py``: 3 epochs from scratch; ``gen/run_train_clm_best_*.py``: 10 epochs at a
constant rate from the pretrained model). Only the decision words (and [EOS]) are scored: the prompt
is always given when decoding, so predicting it would spend the small model's capacity for nothing.
Batches group sentences of similar length (less padding); AdamW with a linear warm-up and a cosine
decay (pretraining) or a constant rate (fine-tuning).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..space import TuneError
from .corpus import read_corpus
from .model import DEFAULT_SHAPE, TLM, ModelShape, torch_threads


@dataclass(frozen=True)
class TrainOptions:
    """``epochs`` over the sentences (fractions allowed), cut short after ``max_minutes`` (the model is
    then trained on what it saw, and the history says so)."""


    epochs: float = 1.0
    batch_size: int = 128
    lr: float = 1e-3
    schedule: str = "cosine"  # or "constant"
    warmup: float = 0.02  # share of the steps with a rising rate (cosine schedule)
    weight_decay: float = 0.01
    max_minutes: float | None = None
    seed: int = 0
    threads: int | None = None  # torch's CPU threads (None: torch's choice; 1 is faster on a busy machine)

    def __post_init__(self) -> None:
        if not self.epochs > 0 or self.batch_size < 1 or not self.lr > 0:
            raise TuneError(f"training needs epochs > 0, batch_size ≥ 1 and lr > 0, got {self}")
        if self.schedule not in ("cosine", "constant"):
            raise TuneError(f"unknown learning-rate schedule {self.schedule!r}; use 'cosine' or 'constant'")


PRETRAIN = TrainOptions()
FINETUNE = TrainOptions(epochs=10.0, batch_size=16, lr=3e-4, schedule="constant", threads=1)


def _batches(lengths: Sequence[int], batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled batches of sentences of similar length: sort shuffled chunks of 32 batches by length."""
    order = rng.permutation(len(lengths))
    chunk = 32 * batch_size
    out = []
    for start in range(0, len(order), chunk):
        part = order[start:start + chunk]
        part = part[np.argsort([lengths[k] for k in part], kind="stable")]
        out += [part[k:k + batch_size] for k in range(0, len(part), batch_size)]
    return [out[k] for k in rng.permutation(len(out))]


def _tensors(tlm: TLM, encoded: Sequence[tuple[list[int], int]], rows: np.ndarray) -> dict[str, Any]:
    import torch
    width = max(len(encoded[k][0]) for k in rows)
    ids = np.full((len(rows), width), tlm.pad, dtype=np.int64)
    labels = np.full((len(rows), width), -100, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for r, k in enumerate(rows):
        seq, prompt = encoded[k]
        ids[r, :len(seq)] = seq
        labels[r, prompt:len(seq)] = seq[prompt:]
        mask[r, :len(seq)] = 1
    device = tlm.device
    return {"input_ids": torch.from_numpy(ids).to(device), "labels": torch.from_numpy(labels).to(device),
            "attention_mask": torch.from_numpy(mask).to(device)}


def fit(tlm: TLM, texts: Sequence[str], options: TrainOptions = PRETRAIN, *, stage: str = "pretrain",
        progress: bool = True) -> dict[str, Any]:
    """Train ``tlm`` on ``texts`` (tensor sentences); returns the run's summary, also appended to
    ``tlm.meta["training"]``."""
    if not texts:
        raise TuneError(f"{stage}: no sentences to train on")
    with torch_threads(options.threads if tlm.device.type == "cpu" else None):
        return _fit(tlm, texts, options, stage, progress)


def _fit(tlm: TLM, texts: Sequence[str], options: TrainOptions, stage: str, progress: bool) -> dict[str, Any]:
    import torch
    start = time.perf_counter()
    rng = np.random.default_rng(options.seed)
    torch.manual_seed(options.seed)
    encoded = tlm.encode(texts)
    limit = tlm.model.config.n_positions
    longest = max(len(s) for s, _ in encoded)
    if longest > limit:
        raise TuneError(f"{stage}: a sentence has {longest} words, more than the model's {limit} positions")
    lengths = [len(s) for s, _ in encoded]
    per_epoch = math.ceil(len(texts) / options.batch_size)
    total = max(1, round(options.epochs * per_epoch))
    model = tlm.model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=options.lr, weight_decay=options.weight_decay,
                                  fused=True)
    warm = max(1, int(options.warmup * total))

    def rate(step: int) -> float:
        if options.schedule == "constant":
            return 1.0
        if step < warm:
            return (step + 1) / warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=total, desc=stage, unit="step", dynamic_ncols=True)
    losses: list[float] = []
    step, stopped = 0, False
    deadline = start + 60 * options.max_minutes if options.max_minutes else math.inf
    try:
        while step < total and not stopped:
            for rows in _batches(lengths, options.batch_size, rng):
                loss = model(**_tensors(tlm, encoded, rows)).loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                losses.append(loss.item())
                step += 1
                if bar is not None:
                    bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}", refresh=False)
                    bar.update(1)
                if step >= total:
                    break
                if time.perf_counter() > deadline:
                    stopped = True
                    break
    finally:
        if bar is not None:
            bar.close()
        model.eval()
    window = max(1, min(50, len(losses) // 10))
    summary = {"stage": stage, "sentences": len(texts), "steps": step, "planned_steps": total,
               "sentences_seen": min(step * options.batch_size, round(options.epochs * len(texts))),
               "stopped_by_time": stopped, "first_loss": float(np.mean(losses[:window])),
               "last_loss": float(np.mean(losses[-window:])), "seconds": round(time.perf_counter() - start, 1),
               "device": str(tlm.device), "options": asdict(options)}
    tlm.meta.setdefault("training", []).append(summary)
    return summary


def loss_of(tlm: TLM, texts: Sequence[str], batch_size: int = 256, threads: int | None = None) -> float:
    """The mean loss per decision word of ``texts`` (the held-out loss of pretraining)."""
    import torch
    encoded = tlm.encode(texts)
    total, words = 0.0, 0
    model = tlm.model.eval()
    with torch.inference_mode(), torch_threads(threads if tlm.device.type == "cpu" else None):
        for start in range(0, len(encoded), batch_size):
            rows = np.arange(start, min(start + batch_size, len(encoded)))
            batch = _tensors(tlm, encoded, rows)
            n = int((batch["labels"][:, 1:] != -100).sum())
            total += model(**batch).loss.item() * n
            words += n
    return total / max(words, 1)


def pretrain(corpus: str | os.PathLike[str], out: str | os.PathLike[str], options: TrainOptions = PRETRAIN,
             shape: ModelShape = DEFAULT_SHAPE, *, half: bool = False, progress: bool = True,
             device: str | None = None) -> TLM:
    """A new model trained on the sentences of a corpus file, saved to directory ``out``."""
    header, texts = read_corpus(corpus)
    tlm = TLM.create(texts, header["target_kind"], shape, options.seed, device, header.get("words", ()))
    tlm.meta["corpus"] = {k: header[k] for k in ("networks", "targets", "sentences", "seed", "templates",
                                                  "excluded") if k in header}
    tlm.meta["corpus"]["file"] = str(corpus)
    fit(tlm, texts, options, stage="pretrain", progress=progress)
    tlm.save(out, half=half)
    return tlm
