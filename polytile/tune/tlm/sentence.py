"""Tensor sentences: a tuning task's prompt and a configuration's decisions as words, and back.

A sentence is ``<prompt> [SEP] <decisions>``. The prompt names what is scheduled and where: the
template, the operator (or the structure of a plain Func), its sizes, its data types and the
target's facts (CPU cores and vector width; GPU architecture and SM count). The decisions follow in
the order the template declares them, one word each, ``name=value`` (``bm=128``, ``stages=4``,
``outer_order=jc.kc.ic``, ``tile_k=8``). Everything is derived from the space a template declares
(``ConfigSpace.decisions``), never from a list per template, so a knob added to a template appears in
its sentences without further work.

Values are written by kind: a split by its inner extents (``4x8``; the outer one follows from the
loop's extent, so the word means the same tile for every workload), a reorder by its loop names
joined with dots, booleans as ``true``/``false``, tuples joined with dots, other values as text with
whitespace replaced. Reading a sentence back looks each word up among the decision's own choices, so
configuration → sentence → configuration is the identity.

Sizes are words too: up to 16 exactly (``R=3``, ``stride=2``), above by their base-2 logarithm in
half steps (``M~9`` for 512, ``K~11.5`` for 3072), so that an unseen size still reads as a known word.
Following TLM (Zhai et al., OSDI'24, ``gen/make_dataset.py``: the compute DAG and the schedule's steps
flattened to whitespace-separated words), but with one word per decision instead of the JSON of
Ansor's steps.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..space import Config, ConfigSpace, Decision, Split, TuneError, Value

SEP = "[SEP]"
EXACT_LIMIT = 16  # sizes up to this are written exactly; larger ones by log2 in half steps
LOG_LIMIT = 32.0  # the largest log2 bucket in the vocabulary's size grid


def size_word(key: str, value: int) -> str:
    """The word of a size: ``R=3`` up to ``EXACT_LIMIT``, else ``M~<log2 rounded to a half>``."""
    if value <= EXACT_LIMIT:
        return f"{key}={value}"
    return f"{key}~{round(2 * math.log2(value)) / 2:g}"


def size_grid(key: str) -> list[str]:
    """Every word ``size_word`` can write for ``key`` (the vocabulary holds them all)."""
    exact = [f"{key}={v}" for v in range(EXACT_LIMIT + 1)]
    first = round(2 * math.log2(EXACT_LIMIT + 1)) / 2
    steps = int(2 * (LOG_LIMIT - first)) + 1
    return exact + [f"{key}~{first + k / 2:g}" for k in range(steps)]


def size_key(word: str) -> str | None:
    """The key of a size word (``M`` of ``M~9`` or ``R=3``), None for any other word."""
    if "~" in word:
        return word.split("~", 1)[0]
    key, sep, value = word.partition("=")
    return key if sep and value.isdigit() else None


# --- decision values ----------------------------------------------------------------------------------


def value_text(value: Value) -> str:
    """A decision value as one whitespace-free word."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ".".join(value_text(v) for v in value)
    return "_".join(str(value).split()) or "_"


def choice_text(decision: Decision, value: Value) -> str:
    """A value of ``decision`` as written in sentences (a split by its inner extents)."""
    if isinstance(decision, Split):
        return "x".join(str(v) for v in value[1:]) or "1"  # type: ignore[index]
    return value_text(value)


@dataclass(frozen=True)
class DecisionWords:
    """The words of one decision's choices, in choice order, and the choice of each word."""

    name: str
    words: tuple[str, ...]

    def digit(self, word: str) -> int:
        try:
            return self.words.index(word)
        except ValueError:
            values = ", ".join(w.split("=", 1)[1] for w in self.words)
            raise TuneError(f"sentence word {word!r} is not a choice of decision {self.name!r} "
                            f"(its choices: {values})") from None


def decision_words(space: ConfigSpace) -> list[DecisionWords]:
    """The words of every decision of ``space``, in declaration order. TuneError when a decision's name
    cannot be a word or two of its choices would be written alike."""
    out = []
    for d in space.decisions:
        if not d.name or any(c.isspace() for c in d.name) or "=" in d.name or "~" in d.name:
            raise TuneError(f"decision name {d.name!r} cannot be written in a tensor sentence; use a name "
                            "without whitespace, '=' or '~'")
        words = tuple(f"{d.name}={choice_text(d, c)}" for c in d.choices)
        if len(set(words)) != len(words):
            seen: dict[str, Value] = {}
            for w, c in zip(words, d.choices, strict=True):
                if w in seen:
                    raise TuneError(f"decision {d.name!r}: choices {seen[w]!r} and {c!r} are both written "
                                    f"{w!r}; give them distinct values")
                seen[w] = c
        out.append(DecisionWords(d.name, words))
    return out


def config_words(space: ConfigSpace, config: Config | dict[str, object]) -> list[str]:
    """The decision words of a configuration (a ``Config`` or values by decision name, e.g. from JSON)."""
    cfg = config if isinstance(config, Config) else space.from_values(config)
    return [dw.words[k] for dw, k in zip(decision_words(space), cfg.digits, strict=True)]


