"""The auto-scheduler: search spaces from schedule templates, features, XGBoost cost models,
simulated annealing, the tensor language model (``tlm``), crash-proof measurement and resumable
tuning records (``pt.tune``)."""

import sys
import types

from .api import TuneResult, apply_best, tune, tune_task
from .measure import MeasureOptions, Measurer, MeasureResult
from .model import XGBModel, pairwise_accuracy
from .records import Record, RecordLog
from .search import (
    TUNERS,
    AnalyticalTuner,
    AnalyticalXGBTuner,
    GridTuner,
    ModelTuner,
    RandomTuner,
    Tuner,
    anneal,
    make_tuner,
)
from .space import Config, ConfigSpace, InvalidConfig, Knob, Reorder, Split, Tag, TemplateConfig, TuneError
from .task import Task, Template, Workload, find_template, list_templates, make_task, template
from .tlm.tuner import TLMTuner

TUNERS["tlm"] = TLMTuner  # defined in its package, which imports torch only when a model is loaded

__all__ = ["AnalyticalTuner", "AnalyticalXGBTuner", "Config", "ConfigSpace", "GridTuner", "InvalidConfig",
           "Knob", "MeasureOptions", "MeasureResult", "Measurer", "ModelTuner", "RandomTuner", "Record",
           "RecordLog", "Reorder", "Split", "TLMTuner", "Tag", "Task",
           "Template", "TemplateConfig", "TuneError", "TuneResult", "Tuner", "Workload", "XGBModel", "anneal",
           "apply_best", "find_template", "list_templates", "make_task", "make_tuner", "pairwise_accuracy",
           "template", "tune", "tune_task"]


class _CallableModule(types.ModuleType):
    """``pt.tune`` is both this package and the function: once ``polytile.tune`` is imported, Python
    binds the package to ``polytile.tune``, so the package itself must answer calls."""

    def __call__(self, *args: object, **kwargs: object) -> object:
        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
