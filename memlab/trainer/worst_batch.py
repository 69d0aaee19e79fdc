"""The batch of a trainer's dataset that costs the most memory: its longest examples, collated as the trainer does.

Memory grows with the tokens of a micro-batch, and a padding collator pads every row to the longest; so the worst
micro-batch is the ``k`` longest examples collated together. Lengths are read without running the model: a
``length``/``lengths`` column where there is one, else the length of ``input_ids``, else (the fallback) the
collator's output for each example on its own.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from memlab.errors import MemlabError
from memlab.trainer.source import TrainerSource

__all__ = ["SAMPLE_DEFAULT", "WorstBatch", "example_length", "worst_batch"]

SAMPLE_DEFAULT = 1000
"""How many examples of an iterable dataset are read to find the longest (it cannot be scanned in full)."""

_MISSING = object()


@dataclass(frozen=True)
class WorstBatch:
    """The costliest micro-batch of a dataset.

    Attributes:
        batch: the collated tensors (a dict), as the trainer's collator made them.
        indices: the examples' positions in the train dataset (in an iterable one: in the order it yields).
        lengths: their lengths in tokens, longest first.
        scanned: how many examples were looked at.
        sampled: True when the dataset is iterable and only its first ``scanned`` examples were read.
        measured_by: where the lengths came from: ``"length column"``, ``"input_ids"`` or ``"collator"``.

    Example:
        >>> import torch
        >>> worst = WorstBatch({"input_ids": torch.zeros(2, 512)}, (17, 3), (512, 498), 2000, False, "input_ids")
        >>> worst.describe()
        'rows 17, 3 of the train dataset, 512 and 498 tokens; scanned 2,000 examples by input_ids'
    """

    batch: dict[str, Any]
    indices: tuple[int, ...]
    lengths: tuple[int, ...]
    scanned: int
    sampled: bool
    measured_by: str

    def describe(self) -> str:
        """One line: which rows, how long, how they were found."""
        rows = ", ".join(str(i) for i in self.indices)
        lengths = [str(n) for n in self.lengths]
        tokens = lengths[0] if len(lengths) == 1 else ", ".join(lengths[:-1]) + " and " + lengths[-1]
        how = f"by {self.measured_by}"
        scan = (
            f"sampled the first {self.scanned:,} examples of an iterable dataset {how}"
            if self.sampled
            else f"scanned {self.scanned:,} examples {how}"
        )
        word = "row" if len(self.indices) == 1 else "rows"
        return f"{word} {rows} of the train dataset, {tokens} tokens; {scan}"


def example_length(example: Any) -> tuple[int, str] | None:
    """An example's length in tokens and where it was read, without the collator; None when it has none.

    Example:
        >>> example_length({"input_ids": [5, 6, 7]}), example_length({"length": 9, "input_ids": [1]})
        ((3, 'input_ids'), (9, 'length column'))
        >>> example_length({"text": "hello"}) is None
        True
    """
    if not isinstance(example, dict):
        return None
    for name in ("length", "lengths"):
        value = example.get(name)
        if isinstance(value, (list, tuple)):
            return int(sum(value)), "length column"
        if value is not None:
            return int(value), "length column"
    ids = example.get("input_ids")
    if ids is None:
        return None
    shape = getattr(ids, "shape", None)
    return (int(shape[-1]) if shape is not None and len(shape) else len(ids)), "input_ids"


def _is_hf_dataset(dataset: Any) -> bool:
    return any(c.__name__ == "Dataset" and c.__module__.startswith("datasets.") for c in type(dataset).__mro__)


def _is_iterable(dataset: Any) -> bool:
    import torch

    return isinstance(dataset, torch.utils.data.IterableDataset) or not (
        hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
    )


def trainer_collation(trainer: Any, dataset: Any) -> tuple[Any, Callable[[list[Any]], Any]]:
    """The dataset and collator as the trainer's train dataloader uses them: the columns its model does not take
    removed (``remove_unused_columns``), through transformers' own helpers where this version has them."""
    collator = trainer.data_collator
    saved = vars(trainer).get("_signature_columns", _MISSING)
    try:
        if _is_hf_dataset(dataset) and hasattr(trainer, "_remove_unused_columns"):
            dataset = trainer._remove_unused_columns(dataset, description="training")
        elif hasattr(trainer, "_get_collator_with_removed_columns"):
            collator = trainer._get_collator_with_removed_columns(collator, description="training")
    finally:
        if saved is not _MISSING:
            trainer._signature_columns = saved
    return dataset, collator


