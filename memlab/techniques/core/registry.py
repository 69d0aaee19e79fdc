"""The registry of levers: what each Plan lever means everywhere, declared once.

A :class:`Lever` says how its lever looks in the interface (help, label, choices), its technique (the object that
puts it on a model and a step: :class:`memlab.runner.step.TrainingStep` puts on :func:`step_techniques` in
:data:`STEP_ORDER` and names no lever), what the search may assume of it (its
memory family, what it can be compared with, what it only slows down, its speed prior, what it is suggested as),
what a dry run on fake tensors makes of it, and how each export carries it or why it refuses. The search's
lists (:data:`memlab.search.space.TECHNIQUES`, ``SLOWER_WITH``, ``needs_at_least``), the memory model's family and
least bytes, the speed prior, the suggestions, the export tables and :data:`memlab.plan.LEVERS` are all read from
:data:`REGISTRY`; a test walks every Plan field and fails when one has no declaration here (and the other way).

This module does not import :mod:`memlab.plan` (plan builds on it); the technique modules it reaches import the plan
only for type checking. Each lever's declaration lives in its own module beside its technique (``DECLARATIONS`` in
:mod:`memlab.techniques.accumulation`, :mod:`memlab.techniques.checkpointing`, ...); :data:`LEVER_MODULES` lists
those modules in the Plan's field order, which :data:`memlab.plan.LEVERS` follows.

Example:
    >>> REGISTRY["optimizer"].choices
    ('adamw', 'adamw8bit', 'paged_adamw8bit', 'adafactor', 'adamw_foreach')
    >>> REGISTRY["checkpointing"].needs_at_least(False, True)  # without checkpointing: at least the memory with it
    True
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from memlab.techniques import (
    accumulation,
    adapters,
    attention,
    checkpointing,
    expandable_segments,
    fp8,
    loss,
    offload,
    optimizer,
    optimizer_in_backward,
    precision,
    precompute_ref,
    vllm,
    weights,
)
from memlab.techniques import compile as compiled
from memlab.techniques.core.lever import Lever, PlanLike
from memlab.techniques.core.technique import Technique

__all__ = ["LEVER_MODULES", "REGISTRY", "STEP_ORDER", "built_settings", "conflicts", "least_share", "refuse_changes",
           "refusals", "step_refusal", "step_techniques"]


LEVER_MODULES: tuple[ModuleType, ...] = (
    accumulation,  # micro_batch, accumulation
    checkpointing,
    weights,
    adapters,  # adapter, lora_rank, lora_targets, lora_alpha, lora_dropout
    attention,
    fp8,
    precision,
    optimizer,
    offload,
    loss,
    optimizer_in_backward,
    compiled,
    expandable_segments,
    vllm,  # vllm_memory, vllm_sleep
    precompute_ref,
)
"""Every lever's own module, each declaring its levers in ``DECLARATIONS``, in the Plan's field order."""

REGISTRY: dict[str, Lever] = {lever.name: lever for module in LEVER_MODULES for lever in module.DECLARATIONS}
"""Every lever's :class:`Lever`, by Plan field name."""


def refusals(plan: PlanLike, target: str, names: tuple[str, ...] | None = None) -> list[str]:
    """Why ``target`` cannot carry ``plan`` (one message per lever it refuses; empty when it carries them all).

    Example:
        >>> from memlab.plan import Plan
        >>> refusals(Plan(), "trainer")
        []
    """
    chosen = REGISTRY if names is None else {name: REGISTRY[name] for name in names}
    return [message for lever in chosen.values() if (message := lever.refusal(plan, target))]


def least_share(plan: PlanLike, facet: str) -> float:
    """The least share a facet (``least_params``, ``least_trained``, ``least_grads``, ``optimizer_state``) allows
    ``plan``: the smallest share any of its levers declares for its value (1 when none says less).

    Example:
        >>> from memlab.plan import Plan
        >>> least_share(Plan(weights="bf16", adapter="qlora"), "least_params")
        0.125
    """
    shares = [getattr(lever, facet).get(getattr(plan, name), 1.0) for name, lever in REGISTRY.items()]
    return min([1.0, *shares])


