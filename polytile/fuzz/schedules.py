"""Random schedule primitives with random arguments drawn from the schedule's current state, and the
snapshot that checks that a refused primitive left the schedule as it was (primitives are
transactional).

A primitive is produced as the text of its call (``s["T"].split("i", 3)``) and executed from
that text, so the calls a case records are exactly what ran.
"""

from __future__ import annotations

import dataclasses
import re
import traceback
from collections.abc import Callable

import numpy as np

from ..errors import PolytileError
from ..schedule.state import Schedule

FACTORS = (1, 2, 3, 4, 5, 7, 8, 16, 64)
FACTOR_WEIGHTS = (1, 6, 4, 5, 2, 2, 3, 2, 1)

PRIMITIVES = {
    "split": 8, "tile": 5, "reorder": 5, "fuse": 3, "skew": 2, "shift": 3, "reverse": 1.5, "apply_sch": 2,
    "separate": 2, "after": 9, "before": 3, "parallel": 4, "vectorize": 4, "unroll": 2, "serial": 0.3,
    "compute_inline": 2.5, "reassociate": 1.5, "cache": 3, "cache_identity": 3, "cache_write": 4, "store": 2,
    "store_at": 2, "set_loc": 1,
}
MEMORY = ("cache", "cache_identity", "cache_write", "store", "store_at")
FUSED_MEMORY_BOOST = 3.0
"""Once computations share loops, memory primitives on them are drawn this much more often: caches
and storage meeting fusion is where schedules go wrong most."""
FOLLOW_UP = 0.6
"""How often an accepted fusion is followed at once by a memory primitive of the fused pair."""
FUSION_FIRST = 0.2
"""How often a schedule starts by fusing a consumer into its producer's outer loop."""
CALL_COUNTS = tuple(range(11))
CALL_COUNT_WEIGHTS = (2, 4, 5, 5, 4, 3, 3, 2, 1.5, 1, 1)


def snapshot(s: Schedule) -> tuple:
    """Everything a primitive may change, as comparable values (functions by identity)."""
    return (_freeze(s.states), _freeze(s.caches), tuple(s.inlined), tuple(s.virtual), _freeze(s.pipelines),
            _freeze(s.pipeline_inflight), _freeze(s.pipeline_producer), tuple(s.stage_names()))


def _freeze(x: object) -> object:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__,) + tuple(_freeze(getattr(x, f.name)) for f in dataclasses.fields(x))
    if isinstance(x, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in x.items()))
    if isinstance(x, (set, frozenset)):
        return tuple(sorted(str(v) for v in x))
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(v) for v in x)
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if callable(x):
        return ("function", id(x))
    if hasattr(x, "rel") and hasattr(x, "names"):  # a LoopSchedule: its loops and its map
        return ("loops", tuple(x.names), str(x.rel))
    return (type(x).__name__, str(x))


@dataclasses.dataclass
class Applied:
    """How one call went: "accepted", "refused" (a PolytileError), "internal" (any other exception)
    or "non-transactional" (refused, but the schedule changed)."""

    outcome: str
    detail: str = ""


def apply(s: Schedule, text: str, namespace: dict) -> Applied:
    """Run the call ``text`` on schedule ``s`` (bound as ``s`` in ``namespace``)."""
    before = snapshot(s)
    try:
        exec(text, namespace)  # noqa: S102 - the fuzzer's own generated call
    except PolytileError as err:
        if snapshot(s) != before:
            return Applied("non-transactional", f"{type(err).__name__}: {err}"[:400])
        return Applied("refused", f"{type(err).__name__}: {str(err)[:300]}")
    except Exception as err:  # noqa: BLE001 - anything else escaping polytile is a finding
        return Applied("internal", describe(err))
    return Applied("accepted")


def describe(err: BaseException) -> str:
    """``Type: message (at the innermost polytile frame)``, for exceptions that escaped polytile."""
    frames = traceback.extract_tb(err.__traceback__)
    where = next((f"{f.filename.split('polytile/')[-1]}:{f.lineno} {f.name}" for f in reversed(frames)
                  if "polytile/" in f.filename and "/fuzz/" not in f.filename), "")
    return f"{type(err).__name__}: {str(err)[:400]}" + (f" (at {where})" if where else "")