def collate(collator: Callable[[list[Any]], Any], examples: list[Any], indices: Iterable[int]) -> dict[str, Any]:
    """The collator's batch as a dict of tensors; its error, wrapped in one that names the examples."""
    import torch

    try:
        collated = collator(examples)
    except Exception as error:
        raise MemlabError(
            f"the trainer's data collator failed on examples {', '.join(map(str, indices))} of the train dataset "
            f"({type(error).__name__}: {error}); fix the collator or those examples, or pass a batch yourself"
        ) from error
    batch = {k: v for k, v in dict(collated).items() if isinstance(v, torch.Tensor)}
    if not batch:
        raise MemlabError("the trainer's data collator returned no tensors; pass a batch of tensors yourself")
    return batch


def _column_lengths(dataset: Any) -> Iterator[tuple[int, str]] | None:
    """Lengths from a datasets.Dataset's columns, read in chunks without the other columns."""
    columns = getattr(dataset, "column_names", None) or []
    for name in ("length", "lengths", "input_ids"):
        if name in columns:
            how = "input_ids" if name == "input_ids" else "length column"

            def lengths(name: str = name, how: str = how) -> Iterator[tuple[int, str]]:
                for chunk in dataset.select_columns([name]).iter(batch_size=1000):
                    for value in chunk[name]:
                        found = example_length({name: value})
                        yield (found[0] if found else 0), how

            return lengths()
    return None


def _lengths_of(examples: Iterable[tuple[int, Any]], collator: Callable[[list[Any]], Any]) -> Iterator[
    tuple[int, int, str, Any]
]:
    """(index, length, how, example) for each example; the collator on the example alone where it has no length."""
    for index, example in examples:
        found = example_length(example)
        if found is None:
            ids = collate(collator, [example], [index]).get("input_ids")
            if ids is None:
                raise MemlabError(
                    f"example {index} of the train dataset has no length memlab can read (no 'input_ids', 'length' "
                    "or 'lengths', and the collator makes no input_ids); add a 'length' column or pass a batch"
                )
            found = (int(ids.shape[-1]), "collator")
        yield index, found[0], found[1], example


def worst_batch(trainer: Any, micro_batch: int | None = None, *, sample: int = SAMPLE_DEFAULT) -> WorstBatch:
    """The micro-batch of the trainer's train dataset that costs the most memory: its ``micro_batch`` longest
    examples collated with the trainer's collator (padding or packing as the trainer does them).

    A map-style dataset is scanned in full, by lengths only (no forward); an iterable one is sampled: its first
    ``sample`` examples. Nothing on the trainer changes.

    Args:
        trainer: a ``transformers.Trainer`` (TRL's included).
        micro_batch: rows; default the trainer's ``per_device_train_batch_size``.
        sample: how many examples of an iterable dataset to read.

    Raises:
        MemlabError: no train dataset, examples without lengths, or a collator that fails (naming the examples).

    Example (a tiny trainer: ``tests/integration/test_trainer.py`` builds one)::

        worst = memlab.trainer.worst_batch(trainer)
        print(worst.describe())   # rows 17, 3 of the train dataset, 512 and 498 tokens; scanned 2,000 ...
    """
    TrainerSource.from_trainer(trainer)  # the checks: a trainer, one process, a train dataset
    rows = micro_batch if micro_batch is not None else trainer.args.per_device_train_batch_size
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise MemlabError(f"micro_batch={micro_batch!r} is not allowed; write a whole number >= 1, or None")
    if not isinstance(sample, int) or sample < 1:
        raise MemlabError(f"sample={sample!r} is not allowed; write a whole number of examples >= 1")
    dataset = trainer.train_dataset
    collated_dataset, collator = trainer_collation(trainer, dataset)
    iterable = _is_iterable(dataset)
    if iterable:
        read = list(_lengths_of(enumerate(itertools.islice(iter(dataset), sample)), collator))
    else:
        column = _column_lengths(dataset) if _is_hf_dataset(dataset) else None
        if column is not None:
            read = [(index, length, how, None) for index, (length, how) in enumerate(column)]
        else:
            numbered = ((index, collated_dataset[index]) for index in range(len(collated_dataset)))
            read = list(_lengths_of(numbered, collator))
    if not read:
        raise MemlabError("the trainer's train dataset is empty; give it examples or pass a batch yourself")
    top = heapq.nlargest(rows, read, key=lambda item: (item[1], -item[0]))
    indices = [index for index, *_ in top]
    examples = [example for *_, example in top] if iterable else [collated_dataset[index] for index in indices]
    batch = collate(collator, examples, indices)
    return WorstBatch(batch, tuple(indices), tuple(length for _, length, *_ in top), len(read), iterable, top[0][2])
