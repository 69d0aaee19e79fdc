"""Batches: counting rows, cutting micro-batches, moving to a device, and the default loss."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError

LossFn = Callable[[nn.Module, Any], torch.Tensor]


@dataclass(frozen=True)
class TrainerLoss:
    """A loss that runs a trainer's own ``compute_loss`` (:meth:`memlab.trainer.source.TrainerSource.make_loss_fn`),
    with the trainer as a field: what a trainer's levers read of the step (``precompute_ref``: whether the trainer is
    a DPOTrainer, and runs it precomputed), asked with :func:`trainer_of`.

    Example:
        >>> loss = TrainerLoss("a trainer", lambda model, batch: batch * 2)
        >>> loss(None, 3), trainer_of(loss), trainer_of(lambda model, batch: 0)
        (6, 'a trainer', None)
    """

    trainer: Any
    loss: Callable[[Any, Any], Any]

    def __call__(self, model: Any, micro_batch: Any) -> Any:
        return self.loss(model, micro_batch)


def trainer_of(loss_fn: Any) -> Any:
    """The trainer whose ``compute_loss`` ``loss_fn`` runs (a :class:`TrainerLoss`), or None."""
    return loss_fn.trainer if isinstance(loss_fn, TrainerLoss) else None


class StepBatches:
    """A batch whose micro-batches are made, not cut: ``make(micro_batch, accumulation)`` returns a step's
    micro-batches (a trainer's collator re-collating its examples for each plan), never slices or repeats of one
    collated batch, so packed and padding-free batches (one row of concatenated sequences) stay whole.

    ``rows`` is the micro-batch a plan without ``micro_batch`` takes. Each step's micro-batches are made once
    and kept; they are made with any dispatch mode (a memory tracker, a fake mode) set aside, as a data loader
    makes them before the step. :meth:`map` gives the same batches with a function applied to every tensor.

    Example:
        >>> batches = StepBatches(lambda rows, steps: [torch.ones(1, rows * 3)] * steps, rows=2)
        >>> [tuple(part.shape) for part in batches.micro_batches(None, 2)], count_rows(batches)
        ([(1, 6), (1, 6)], 2)
    """

    def __init__(self, make: Callable[[int, int], list[Any]], rows: int, describe: str = "") -> None:
        self.make = make
        self.rows = rows
        self.describe = describe
        self._made: dict[tuple[int, int], list[Any]] = {}

    def micro_batches(self, micro_batch: int | None, accumulation: int) -> list[Any]:
        """The ``accumulation`` micro-batches of ``micro_batch`` rows each (default :attr:`rows`)."""
        from torch.utils._python_dispatch import _disable_current_modes

        key = (micro_batch or self.rows, accumulation)
        if key not in self._made:
            with _disable_current_modes():
                self._made[key] = list(self.make(*key))
        return self._made[key]

    def map(self, function: Callable[[torch.Tensor], torch.Tensor]) -> StepBatches:
        """The same micro-batches with ``function`` applied to every tensor (moved to a device, made fake)."""
        return StepBatches(
            lambda rows, steps: [map_tensors(part, function) for part in self.micro_batches(rows, steps)],
            self.rows,
            self.describe,
        )

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors of the micro-batches made so far (the plain micro-batch made first, if none was)."""
        if not self._made:
            self.micro_batches(None, 1)
        for made in self._made.values():
            for part in made:
                yield from named_tensors(part)

    def __repr__(self) -> str:
        return f"StepBatches({self.describe or f'{self.rows} rows'})"


Batch = Mapping[str, Any] | torch.Tensor | tuple[Any, ...] | list[Any] | StepBatches


def named_tensors(batch: Batch) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a batch (dict, tensor, tuple or list) with a name for messages."""
    if isinstance(batch, torch.Tensor):
        yield "batch", batch
    elif isinstance(batch, StepBatches):
        yield from batch.tensors()
    elif isinstance(batch, Mapping):
        for key, value in batch.items():
            if isinstance(value, torch.Tensor):
                yield repr(key), value
    elif isinstance(batch, (tuple, list)):
        for position, value in enumerate(batch):
            if isinstance(value, torch.Tensor):
                yield f"[{position}]", value
    else:
        raise MemlabError(
            f"a batch of type {type(batch).__name__} is not supported; "
            "pass a dict of tensors, a tensor, or a tuple of tensors with rows on dimension 0"
        )


TEXT_ROWS = ("input_ids", "inputs_embeds", "attention_mask", "labels", "token_type_ids")
"""Keys whose dimension 0 is the batch's rows in a batch that cannot be cut (the text of a vision-language batch)."""


def count_rows(batch: Batch) -> int:
    """Rows in a batch: dimension 0 of every tensor in it, which must agree; for an atomic batch
    (:func:`is_atomic`), dimension 0 of its text tensors.

    Example:
        >>> count_rows({"input_ids": torch.zeros(4, 8), "labels": torch.zeros(4, 8)})
        4
        >>> count_rows({"input_ids": torch.zeros(2, 8), "pixel_values": torch.zeros(64, 12)})
        2
    """
    if isinstance(batch, StepBatches):
        return batch.rows
    rows = _rows_by_name(batch)
    if len(set(rows.values())) == 1:
        return next(iter(rows.values()))
    text = _text_rows(batch)
    if text is not None:
        return text
    listed = ", ".join(f"{name}: {count}" for name, count in rows.items())
    raise MemlabError(
        f"batch tensors disagree on the number of rows ({listed}); give them the same dimension 0, or, for a batch "
        "that cannot be cut into rows (a vision-language processor's patches), pass it as a dict whose text tensors "
        "(input_ids, attention_mask, labels) share dimension 0: memlab then takes it whole"
    )


def is_atomic(batch: Batch) -> bool:
    """Whether ``batch`` is one atomic batch: a dict whose tensors do not share dimension 0 while its text tensors
    do (a vision-language processor's flattened patches, one grid row per image). Such a batch is measured and
    estimated as given, never cut into micro-batches or repeated row by row.

    Example:
        >>> is_atomic({"input_ids": torch.zeros(2, 8), "pixel_values": torch.zeros(64, 12)})
        True
        >>> is_atomic({"input_ids": torch.zeros(2, 8), "pixel_values": torch.zeros(2, 3, 4, 4)})
        False
    """
    if isinstance(batch, StepBatches) or not isinstance(batch, Mapping):
        return False
    return len(set(_rows_by_name(batch).values())) > 1 and _text_rows(batch) is not None


def atomic_refusal(rows: int, asked: str, instead: str | None = None) -> MemlabError:
    """The error for a plan that would cut or repeat the rows of an atomic batch of ``rows`` rows; ``instead``
    says what to write (default: a training plan's micro-batches)."""
    instead = instead or (
        f"write micro_batch=None (or micro_batch={rows}), with accumulation=k to run the whole batch k times per "
        "step; or make the batch of one micro-batch with the processor and pass that, or pass a Trainer whose "
        "collator makes each micro-batch"
    )
    return MemlabError(
        f"{asked} would cut or repeat the rows of an atomic batch (its tensors do not share dimension 0, as a "
        f"vision-language processor makes them), which memlab takes whole; {instead}"
    )


def _rows_by_name(batch: Batch) -> dict[str, int]:
    rows: dict[str, int] = {}
    for name, tensor in named_tensors(batch):
        if tensor.dim() == 0:
            raise MemlabError(f"batch tensor {name} is a scalar; every batch tensor needs rows on dimension 0")
        rows[name] = tensor.shape[0]
    if not rows:
        raise MemlabError("the batch holds no tensors; pass a dict of tensors, a tensor, or a tuple of tensors")
    if 0 in rows.values():
        raise MemlabError("the batch has no rows; pass at least one row (dimension 0 of every tensor)")
    return rows


def _text_rows(batch: Batch) -> int | None:
    """The rows the text tensors of a dict batch agree on (None: none, or they disagree)."""
    if not isinstance(batch, Mapping):
        return None
    counts = {value.shape[0] for key, value in batch.items()
              if key in TEXT_ROWS and isinstance(value, torch.Tensor) and value.dim() > 0}
    return counts.pop() if len(counts) == 1 else None


def count_tokens(batch: Batch) -> int | None:
    """Tokens in a batch: the sum of ``attention_mask`` if present, else the size of ``input_ids``; None otherwise.

    Example:
        >>> count_tokens({"input_ids": torch.zeros(2, 5, dtype=torch.long)})
        10
    """
    if isinstance(batch, StepBatches):
        counts = [count_tokens(part) for part in batch.micro_batches(None, 1)]
        return None if None in counts else sum(c for c in counts if c is not None)
    if not isinstance(batch, Mapping):
        return None
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        return int(mask.sum().item())
    ids = batch.get("input_ids")
    if isinstance(ids, torch.Tensor):
        return ids.numel()
    return None


def map_tensors(batch: Batch, function: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
    """The batch with ``function`` applied to every tensor; other values pass through unchanged."""
    if isinstance(batch, torch.Tensor):
        return function(batch)
    if isinstance(batch, StepBatches):
        return batch.map(function)
    if isinstance(batch, Mapping):
        return {key: function(v) if isinstance(v, torch.Tensor) else v for key, v in batch.items()}
    values = [function(v) if isinstance(v, torch.Tensor) else v for v in batch]
    if hasattr(batch, "_fields"):  # a namedtuple takes its fields as arguments
        return type(batch)(*values)
    return type(batch)(values)


def take_rows(batch: Batch, indices: torch.Tensor) -> Batch:
    """The rows at ``indices`` of every tensor (a new tensor each time, never a view of the user's batch); an
    atomic batch (:func:`is_atomic`) is refused."""
    if is_atomic(batch):
        raise atomic_refusal(count_rows(batch), f"taking {len(indices)} rows")
    return map_tensors(batch, lambda tensor: tensor.index_select(0, _moved(indices, tensor)))


def _moved(indices: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """``indices`` on ``tensor``'s device; for a fake tensor (a dry run's) through its fake mode, so that a dry run
    for a GPU makes no real copy on it."""
    fake_mode = getattr(tensor, "fake_mode", None)
    if fake_mode is None or indices.device == tensor.device:
        return indices.to(tensor.device)
    with fake_mode:
        return indices.to(tensor.device)


def same_layout(first: Batch, second: Batch) -> bool:
    """Whether two batches would run the same step: the same structure, every tensor of the same shape, dtype,
    device, strides and ``requires_grad``, and the same values wherever values are known (a real tensor's, or a
    fake tensor's kept ``constant``: an image batch's grids decide shapes); other values equal.

    Example:
        >>> same_layout({"ids": torch.zeros(2, 8)}, {"ids": torch.ones(2, 8)})  # values differ: both known
        False
        >>> from torch._subclasses.fake_tensor import FakeTensorMode
        >>> with FakeTensorMode() as mode:
        ...     first, second = torch.empty(2, 8), torch.empty(2, 8)
        >>> same_layout({"ids": first}, {"ids": second}), same_layout({"ids": first}, {"ids": second[:1]})
        (True, False)
    """
    if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor):
        return _same_tensor(first, second)
    if isinstance(first, Mapping) and isinstance(second, Mapping):
        return list(first) == list(second) and all(same_layout(first[key], second[key]) for key in first)
    if isinstance(first, (tuple, list)) and isinstance(second, (tuple, list)):
        return type(first) is type(second) and len(first) == len(second) and all(
            same_layout(a, b) for a, b in zip(first, second, strict=True))
    if isinstance(first, (torch.Tensor, Mapping, tuple, list, StepBatches)) or isinstance(
            second, (torch.Tensor, Mapping, tuple, list, StepBatches)):
        return first is second
    try:
        return bool(first == second)
    except Exception:  # noqa: BLE001 - a value that cannot say whether it equals another is taken as different
        return first is second


def _same_tensor(first: torch.Tensor, second: torch.Tensor) -> bool:
    if first is second:
        return True
    if (first.shape, first.dtype, first.device, first.requires_grad) != (
            second.shape, second.dtype, second.device, second.requires_grad) or first.stride() != second.stride():
        return False
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import _disable_current_modes

    def values(tensor: torch.Tensor) -> torch.Tensor | None:
        if isinstance(tensor, FakeTensor):
            return tensor.constant
        return None if tensor.is_meta else tensor

    first_values, second_values = values(first), values(second)
    if first_values is None or second_values is None:
        return first_values is None and second_values is None
    with _disable_current_modes():
        return bool(torch.equal(first_values, second_values))


def repeats_left_out(micro: list[Batch]) -> list[Batch]:
    """A dry run's micro-batches: each one past the second that repeats the layout of the one before it is left
    out (:func:`same_layout`).

    On fake tensors nothing depends on a tensor's values but its shapes (where values are known, they are
    compared too), and from the second micro-batch on, the step starts each one with the same tensors alive: the
    gradients of the ones before, the optimizer's state. A repeat's allocations are then the one before's, in the
    same order, so its peak is the same and the step's peak with it; running it again would only take time, one
    micro-batch's dry run each (4 of 8 on an 8B GRPO step of 4 micro-batches, warm-up included). The step still
    holds every micro-batch, as it does live.

    Example:
        >>> parts = [torch.zeros(2, 8), torch.zeros(2, 8), torch.zeros(2, 8), torch.zeros(1, 8)]
        >>> [tuple(part.shape) for part in repeats_left_out(parts)]
        [(2, 8), (2, 8), (1, 8)]
    """
    return [part for number, part in enumerate(micro) if number < 2 or not same_layout(part, micro[number - 1])]


def repeats_note(micro_batches: int, run: int) -> str:
    """What a dry run says where :func:`repeats_left_out` left micro-batches out.

    Example:
        >>> repeats_note(4, 2).split(";")[0]
        'accumulation 4: 2 of the 4 micro-batches repeat the shapes of the one before and were not run again'
    """
    return (f"accumulation {micro_batches}: {micro_batches - run} of the {micro_batches} micro-batches repeat the "
            f"shapes of the one before and were not run again; their memory repeats it exactly (the timeline shows "
            f"the {run} run)")


def batch_device(batch: Batch) -> torch.device | None:
    for _, tensor in named_tensors(batch):
        return tensor.device
    return None


def default_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """``model(**batch).loss`` for a dict batch, the Hugging Face convention."""
    if not isinstance(batch, Mapping):
        raise MemlabError(
            f"a {type(batch).__name__} batch needs a loss_fn; pass loss_fn=lambda model, batch: <scalar loss>"
        )
    output = model(**batch)
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if loss is None:
        raise MemlabError(
            f"{type(model).__name__}(**batch) returned no .loss (does the batch have labels?); "
            "add labels to the batch or pass loss_fn=lambda model, batch: <scalar loss>"
        )
    return loss


def resolve_loss_fn(batch: Batch, loss_fn: LossFn | None) -> LossFn:
    """The loss function to use: the user's, else the default for dict batches; a clear error otherwise."""
    if loss_fn is None and isinstance(batch, StepBatches):
        return default_loss
    if loss_fn is not None:
        if not callable(loss_fn):
            raise MemlabError("loss_fn must be callable as loss_fn(model, batch) -> scalar tensor")
        _check_takes_model_and_batch(loss_fn)
        return loss_fn
    if not isinstance(batch, Mapping):
        raise MemlabError(
            f"a {type(batch).__name__} batch needs a loss_fn; pass loss_fn=lambda model, batch: <scalar loss>"
        )
    return default_loss


def _check_takes_model_and_batch(loss_fn: Callable[..., Any]) -> None:
    try:
        signature = inspect.signature(loss_fn)
    except (TypeError, ValueError):  # a builtin or C function: nothing to check
        return
    try:
        signature.bind(None, None)
    except TypeError:
        raise MemlabError(
            f"loss_fn{signature} cannot be called as loss_fn(model, batch); "
            "write it with two arguments, e.g. loss_fn=lambda model, batch: model(batch).mean()"
        ) from None


def check_loss(loss: Any) -> torch.Tensor:
    """The loss itself if it is a scalar tensor that can be differentiated; a clear error otherwise."""
    if not isinstance(loss, torch.Tensor):
        raise MemlabError(f"the loss is a {type(loss).__name__}, not a tensor; return a scalar tensor from loss_fn")
    if loss.numel() != 1:
        raise MemlabError(
            f"the loss has shape {tuple(loss.shape)}, not a scalar; reduce it, e.g. return loss.mean()"
        )
    if not loss.requires_grad:
        raise MemlabError("the loss does not require grad; compute it from the model's output without no_grad()")
    return loss.reshape(())
