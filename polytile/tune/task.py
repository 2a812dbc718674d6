"""Tuning tasks: a template applied to one workload (an operator at fixed sizes) on one target.

A workload is named by an operator of ``polytile.ops`` and its sizes (or given as a plain Func), so
that worker processes rebuild it from a small picklable description. The task defines the space by
running the template once in define mode, checks configurations cheaply in check mode, and builds
the schedule of a configuration in apply mode (see ``space``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import PolytileError
from ..target import CPUTarget, CUDATarget, as_target
from .space import ConfigSpace, InvalidConfig, TemplateConfig, TuneError, _StopTemplate

TemplateFn = Callable[..., Any]  # fn(cfg, op) -> Schedule
ModelFn = Callable[[Any, Any, dict[str, object]], float]  # model(op, target, values) -> predicted seconds
AppliesFn = Callable[[Any, Any], bool]  # applies(op, target) -> whether the template fits this workload


@dataclass(frozen=True)
class Template:
    """A schedule template: ``fn(cfg, op) -> Schedule`` for operator ``op`` on targets of ``kind``.

    ``model(op, target, values)``, when given, predicts a configuration's time in seconds without
    building it (the analytical tuners rank the space by it); ``applies(op, target)``, when given,
    says whether the template fits a workload (e.g. tensor cores need 16-bit operands)."""

    name: str
    op: str
    kind: str
    fn: TemplateFn
    model: ModelFn | None = None
    applies: AppliesFn | None = None

    def __call__(self, cfg: TemplateConfig, op: object) -> object:
        return self.fn(cfg, op)

    def __reduce__(self) -> tuple[object, ...]:
        # pickled by the module attribute the decorator left in place of the function
        return (_load_template, (self.fn.__module__, self.fn.__qualname__))


def _load_template(module: str, qualname: str) -> Template:
    import importlib
    obj: object = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, Template):
        raise TuneError(f"{module}.{qualname} is not a tuning template; define templates at module level")
    return obj


_TEMPLATES: dict[str, Template] = {}


def template(op: str, target: str = "cpu", name: str | None = None, *, model: ModelFn | None = None,
             applies: AppliesFn | None = None) -> Callable[[TemplateFn], Template]:
    """Register a schedule template for operator ``op`` on ``target`` ("cpu" or "cuda")::

        @polytile.tune.template("matmul", "cpu")
        def matmul_cpu(cfg, op): ...

    ``model(op, target, values) -> seconds`` gives the analytical tuners a prediction per
    configuration; ``applies(op, target) -> bool`` restricts the workloads the template is chosen
    for when no template is named. The function must be defined at module level (worker processes
    import it by name).
    """
    def register(fn: TemplateFn) -> Template:
        t = Template(name or fn.__name__, op, target, fn, model, applies)
        _TEMPLATES[t.name] = t
        return t
    return register


def _load_builtin_templates() -> None:
    from . import templates  # noqa: F401 - registers the built-in templates


def find_template(op: str, kind: str, name: str | None = None, instance: Callable[[], object] | None = None,
                  target: object = None) -> Template:
    """The template ``name``, or the first registered for ``op`` on targets of ``kind`` that applies to
    the operator ``instance()`` returns on ``target`` (when given; called only if a candidate asks)."""
    _load_builtin_templates()
    if name is not None:
        if name not in _TEMPLATES:
            raise TuneError(f"no tuning template named {name!r}; known: {', '.join(sorted(_TEMPLATES))}")
        return _TEMPLATES[name]
    candidates = [t for t in _TEMPLATES.values() if t.op == op and t.kind == kind]
    for t in candidates:
        if t.applies is None or instance is None or t.applies(instance(), target):
            return t
    if candidates:
        key = getattr(instance(), "key", op) if instance is not None else op
        raise TuneError(f"no tuning template for {op} on {kind} applies to {key} "
                        f"(templates {', '.join(t.name for t in candidates)} need other data types or "
                        "hardware); name one with template=... to force it")
    ops = sorted({t.op for t in _TEMPLATES.values() if t.kind == kind})
    raise TuneError(f"no tuning template for operator {op!r} on {kind}; templates exist for {', '.join(ops)} "
                    "(register one with @polytile.tune.template)")


def list_templates() -> list[Template]:
    _load_builtin_templates()
    return list(_TEMPLATES.values())


# --- workloads ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """An operator of ``polytile.ops`` at fixed sizes (``op`` and ``shape``), or a plain Func."""

    op: str
    shape: tuple[tuple[str, object], ...] = ()
    func: object | None = None  # a pt.Func when the workload is not a library operator

    @staticmethod
    def of(op_name: str, **shape: object) -> Workload:
        return Workload(op_name, tuple(sorted(shape.items())))

    def instantiate(self) -> Any:
        """The ``polytile.ops.Op`` object (for a Func: an Op whose reference is the default schedule)."""
        if self.func is not None:
            return _func_op(self.func)
        from .. import ops
        return ops.get(self.op, **dict(self.shape))

    def with_shape(self, shape: dict[str, object]) -> Workload:
        return Workload(self.op, tuple(sorted(shape.items())), self.func)

    @property
    def key(self) -> str:
        if self.func is not None:
            return f"func:{self.op}:{_func_fingerprint(self.func)}"
        return f"{self.op}(" + ",".join(f"{k}={v}" for k, v in self.shape) + ")"


def _func_fingerprint(func: object) -> str:
    import hashlib

    from ..lang.printer import expr_str
    parts = [func.name]  # type: ignore[attr-defined]
    for t in [*func.inputs, *func.computations]:  # type: ignore[attr-defined]
        body = expr_str(t.body) if hasattr(t, "body") else "input"
        if getattr(t, "epilogue", None) is not None:
            body += f" then {t.accumulated.name} -> {expr_str(t.epilogue)}"
        parts.append(f"{t.name}:{t.dtype.name}[{','.join(expr_str(d) for d in t.shape)}]={body}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def _func_op(func: Any) -> Any:
    """An operator wrapping a plain Func: random inputs for its placeholders, the default schedule as
    reference (differential testing against the unscheduled program)."""
    from ..build import build
    from ..ops import Op, random_array
    for t in func.inputs:
        if not all(isinstance(_const(d), int) for d in t.shape):
            raise TuneError(f"Func {func.name}: input {t.name} has symbolic sizes; tune a Func with "
                            "constant sizes (bind the parameters first)")
    shapes = [(tuple(_const(d) for d in t.shape), t.dtype.name) for t in func.inputs]
    cache: dict[str, object] = {}

    def reference(*arrays: np.ndarray) -> object:
        if "kernel" not in cache:
            cache["kernel"] = build(func, "cpu")
        return cache["kernel"](*arrays)  # type: ignore[operator]

    flops = 0.0
    return Op(func.name, {}, func, lambda rng: [random_array(rng, s, d) for s, d in shapes], reference,
              flops, 0.0, {}, tolerance=_func_tolerance(func))


def _func_tolerance(func: Any) -> float:
    """``dtypes.tolerance`` of the Func's outputs over its longest constant reduction (a schedule may
    sum in another order than the unscheduled reference)."""
    from ..dtypes import tolerance
    longest = 1
    for comp in func.computations:
        terms = 1
        for ax in comp.reduce_axes:
            lo, hi = _const(ax.lo), _const(ax.hi)
            terms *= hi - lo if lo is not None and hi is not None else 1
        longest = max(longest, terms)
    operands = func.inputs[0].dtype if func.inputs else None
    return max(tolerance(out.dtype, longest, operands) for out in func.outputs)


def _const(e: object) -> int | None:
    value = getattr(e, "value", None)
    return int(value) if isinstance(value, (int, np.integer)) else None


# --- tasks --------------------------------------------------------------------------------------------


@dataclass
class Task:
    """A template, a workload and a target: what one tuning run optimizes."""

    template: Template
    workload: Workload
    target: CPUTarget | CUDATarget
    _op: Any = field(default=None, repr=False, compare=False)
    _space: ConfigSpace | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, object]:
        return {"template": self.template, "workload": self.workload, "target": self.target}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    @property
    def op(self) -> Any:
        if self._op is None:
            self._op = self.workload.instantiate()
        return self._op

    @property
    def space(self) -> ConfigSpace:
        if self._space is None:
            cfg = TemplateConfig("define", self.target)
            try:
                self.template(cfg, self.op)
            except _StopTemplate:
                pass
            except PolytileError as err:
                raise TuneError(f"template {self.template.name} failed while defining its space on "
                                f"{self.workload.key}: {err}") from err
            if not cfg.decisions:
                raise TuneError(f"template {self.template.name} declares no decision; nothing to tune")
            self._space = ConfigSpace(cfg.decisions, self._check)
        return self._space

    def _check(self, values: dict[str, object]) -> str | None:
        cfg = TemplateConfig("check", self.target, values)
        try:
            self.template(cfg, self.op)
        except _StopTemplate:
            return None
        except InvalidConfig as err:
            return str(err)
        return None

    @property
    def key(self) -> str:
        """The workload key of records: template, operator sizes and the space's signature."""
        return f"{self.template.name}/{self.workload.key}/{self.space.signature}"

    @property
    def flops(self) -> float:
        return float(self.op.flops)

    @property
    def has_model(self) -> bool:
        return self.template.model is not None

    def predict(self, configs: Sequence[dict[str, object]]) -> np.ndarray:
        """The template's analytical prediction (seconds) of each configuration, given as values by
        decision name; TuneError when the template has no model."""
        model = self.template.model
        if model is None:
            raise TuneError(f"template {self.template.name} has no analytical model; the analytical tuners "
                            "need one (tune it with tuner='xgb', or register the template with model=...)")
        return np.array([model(self.op, self.target, dict(v)) for v in configs], dtype=np.float64)

    def schedule(self, values: dict[str, object], op: Any = None) -> Any:
        """The schedule of a configuration (given as values by decision name) on this workload, or on
        ``op`` (the same operator at other sizes)."""
        cfg = TemplateConfig("apply", self.target, dict(values))
        sched = self.template(cfg, op if op is not None else self.op)
        if sched is None:
            raise TuneError(f"template {self.template.name} returned no schedule; end it with `return s`")
        return sched


