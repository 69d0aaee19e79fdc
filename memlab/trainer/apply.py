"""Put a memlab plan on a live trainer, so that its next ``train()`` runs with it, and take it off again exactly."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

from memlab.errors import MemlabError
from memlab.export.trainer_arguments import check_single_process, trl_training_arguments
from memlab.live.module_state import ModelValues
from memlab.live.patching import patched
from memlab.live.structure import ModuleStructure
from memlab.live.trainer_kinds import TrainerKind, kind_of
from memlab.plan import Plan
from memlab.techniques.core.registry import built_settings, refuse_changes
from memlab.trainer.source import (
    is_trainer,
    keeps_trainer_batch,
    trainer_model,
    trl_offload_context_for,
)

__all__ = ["APPLIED_MARK", "TrainerApplied", "accelerate_state_of", "apply_to_trainer", "check_plan_for_trainer"]


def check_plan_for_trainer(plan: Plan) -> None:
    """Refuse the levers a live trainer cannot take (yet), saying what to do instead.

    Example:
        >>> check_plan_for_trainer(Plan(micro_batch=2, accumulation=4, checkpointing=True, adapter="lora"))
        >>> check_plan_for_trainer(Plan(offload="optimizer"))
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: offload='optimizer' needs DeepSpeed, which a live trainer cannot switch to; ...
    """
    if not isinstance(plan, Plan):
        raise MemlabError(f"a {type(plan).__name__} is not a plan; pass a memlab.Plan, e.g. report.best.plan")
    if plan.offloads_optimizer:
        raise MemlabError(
            f"offload={plan.offload!r} needs DeepSpeed, which a live trainer cannot switch to; build a new Trainer "
            "with TrainingArguments(deepspeed=plan.to_deepspeed(), ...), or pick a plan without optimizer offload"
        )
    if plan.weights != "fp32":
        raise MemlabError(
            "weights='bf16' is not applied to a live trainer yet; load the model in bf16 "
            "(from_pretrained(name, dtype=torch.bfloat16)) and build the trainer on it"
        )
    if plan.adapter == "qlora":
        raise MemlabError(
            "adapter='qlora' is not applied to a live trainer yet; load the model with a 4-bit BitsAndBytesConfig "
            "and wrap it with peft.get_peft_model(model, plan.to_peft_config()) (plan.to_code() shows how)"
        )
    if type(plan.checkpointing) is int and plan.checkpointing > 0:
        raise MemlabError(
            f"checkpointing={plan.checkpointing} blocks is not applied to a live trainer: its activation_checkpointing "
            "switch covers every block or none; apply plan.replace(checkpointing=True), or checkpoint the blocks on "
            "the model (plan.to_code() shows how) before building the Trainer"
        )
    if plan.loss != "full":
        raise MemlabError(
            "loss='chunked' is not applied to a live trainer yet; build the Trainer with "
            "TrainingArguments(**plan.to_training_arguments()) (Liger Kernel's fused linear cross-entropy)"
        )


class TrainerApplied:
    """A plan applied to a trainer (:func:`apply_to_trainer`); ``undo()`` gives the trainer and model back.

    Attributes:
        trainer: the trainer.
        plan: the plan it now trains with.
    """

    def __init__(self, trainer: Any, plan: Plan, undoes: list[Callable[[], None]]) -> None:
        self.trainer = trainer
        self.plan = plan
        self._undoes = undoes

    @property
    def undone(self) -> bool:
        return not self._undoes

    @property
    def active(self) -> bool:
        """Whether the plan is still on the trainer (as :attr:`memlab.Applied.active` says of a model)."""
        return bool(self._undoes)

    def undo(self) -> None:
        """Put back the trainer's arguments, model, optimizer, scheduler, callbacks and state, and the model's
        parameters (bit-exact, even after ``train()``), buffers, gradients and structure (adapters taken off).
        Calling it again does nothing."""
        while self._undoes:
            self._undoes.pop()()

    def __enter__(self) -> TrainerApplied:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.undo()

    def __repr__(self) -> str:
        return f"TrainerApplied({self.plan.label()!r}{', undone' if self.undone else ''})"


APPLIED_MARK = "_memlab_applied"
"""The instance attribute that says a plan is on the trainer (its label); ``undo()`` takes it off with the rest."""


def _trainer_restorer(trainer: Any) -> Callable[[], None]:
    """What puts the trainer's own attributes back: its ``__dict__`` (args, model, optimizer, scheduler, state,
    accelerator...) and its callback handler's, with the list of callbacks. A :func:`memlab.trainer.watch` put on
    after the plan stays on (its wrappers and callback), so that apply, watch, undo and remove compose in any
    order."""
    from memlab.trainer.watch import installed_watch

    attributes = dict(vars(trainer))
    handler = trainer.callback_handler
    handler_attributes = dict(vars(handler))
    callbacks = list(handler.callbacks)

    def restore() -> None:
        watch = installed_watch(trainer)
        kept = {} if watch is None else watch.instance_attributes()
        vars(trainer).clear()
        vars(trainer).update(attributes)
        vars(handler).clear()
        vars(handler).update(handler_attributes)
        handler.callbacks[:] = callbacks
        if watch is not None:
            vars(trainer).update(kept)
            watch.reinstall_callback()
        restored = installed_watch(trainer)
        if restored is not None and restored.removed:  # removed since the plan went on: it stays off
            restored.take_off()

    return restore


def _model_restorer(model: Any) -> Callable[[], None]:
    structure = ModuleStructure.capture(model)
    values = ModelValues.capture(model)

    def restore() -> None:
        structure.restore()
        values.restore()

    return restore


def _new_arguments(args: Any, plan: Plan, kind: TrainerKind) -> Any:
    from memlab.export.engines import training_arguments

    fields = {f.name for f in dataclasses.fields(args)}
    # The adapters go on the model itself (peft, below); the arguments carry the rest of the plan, but what a built
    # trainer cannot change (a vLLM engine's settings, precompute_ref), which refuse_changes found the trainer's own.
    legacy = "activation_checkpointing" not in fields
    flat = plan.replace(adapter="none", **dict.fromkeys(built_settings()))
    # TRL's configs offload activations with their own flag
    changes = trl_training_arguments(flat, legacy_names=legacy) if "activation_offloading" in fields else \
        training_arguments(flat, legacy_names=legacy)
    if kind.arguments is not None:  # a GRPOConfig: the generation batch kept, steps_per_generation follows
        changes.update(kind.arguments(args, plan))
    try:
        return dataclasses.replace(args, **changes)
    except Exception as error:
        raise MemlabError(
            f"transformers refused the plan's arguments ({type(error).__name__}: {error}); pick another plan"
        ) from error


def _prepared_in_init(trainer: Any) -> list[Any]:
    """The models a TRL trainer prepares with its accelerator in ``__init__`` (``accelerator.prepare_model(...,
    evaluation_mode=True)``): its reference model, the reward models among its reward functions (GRPO, RLOO), a
    distillation teacher."""
    import torch

    held = [vars(trainer).get("ref_model"), vars(trainer).get("teacher_model"),
            *(vars(trainer).get("reward_funcs") or [])]
    models: list[Any] = []
    for model in held:
        if isinstance(model, torch.nn.Module) and all(model is not seen for seen in models):
            models.append(model)
    return models


def _prepared_again(trainer: Any) -> Callable[[], None]:
    """The models TRL prepared in the trainer's ``__init__`` (:func:`_prepared_in_init`) prepared again by the
    rebuilt accelerator; returns the undo. Under bf16/fp16, ``prepare_model`` wraps a model's forward in autocast and
    fp32 outputs; ``train()`` prepares the policy again, these never. So a DPOTrainer built in fp32 and applied a bf16
    plan ran its reference in fp32 (its fused LM head's fp32 tiles: the step's peak), 1.8x what ``fit`` had estimated
    for the plan. Here each one's forward is what the new accelerator's ``prepare_model`` makes of the forward it had
    before any: wrapped as accelerate wraps it under mixed precision, the bare forward without."""
    from memlab.trainer.source import fp32_outputs_forward

    accelerator = getattr(trainer, "accelerator", None)
    stack = contextlib.ExitStack()
    if accelerator is None:
        return stack.close
    mixed = bool(getattr(accelerator, "native_amp", False))
    for model in _prepared_in_init(trainer):
        bare = vars(model).get("_original_forward", model.forward) if "forward" in vars(model) else model.forward
        changes: dict[str, Any] = {"forward": bare}
        if mixed:  # a context of its own for each model, as prepare_model makes one each time
            from accelerate.utils import get_mixed_precision_context_manager

            autocast = get_mixed_precision_context_manager(True, getattr(accelerator, "autocast_handler", None))
            with patched(model, forward=bare):
                changes = {"forward": fp32_outputs_forward(model, wrap=autocast), "_original_forward": bare}
        stack.enter_context(patched(model, **changes))
    return stack.close


def _rebuild_accelerator(create: Callable[[], None]) -> None:
    """The trainer's accelerator built again for its (new) arguments. accelerate keeps one state per process, which
    refuses another mixed precision; it is reset first (one process here: memlab refuses DeepSpeed and FSDP)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    create()


