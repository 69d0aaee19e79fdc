"""memlab: fit training into GPU memory, interactively, on the model already in your kernel.

Example:
    >>> import memlab, torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    >>> trial = memlab.measure(model, torch.randn(4, 8), memlab.Plan(), loss_fn=lambda m, b: m(b).mean())
    >>> trial.status
    'ok'

Inference is a mode of the same entry points: ``memlab.measure(model, batch, memlab.InferencePlan(...))`` (see
:mod:`memlab.inference`).
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from memlab.live.compat import check_stack

check_stack()  # a stack older than memlab's floors is said here, once, before any module that needs newer releases

from memlab.errors import MemlabError, UnsupportedTechnique  # noqa: E402  (errors.py imports nothing else)
from memlab.seams import provide  # noqa: E402  (seams.py imports nothing)


def _plan_exports() -> PlanExports:
    import memlab.export as exports

    return exports  # the module as the protocol: mypy checks each function the Plan calls against the export's own


def _trainer_kinds() -> tuple[TrainerKind, ...]:
    from memlab.kinds import KINDS

    return KINDS


# The package stands above every layer, so it is the one place that says which module provides a seam: the Plan's
# to_*/from_* ask for "plan exports" (memlab.plan.PLAN_EXPORTS: memlab/export/ builds on the Plan and is imported on
# the first export), and memlab.live.trainer_kinds.kind_of asks for "trainer kinds" (TRAINER_KINDS: memlab/kinds/
# lists them, above the runner and the estimation their hooks call, imported on the first lookup). Each loader
# returns its seam's type (tests/test_layout.py checks it), which mypy holds what it returns to.
provide("plan exports", _plan_exports)
provide("trainer kinds", _trainer_kinds)

if TYPE_CHECKING:
    from memlab.estimation import estimate
    from memlab.estimation.cuda.gpus import gpu_kind
    from memlab.estimation.dryrun.load import model_on_meta
    from memlab.frontends.jupyter.panel import Panel
    from memlab.inference import InferencePlan, fit_inference, kv_cache_bytes
    from memlab.live.trainer_kinds import TrainerKind
    from memlab.plan import Plan, PlanExports, parse_budget
    from memlab.report import InferenceTrial, Report, Trial
    from memlab.runner.apply import Applied, apply
    from memlab.runner.trial import compare, measure
    from memlab.search import fit
    from memlab.search.limits import Limits, limits
    from memlab.techniques.vllm import VLLMServer
    from memlab.trainer.meta import trainer_on_meta

_EXPORTS = {  # the names ``import memlab`` gives, each imported on first use (torch only then: the CLI starts fast)
    "estimate": "memlab.estimation", "gpu_kind": "memlab.estimation.cuda.gpus", "Plan": "memlab.plan",
    "parse_budget": "memlab.plan", "InferenceTrial": "memlab.report", "Report": "memlab.report",
    "Trial": "memlab.report", "Applied": "memlab.runner.apply", "apply": "memlab.runner.apply",
    "compare": "memlab.runner.trial", "measure": "memlab.runner.trial", "fit": "memlab.search",
    "Limits": "memlab.search.limits", "limits": "memlab.search.limits", "InferencePlan": "memlab.inference",
    "fit_inference": "memlab.inference", "kv_cache_bytes": "memlab.inference",
    "trainer_on_meta": "memlab.trainer.meta", "model_on_meta": "memlab.estimation.dryrun.load",
    "VLLMServer": "memlab.techniques.vllm",
}


class _Package(types.ModuleType):
    """memlab itself: an exported name stays what it is when a submodule of the same name is imported
    (``memlab.measure`` the function, beside the package ``memlab/measure/``), as when every name was imported
    eagerly, the export last.

    Why it stays (issue 87 asked): Python's import system sets each submodule on its parent package with
    ``setattr`` once the submodule has run (``importlib._bootstrap._find_and_load_unlocked``), so without this class
    ``import memlab.measure.tracker``, made before the first ``memlab.measure``, leaves ``memlab.measure`` the package
    and ``memlab.measure(model, ...)`` a TypeError; a module's own ``__getattr__`` is asked only for a name it lacks,
    and only its class's ``__setattr__`` sees that assignment. Both names are the contract (DESIGN.md section 2:
    ``memlab.measure(...)``; section 4: the ``measure/`` package, which every layer imports): only renaming the
    package would let this class go."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    """An exported name (:data:`_EXPORTS`), or a subpackage (``memlab.report``), imported on first use."""
    import importlib

    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__version__ = "0.1.0"

__all__ = [
    "Applied",
    "InferencePlan",
    "InferenceTrial",
    "Limits",
    "MemlabError",
    "Plan",
    "Report",
    "Trial",
    "UnsupportedTechnique",
    "VLLMServer",
    "apply",
    "compare",
    "estimate",
    "fit",
    "fit_inference",
    "gpu_kind",
    "kv_cache_bytes",
    "limits",
    "load_ipython_extension",
    "measure",
    "model_on_meta",
    "panel",
    "parse_budget",
    "trainer_on_meta",
    "unload_ipython_extension",
    "watch",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext memlab``: registers ``%%memfit``. IPython is imported only here, never by ``import memlab``."""
    from memlab.frontends.jupyter.magic import load_ipython_extension as load

    load(ipython)