def conflicts(plan: PlanLike) -> list[str]:
    """Why ``plan``'s settings cannot go together (each lever's ``conflicts``; empty when they can). ``plan`` may
    be any object with the Plan's fields (the search asks of a combination before building it).

    Example:
        >>> from memlab.plan import Plan
        >>> conflicts(Plan())
        []
    """
    return [message for lever in REGISTRY.values() if lever.conflicts and (message := lever.conflicts(plan))]


def step_refusal(plan: PlanLike, loss_fn: Any = None) -> str:
    """Why one device's step cannot run ``plan`` with ``loss_fn`` (the first lever whose ``refuses_step`` says so, in
    the Plan's order), ``""`` where it can: what the runner and the one-device estimate ask before anything runs.

    Example:
        >>> from memlab.plan import Plan
        >>> step_refusal(Plan()), step_refusal(Plan(offload="params"))[:31]
        ('', "offload='params' keeps each GPU")
    """
    for lever in REGISTRY.values():
        if lever.refuses_step is not None and (why := lever.refuses_step(plan, loss_fn)):
            return why
    return ""


def built_settings() -> tuple[str, ...]:
    """The levers a built trainer cannot change (those that declare :attr:`Lever.refuses_change`), in the Plan's
    order: ``memlab.apply`` leaves them out of the arguments it changes and refuses a value other than the trainer's
    own, ``fit`` searches them in dry runs only.

    Example:
        >>> built_settings()
        ('vllm_memory', 'vllm_sleep', 'precompute_ref')
    """
    return tuple(name for name, lever in REGISTRY.items() if lever.refuses_change is not None)


def refuse_changes(trainer: Any, plan: PlanLike) -> None:
    """``memlab.apply``'s check of :func:`built_settings` on a built ``trainer``: each lever's
    :attr:`Lever.refuses_change` in the Plan's order (one check a function, however many levers share it), the first
    that refuses raising its MemlabError.

    Example:
        >>> from types import SimpleNamespace
        >>> from memlab.plan import Plan
        >>> refuse_changes(SimpleNamespace(args=SimpleNamespace()), Plan())  # the trainer's own settings: nothing
    """
    checks: list[Callable[[Any, PlanLike], None]] = []
    for lever in REGISTRY.values():
        if lever.refuses_change is not None and lever.refuses_change not in checks:
            checks.append(lever.refuses_change)
    for check in checks:
        check(trainer, plan)


STEP_ORDER = ("vllm_memory", "precompute_ref", "expandable_segments",
              "loss", "attention", "adapter", "weights", "fp8", "micro_batch", "precision", "optimizer", "offload",
              "optimizer_in_backward", "checkpointing", "compile")
"""The order in which a training step puts the levers' techniques on (each named by one lever that has it): the
loss first, since it is checked before the model is touched; the attention implementation before anything wraps
the model's modules (it is set on the transformers model itself); adapters before pure bf16 weights, since they decide
which weights train; float8's linear layers after the weights' dtype is set (they share those weights) and before
checkpointing or compile wrap the model; the optimizer before offload and the optimizer in backward, which build on
it; checkpointing on the model as the others left it; compile last, on the forward every other lever has changed.
The allocator's expandable segments go on before them all, so that what the others allocate on a GPU lands in their
segments. The vLLM engine's levers (``vllm_memory``, ``vllm_sleep``) change no step: their technique, first, only
refuses a step asked to run them before anything is put on (the GRPO estimate reads them before its training dry
run). The reference log-probs' lever (``precompute_ref``) wraps the trainer's loss before the loss's own
technique reads it."""


def step_techniques() -> list[Technique]:
    """Every lever's technique once, in :data:`STEP_ORDER` (what :class:`memlab.runner.step.TrainingStep` puts on).

    Example:
        >>> [type(technique).__name__ for technique in step_techniques()][:3]
        ['VLLMEngine', 'PrecomputeReference', 'ExpandableSegments']
    """
    ordered: list[Technique] = []
    for name in STEP_ORDER:
        technique = REGISTRY[name].technique
        if technique is not None and all(technique is not seen for seen in ordered):
            ordered.append(technique)
    return ordered