def words_config(space: ConfigSpace, words: Sequence[str]) -> Config:
    """The configuration a sequence of decision words describes (TuneError naming a wrong word)."""
    names = decision_words(space)
    if len(words) != len(names):
        raise TuneError(f"a sentence of this space has {len(names)} decision words "
                        f"({', '.join(n.name for n in names)}), got {len(words)}")
    digits = []
    for dw, word in zip(names, words, strict=True):
        if word.split("=", 1)[0] != dw.name:
            raise TuneError(f"sentence word {word!r} is where decision {dw.name!r} belongs")
        digits.append(dw.digit(word))
    return space.config(digits)


# --- prompts -------------------------------------------------------------------------------------------


def prompt_words(task: Any) -> list[str]:
    """The prompt of a task: template, operator or Func structure, sizes, data types, target facts."""
    op = task.op
    words = [f"template={task.template.name}", f"target={task.target.kind}"]
    words += target_words(task.target)
    func = op.func
    words.append("in=" + ".".join(sorted({t.dtype.name for t in func.inputs})) if func.inputs else "in=none")
    words.append("out=" + ".".join(t.dtype.name for t in func.outputs))
    if task.workload.func is not None:
        return words + ["op=func"] + func_words(func)
    words.append(f"op={op.name}")
    for key, value in sorted(op.shape.items()):
        words.append(size_word(key, int(value)) if _is_int(value) else f"{key}={value_text(value)}")
    for key, value in sorted(dict(task.workload.shape).items()):
        if key not in op.shape and key != "dtype":  # options such as dense's activation
            words.append(f"{key}={value_text(value)}")
    return words


def target_words(target: Any) -> list[str]:
    """The target's facts that decide a good schedule."""
    if target.kind == "cpu":
        return [size_word("cores", max(1, int(target.cores))), f"vector={target.vector_bits}b"]
    return [f"arch={target.arch}", size_word("sms", int(target.sms))]


def func_words(func: Any, limit: int = 4) -> list[str]:
    """The structure of a plain Func: per computation (the last ``limit``), its data and reduction
    extents and the kinds of operations in its body — never the user's names."""
    comps = list(func.computations)
    words = [size_word("computations", len(comps))]
    for k, comp in enumerate(comps[-limit:]):
        words += [size_word(f"c{k}.d{j}", _extent(d)) for j, d in enumerate(comp.shape)]
        for j, ax in enumerate(comp.reduce_axes):
            words.append(size_word(f"c{k}.r{j}", max(0, _extent(ax.hi) - _extent(ax.lo))))
        words += [f"c{k}.{kind}" for kind in sorted(_expr_kinds(comp.body))]
    return words


def _extent(e: object) -> int:
    value = getattr(e, "value", None)
    return int(value) if _is_int(value) else 0


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _expr_kinds(expr: object) -> set[str]:
    """The operations in an expression: node kinds with their operator (``BinOp*``, ``Reduce:sum``)."""
    from ...lang.expr import Expr
    kinds: set[str] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if not isinstance(node, Expr):
            continue
        name = type(node).__name__
        op = getattr(node, "name", None) if name == "Call" else getattr(node, "op", None)
        if name not in ("Var", "IterVar", "Param", "Const"):
            kinds.add(f"{name}:{op}" if isinstance(op, str) else name)
        for slot in _slots(type(node)):
            child = getattr(node, slot, None)
            if isinstance(child, Expr):
                stack.append(child)
            elif isinstance(child, tuple):
                stack += [c for c in child if isinstance(c, Expr)]
    return kinds


def _slots(cls: type) -> list[str]:
    return [s for c in cls.__mro__ for s in getattr(c, "__slots__", ()) if s not in ("dtype", "tensor")]


# --- whole sentences ------------------------------------------------------------------------------------


def sentence(task: Any, config: Config | dict[str, object]) -> str:
    """The tensor sentence of a configuration of ``task``: ``<prompt> [SEP] <decisions>``."""
    return " ".join([*prompt_words(task), SEP, *config_words(task.space, config)])


def split_sentence(text: str) -> tuple[list[str], list[str]]:
    """The prompt words and decision words of a sentence (TuneError without exactly one separator)."""
    words = text.split()
    if words.count(SEP) != 1:
        excerpt = text if len(text) <= 80 else text[:77] + "..."
        raise TuneError(f"not a tensor sentence (needs one {SEP} between prompt and decisions): {excerpt!r}")
    k = words.index(SEP)
    return words[:k], words[k + 1:]


def read_sentence(task: Any, text: str) -> Config:
    """The configuration of ``task`` a sentence describes; TuneError when its prompt is another task's."""
    prompt, decisions = split_sentence(text)
    expected = prompt_words(task)
    if prompt != expected:
        raise TuneError(f"the sentence's prompt ({' '.join(prompt)}) is not that of {task.workload.key} on "
                        f"{task.target.key} ({' '.join(expected)})")
    return words_config(task.space, decisions)