class SharedStateRestorer:
    """What puts accelerate's process-wide state back as it was when this restorer was made: ``PartialState`` and
    ``AcceleratorState`` share one dict each among all their instances (every trainer's accelerator reads them),
    so a rebuild that resets them, or fails half-way, would otherwise leave every other trainer in the process
    without its state (``'AcceleratorState' object has no attribute 'parallelism_config'``).

    Only a state that worked is put back, and only over the one memlab left (:meth:`left_by_memlab`). Arguments made
    before the plan went on (an ``SFTConfig`` for the next trainer) reset the state and leave it empty: a trainer
    built after the rebuild shares the rebuilt state, and emptied again, its steps would fail as above. And a
    trainer built since whose arguments reset the state set a whole state of its own, which every accelerator reads
    from then on, as accelerate has it: it stays.

    Example:
        >>> from accelerate.state import AcceleratorState
        >>> restore = shared_state_restorer()
        >>> AcceleratorState._reset_state(); restore.left_by_memlab(); restore()
    """

    def __init__(self) -> None:
        from accelerate.state import AcceleratorState, PartialState

        self._shared = (PartialState._shared_state, AcceleratorState._shared_state)
        self._saved = tuple(dict(shared) for shared in self._shared)
        self._left: tuple[dict[str, Any], ...] | None = None

    def left_by_memlab(self) -> None:
        """Note the state as memlab leaves it (after the rebuild), to tell a later trainer's state from it."""
        self._left = tuple(dict(shared) for shared in self._shared)

    def __call__(self) -> None:
        if not self._saved[-1]:
            return  # no accelerator had a state to go back to
        if self._left is not None and self._shared[-1] and not all(
            shared.keys() == left.keys() and all(shared[key] is value for key, value in left.items())
            for shared, left in zip(self._shared, self._left, strict=True)
        ):
            return  # a whole state made since memlab's rebuild (another trainer's): it stays
        for shared, state in zip(self._shared, self._saved, strict=True):  # the same dicts: every instance shares them
            shared.clear()
            shared.update(state)