def make_task(op_or_func: object, target: object = "cpu", template: str | Template | None = None,
              **shape: object) -> Task:
    """A task from an operator name and sizes (``"matmul", M=512, …``), a ``polytile.ops.Op``, or a Func."""
    from ..lang.func import Func
    tgt = as_target(target)
    if isinstance(op_or_func, Func):
        workload = Workload(op_or_func.name, (), op_or_func)
        op_name = "func"
    elif isinstance(op_or_func, str):
        workload = Workload.of(op_or_func, **shape)
        op_name = op_or_func
    elif hasattr(op_or_func, "shape") and hasattr(op_or_func, "func") and hasattr(op_or_func, "name"):
        op_name = op_or_func.name  # type: ignore[attr-defined]
        sizes = {**op_or_func.shape, **_dtype_argument(op_or_func), **shape}  # type: ignore[attr-defined]
        workload = Workload.of(op_name, **sizes)
    else:
        raise TuneError(f"cannot tune {type(op_or_func).__name__}: pass an operator name with sizes, a "
                        "polytile.ops operator, or a pt.Func")
    loaded: list[object] = []

    def instance() -> object:
        if not loaded:
            loaded.append(workload.instantiate())
        return loaded[0]

    if isinstance(template, Template):
        tmpl = template
    else:
        tmpl = find_template(op_name, tgt.kind, template, instance, tgt)
    task = Task(tmpl, workload, tgt, loaded[0] if loaded else None)
    if workload.func is not None and tmpl.op != "func":
        raise TuneError(f"template {tmpl.name} is for operator {tmpl.op}, not a plain Func")
    return task


def _dtype_argument(op: Any) -> dict[str, object]:
    """``{"dtype": ...}`` when a library operator was made with another data type than its default
    (an operator's ``shape`` holds only its sizes)."""
    import inspect

    from .. import ops
    factory = ops.OPS.get(op.name)
    param = inspect.signature(factory).parameters.get("dtype") if factory is not None else None
    if param is None or not op.func.inputs:
        return {}
    dtype = op.func.inputs[0].dtype.name
    return {} if dtype == param.default else {"dtype": dtype}
