"""The registry of levers: what each Plan lever means everywhere, declared once.

A :class:`Lever` says how its lever looks in the interface (help, label, choices), which technique puts it on a
model or a step (what :class:`memlab.runner.step.TrainingStep` calls), what the search may assume of it (its
memory family, what it can be compared with, what it only slows down, its speed prior, what it is suggested as),
what a dry run on fake tensors makes of it, and how each export carries it or why it refuses. The search's
lists (:data:`memlab.search.space.TECHNIQUES`, ``SLOWER_WITH``, ``needs_at_least``), the memory model's family and
least bytes, the speed prior, the suggestions, the export tables and :data:`memlab.plan.LEVERS` are all read from
:data:`REGISTRY`; a test walks every Plan field and fails when one has no declaration here (and the other way).

This module imports neither torch nor :mod:`memlab.plan` (plan builds on it), so a plan and its exports stay light.
The declarations live in torch-free modules beside the techniques: ``levers_batch`` (how the batch is cut),
``levers_model`` (what changes the model: weights, adapters, checkpointing), ``levers_step`` (what changes the step:
precision, optimizer, offload, loss); :data:`memlab.plan.LEVERS` lists them in the Plan's field order.

Example:
    >>> REGISTRY["optimizer"].choices
    ('adamw', 'adamw8bit', 'paged_adamw8bit', 'adafactor', 'adamw_foreach')
    >>> REGISTRY["checkpointing"].needs_at_least(False, True)  # without checkpointing: at least the memory with it
    True
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from memlab.techniques import levers_batch, levers_model, levers_step
from memlab.techniques.lever import Lever, PlanLike

__all__ = ["REGISTRY", "conflicts", "least_share", "refusals", "resolve", "stepping"]


def _declarations() -> dict[str, Lever]:
    declared: dict[str, Lever] = {}
    for module in (levers_batch, levers_model, levers_step):
        for lever in module.LEVERS:
            declared[lever.name] = lever
    return declared


REGISTRY: dict[str, Lever] = _declarations()
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


def resolve(reference: str) -> Callable[..., Any]:
    """The function a ``"module:function"`` reference of a declaration names (imported on first use, so that the
    declarations stay free of torch).

    Example:
        >>> resolve("memlab.techniques.accumulation:micro_batches").__name__
        'micro_batches'
    """
    module, _, function = reference.partition(":")
    found: Callable[..., Any] = getattr(importlib.import_module(module), function)
    return found


def conflicts(plan: PlanLike) -> list[str]:
    """Why ``plan``'s settings cannot go together (each lever's ``conflicts``; empty when they can). ``plan`` may
    be any object with the Plan's fields (the search asks of a combination before building it).

    Example:
        >>> from memlab.plan import Plan
        >>> conflicts(Plan())
        []
    """
    return [message for lever in REGISTRY.values() if lever.conflicts and (message := lever.conflicts(plan))]


def stepping(plan: PlanLike) -> Any:
    """How ``plan``'s optimizer step runs where a lever changes it (the first lever whose ``stepping`` gives one),
    else None: the step builds its optimizer and steps it after the last backward.

    Example:
        >>> from memlab.plan import Plan
        >>> stepping(Plan()) is None
        True
    """
    for lever in REGISTRY.values():
        if lever.stepping and (made := resolve(lever.stepping)(plan)) is not None:
            return made
    return None