def shared_state_restorer() -> SharedStateRestorer:
    """A :class:`SharedStateRestorer` of accelerate's process-wide state as it is now.

    Example:
        >>> restore = shared_state_restorer()
        >>> restore.left_by_memlab(); restore()
    """
    return SharedStateRestorer()


@contextlib.contextmanager
def accelerate_state_of(trainer: Any) -> Iterator[None]:
    """Within it, accelerate's process-wide state is the trainer's own where it was emptied since the trainer was
    built, and it is put back exactly after. transformers empties ``AcceleratorState``'s shared state whenever
    arguments read their device (any ``TrainingArguments`` or ``SFTConfig`` made, a plan written back included),
    and every trainer built before reads that state through its accelerator: TRL's ``compute_loss`` then fails
    (``'AcceleratorState' object has no attribute 'parallelism_config'``), as the trainer's own ``train()`` would.
    The entry points run a trainer's step inside it (:func:`memlab.trainer.entry.trainer_state`): the trainer's
    accelerator is built again for its own arguments, which fills the state, and the trainer gets its own
    accelerator object back, reading it. Where the state is there (the usual case), nothing happens.

    Example:
        >>> with accelerate_state_of(None):
        ...     pass
    """
    from accelerate.state import AcceleratorState, GradientState, PartialState

    create = getattr(trainer, "create_accelerator_and_postprocess", None)
    if create is None or AcceleratorState._shared_state or getattr(trainer, "accelerator", None) is None:
        yield
        return
    shared = (PartialState._shared_state, AcceleratorState._shared_state, GradientState._shared_state)
    saved = tuple(dict(state) for state in shared)
    restore_trainer = _trainer_restorer(trainer)
    try:
        create()
    finally:
        restore_trainer()
    try:
        yield
    finally:
        for state, before in zip(shared, saved, strict=True):  # the same dicts: every instance shares them
            state.clear()
            state.update(before)


