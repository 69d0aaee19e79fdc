"""A DPOTrainer's reference log-probs computed before training as a lever (issue 59): ``Plan(precompute_ref=...)``,
TRL's ``DPOConfig(precompute_ref_log_probs=...)``.

It keeps the training the same: the same reference log-probs, computed once in ``DPOTrainer.__init__`` (a column of
the train dataset) instead of by a reference forward in every step. Built that way without a ``ref_model``, TRL loads
no reference model either (``self.ref_model = None``; a peft model never needs one). None (the default) means "as the
trainer is set up"; a plan read from a DPOConfig with it on carries True.

A step runs ``precompute_ref=True`` as TRL runs it precomputed: the trainer's ``precompute_ref_logps`` True while
its ``compute_loss`` runs, and each micro-batch given ``ref_chosen_logps`` / ``ref_rejected_logps`` (one float per
pair, as TRL's collator stacks them); everything put back afterwards. So a dry run has no reference forward, and the
trainer's estimate counts no reference weights (:func:`memlab.trainer.reference.with_reference`). A live trial on a
trainer built without it runs the same step, but the trainer's reference model stays in memory (its notes say so).
``False`` on a trainer built with it is refused (it holds no reference model to run), and so is the lever on anything
but a DPOTrainer. ``memlab.apply`` refuses a plan that changes it: TRL decides it in ``DPOTrainer.__init__``. The only
export that holds it is a ``DPOConfig``'s keywords (:func:`dpo_config_keywords`); the others say where it goes.

Example:
    >>> [lever.name for lever in DECLARATIONS]
    ['precompute_ref']
    >>> from memlab.plan import Plan
    >>> dpo_config_keywords(Plan(precompute_ref=True))
    {'precompute_ref_log_probs': True}
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

from memlab.errors import MemlabError
from memlab.live.batch import TrainerLoss, trainer_of
from memlab.live.patching import patched
from memlab.techniques.core.fragments import Accelerate, Code, Elsewhere, Export, Fragment, per_target_but_peft
from memlab.techniques.core.lever import SWITCH, Lever, PlanLike
from memlab.techniques.core.technique import StepParts, Technique, Undo

__all__ = ["DECLARATIONS", "DPO_ONLY", "KEYWORD", "PRECOMPUTE", "PrecomputeReference", "dpo_config_keywords",
           "precompute_from_arguments", "precomputes", "refuse_precompute_change", "precompute_refusal"]

KEYWORD = "precompute_ref_log_probs"
"""The lever's ``DPOConfig`` keyword."""

DPO_ONLY = ("precompute_ref sets a TRL DPOTrainer's reference log-probs computed before training "
            "(DPOConfig's precompute_ref_log_probs): export it with plan.to_training_arguments(trl=trl.DPOConfig)")
"""Where the lever goes, said by every export but a DPOConfig's."""


def dpo_config_keywords(plan: PlanLike) -> dict[str, Any]:
    """The ``DPOConfig`` keyword of the lever where ``plan`` sets it (none where it is None).

    Example:
        >>> from memlab.plan import Plan
        >>> dpo_config_keywords(Plan(precompute_ref=False)), dpo_config_keywords(Plan())
        ({'precompute_ref_log_probs': False}, {})
    """
    value = getattr(plan, "precompute_ref", None)
    return {} if value is None else {KEYWORD: bool(value)}


def without_precompute(plan: Any) -> Any:
    """``plan`` with the lever at None (the trainer's own): what the Trainer's keywords carry once the DPOConfig's
    own keyword is written apart (:func:`dpo_config_keywords`).

    Example:
        >>> from memlab.plan import Plan
        >>> without_precompute(Plan(micro_batch=2, precompute_ref=True)) == Plan(micro_batch=2)
        True
    """
    return plan.replace(precompute_ref=None) if plan.precompute_ref is not None else plan


def reference_unloaded(plan: Any, trainer: Any) -> str:
    """Why no reference model is counted beside the policy where ``plan`` precomputes the reference log-probs on a
    DPOTrainer that did not (built without ``precompute_ref_log_probs``): one built for it without ``ref_model``
    loads none; ``""`` where the trainer's own reference model is counted.

    Example:
        >>> from memlab.plan import Plan
        >>> reference_unloaded(Plan(), object()), reference_unloaded(Plan(precompute_ref=True), object())[:28]
        ('', 'no reference model counted: ')
    """
    if not getattr(plan, "precompute_ref", None) or getattr(trainer, "precompute_ref_logps", False):
        return ""
    return ("no reference model counted: a DPOTrainer built with DPOConfig(precompute_ref_log_probs=True) and without "
            "ref_model loads none (it precomputes with the policy as loaded); passed a ref_model, it keeps it on the "
            "device")