class ScheduleGenerator:
    """Draws primitive calls for a schedule from ``rng``, each from the schedule's current state."""

    primitives = PRIMITIVES  # name -> weight of the primitives drawn

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.applies = 0
        self.fused: list[str] = []  # stages an accepted after/before put in a shared loop
        self.follow_up: list[str] = []  # calls to make next

    def pick(self, items, weights=None):  # noqa: ANN001, ANN201
        items = list(items)
        if weights is None:
            return items[int(self.rng.integers(len(items)))]
        w = np.asarray(weights, dtype=float)
        return items[int(self.rng.choice(len(items), p=w / w.sum()))]

    def count(self) -> int:
        return int(self.pick(CALL_COUNTS, CALL_COUNT_WEIGHTS))

    def call(self, s: Schedule) -> str:
        """The text of one primitive call on ``s`` (draws again where a primitive does not apply to
        the stage drawn, e.g. ``tile`` of a single loop)."""
        if self.follow_up:
            return self.follow_up.pop()
        fused = [n for n in self.fused if n in s.stage_names()]
        weights = {p: w * (FUSED_MEMORY_BOOST if fused and p in MEMORY else 1) for p, w in self.primitives.items()}
        while True:
            stage = self.pick(fused) if fused and self.rng.random() < 0.6 else self.pick(s.stage_names())
            prim = self.pick(list(weights), list(weights.values()))
            text = getattr(self, f"p_{prim}")(s, stage)
            if text is not None:
                return f's["{stage}"].{text}'

    def fusion(self, s: Schedule) -> str | None:
        """A consumer placed after one of its producers inside the producer's outer loop, if any."""
        pairs = [(c, p) for c in s.stage_names() for p in self.reads(s, c) if p in s.stage_names() and s[p].loops]
        if not pairs:
            return None
        consumer, producer = self.pick(pairs)
        return f's["{consumer}"].after(s["{producer}"], "{s[producer].loops[0]}")'

    def fused_with(self, s: Schedule, text: str) -> None:
        """After an accepted ``s["A"].after(s["B"], level)``: remember both, and now and then follow
        with a memory primitive of the pair at some level (inside, at or outside the shared loops):
        the consumer caching the producer, or either one writing through a cache or folded storage."""
        a, b = re.findall(r's\["(\w+)"\]', text)[:2]
        self.fused += [n for n in (a, b) if n not in self.fused]
        related = b in self.reads(s, a) or a in self.reads(s, b)
        if text.endswith(", None)") or not related or self.rng.random() >= FOLLOW_UP:
            return
        consumer, producer = (a, b) if b in self.reads(s, a) else (b, a)
        choices = [(consumer, f'cache_identity("{producer}", {self.level(s, consumer, 0.4)})'),
                   (consumer, f'cache("{producer}", {self.level(s, consumer, 0.4)})'),
                   (producer, f"cache_write({self.level(s, producer, 0.4)})"),
                   (consumer, f"cache_write({self.level(s, consumer, 0.4)})"),
                   (producer, f'store_at("{self.pick(s[producer].loops)}")' if s[producer].loops else None)]
        stage, call = self.pick([c for c in choices if c[1] is not None])
        self.follow_up.append(f's["{stage}"].{call}')

    # --- helpers ------------------------------------------------------------------------------------
    def loop(self, s: Schedule, stage: str) -> str | None:
        loops = s[stage].loops
        return self.pick(loops) if loops else None

    def adjacent(self, s: Schedule, stage: str) -> tuple[str, str] | None:
        loops = s[stage].loops
        if len(loops) < 2:
            return None
        p = int(self.rng.integers(len(loops) - 1))
        return loops[p], loops[p + 1]

    def factor(self) -> int:
        return int(self.pick(FACTORS, FACTOR_WEIGHTS))

    def level(self, s: Schedule, stage: str, none_weight: float = 0.25) -> str:
        loops = s[stage].loops
        if not loops or self.rng.random() < none_weight:
            return "None"
        return f'"{self.pick(loops)}"'

    def layout(self, n: int) -> str | None:
        """A storage layout over ``n`` indices: a permutation, or one index split into panels."""
        if n == 0:
            return None
        names = list("abcd")[:n]
        perm = list(self.rng.permutation(n))
        out = [names[p] for p in perm]
        if self.rng.random() < 0.35:
            k = int(self.rng.integers(n))
            f = int(self.pick([2, 4]))
            v = out[k]
            out = out[:k] + [f"{v} // {f}"] + out[k + 1:] + [f"{v} % {f}"]
        body = ", ".join(out) + ("," if len(out) == 1 else "")
        return f"lambda {', '.join(names)}: ({body})"

    def reads(self, s: Schedule, stage: str) -> list[str]:
        from ..lang.expr import Load, walk
        names = {t.name for t in s.computation(stage).inputs()}
        names |= {n.tensor.name for n in walk(s.bodies[stage]) if isinstance(n, Load)}
        return sorted(names)

    def ndim_of(self, s: Schedule, name: str) -> int:
        return s.func.tensor(name).ndim

    # --- loop primitives ----------------------------------------------------------------------------
    def p_split(self, s: Schedule, stage: str) -> str | None:
        loop = self.loop(s, stage)
        return None if loop is None else f'split("{loop}", {self.factor()})'

    def p_tile(self, s: Schedule, stage: str) -> str | None:
        pair = self.adjacent(s, stage)
        return None if pair is None else f'tile("{pair[0]}", "{pair[1]}", {self.factor()}, {self.factor()})'

    def p_reorder(self, s: Schedule, stage: str) -> str | None:
        loops = s[stage].loops
        if len(loops) < 2:
            return None
        k = int(self.rng.integers(2, min(len(loops), 4) + 1))
        chosen = [loops[i] for i in self.rng.choice(len(loops), size=k, replace=False)]
        quoted = ", ".join(f'"{x}"' for x in chosen)
        return f"reorder({quoted})"

    def p_fuse(self, s: Schedule, stage: str) -> str | None:
        pair = self.adjacent(s, stage)
        return None if pair is None else f'fuse("{pair[0]}", "{pair[1]}")'

    def p_skew(self, s: Schedule, stage: str) -> str | None:
        loops = s[stage].loops
        if len(loops) < 2:
            return None
        p, q = sorted(int(x) for x in self.rng.choice(len(loops), size=2, replace=False))
        return f'skew("{loops[p]}", "{loops[q]}", {int(self.pick([1, 1, 2, -1]))})'

    def p_shift(self, s: Schedule, stage: str) -> str | None:
        loop = self.loop(s, stage)
        return None if loop is None else f'shift("{loop}", {int(self.pick([-3, -2, -1, 1, 2, 3]))})'

    def p_reverse(self, s: Schedule, stage: str) -> str | None:
        loop = self.loop(s, stage)
        return None if loop is None else f'reverse("{loop}")'

    def p_apply_sch(self, s: Schedule, stage: str) -> str | None:
        n = len(s[stage].loops)
        if n == 0 or n > 6:
            return None
        m = np.eye(n, dtype=int)
        for _ in range(int(self.rng.integers(1, 4))):
            move = self.pick(["swap", "add", "negate", "scale"], [3, 4, 1, 0.5])
            i, j = (int(x) for x in self.rng.choice(n, size=2, replace=n < 2))
            if move == "swap":
                m[[i, j]] = m[[j, i]]
            elif move == "add" and i != j:
                m[i] += int(self.pick([1, -1, 2])) * m[j]
            elif move == "negate":
                m[i] = -m[i]
            elif move == "scale":
                m[i] *= 2
        xs = [f"x{k}" for k in range(n)]
        outs = [_affine_text(row, xs) for row in m]
        self.applies += 1
        names = ", ".join(f'"t{self.applies}_{k}"' for k in range(n))
        return f'apply_sch("{{ [{", ".join(xs)}] -> [{", ".join(outs)}] }}", [{names}])'

    def p_separate(self, s: Schedule, stage: str) -> str | None:
        loop = self.loop(s, stage)
        return None if loop is None else f'separate("{loop}")'

    # --- ordering -----------------------------------------------------------------------------------
    def _place(self, s: Schedule, stage: str, how: str) -> str | None:
        """``after``/``before`` another stage, mostly the producer (consumer) it could fuse with, at
        mostly an outer loop of it."""
        others = [n for n in s.stage_names() if n != stage]
        if not others:
            return None
        related = [n for n in others if (n in self.reads(s, stage)) == (how == "after")
                   and (how == "after" or stage in self.reads(s, n))]
        other = self.pick(related) if related and self.rng.random() < 0.75 else self.pick(others)
        loops = s[other].loops
        if not loops or self.rng.random() < 0.15:
            return f'{how}(s["{other}"], None)'
        depth = min(len(loops) - 1, int(self.pick([0, 0, 1, 1, 2, 3])))
        return f'{how}(s["{other}"], "{loops[depth]}")'

    def p_after(self, s: Schedule, stage: str) -> str | None:
        return self._place(s, stage, "after")

    def p_before(self, s: Schedule, stage: str) -> str | None:
        return self._place(s, stage, "before")

    # --- tags ---------------------------------------------------------------------------------------
    def _tag(self, s: Schedule, stage: str, how: str) -> str | None:
        loop = self.loop(s, stage)
        return None if loop is None else f'{how}("{loop}")'

    def p_parallel(self, s: Schedule, stage: str) -> str | None:
        return self._tag(s, stage, "parallel")

    def p_vectorize(self, s: Schedule, stage: str) -> str | None:
        return self._tag(s, stage, "vectorize")

    def p_unroll(self, s: Schedule, stage: str) -> str | None:
        return self._tag(s, stage, "unroll")

    def p_serial(self, s: Schedule, stage: str) -> str | None:
        loop = self.loop(s, stage)
        return None if loop is None else f'tag("{loop}", "serial")'

    # --- whole computations -------------------------------------------------------------------------
    def p_compute_inline(self, s: Schedule, stage: str) -> str | None:
        comp = s.computation(stage)
        inlinable = comp.reduction is None and comp.where is None and all(o is not comp for o in s.func.outputs)
        return "compute_inline()" if inlinable or self.rng.random() < 0.2 else None

    def p_reassociate(self, s: Schedule, stage: str) -> str | None:
        return "reassociate()" if s.computation(stage).reduction is not None else None

    # --- memory -------------------------------------------------------------------------------------
    def read_tensor(self, s: Schedule, stage: str) -> str | None:
        """A tensor the stage reads, mostly one computed by another stage (where fusion matters)."""
        reads = self.reads(s, stage)
        computed = [t for t in reads if t in s.stage_names()]
        if computed and self.rng.random() < 0.5:
            return self.pick(computed)
        return self.pick(reads) if reads else None

    def p_cache(self, s: Schedule, stage: str) -> str | None:
        t = self.read_tensor(s, stage)
        if t is None:
            return None
        layout = self.layout(self.ndim_of(s, t))
        extra = f", layout={layout}" if layout else ""
        return f'cache("{t}", {self.level(s, stage)}{extra})'

    def p_cache_identity(self, s: Schedule, stage: str) -> str | None:
        t = self.read_tensor(s, stage)
        if t is None:
            return None
        loc = self.pick(["", ', loc="stack"', ', loc="heap"'], [6, 1, 1])
        return f'cache_identity("{t}", {self.level(s, stage)}{loc})'

    def p_cache_write(self, s: Schedule, stage: str) -> str | None:
        extra = ""
        if self.rng.random() < 0.2:
            layout = self.layout(self.ndim_of(s, stage))
            extra = f", layout={layout}" if layout else ""
        return f"cache_write({self.level(s, stage)}{extra})"

    def p_store(self, s: Schedule, stage: str) -> str | None:
        layout = self.layout(self.ndim_of(s, stage))
        return None if layout is None else f"store({layout})"

    def p_store_at(self, s: Schedule, stage: str) -> str | None:
        loop = self.loop(s, stage)
        return None if loop is None else f'store_at("{loop}")'

    def p_set_loc(self, s: Schedule, stage: str) -> str | None:
        return f'set_loc("{self.pick(["heap", "stack", "auto"])}")'


def _affine_text(row: np.ndarray, xs: list[str]) -> str:
    parts = []
    for c, x in zip(row, xs):
        c = int(c)
        if c == 0:
            continue
        term = x if abs(c) == 1 else f"{abs(c)}*{x}"
        parts.append(("- " if c < 0 else "+ ") + term)
    text = " ".join(parts) or "0"
    return text[2:] if text.startswith("+ ") else "-" + text[2:] if text.startswith("- ") else text


def generate_calls(rng: np.random.Generator, s: Schedule, namespace: dict,
                   on_call: Callable[[str, Applied], bool]) -> None:
    """Draw and apply a random number of calls to ``s``; ``on_call`` sees each and returns False
    to stop (after an internal error)."""
    gen = ScheduleGenerator(rng)
    left = gen.count()
    first = gen.fusion(s) if left and rng.random() < FUSION_FIRST else None
    if first is not None:
        gen.follow_up.append(first)
    while left > 0 or gen.follow_up:
        left -= not gen.follow_up  # a follow-up does not use up a draw
        text = gen.call(s)
        applied = apply(s, text, namespace)
        if not on_call(text, applied):
            return
        if applied.outcome == "accepted" and (".after(" in text or ".before(" in text):
            gen.fused_with(s, text)
