"""Constrained decoding: the model writes a configuration one decision word at a time, each word drawn
only from the values that still complete to a valid configuration not measured before.

``Completions`` knows, for a prefix of decisions, whether the value just chosen has a *witness*:
a full configuration beginning with prefix + value that the space accepts (its template's constraints
and the target's resource limits, ``ConfigSpace.is_valid``) and that is not excluded. Decoding takes
only values with a witness, so it never reaches a dead end and every configuration it writes is valid
and new: validity by construction. (TLM generated freely and dropped invalid sentences afterwards,
``gen/gen_state.py``.)

A space of at most ``exhaustive_limit`` configurations is enumerated once, and the masks are exact.
In a larger one, witnesses come from a pool (valid configurations met so far, seeded by uniform
samples) and, for a value the pool does not cover, from a search: the value with the suffixes of
pool configurations grafted on, random completions, and every completion when few remain
(``subtree_limit``). A value whose search fails is left out for the rest of that call: decoding may
miss some valid configurations of a large space, never take an invalid one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..space import ConfigSpace

Digits = tuple[int, ...]


class Completions:
    """Witnessed values of a space's decisions, prefix by prefix, excluding configurations in ``exclude``
    (a set the caller keeps growing, e.g. a tuner's measured configurations)."""

    def __init__(self, space: ConfigSpace, exclude: Set[Digits], rng: np.random.Generator, *,
                 exhaustive_limit: int = 16384, subtree_limit: int = 64, tries: int = 6, pool: int = 64):
        self.space = space
        self.exclude = exclude
        self.rng = rng
        self.radix = [int(r) for r in space.radix]
        self.depth = len(self.radix)
        self.subtree = [math.prod(self.radix[k:]) for k in range(self.depth + 1)]
        self.subtree_limit, self.tries = subtree_limit, tries
        self.count: dict[Digits, int] = {}  # prefix -> witnesses below it that are not removed
        self.known: set[Digits] = set()
        self.pool: list[Digits] = []  # the witnesses, for grafting suffixes
        self.removed: set[Digits] = set()  # witnesses excluded or taken (no longer counted)
        self.failed: set[Digits] = set()  # prefixes whose search failed during this call
        self.exact = space.size <= exhaustive_limit
        if self.exact:
            for index in range(space.size):
                d = space.config_at(index).digits
                if space.is_valid(d):
                    self._add(d)
        else:
            for d in space.sample_valid(rng, pool, exclude):
                self._add(d)
        self.sync()

    def _add(self, d: Digits) -> None:
        if d in self.known:
            return
        self.known.add(d)
        self.pool.append(d)
        for k in range(self.depth + 1):
            self.count[d[:k]] = self.count.get(d[:k], 0) + 1

    def remove(self, d: Digits) -> None:
        """Stop offering configuration ``d`` (measured, or taken by this batch)."""
        if d in self.known and d not in self.removed:
            self.removed.add(d)
            for k in range(self.depth + 1):
                self.count[d[:k]] -= 1

    def restore(self, d: Digits) -> None:
        """Offer a removed configuration again (taken by a batch, then not used), unless excluded."""
        if d in self.removed and d not in self.exclude:
            self.removed.discard(d)
            for k in range(self.depth + 1):
                self.count[d[:k]] += 1

    def sync(self) -> None:
        """Remove the witnesses ``exclude`` gained since the last call; forget failed searches."""
        small, large = (self.known, self.exclude) if len(self.known) < len(self.exclude) else (self.exclude,
                                                                                               self.known)
        for d in [d for d in small if d in large]:
            self.remove(d)
        self.failed.clear()

    def _usable(self, d: Digits) -> bool:
        if d in self.known:
            return d not in self.removed
        if d in self.exclude or not self.space.is_valid(d):
            return False
        self._add(d)
        return True

    def _search(self, prefix: Digits) -> bool:
        """Find a witness below ``prefix``; remembered as failed when none is found."""
        if self.exact or prefix in self.failed:
            return False
        k = len(prefix)
        if self.subtree[k] <= self.subtree_limit:
            found = False
            for index in range(self.subtree[k]):
                tail = []
                for r in reversed(self.radix[k:]):
                    index, digit = divmod(index, r)
                    tail.append(digit)
                found = self._usable(prefix + tuple(reversed(tail))) or found
        else:
            found = False
            for t in range(self.tries):
                if t % 2 == 0 and self.pool:
                    donor = self.pool[int(self.rng.integers(len(self.pool)))]
                    tail = donor[k:]
                else:
                    tail = tuple(int(self.rng.integers(r)) for r in self.radix[k:])
                if self._usable(prefix + tail):
                    found = True
                    break
        if not found:
            self.failed.add(prefix)
        return found

    def has(self, prefix: Digits) -> bool:
        """Whether ``prefix`` (its last decision just chosen) completes to a witness."""
        return self.count.get(prefix, 0) > 0 or self._search(prefix)


@dataclass
class Sample:
    """A decoded configuration and its log-probability under the decoding distribution."""

    digits: Digits
    logprob: float


def decode(next_logits: Callable[[np.ndarray | None], np.ndarray], choice_ids: list[np.ndarray],
           completions: Completions, rows: int, rng: np.random.Generator, *, temperature: float = 1.0,
           top_k: int = 0, unk: int = 1) -> list[Sample]:
    """Decode ``rows`` configurations in parallel. ``next_logits(tokens)`` feeds the words chosen last
    (None at the start) and returns the next word's logits, one row per configuration; ``choice_ids``
    gives each decision's word id per choice ([UNK]'s probability is shared by the values outside the
    vocabulary).

    Each value is drawn from the model's distribution over the decision's values, restricted to those
    with a witness (and to the ``top_k`` likeliest of them): values are visited in the order of their
    log-probability plus Gumbel noise and the first with a witness is taken — an exact sample of the
    restricted distribution that looks up witnesses only for the values it visits. A sample's
    ``logprob`` is the model's, over each decision's values."""
    prefixes: list[Digits] = [() for _ in range(rows)]
    logprob = np.zeros(rows)
    tokens = None
    for ids in choice_ids:
        z = np.asarray(next_logits(tokens), dtype=np.float64)[:, ids] / max(temperature, 1e-6)
        unknown = ids == unk
        if unknown.sum() > 1:
            z[:, unknown] -= math.log(unknown.sum())
        z -= z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        tokens = np.empty(rows, dtype=np.int64)
        for r in range(rows):
            value = _draw(logp[r], prefixes[r], completions, rng, top_k)
            if value is None:  # only at the first decision: nothing valid and new is left
                return []
            prefixes[r] += (value,)
            logprob[r] += logp[r, value]
            tokens[r] = ids[value]
    return [Sample(d, float(lp)) for d, lp in zip(prefixes, logprob, strict=True)]


def _draw(logp: np.ndarray, prefix: Digits, completions: Completions, rng: np.random.Generator,
          top_k: int) -> int | None:
    """A value drawn from ``exp(logp)`` restricted to the witnessed values (the ``top_k`` likeliest)."""
    if 0 < top_k < len(logp):
        likeliest = []
        for v in np.argsort(-logp, kind="stable"):
            if completions.has(prefix + (int(v),)):
                likeliest.append(int(v))
                if len(likeliest) == top_k:
                    break
        if not likeliest:
            return None
        keys = logp[likeliest] + rng.gumbel(size=len(likeliest))
        return likeliest[int(np.argmax(keys))]
    for v in np.argsort(-(logp + rng.gumbel(size=len(logp)))):
        if completions.has(prefix + (int(v),)):
            return int(v)
    return None


def generate(tlm: Any, task: Any, n: int, completions: Completions, rng: np.random.Generator, *,
             temperature: float = 1.0, top_k: int = 0, oversample: int = 2, rounds: int = 5) -> list[Sample]:
    """Up to ``n`` distinct valid configurations of ``task`` that ``completions`` does not exclude, most
    likely first: ``oversample`` × n rows are decoded per round (the prompt once per row, then one
    word per decision with the model's key-value cache), for at most ``rounds`` rounds (as TLM's
    ``gen_state.py`` retries), and the ``n`` most likely of the distinct ones are kept."""
    import torch

    from .model import torch_threads
    tlm.check_task(task)
    prompt = tlm.prompt_ids(task)
    choice = tlm.choice_ids(task.space)
    model = tlm.model.eval()
    completions.sync()
    found: dict[Digits, Sample] = {}
    for _ in range(rounds):
        rows = (n - len(found)) * oversample
        if rows <= 0:
            break
        cache: dict[str, Any] = {}

        def next_logits(tokens: np.ndarray | None, rows: int = rows, cache: dict[str, Any] = cache) -> np.ndarray:
            # the cache is the second argument and the second output (without labels) in transformers 4
            # and 5 alike, whose keyword for it differs (past_key_values, cache)
            with torch.inference_mode():
                if tokens is None:  # the prompt, once, then its keys and values copied to every row
                    out = model(torch.tensor([prompt], device=tlm.device), None, use_cache=True)
                    out[1].batch_repeat_interleave(rows)
                    cache["kv"] = out[1]
                    return out[0][:, -1, :].float().cpu().numpy().repeat(rows, axis=0)
                out = model(torch.as_tensor(tokens, device=tlm.device)[:, None], cache["kv"], use_cache=True)
            cache["kv"] = out[1]
            return out[0][:, -1, :].float().cpu().numpy()

        with torch_threads(1 if tlm.device.type == "cpu" else None):  # small matrices: one thread is fastest
            samples = decode(next_logits, choice, completions, rows, rng, temperature=temperature, top_k=top_k,
                             unk=tlm.unk)
        if not samples:
            break
        for s in samples:
            if s.digits not in found:
                found[s.digits] = s
                completions.remove(s.digits)  # the next round writes other configurations
    ranked = sorted(found.values(), key=lambda s: -s.logprob)
    for s in ranked[n:]:
        completions.restore(s.digits)
    return ranked[:n]
