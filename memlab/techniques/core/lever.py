"""The declaration of one lever (:class:`Lever`): what it means in the interface, the step, the search, dry runs
and each export. :mod:`memlab.techniques.core.registry` gathers the declarations into ``REGISTRY``.

What front ends know of a lever (:class:`LeverSpec`) and the check of a plan's values (:func:`check_levers`) are
here too. This module imports neither torch nor :mod:`memlab.plan` (plan builds on it); the techniques it names do.

Example:
    >>> Lever("spin", False, help="spins: faster").type
    'bool'
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from memlab.errors import MemlabError

if TYPE_CHECKING:
    from memlab.techniques.core.technique import Technique

from memlab.techniques.core.fragments import TARGETS as TARGETS  # re-exported: the declarations import them here
from memlab.techniques.core.fragments import Export, refusal_of
from memlab.techniques.core.fragments import carried as carried
from memlab.techniques.core.fragments import concerns_adapters_only as concerns_adapters_only

PlanLike = Any
"""A :class:`memlab.Plan` (typed loosely here: plan builds on this module)."""

SWITCH = ("on", "off")
"""The choices of a switch whose default is None (``vllm_sleep``): front ends offer the live object's own, on and
off (a drop-down, ``--try vllm_sleep=on,off``); the plan stores True, False or None."""

Refusal = Export
"""An export's declaration for one lever (:data:`memlab.techniques.core.fragments.Export`): the fragment it adds, where
the lever goes instead (:class:`~memlab.techniques.core.fragments.Elsewhere`), or what to write instead (a ``str``)."""


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
        technique: the :class:`memlab.techniques.core.technique.Technique` that puts the lever on a model and a step and
            takes it off again, says the lever's notes and what a dry run makes of it. Levers that are settings of
            one technique share it (``lora_rank`` is the adapter's). The step puts the techniques on in
            :data:`memlab.techniques.core.registry.STEP_ORDER`.
        conflicts: why a plan cannot have the lever's value together with its other settings (one sentence saying
            what to write), ``""`` when it can; it reads the plan's fields only, so the search can ask it of a
            combination before building the plan. None: the lever goes with every setting.
        none_means: what None stands for, where the lever is a count whose default is None ("all of the batch's
            rows"), said in the message that refuses a bad value.
        applies: whether the lever means anything in a plan (its other fields); where it does not, the plan holds
            the lever's default, so that grids hold no duplicate plans. None: it always does.
        from_peft: the lever's value read from a user's peft ``LoraConfig`` (what a peft model the user wrapped
            trains with), or None where peft's config does not say it.
        from_arguments: the lever's value read from a ``transformers.TrainingArguments`` (TRL's configs too), the
            default where the arguments set none (:func:`memlab.export.trainer_arguments.plan_from_training_arguments`
            asks every lever); a MemlabError for a setting memlab cannot measure. None: the arguments never set it.
        from_model: the lever's value that a trainer's model says (its trained weights' dtype, the peft adapters it
            carries; :meth:`memlab.Plan.from_trainer` asks every lever), or None where the model does not say it.
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
        blocks: a switch that also takes a count of the model's repeated blocks (``checkpointing``: False, True for
            every block, or how many); its type is ``"blocks"``.
        value_type: the type where the default (None) does not say it: ``"float"``, None allowed (``vllm_memory``:
            None is "as the trainer is set up"; 0 in the panel is None). A switch whose default is None is a choice
            of :data:`SWITCH` instead, stored as a bool.
        exports: per :data:`TARGETS`, what the export writes for the lever (:mod:`memlab.techniques.core.fragments`: its
            fragment, :class:`~memlab.techniques.core.fragments.Elsewhere`, or the refusal saying what to write).
        needs_trainer: the built trainer whose setting the lever is (``"a TRL DPOTrainer"``): a step without it
            cannot use the lever, so a front end that builds the model itself (``memlab estimate``, from a config)
            neither offers nor takes it. ``""``: any step can.
        refuses_step: ``(plan, loss_fn) -> str``: why one device's step cannot run the plan's value of the lever
            with that loss (one sentence saying what to write), ``""`` where it can; the runner and the one-device
            estimate ask it (:func:`memlab.techniques.core.registry.step_refusal`) before the model is touched.
            None: every step can.
        refuses_change: ``(trainer, plan) -> None``: ``memlab.apply``'s check of the lever on a built trainer, whose
            ``__init__`` decides it (a GRPOTrainer's vLLM engine, a DPOTrainer's reference log-probs): raises a
            MemlabError, saying how to build the trainer with the plan's value, where that value is not the
            trainer's own. Set, it makes the lever one a built trainer cannot change: ``apply`` leaves it out of the
            arguments it changes, and ``fit`` searches it in dry runs only. None: ``apply`` changes it.
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
    from_arguments: Callable[[Any], Any] | None = None
    from_model: Callable[[Any], Any] | None = None
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
    blocks: bool = False
    value_type: str = ""
    needs_trainer: str = ""
    refuses_step: Callable[[PlanLike, Any], str] | None = None
    refuses_change: Callable[[Any, PlanLike], None] | None = None

    @property
    def type(self) -> str:
        """``"choice"``, ``"bool"``, ``"blocks"`` (False, True or a count of blocks), ``"float"`` (a number >= 0) or
        ``"int"`` (a count; None allowed where the default is None)."""
        if self.choices:
            return "choice"
        if self.value_type:
            return self.value_type
        if self.blocks:
            return "blocks"
        if isinstance(self.default, bool):
            return "bool"
        return "float" if isinstance(self.default, float) else "int"

    def refusal(self, plan: PlanLike, target: str) -> str:
        """What ``target`` says of this lever in ``plan``: ``""`` when it carries it, else what to do instead."""
        return refusal_of(self.exports[target](plan))

    def fragment(self, plan: PlanLike, target: str) -> Any:
        """What ``target`` writes for this lever in ``plan`` (see :mod:`memlab.techniques.core.fragments`)."""
        return self.exports[target](plan)


@dataclass(frozen=True)
class LeverSpec:
    """What front ends know of one lever: ``type`` is ``"int"`` (a count, None allowed where the default is None),
    ``"float"`` (a number >= 0), ``"bool"``, ``"blocks"`` (False, True or a count of blocks) or ``"choice"``;
    ``open_choices``: a tuple of names is allowed besides ``choices``; ``needs_trainer``: the built trainer the lever
    is a setting of (:attr:`Lever.needs_trainer`), ``""`` for any step. It reads as a mapping too
    (``spec["help"]``).

    Example:
        >>> LeverSpec("precision", "fp32", "choice", "autocast", "{}", ("fp32", "bf16"))["choices"]
        ('fp32', 'bf16')
    """

    name: str
    default: Any
    type: str
    help: str
    short: str
    choices: tuple[str, ...]
    open_choices: bool = False
    none_means: str = ""
    needs_trainer: str = ""

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)


def lever_specs(plan_class: type, declared: Mapping[str, Lever] | None = None) -> dict[str, LeverSpec]:
    """The :class:`LeverSpec` of every field of ``plan_class`` (a dataclass of :func:`lever` fields), in field
    order; ``declared`` gives the declarations of levers whose field says only its default (a Plan's: the
    registry). A field with neither help nor a declaration is an error: every lever says what it does.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.techniques.core.registry import REGISTRY
        >>> list(lever_specs(Plan, REGISTRY))[:3]
        ['micro_batch', 'accumulation', 'checkpointing']
    """
    specs: dict[str, LeverSpec] = {}
    for plan_field in fields(plan_class):
        declaration = (declared or {}).get(plan_field.name)
        if declaration is not None:
            if declaration.default != plan_field.default:
                raise TypeError(f"{plan_field.name}'s default differs between the plan and its declaration")
            specs[plan_field.name] = LeverSpec(
                plan_field.name, declaration.default, declaration.type, declaration.help, declaration.short,
                declaration.choices, declaration.open_choices, declaration.none_means, declaration.needs_trainer,
            )
            continue
        help_text = plan_field.metadata.get("help")
        if not help_text:
            raise TypeError(f"{plan_class.__name__}.{plan_field.name} is a lever without a declaration")
        choices = tuple(plan_field.metadata.get("choices", ()))
        kind = "choice" if choices else "bool" if isinstance(plan_field.default, bool) else (
            "float" if isinstance(plan_field.default, float) else "int")
        specs[plan_field.name] = LeverSpec(
            plan_field.name, plan_field.default, kind, help_text, plan_field.metadata.get("short", ""), choices
        )
    return specs


def check_levers(plan: Any, specs: Mapping[str, LeverSpec]) -> None:
    """Check each lever of ``plan`` against its spec: whole numbers (None where the default is None), True/False,
    a choice; a :class:`MemlabError` saying what to write otherwise. Whole numbers are stored as ``int``.

    Example:
        >>> from memlab.plan import LEVERS, Plan
        >>> check_levers(Plan(), LEVERS)
        >>> Plan(checkpointing=0).checkpointing, Plan(checkpointing=2).checkpointing
        (False, 2)
    """
    for name, spec in specs.items():
        value = getattr(plan, name)
        if spec.type == "int":
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                object.__setattr__(plan, name, int(value))
                value = int(value)
            if value is None and spec.default is None:
                continue
            least = 0 if spec.default == 0 else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                none = f", or None ({spec.none_means or 'the default'})" if spec.default is None else ""
                example = f", e.g. {spec.default}" if isinstance(spec.default, int) and spec.default > 1 else ""
                raise MemlabError(f"{name}={value!r} is not allowed; write a whole number >= {least}{none}{example}")
        elif spec.type == "float":
            if spec.default is None and (value is None or value == 0):  # 0 is the panel's None
                object.__setattr__(plan, name, None)
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
                raise MemlabError(f"{name}={value!r} is not allowed; write a number >= 0, e.g. 0.05")
            object.__setattr__(plan, name, float(value))
        elif spec.type == "blocks":
            if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0:
                object.__setattr__(plan, name, int(value) or False)  # 0 blocks is off
            elif not isinstance(value, bool):
                raise MemlabError(f"{name}={value!r} is not allowed; write True (every block), False, or a whole "
                                  "number of blocks >= 0, e.g. 4")
        elif spec.type == "bool" and not isinstance(value, bool):
            raise MemlabError(f"{name}={value!r} is not allowed; write True or False")
        elif spec.choices == SWITCH:  # a switch with None (the live object's own): stored as a bool
            if value in SWITCH:
                object.__setattr__(plan, name, value == "on")
            elif not isinstance(value, bool) and not (value is None and spec.default is None):
                raise MemlabError(f"{name}={value!r} is not allowed; write True or False ('on' / 'off'), or None "
                                  f"({spec.none_means or 'the default'})")
        elif spec.choices and value not in spec.choices and not (value is None and spec.default is None):
            if spec.open_choices and _names(value) is not None:
                object.__setattr__(plan, name, _names(value))
                continue
            extra = ", or a list of module names" if spec.open_choices else ""
            if spec.default is None:
                extra += ", or None (the model as it is)"
            raise MemlabError(f"{name}={value!r} is not known; write one of {', '.join(spec.choices)}{extra}")


def _names(value: Any) -> tuple[str, ...] | None:
    """A list or tuple of module names as a tuple (a plan stays hashable), else None."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    return None
