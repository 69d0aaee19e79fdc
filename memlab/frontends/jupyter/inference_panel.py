"""The widget panel's inference mode: one control per inference lever, Run and Largest batch, the live figure and a
table of every run. ``memlab.panel(model, batch, inference=True)`` returns an :class:`InferencePanel`.

* a control per setting of :class:`memlab.InferencePlan` (batch-size, weights, quantize, new-tokens, kv-cache),
  labelled with its name and with its help (what it does, what it costs) as its tooltip, and a memory budget;
* **Run** measures the setting under ``torch.inference_mode()`` on the live model (``memlab.compare`` with the live
  figure as its callback; the model is left bit-exact); **Largest batch** searches the largest batch of the
  setting within the budget (:func:`memlab.fit_inference`); **Clear** forgets the results;
* a one-line status, the live figure (stacking params, activations, kv_cache and other) and the table of runs.

There is nothing to apply: inference changes nothing on the model. Everything but Largest batch is the panel both
modes share, :class:`memlab.frontends.jupyter.panel_core.PanelCore`.
"""

from __future__ import annotations

from typing import cast

import ipywidgets as widgets
from torch import nn
from typing_extensions import Unpack

from memlab.errors import MemlabError
from memlab.frontends.jupyter.panel_core import PanelCore
from memlab.inference.fit import fit_inference
from memlab.inference.run import check_inference_options
from memlab.live.batch import Batch
from memlab.live.device import model_device
from memlab.options import RunOptions, TrialKeywords
from memlab.plan import InferencePlan
from memlab.report import INFERENCE_CATEGORIES, Trial, one_line

__all__ = ["InferencePanel"]


class InferencePanel(PanelCore):
    """The memlab widget panel in inference mode (see the module docstring).

    Args:
        model, batch: the live model and a batch (for generation, a dict with ``input_ids``).
        name: what messages call the model; by default its variable name in the IPython user namespace.
        min_interval_s: the least time between two redraws of the live figure during a run.
        options: :class:`~memlab.options.TrialKeywords` (``budget`` starts the budget field).

    Attributes:
        report: the Report of every run since the panel was built or cleared. controls: the input widgets by
        name (``batch_size``, ``weights``, ``quantize``, ``new_tokens``, ``kv_cache``, ``budget``). run_button,
        largest_button, clear_button: the buttons. status, table, figure: the message, the table, the LiveFigure.

    Example:
        >>> import torch
        >>> p = InferencePanel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)),
        ...                    torch.randn(4, 8), steps=1, noise=0)
        >>> p.controls["weights"].value = "bf16"
        >>> p.run_button.click()
        >>> [trial.label for trial in p.report], "(no budget set)" in p.status.value  # no budget: no "fits"
        (['bf16'], True)
    """

    plan_class = InferencePlan
    rows_lever = "batch_size"
    categories = INFERENCE_CATEGORIES
    rate_unit = "tokens/s"
    what = "an inference setting"

    def __init__(
        self,
        model: nn.Module,
        batch: Batch,
        *,
        name: str | None = None,
        min_interval_s: float = 0.25,
        **options: Unpack[TrialKeywords],
    ) -> None:
        run_options = RunOptions.from_keywords({**options, "progress": False})
        check_inference_options(run_options)
        self.largest_button = widgets.Button(
            description="Largest batch", icon="search",
            tooltip="Find the largest batch of this setting whose peak fits the budget",
        )
        super().__init__(model, batch, run_options, name=name, min_interval_s=min_interval_s)
        self.largest_button.on_click(lambda _: self.largest_batch())

    def plan(self) -> InferencePlan:
        """The setting the controls show (a clear MemlabError for an impossible one).

        Example:
            >>> import torch
            >>> InferencePanel(torch.nn.Linear(4, 2), torch.randn(2, 4)).plan().label()
            'fp32'
        """
        return cast(InferencePlan, super().plan())

    def largest_batch(self) -> Trial | None:
        """Search the largest batch of the setting within the budget (what Largest batch does); the largest trial
        that fits, or None (the status line says why).

        Example:
            >>> import torch
            >>> p = InferencePanel(torch.nn.Linear(4, 2), torch.randn(2, 4), steps=1, noise=0)
            >>> p.largest_batch() is None, "needs a budget" in p.status.value
            (True, True)
        """
        try:
            budget = self.budget()
        except MemlabError as error:
            self._say(f"Cannot run: {one_line(error, limit=None)}", "error")
            return None
        if budget is None and model_device(self.model).type != "cuda":
            self._say("Largest batch needs a budget: write one, such as 8GiB, in the budget field", "error")
            return None
        return self._measure(
            lambda plan, options: fit_inference(self.model, self.batch, plan.replace(batch_size=None), **options)
        )

    def _mode_buttons(self) -> list[widgets.Button]:
        return [self.largest_button]

    def _run_tooltip(self) -> str:
        return "Measure this setting on the live model under torch.inference_mode()"

    def _rate(self, trial: Trial) -> float | None:
        return trial.tokens_per_s
