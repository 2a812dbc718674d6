"""The ``tlm`` tuner: each batch is written by the tensor language model, and between batches the
model is fine-tuned on the best configurations measured so far — TLM's loop (generate, measure,
fine-tune on the best, repeat: ``gen/run.py``) inside one tuning run.

Decoding is constrained (``decode``): every configuration proposed is valid and not measured before.
The model is loaded once per run; with fine-tuning on (the default), the run trains its own copy,
so a model object shared by several runs is never changed by them. A resumed run replays its records
into the tuner like every tuner: the first batch after them is written by a model fine-tuned on them.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

from ..search import Digits, Tuner
from ..space import ConfigSpace, TuneError
from .decode import Completions, generate


class TLMTuner(Tuner):
    """Batches sampled from a trained model (``model``: a directory, "default" or a loaded ``TLM``) at
    ``temperature``, among the ``top_k`` likeliest words (0: all); ``finetune``: before each batch,
    train on the fastest quarter of the measured configurations, at most ``best`` of them
    (``finetune_options``, default ``train.FINETUNE``)."""

    name = "tlm"
    needs_task = True  # writes the task's prompt

    def __init__(self, space: ConfigSpace, seed: int = 0, *, task: Any, model: object = None,
                 temperature: float = 1.0, top_k: int = 0, finetune: bool = True, best: int = 4,
                 finetune_options: Any = None, oversample: int = 2, device: str | None = None):
        super().__init__(space, seed)
        if not (isinstance(temperature, (int, float)) and temperature > 0):
            raise TuneError(f"temperature must be a positive number, got {temperature!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise TuneError(f"top_k must be a non-negative integer (0: no limit), got {top_k!r}")
        from .model import TLM, resolve
        from .train import FINETUNE
        shared = resolve(model, task.target.kind, device)
        shared.check_task(task)
        shared.prompt_ids(task)  # the task's sentences fit the model: checked before anything runs
        unknown = shared.unknown_decisions(space)
        if unknown:
            where = f" ({shared.path})" if shared.path else ""
            warnings.warn(f"the TLM model{where} has no word for the decisions {', '.join(unknown)} of template "
                          f"{task.template.name}: it draws them at random; build it again with `polytile tlm "
                          f"corpus` and `polytile tlm pretrain`", stacklevel=2)
        self.tlm = TLM(shared.tokenizer, copy.deepcopy(shared.model), copy.deepcopy(shared.meta),
                       shared.path) if finetune else shared
        self.task = task
        self.temperature, self.top_k, self.oversample = float(temperature), top_k, oversample
        self.finetune, self.best = finetune, best
        self.finetune_options = finetune_options or FINETUNE
        self.completions: Completions | None = None
        self._tuned_on: tuple[Digits, ...] = ()

    def next_batch(self, n: int) -> list[Digits]:
        if self.finetune:
            self._finetune()
        if self.completions is None:
            self.completions = Completions(self.space, self.visited, self.rng)
        samples = generate(self.tlm, self.task, n, self.completions, self.rng, temperature=self.temperature,
                           top_k=self.top_k, oversample=self.oversample)
        return self._take([s.digits for s in samples], n)

    def _finetune(self) -> None:
        """Train on the best measured configurations when they changed since the last time."""
        from .sentence import sentence
        from .train import fit
        ranked = sorted((c, d) for d, c in self.history if math.isfinite(c))
        # the fastest quarter, at most ``best``: after one batch only its winner (TLM fine-tunes on the
        # single best program per workload on the CPU, gen/make_dataset.py for_gen_best)
        chosen = tuple(d for _, d in ranked[:max(1, min(self.best, len(ranked) // 4))])
        if not chosen or chosen == self._tuned_on:
            return
        texts = [sentence(self.task, self.space.config(d)) for d in chosen]
        fit(self.tlm, texts, self.finetune_options, stage="tune", progress=False)
        self._tuned_on = chosen
