"""polytile for PyTorch models: kernels as torch operators, the ``torch.compile`` backend "polytile",
``explain`` and model-level tuning.

Importing this package registers the backend with dynamo::

    import polytile.torch
    compiled = torch.compile(model, backend="polytile", options={"records": "model.jsonl"})
    print(polytile.torch.explain(model, x))          # what polytile took, what it left to torch
    polytile.torch.tune(model, [x], trials=200, records="model.jsonl")
"""

from __future__ import annotations

from . import templates  # noqa: F401 - registers the tuning templates of imported groups
from .compiler import Options, backend, polytile_backend
from .customop import KernelCall, custom_op
from .explain import Report, explain
from .tuning import ModelTask, TuneReport, extract_tasks, tune


def _register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend
    if "polytile" not in _BACKENDS:
        register_backend(name="polytile")(polytile_backend)


_register()

__all__ = ["KernelCall", "ModelTask", "Options", "Report", "TuneReport", "backend", "custom_op", "explain",
           "extract_tasks", "polytile_backend", "tune"]