SEARCHED = {"precompute_ref": [None, True]}
"""What ``fit`` searches of the lever on a DPOTrainer (the trainer's own, and precomputed), in its dry runs only: a
built trainer cannot change it (the DPO kind's ``levers``)."""


def precompute_from_arguments(args: Any) -> bool | None:
    """The lever's value a config sets: True where it precomputes (``precompute_ref_log_probs=True``); None
    otherwise (the trainer's own, a reference forward in each step).

    Example:
        >>> from types import SimpleNamespace
        >>> precompute_from_arguments(SimpleNamespace(precompute_ref_log_probs=True))
        True
        >>> precompute_from_arguments(SimpleNamespace()) is None
        True
    """
    return True if getattr(args, KEYWORD, False) is True else None


def precomputes(trainer: Any) -> bool:
    """Whether a DPOTrainer reads its reference log-probs from its batches (TRL's ``precompute_ref_logps``).

    Example:
        >>> from types import SimpleNamespace
        >>> precomputes(SimpleNamespace(precompute_ref_logps=True)), precomputes(object())
        (True, False)
    """
    return bool(getattr(trainer, "precompute_ref_logps", False))


def _is_dpo(trainer: Any) -> bool:
    return trainer is not None and hasattr(trainer, "precompute_ref_logps") and hasattr(trainer, "ref_model")


def _rebuild(value: bool) -> str:
    without = " and without ref_model= (TRL then loads no reference model: it precomputes with the policy as " \
              "loaded, or a peft model's base)" if value else " and a ref_model= (or a peft model)"
    return f"build a new DPOTrainer with DPOConfig({KEYWORD}={value}, ...){without}"


def refuse_precompute_change(trainer: Any, plan: PlanLike) -> None:
    """``memlab.apply(trainer, plan)``'s check: a plan whose ``precompute_ref`` differs from the DPOTrainer's own is
    refused, nothing changed (TRL computes the reference log-probs, and decides which reference model it holds, in
    ``DPOTrainer.__init__``); the lever on another trainer is refused too.

    Example:
        >>> from types import SimpleNamespace
        >>> from memlab.plan import Plan
        >>> trainer = SimpleNamespace(precompute_ref_logps=False, ref_model=None)
        >>> refuse_precompute_change(trainer, Plan(precompute_ref=False))  # the trainer's own: nothing
        >>> refuse_precompute_change(trainer, Plan(precompute_ref=True))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: plan 'precompute-ref=True' changes ... build a new DPOTrainer with \
DPOConfig(precompute_ref_log_probs=True, ...) ...
    """
    wanted = getattr(plan, "precompute_ref", None)
    if wanted is None:
        return
    if not _is_dpo(trainer):
        raise MemlabError(f"plan {plan.label()!r} sets precompute_ref, and this trainer is no DPOTrainer: {DPO_ONLY}; "
                          "apply plan.replace(precompute_ref=None)")
    if bool(wanted) == precomputes(trainer):
        return
    raise MemlabError(
        f"plan {plan.label()!r} changes where this DPOTrainer's reference log-probs come from, which TRL decides in "
        "DPOTrainer.__init__ (it computes them there over the train dataset, and chooses the reference model it "
        f"holds), so memlab.apply cannot change it on a built trainer: {_rebuild(bool(wanted))} "
        "(plan.to_training_arguments(trl=trl.DPOConfig) writes it), then apply plan.replace(precompute_ref=None) to "
        "it if the plan changes anything else"
    )


def precompute_refusal(plan: PlanLike, loss_fn: Any) -> str:
    """Why a step of ``plan`` with ``loss_fn`` cannot run its ``precompute_ref`` (``""`` where it can): the runner and
    the estimate ask it before anything runs, and the technique again.

    Example:
        >>> from memlab.plan import Plan
        >>> precompute_refusal(Plan(), None), precompute_refusal(Plan(precompute_ref=True), None)[:40]
        ('', "plan 'precompute-ref=True' sets precompu")
    """
    wanted = getattr(plan, "precompute_ref", None)
    if wanted is None:
        return ""
    trainer = trainer_of(loss_fn)
    if not _is_dpo(trainer):
        return (f"plan {plan.label()!r} sets precompute_ref, and this step has no DPOTrainer's reference: "
                f"{DPO_ONLY}. Measure or estimate a DPOTrainer with it (memlab.estimate(trainer, plan)), or write the "
                "plan without precompute_ref")
    if wanted is False and precomputes(trainer):
        return (f"plan {plan.label()!r} computes the reference log-probs in each step, and this DPOTrainer "
                "precomputed them (DPOConfig(precompute_ref_log_probs=True)), so it may hold no reference model to "
                f"run: {_rebuild(False)}, and estimate that one; or write precompute_ref=None (the trainer's own)")
    return ""