def watch(trainer: Any, budget: int | str | None = None, *, show: bool | None = None) -> Any:
    """Watch the memory of every step of ``trainer.train()``: a callback records each step's peak, time and example
    lengths, warns once near ``budget``, and logs ``memory/*`` into the trainer's logs. Returns the
    :class:`memlab.trainer.Watch` (``peak_bytes``, ``peak_step``, ``peak_lengths``, ``timeline``: the costliest step's
    memory over time, ``to_dataframe()``, ``remove()``). transformers' Trainer is imported only here.

    In a notebook (IPython with a kernel, or ``show=True``) the training cell also shows a live figure, samples/s
    and memory per step with the budget line, redrawn every ``logging_steps`` steps and left as a static figure
    when training ends, with the costliest step's timeline below it (:mod:`memlab.frontends.jupyter.watch_figure`);
    ``show=False`` never draws.

    Example (a tiny trainer: ``tests/trainer/test_trainer.py`` builds one)::

        watched = memlab.watch(trainer, budget="24GiB")
        trainer.train()
        watched.peak_bytes, watched.peak_step
    """
    from memlab.trainer.watch import watch as start

    watched = start(trainer, budget=budget)
    if show is None:
        show = _in_a_kernel()
    if show:
        from memlab.frontends.jupyter.watch_figure import show_watch

        show_watch(watched)
    return watched


def _in_a_kernel() -> bool:
    """Whether IPython runs with a kernel that draws widgets (the magic's test); IPython is imported only where it
    already is."""
    import sys

    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext memlab`` (and so ``%reload_ext memlab``)."""
    from memlab.frontends.jupyter.magic import unload_ipython_extension as unload

    unload(ipython)


def panel(
    model: Any, batch: Any = None, loss_fn: Any = None, *, inference: bool = False, **keywords: Any
) -> Panel | Any:
    """The widget panel on the live model: a control per technique, Run, Apply/Undo, the live figure, every run.

    ``model`` may be a ``transformers.Trainer`` (TRL's too), the batch then optional (its train dataset's worst batch):
    Apply puts the setting on the trainer (``memlab.apply(trainer, plan)``), Undo gives the trainer back.

    ipywidgets and plotly are imported here, on first use, never by ``import memlab``. ``inference=True`` gives
    the inference mode (:class:`memlab.frontends.jupyter.inference_panel.InferencePanel`): a control per setting of
    :class:`memlab.InferencePlan`, Run and Largest batch.

    Example:
        >>> import memlab, torch
        >>> p = memlab.panel(torch.nn.Linear(4, 1), torch.randn(8, 4), loss_fn=lambda m, b: m(b).mean(), steps=1)
        >>> p.run_button.click(); len(p.report)
        1
    """
    from memlab.errors import refuse_class

    refuse_class(model, "panel")
    if inference:
        if loss_fn is not None:
            raise MemlabError("loss_fn is for training, and the inference panel runs the model's forward; drop it")
        from memlab.frontends.jupyter.inference_panel import InferencePanel

        return InferencePanel(model, batch, **keywords)
    from memlab.frontends.jupyter.panel import panel as make_panel

    return make_panel(model, batch, loss_fn, **keywords)