def apply_to_trainer(trainer: Any, plan: Plan) -> TrainerApplied:
    """Set the trainer up to train with ``plan`` on its next ``train()``; undo with ``.undo()``.

    - ``trainer.args`` becomes a copy of its arguments with the plan's batch size (kept where
      ``plan.micro_batch`` is None), accumulation, checkpointing, bf16/fp16 and optim
      (:func:`memlab.export.engines.training_arguments`), and the trainer's accelerator is rebuilt for them (as
      transformers' own hyperparameter search does);
    - a LoRA plan puts peft adapters on the trainer's model in place (every linear layer but the output head, rank
      ``plan.lora_rank``; :func:`memlab.techniques.adapters.attach_adapter`);
    - what the trainer's kind changes besides (its ``arguments``, :mod:`memlab.live.trainer_kinds`): on TRL's
      GRPOTrainer, the plan's split of one optimizer step's generations (``per_device_train_batch_size``
      generations per device x accumulation) with the generation batch kept: ``steps_per_generation`` becomes
      ``generation_batch_size / micro_batch`` (the GRPO kind's ``arguments``); a split whose micro-batch
      does not divide the generation batch is refused;
    - ``trainer.optimizer`` and ``trainer.lr_scheduler`` are dropped, so that ``train()`` builds them for the
      plan (over the adapters only, with a LoRA plan); a GRPOTrainer's generations buffered by an earlier
      ``train()`` are dropped too (its next ``train()`` generates first, as a new trainer's does).

    Refused with a :class:`MemlabError`, before anything changes: optimizer offload (DeepSpeed), pure bf16 weights,
    QLoRA and the chunked loss (not yet on a live trainer; :func:`check_plan_for_trainer` says what to do), a
    plan that changes what a built trainer cannot change, a GRPOTrainer's vLLM engine or a DPOTrainer's
    ``precompute_ref`` (TRL decides both in the trainer's ``__init__``: build a new trainer; each lever's
    :attr:`~memlab.techniques.core.lever.Lever.refuses_change`), a
    trainer set up for DeepSpeed or FSDP, and a trainer that already has a plan applied (``undo()`` it first). A
    peft model keeps its own adapters: a LoRA plan must carry their settings (the plan memlab read from it does).

    Example (a tiny trainer: ``tests/trainer/test_trainer.py`` builds one)::

        applied = memlab.trainer.apply_to_trainer(trainer, memlab.Plan(micro_batch=1, accumulation=4))
        trainer.train()
        applied.undo()   # args, model (bit-exact), optimizer, scheduler, callbacks as they were
    """
    if not is_trainer(trainer):
        raise MemlabError(f"apply_to_trainer takes a transformers Trainer, not a {type(trainer).__name__}")
    kind = kind_of(trainer)  # a trainer of no kind memlab takes is refused, saying which it takes
    check_plan_for_trainer(plan)
    # what a built trainer cannot change (each lever's refuses_change): TRL builds a GRPOTrainer's vLLM engine and
    # computes a DPOTrainer's reference log-probs in its __init__
    refuse_changes(trainer, plan)
    check_single_process(trainer.args)
    plan = keeps_trainer_batch(plan, trainer.args)  # Plan(): the trainer's effective batch in one micro-batch
    if kind.check_plan is not None:  # what the kind refuses (a GRPOTrainer: a split of other than its generations)
        kind.check_plan(trainer, plan)
    model = trainer_model(trainer)
    if APPLIED_MARK in vars(trainer):
        raise MemlabError(
            f"this trainer already trains with a plan memlab applied ({vars(trainer)[APPLIED_MARK]}); call "
            "applied.undo() first (the trainer is then as it was), then memlab.apply(trainer, plan)"
        )
    carried = False
    if plan.adapter != "none" and hasattr(model, "peft_config"):
        from memlab.techniques.adapters import carried_settings, carries_plan_adapters

        carried = carries_plan_adapters(model, plan)
        if not carried:
            raise MemlabError(
                "this trainer's model already carries peft adapters, and they are what trains; apply a plan with "
                f"its own settings ({carried_settings(model)}), or adapter='none' to keep them as they are"
            )
    # accelerate's process-wide state, before anything touches it (new TrainingArguments may reset it already):
    # undo puts it back exactly, even where the rebuild fails half-way
    restore_shared = shared_state_restorer()
    try:
        new_args = _new_arguments(trainer.args, plan, kind)
    except BaseException:
        restore_shared()
        raise
    undoes: list[Callable[[], None]] = [_model_restorer(model), restore_shared, _trainer_restorer(trainer)]
    create = getattr(trainer, "create_accelerator_and_postprocess", None)
    rebuild = None if create is None else functools.partial(_rebuild_accelerator, create)
    try:
        trainer.args = new_args
        if "_train_batch_size" in vars(trainer):
            trainer._train_batch_size = new_args.train_batch_size
        if rebuild is not None:  # undo gives the trainer its own accelerator object back, and the shared state
            rebuild()
            undoes.append(_prepared_again(trainer))
        restore_shared.left_by_memlab()
        trl_offload_context_for(trainer)
        vars(trainer)[APPLIED_MARK] = plan.label()
        if plan.adapter != "none" and not carried:
            from memlab.techniques.adapters import attach_adapter

            detach = attach_adapter(model, plan)
            if detach is not None:
                undoes.append(detach)
        trainer.optimizer = None
        trainer.lr_scheduler = None
        if kind.start_afresh is not None:  # the kind's own state reset for the next train() (GRPO's generations)
            kind.start_afresh(trainer)
    except BaseException:
        TrainerApplied(trainer, plan, undoes).undo()
        raise
    return TrainerApplied(trainer, plan, undoes)
