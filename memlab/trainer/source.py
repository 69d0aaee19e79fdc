"""A ``transformers.Trainer`` (TRL's trainers included) as what memlab measures: its model, data, loss and plan.

Nothing here imports transformers, TRL or datasets at module level: a trainer is recognised by the names of its
classes, so ``import memlab`` stays light and memlab works where TRL and datasets are not installed.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from types import MethodType
from typing import Any

from memlab.errors import MemlabError
from memlab.export.trainer_arguments import plan_from_trainer, trainer_model
from memlab.live.batch import TrainerLoss
from memlab.live.patching import patched
from memlab.live.rebind import untracked_copy
from memlab.live.trainer_kinds import TrainerKind, is_trainer, kind_of
from memlab.plan import Plan
from memlab.trainer.reference import gathered_in_forward, held_while_running

__all__ = [
    "TrainerSource",
    "accelerate_outputs_fp32",
    "fp32_outputs_forward",
    "check_trainer_kind",
    "dry_run_models",
    "has_own_compute_loss",
    "is_trainer",
    "keeps_trainer_batch",
    "trainer_model",
    "trl_offload_context_for",
]

_PLAIN = (bool, int, float, str, type(None))


def check_trainer_kind(trainer: Any) -> TrainerKind:
    """The trainer's kind (:func:`memlab.live.trainer_kinds.kind_of`) where the Trainer's own step measures it: a kind
    with a step of its own (GRPO's generates first) is refused with what takes it (its ``elsewhere``), as is a TRL
    trainer of no declared kind (PPO, online DPO...); nothing on the trainer changes.

    Example:
        >>> check_trainer_kind(object())
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: a object is not a transformers Trainer; pass a Trainer (TRL's SFTTrainer, \
DPOTrainer and GRPOTrainer too), or a model and a batch
    """
    kind = kind_of(trainer)
    if kind.target is not None:
        raise MemlabError(kind.elsewhere(trainer) if kind.elsewhere is not None else
                          f"a {kind.name} runs a step of its own, which this call does not run; write "
                          "memlab.measure(trainer), memlab.estimate(trainer) or memlab.fit(trainer, budget=...)")
    return kind


def trl_offload_context_for(trainer: Any) -> None:
    """Make a TRL trainer's activation-offloading context (``maybe_activation_offload_context``, which TRL builds
    once in ``__init__`` and enters around each ``training_step``) follow ``trainer.args.activation_offloading``
    after its arguments changed (:func:`memlab.trainer.apply.apply_to_trainer`). Off: a null context. On: TRL's
    ``get_act_offloading_ctx_manager``, which needs an accelerator; without one (a CPU-only machine) offload moves
    nothing and the null context stands in. A trainer without that attribute (transformers' own) is left alone.

    Example:
        >>> from types import SimpleNamespace
        >>> trainer = SimpleNamespace(args=SimpleNamespace(activation_offloading=False),
        ...                           maybe_activation_offload_context="TRL's context")
        >>> trl_offload_context_for(trainer); type(trainer.maybe_activation_offload_context).__name__
        'nullcontext'
    """
    if "maybe_activation_offload_context" not in vars(trainer):
        return
    context: Any = nullcontext()
    if getattr(trainer.args, "activation_offloading", False):
        import torch

        # is_available, not current_accelerator: a CUDA build of torch names CUDA even where no GPU or driver is.
        if isinstance(trainer.maybe_activation_offload_context, nullcontext) and torch.accelerator.is_available():
            from trl.models import get_act_offloading_ctx_manager

            context = get_act_offloading_ctx_manager(model=trainer.model)
        elif not isinstance(trainer.maybe_activation_offload_context, nullcontext):
            return  # TRL's own context, already on
    trainer.maybe_activation_offload_context = context


def _is_plain_data(value: Any, limit: int = 10_000) -> bool:
    """Python scalars, and dicts/lists of them (the counters and metric lists a trainer keeps), up to ``limit``."""
    stack, seen = [value], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > limit:
            return False
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif not isinstance(item, _PLAIN):
            return False
    return True


def has_own_compute_loss(trainer: Any) -> bool:
    """Whether the trainer's class overrides ``compute_loss`` outside transformers and TRL (a custom loss).

    Example:
        >>> has_own_compute_loss(object())
        False
    """
    method = getattr(type(trainer), "compute_loss", None)
    module = getattr(method, "__module__", "") or ""
    return method is not None and not module.startswith(("transformers.", "trl."))


@contextmanager
def trainer_bookkeeping_kept(trainer: Any) -> Iterator[None]:
    """Put back the trainer's plain-data attributes after a memlab loss call (TRL's ``compute_loss`` appends
    metrics and counts tokens), so that measuring leaves nothing in the user's next log.

    Each attribute ends as the very object it was (a list dataset of token ids is plain data too, and the user's
    ``trainer.train_dataset`` must stay the object they passed): one the call rebound is bound back, and a list or
    dict the call changed in place gets its old contents back in place; one left equal is not touched.

    Example:
        >>> from types import SimpleNamespace
        >>> trainer = SimpleNamespace(train_dataset=[{"input_ids": [1, 2]}], metrics={"loss": []})
        >>> data, metrics = trainer.train_dataset, trainer.metrics
        >>> with trainer_bookkeeping_kept(trainer):
        ...     trainer.metrics["loss"].append(1.0)
        ...     trainer.train_dataset = list(data)
        >>> trainer.train_dataset is data, trainer.metrics is metrics, trainer.metrics
        (True, True, {'loss': []})
    """
    saved = {name: (value, copy.deepcopy(value)) for name, value in vars(trainer).items() if _is_plain_data(value)}
    try:
        yield
    finally:
        for name, (original, contents) in saved.items():
            if vars(trainer).get(name, _GONE) is not original:
                setattr(trainer, name, original)
            if original == contents:
                continue
            if isinstance(original, list):
                original[:] = contents
            elif isinstance(original, dict):
                original.clear()
                original.update(contents)
            else:  # an immutable value cannot have changed in place; a tuple of lists is put back as a copy
                setattr(trainer, name, contents)


_GONE = object()


@contextmanager
def dry_run_models(trainer: Any, model: Any) -> Iterator[None]:
    """Within it, a trainer whose loss a dry run calls on ``model`` (the fake copy of its policy) holds that copy as
    its ``model`` (and ``model_wrapped``, where it was the model) and a fake copy of its ``ref_model``: TRL's losses
    reach the policy through ``self.model`` too (a DPOTrainer's peft reference is the policy with its adapters
    off) and the reference through ``self.ref_model``, which would otherwise run the live weights, or fail on the
    meta device. The reference's copy is made outside the step's tracking (its weights are counted apart:
    :func:`memlab.trainer.reference.with_reference`). Everything is put back after; nothing changes for a live model.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> trainer = SimpleNamespace(model=torch.nn.Linear(2, 2))
        >>> with dry_run_models(trainer, trainer.model):
        ...     pass
    """
    from torch._subclasses.fake_tensor import is_fake
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    held = vars(trainer).get("model")
    if first is None or not is_fake(first) or held is model:
        yield
        return
    copies: dict[str, Any] = {"model": model}
    if vars(trainer).get("model_wrapped", held) is held:
        copies["model_wrapped"] = model
    reference = vars(trainer).get("ref_model")
    if type(reference).__name__ == "DeepSpeedEngine":  # TRL's prepare_deepspeed wraps a ZeRO-3 reference
        reference = reference.module
    if reference is not None and hasattr(reference, "parameters") and reference is not held:
        copies["ref_model"] = untracked_copy(reference, first)
        # a sharded dry run (DTensor weights): FSDP2 gathers a whole reference as TRL shards it
        gathers = gathered_in_forward(trainer) if is_traceable_wrapper_subclass(first) else 0
        held_while_running(copies["ref_model"], gathers)
    accelerator = getattr(trainer, "accelerator", None)
    # A dry run is one rank's step alone: TRL's losses gather and reduce their metrics over the processes, which a
    # fake tensor cannot be sent to (the forked copy a launched rank estimates in has no group, and a trainer set up
    # for DeepSpeed in one process gathers through torch.distributed all the same); each collective answers with
    # this rank's own value.
    alone = {"gather": _own, "gather_for_metrics": _own, "reduce": _own} if accelerator is not None else {}
    with patched(trainer, **copies), patched(accelerator, **alone):
        yield


def _own(data: Any, *_: Any, **__: Any) -> Any:
    """A collective over one process: its own data."""
    return data


@contextmanager
def accelerate_outputs_fp32(model: Any) -> Iterator[None]:
    """Within it, ``model``'s forward returns its fp16/bf16 tensors copied to fp32, as a Trainer with ``bf16=True``
    or ``fp16=True`` runs it: accelerate's ``prepare_model`` wraps the forward in autocast and in
    ``accelerate.utils.convert_outputs_to_fp32`` (its ``native_amp`` block), so the logits' fp32 copy (tokens x
    vocabulary x 4 bytes) is alive as long as the outputs are. memlab's precision lever brings the autocast; this
    brings the copy, wrapped exactly as accelerate wraps it. Only where autocast is on for the model's device type
    (the plan's precision is fp16/bf16); a forward that accelerate already wraps is left as it is. The model's
    own ``forward`` attribute (memlab's compiled forward, say) is kept under the wrapper and put back after, also
    on error.

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(2, 2)
        >>> with torch.autocast("cpu", dtype=torch.bfloat16), accelerate_outputs_fp32(model):
        ...     model(torch.ones(1, 2)).dtype
        torch.float32
        >>> "forward" in vars(model)
        False
    """
    parameter = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    device_type = parameter.device.type if parameter is not None else "cpu"
    if not _autocast_on(device_type) or _converts_outputs(model.forward):
        yield
        return
    with patched(model, forward=fp32_outputs_forward(model)):
        yield


def fp32_outputs_forward(model: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
                         ) -> Callable[..., Any]:
    """``model.forward`` (first wrapped by ``wrap``, where given) under ``accelerate.utils.convert_outputs_to_fp32``,
    as accelerate's ``prepare_model`` wraps it in its two cases: a bound method's function wrapped and bound to the
    model again, anything else (an instance function) wrapped as it is. Nothing is set on the model.

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(2, 2).bfloat16()
        >>> fp32_outputs_forward(model)(torch.ones(1, 2, dtype=torch.bfloat16)).dtype
        torch.float32
    """
    from accelerate.utils import convert_outputs_to_fp32

    forward = model.forward
    function = getattr(forward, "__func__", None)
    if function is not None:
        return MethodType(convert_outputs_to_fp32(wrap(function) if wrap else function), model)
    return convert_outputs_to_fp32(wrap(forward) if wrap else forward)


def _autocast_on(device_type: str) -> bool:
    import torch

    try:
        return bool(torch.is_autocast_enabled(device_type))
    except RuntimeError:  # a device type autocast does not know: no mixed precision there
        return False


def _converts_outputs(forward: Any) -> bool:
    """Whether ``forward`` is already accelerate's fp32-output wrapper (a model a Trainer prepared before)."""
    seen = 0
    while forward is not None and seen < 8:
        if type(forward).__name__ == "ConvertOutputsToFp32":
            return True
        forward = getattr(getattr(forward, "__func__", forward), "__wrapped__", None)
        seen += 1
    return False


def keeps_trainer_batch(plan: Plan, args: Any) -> Plan:
    """``plan`` with the trainer's effective batch where it leaves the batch open (``micro_batch=None``), as
    ``fit`` keeps it: the trainer's step holds ``per_device_train_batch_size x gradient_accumulation_steps`` rows on
    each device (``x`` the processes in all), and a plan on it keeps them. ``Plan()`` means what it means on every
    object: the whole effective batch in one micro-batch; ``Plan(accumulation=k)`` the effective batch in ``k``
    micro-batches. A plan that names its ``micro_batch`` is measured as it says. The trainer as set up is
    ``plan=None`` (:meth:`memlab.Plan.from_trainer`). The trial's plan and ``rows_per_step`` then say what ran.

    Raises:
        MemlabError: an accumulation that does not divide the trainer's effective batch.

    Example:
        >>> from types import SimpleNamespace
        >>> args = SimpleNamespace(per_device_train_batch_size=2, gradient_accumulation_steps=2)
        >>> keeps_trainer_batch(Plan(), args).label(), keeps_trainer_batch(Plan(accumulation=4), args).label()
        ('mb4x1', 'mb1x4')
    """
    if plan.micro_batch is not None:
        return plan
    rows, steps = int(args.per_device_train_batch_size), int(args.gradient_accumulation_steps)
    if (rows * steps) % plan.accumulation:
        raise MemlabError(
            f"the trainer's step holds {rows * steps} rows per device (per_device_train_batch_size={rows} x "
            f"gradient_accumulation_steps={steps}), which accumulation={plan.accumulation} does not divide; write "
            f"an accumulation that divides {rows * steps}, or name the micro_batch too; the trainer as set up is "
            "plan=None (memlab.Plan.from_trainer(trainer))"
        )
    return plan.replace(micro_batch=rows * steps // plan.accumulation)


@dataclass
class TrainerSource:
    """What memlab takes from a live trainer.

    Attributes:
        trainer: the trainer itself.
        model: its model, unwrapped (:func:`trainer_model`).
        collator: its data collator (``trainer.data_collator``).
        loss_fn: ``loss_fn(model, micro_batch)`` through ``trainer.compute_loss``, so TRL's losses and
            completion-only masking count as they do in training (see :meth:`make_loss_fn`).
        effective_batch: rows per optimizer step on one device: ``per_device_train_batch_size x
            gradient_accumulation_steps`` (several GPUs aside).
        plan: the trainer's current settings as a plan (:meth:`plan_of`).
        loss_note: what a trial should know of the loss measured (Liger's fused loss stood in for), or None.
    """

    trainer: Any
    model: Any
    collator: Callable[[list[Any]], Any]
    loss_fn: Callable[[Any, Any], Any]
    effective_batch: int
    plan: Plan
    loss_note: str | None = None

    @classmethod
    def from_trainer(cls, trainer: Any) -> TrainerSource:
        """Read a trainer; nothing on it changes. One set up for DeepSpeed or FSDP is read too: the entry points
        that run its step in this process refuse it (:func:`memlab.trainer.entry.live_target`), an estimate answers
        it per GPU (:mod:`memlab.trainer.sharding`).

        Raises:
            MemlabError: not a trainer, or an optimizer memlab cannot measure in its arguments.

        Example:
            >>> TrainerSource.from_trainer(object())
            Traceback (most recent call last):
            ...
            memlab.errors.MemlabError: a object is not a transformers Trainer; pass a Trainer ...
        """
        check_trainer_kind(trainer)  # not a trainer, or a kind whose own step this call does not run: refused
        args = trainer.args
        model = trainer_model(trainer)
        plan, loss_note = cls.plan_of(trainer), None
        loss_fn: Callable[[Any, Any], Any] = cls.make_loss_fn(trainer)
        if plan.loss == "chunked":
            if has_own_compute_loss(trainer):
                plan = plan.replace(loss="full")
                loss_note = ("the trainer has its own compute_loss, which memlab measures as it is; Liger's fused "
                             "loss (use_liger_kernel=True) is not measured with it (loss='full')")
            else:
                from memlab.live.batch import default_loss

                loss_fn = default_loss  # the model's loss, which memlab's chunked loss stands in for
                loss_note = ("the trainer uses Liger's fused linear cross-entropy (use_liger_kernel=True): memlab "
                             "measures its own chunked cross-entropy (loss='chunked') in its place, the same memory "
                             "pattern; Liger's Triton kernels run only on CUDA")
        return cls(
            trainer=trainer,
            model=model,
            collator=trainer.data_collator,
            loss_fn=loss_fn,
            effective_batch=args.per_device_train_batch_size * args.gradient_accumulation_steps,
            plan=plan,
            loss_note=loss_note,
        )

    @staticmethod
    def plan_of(trainer: Any) -> Plan:
        """The trainer's settings as a plan (:func:`memlab.export.trainer_arguments.plan_from_trainer`)."""
        return plan_from_trainer(trainer)

    @staticmethod
    def make_loss_fn(trainer: Any) -> TrainerLoss:
        """``loss_fn(model, micro_batch)`` calling ``trainer.compute_loss(model, inputs)`` in the trainer's own
        loss context, on a copy of the batch dict (TRL writes into it).

        ``num_items_in_batch`` is passed as None where ``compute_loss`` takes it: the loss is then each
        micro-batch's mean, and memlab scales it for accumulation itself (the memory is the same). The trainer's
        counters and metric lists are put back after each call (:func:`trainer_bookkeeping_kept`). Under mixed
        precision the model's outputs are copied to fp32 as accelerate does in training
        (:func:`accelerate_outputs_fp32`).
        """
        takes_count = "num_items_in_batch" in inspect.signature(trainer.compute_loss).parameters

        def loss_fn(model: Any, micro_batch: Any) -> Any:
            inputs = dict(micro_batch)
            keywords = {"num_items_in_batch": None} if takes_count else {}
            context = getattr(trainer, "compute_loss_context_manager", nullcontext)
            with trainer_bookkeeping_kept(trainer), dry_run_models(trainer, model), context(), \
                    accelerate_outputs_fp32(model):
                return trainer.compute_loss(model, inputs, **keywords)

        return TrainerLoss(trainer, loss_fn)  # the trainer a field: what its levers read (precompute_ref)
