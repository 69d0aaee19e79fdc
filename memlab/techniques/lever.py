"""The declaration of one lever (:class:`Lever`): what it means in the interface, the step, the search, dry runs
and each export. :mod:`memlab.techniques.registry` gathers the declarations into ``REGISTRY``.

This module imports neither torch nor :mod:`memlab.plan` (plan builds on it); the techniques it names do.

Example:
    >>> Lever("spin", False, help="spins: faster").type
    'bool'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memlab.techniques.technique import Technique

from memlab.techniques.fragments import TARGETS as TARGETS  # re-exported: the declarations import them here
from memlab.techniques.fragments import Export, refusal_of
from memlab.techniques.fragments import carried as carried
from memlab.techniques.fragments import concerns_adapters_only as concerns_adapters_only

PlanLike = Any
"""A :class:`memlab.Plan` (typed loosely here: plan builds on this module)."""

Refusal = Export
"""An export's declaration for one lever (:data:`memlab.techniques.fragments.Export`): the fragment it adds, where
the lever goes instead (:class:`~memlab.techniques.fragments.Elsewhere`), or what to write instead (a ``str``)."""


@dataclass(frozen=True)
class Lever:
    """One lever's declaration (see the module docstring).

    Args:
        name: the Plan field.
        default: the value that changes nothing.
        help: what it does and what it costs (the panel's tooltip, the magic's help).
        short: how a label shows a value other than the default (a format string; for a bool the text shown
            when True); empty: :meth:`memlab.Plan.label` has its own rule.
        choices: the allowed values of a text lever.
        open_choices: besides ``choices``, a tuple of names is allowed (``lora_targets``).
        split: the lever cuts the batch (micro_batch, accumulation) rather than being a technique axis.
        technique: the :class:`memlab.techniques.technique.Technique` that puts the lever on a model and a step and
            takes it off again, says the lever's notes and what a dry run makes of it. Levers that are settings of
            one technique share it (``lora_rank`` is the adapter's). The step puts the techniques on in
            :data:`memlab.techniques.registry.STEP_ORDER`.
        conflicts: why a plan cannot have the lever's value together with its other settings (one sentence saying
            what to write), ``""`` when it can; it reads the plan's fields only, so the search can ask it of a
            combination before building the plan. None: the lever goes with every setting.
        none_means: what None stands for, where the lever is a count whose default is None ("all of the batch's
            rows"), said in the message that refuses a bad value.
        applies: whether the lever means anything in a plan (its other fields); where it does not, the plan holds
            the lever's default, so that grids hold no duplicate plans. None: it always does.
        from_peft: the lever's value read from a user's peft ``LoraConfig`` (what a peft model the user wrapped
            trains with), or None where peft's config does not say it.
        needs_at_least: ``(mine, theirs) -> bool``: whether a plan with ``mine`` needs at least the memory of the
            same plan with ``theirs``, whatever the model. None (the default): values compare only with themselves.
        slower: ``(value, instead)`` pairs: the plan with ``value`` does the work of the one with ``instead`` and
            more, so it is never faster.
        family: the lever decides the model's own bytes (parameters, gradients, optimizer state).
        activation_key: how the lever's value enters the key of the activation lines (None: it does not).
        least_params: per value, the least share of the plain family's parameter bytes a plan may hold.
        least_trained: per value, the least share of the trainable bytes that are trained (and have gradients).
        least_grads: per value, the least share of the trained bytes held as gradients at the step's end.
        optimizer_state: per value, the least optimizer state as a share of AdamW's.
        speed: per value, the expected samples/s relative to the plain plan, ``(on a GPU, on a CPU)``.
        suggest: values to suggest when nothing in the searched space fits (they change what is trained).
        on_cpu: the value that runs exactly like this one on a CPU (None: the value itself).
        on_cpu_note: why ``on_cpu`` runs the same (what the search says of a plan it skips for that).
        exports: per :data:`TARGETS`, what the export writes for the lever (:mod:`memlab.techniques.fragments`: its
            fragment, :class:`~memlab.techniques.fragments.Elsewhere`, or the refusal saying what to write).
    """

    name: str
    default: Any
    help: str
    short: str = ""
    choices: tuple[str, ...] = ()
    open_choices: bool = False
    split: bool = False
    technique: Technique | None = None
    conflicts: Callable[[PlanLike], str] | None = None
    none_means: str = ""
    applies: Callable[[PlanLike], bool] | None = None
    from_peft: Callable[[Any], Any] | None = None
    needs_at_least: Callable[[Any, Any], bool] | None = None
    slower: tuple[tuple[Any, Any], ...] = ()
    family: bool = False
    activation_key: Callable[[Any], Any] | None = None
    least_params: Mapping[Any, float] = field(default_factory=dict)
    least_trained: Mapping[Any, float] = field(default_factory=dict)
    least_grads: Mapping[Any, float] = field(default_factory=dict)
    optimizer_state: Mapping[Any, float] = field(default_factory=dict)
    speed: Mapping[Any, tuple[float, float]] = field(default_factory=dict)
    suggest: tuple[Any, ...] = ()
    on_cpu: Callable[[Any], Any] | None = None
    on_cpu_note: str = ""
    exports: Mapping[str, Refusal] = field(default_factory=dict)

    @property
    def type(self) -> str:
        """``"choice"``, ``"bool"``, ``"float"`` (a number >= 0) or ``"int"`` (a count; None allowed where the default
        is None)."""
        if self.choices:
            return "choice"
        if isinstance(self.default, bool):
            return "bool"
        return "float" if isinstance(self.default, float) else "int"

    def refusal(self, plan: PlanLike, target: str) -> str:
        """What ``target`` says of this lever in ``plan``: ``""`` when it carries it, else what to do instead."""
        return refusal_of(self.exports[target](plan))

    def fragment(self, plan: PlanLike, target: str) -> Any:
        """What ``target`` writes for this lever in ``plan`` (see :mod:`memlab.techniques.fragments`)."""
        return self.exports[target](plan)