def _precomputed(loss_fn: Callable[[Any, Any], Any], trainer: Any) -> TrainerLoss:
    """``loss_fn`` run as TRL runs a precomputed step: the flag on, each micro-batch given its pairs' reference
    log-probs (zeros: their values change no memory), both put back after the call."""

    def loss(model: Any, micro_batch: Any) -> Any:
        inputs = dict(micro_batch)
        ids = inputs.get("input_ids", inputs.get("completion_mask"))  # chosen then rejected: two rows per pair
        if ids is None:
            raise MemlabError("precompute_ref=True needs the DPOTrainer's collated batch (input_ids, chosen rows then "
                              "rejected rows), and this batch has no input_ids; write precompute_ref=None")
        pairs = ids.shape[0] // 2
        inputs["ref_chosen_logps"] = ids.new_zeros(pairs, dtype=_float32())
        inputs["ref_rejected_logps"] = ids.new_zeros(pairs, dtype=_float32())
        with patched(trainer, precompute_ref_logps=True):
            return loss_fn(model, inputs)

    return TrainerLoss(trainer, loss)


def _float32() -> Any:
    import torch

    return torch.float32


class PrecomputeReference(Technique):
    """The lever in a step: on a DPOTrainer that computes the reference in each step, ``precompute_ref=True`` runs
    its ``compute_loss`` as precomputed (the flag and the batch's columns, put back after each call); the trainer's
    own value changes nothing; anything else refuses.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from memlab.plan import Plan
        >>> PRECOMPUTE.put_on(StepParts(nn.Linear(2, 2), Plan(), torch.device("cpu"))) is None
        True
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        if parts.plan.precompute_ref is None:
            return None
        refusal = precompute_refusal(parts.plan, parts.loss_fn)
        if refusal:
            raise MemlabError(refusal)
        trainer = trainer_of(parts.loss_fn)
        if parts.plan.precompute_ref and not precomputes(trainer) and parts.loss_fn is not None:
            parts.loss_fn = _precomputed(parts.loss_fn, trainer)
        return None

    def notes(self, parts: StepParts) -> list[str]:
        trainer = trainer_of(parts.loss_fn)
        if not parts.plan.precompute_ref or not _is_dpo(trainer) or vars(trainer).get("precompute_ref_logps"):
            return []
        said = ("precompute_ref=True: the step reads its reference log-probs from the batch, as TRL runs it with "
                "DPOConfig(precompute_ref_log_probs=True) (computed once in DPOTrainer.__init__): no reference "
                "forward in the step")
        if trainer.ref_model is not None and not parts.fake:
            said += ("; this live trainer's reference model stays in memory (under other), which a DPOTrainer built "
                     "with it and without ref_model does not load")
        return [said]


PRECOMPUTE = PrecomputeReference()
"""The lever's technique."""

SAID_IN_CODE = tuple(f"# {line}" for line in textwrap.wrap(DPO_ONLY, 100))
"""What a script export says of the lever: its comment lines."""


def _export(target: str) -> Export:
    def fragment(plan: PlanLike) -> Fragment:
        if plan.precompute_ref is None:
            return ""
        if target == "code":
            return Code(environment=SAID_IN_CODE)
        if target == "accelerate":
            return Accelerate(script=Code(environment=SAID_IN_CODE))
        return Elsewhere(DPO_ONLY)  # a DPOConfig's export adds dpo_config_keywords itself

    return fragment


DECLARATIONS = (
    Lever(
        "precompute_ref",
        None,
        short="precompute-ref={}",
        help="a DPOTrainer's reference log-probs computed once before training (precompute_ref_log_probs): no "
        "reference forward in each step, and no reference model held when built without ref_model; the training "
        "the same (None: the trainer's own)",
        choices=SWITCH,
        technique=PRECOMPUTE,
        none_means="the trainer's own setting",
        from_arguments=precompute_from_arguments,
        exports=per_target_but_peft(_export),
        needs_trainer="a TRL DPOTrainer",
        refuses_step=precompute_refusal,
        refuses_change=refuse_precompute_change,
    ),
)
"""The lever's declaration (:data:`memlab.techniques.core.registry.REGISTRY` gathers it)."""
