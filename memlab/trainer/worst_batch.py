"""A trainer's micro-batches as its collator makes them: the costliest first (the worst batch), for any plan.

Memory grows with what a micro-batch holds once collated: a padding collator pads every row to the longest, a
packing or padding-free one concatenates them. So the worst micro-batch is the ``k`` costliest examples collated
together, each example's cost the size of every sequence it carries (``input_ids``, ``labels``, decoder inputs,
image sizes). Sizes are read without running the model: a ``length``/``lengths`` column where there is one, else
the example's sequences, else (the fallback) the collator's output for each example on its own.
:func:`trainer_batches` gives the runner a plan's micro-batches: re-collated from the examples, never cut.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from memlab.errors import MemlabError
from memlab.live.batch import StepBatches
from memlab.trainer.source import TrainerSource

__all__ = ["SAMPLE_DEFAULT", "WorstBatch", "example_cost", "example_length", "example_sizes", "scan", "trainer_batches",
           "worst_batch"]

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
    return _size(ids), "input_ids"


def _size(value: Any) -> int:
    """Elements of a list (nested lists flattened) or a tensor/array: what a collator pads or packs of it."""
    numel = getattr(value, "numel", None)
    if callable(numel):
        return int(numel())
    size = getattr(value, "size", None)
    if isinstance(size, int):  # a numpy array
        return size
    if isinstance(value, (list, tuple)):
        return sum(_size(item) if isinstance(item, (list, tuple)) else 1 for item in value)
    return 0


def example_sizes(example: Any) -> dict[str, int]:
    """What the collator pads or packs of an example: the size of each of its sequences (``input_ids``, ``labels``,
    a seq2seq model's ``decoder_input_ids``, ``pixel_values``...), the length column standing for ``input_ids``.

    Example:
        >>> example_sizes({"input_ids": [1, 2, 3], "labels": [4, 5], "text": "hi", "id": 7})
        {'input_ids': 3, 'labels': 2}
    """
    if not isinstance(example, dict):
        return {}
    sizes = {name: _size(value) for name, value in example.items() if not isinstance(value, (str, bytes, int, float))
             and name not in ("length", "lengths") and _size(value) > 0}
    found = example_length(example)
    if found is not None and found[1] == "length column":
        sizes["input_ids"] = found[0]
    return sizes


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
            try:
                dataset = trainer._remove_unused_columns(dataset, description="training")
            except ValueError as error:  # "No columns in the dataset match the model's forward method signature"
                raise MemlabError(untokenized_message(dataset)) from error
        elif hasattr(trainer, "_get_collator_with_removed_columns"):
            collator = trainer._get_collator_with_removed_columns(collator, description="training")
    finally:
        if saved is not _MISSING:
            trainer._signature_columns = saved
    return dataset, collator


def untokenized_message(dataset: Any) -> str:
    """What to write when none of a train dataset's columns is an input of the model (untokenized text, for one):
    transformers' Trainer would drop every column.

    Example:
        >>> print(untokenized_message(type("D", (), {"column_names": ["text"]})()))  # doctest: +ELLIPSIS
        the trainer's train dataset has only the column text, which the model does not take (the Trainer drops...
    """
    columns = list(getattr(dataset, "column_names", None) or [])
    named = ", ".join(columns) or "none"
    text = next((column for column in columns if "text" in column), columns[0] if columns else "text")
    return (
        f"the trainer's train dataset has only the column{'s' if len(columns) != 1 else ''} {named}, which the "
        "model does not take (the Trainer drops every column its forward does not name, and then has nothing); "
        f"tokenize it first: dataset.map(lambda e: tokenizer(e[{text!r}], truncation=True), batched=True, "
        f"remove_columns={columns!r}) with data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False), "
        "or train with TRL's SFTTrainer, which tokenizes a text column itself"
    )


def collate(collator: Callable[[list[Any]], Any], examples: list[Any], indices: Iterable[int]) -> dict[str, Any]:
    """The collator's batch as a dict (its tensors, and the numbers a padding-free collator adds, such as
    ``max_length_q``); its error, wrapped in one that names the examples."""
    import torch

    try:
        collated = collator(examples)
    except Exception as error:
        said = str(error) if len(str(error)) <= 300 else f"{str(error)[:300]}..."  # a processor repeats its input
        raise MemlabError(
            f"the trainer's data collator failed on examples {', '.join(map(str, indices))} of the train dataset "
            f"({type(error).__name__}: {said}); fix the collator or those examples (tokenize the dataset: "
            "dataset.map(lambda e: tokenizer(e['text']))), or pass a batch yourself"
        ) from error
    try:
        items = dict(collated)
    except (TypeError, ValueError):
        items = {}
    batch = {k: v for k, v in items.items() if isinstance(v, (torch.Tensor, int, float)) and not isinstance(v, bool)}
    if not any(isinstance(v, torch.Tensor) for v in batch.values()):
        raise MemlabError(
            "the trainer's data collator returned no tensors; give the trainer a collator that returns a dict of "
            "tensors (e.g. DataCollatorWithPadding(tokenizer)) over a tokenized dataset (dataset.map(lambda e: "
            "tokenizer(e['text'], truncation=True), batched=True): text must be tokenized first, or use TRL's "
            "SFTTrainer, which does), or pass a batch of tensors yourself"
        )
    if "input_ids" not in batch and "inputs_embeds" not in batch and "pixel_values" not in batch:
        raise MemlabError(
            f"the trainer's collated batch has no input_ids (it has {', '.join(batch)}); tokenize the dataset so "
            "that its rows carry input_ids, or pass a batch yourself"
        )
    return batch


def collated_size(batch: dict[str, Any]) -> int:
    """Elements of a collated batch's tensors: what it costs, padding and packing included."""
    import torch

    return sum(v.numel() for v in batch.values() if isinstance(v, torch.Tensor))


@dataclass(frozen=True)
class Ranked:
    """One example as the scan saw it: its position, its cost (the sum of its sizes), its sizes, and the example
    itself where the dataset cannot be read again (an iterable one)."""

    index: int
    cost: int
    sizes: dict[str, int]
    example: Any = None


@dataclass(frozen=True)
class Scan:
    """The costliest examples of a train dataset, costliest first, and how they were found."""

    ranked: tuple[Ranked, ...]
    scanned: int
    sampled: bool
    measured_by: str
    dataset: Any
    collator: Callable[[list[Any]], Any]

    def examples(self, chosen: Sequence[Ranked]) -> list[Any]:
        return [item.example if self.sampled else self.dataset[item.index] for item in chosen]

    def collate(self, chosen: Sequence[Ranked]) -> dict[str, Any]:
        return collate(self.collator, self.examples(chosen), [item.index for item in chosen])

    def worst_group(self, rows: int) -> tuple[list[Ranked], str]:
        """The ``rows`` examples whose collated batch is largest, and how they were chosen: the costliest by every
        sequence's size, and for each sequence (``input_ids``, ``labels``...) its longest, collated in turn."""
        first = list(self.ranked[:rows])
        names = sorted({name for item in self.ranked for name in item.sizes})
        groups = {tuple(item.index for item in first): first}
        for name in names:
            group = sorted(self.ranked, key=lambda item: (-item.sizes.get(name, 0), -item.cost, item.index))[:rows]
            groups.setdefault(tuple(sorted(item.index for item in group)), group)
        if len(groups) == 1:
            return first, self.measured_by
        best = max(groups.values(), key=lambda group: collated_size(self.collate(group)))
        return best, f"{self.measured_by}, the largest collated of the longest by {', '.join(names)}"


def example_cost(sizes: dict[str, int]) -> int:
    """What an example adds to a collated batch: the sum of its sequences' sizes; a preference pair's (TRL's
    ``prompt_ids``, ``chosen_ids``, ``rejected_ids``) its longer of prompt + chosen and prompt + rejected, the rows
    its collator pads to one width.

    Example:
        >>> example_cost({"input_ids": 5, "labels": 5}), example_cost({"prompt_ids": 4, "chosen_ids": 22,
        ...                                                            "rejected_ids": 1})
        (10, 26)
    """
    if {"prompt_ids", "chosen_ids", "rejected_ids"} <= sizes.keys():
        return sizes["prompt_ids"] + max(sizes["chosen_ids"], sizes["rejected_ids"])
    return sum(sizes.values())


def _sequence_columns(dataset: Any) -> list[str]:
    first = dataset[0] if len(dataset) else {}
    names = [name for name in ("length", "lengths") if name in getattr(dataset, "column_names", [])]
    return names or [name for name in example_sizes(first)]


def _column_sizes(dataset: Any) -> Iterator[tuple[int, dict[str, int]]] | None:
    """Each example's sizes from a datasets.Dataset's columns, read in chunks without its other columns."""
    names = _sequence_columns(dataset) if len(dataset) else []
    if not names:
        return None

    def read() -> Iterator[tuple[int, dict[str, int]]]:
        index = 0
        for chunk in dataset.select_columns(names).iter(batch_size=1000):
            for values in zip(*(chunk[name] for name in names), strict=True):
                yield index, example_sizes(dict(zip(names, values, strict=True)))
                index += 1

    return read()


def _sizes_of(index: int, example: Any, collator: Callable[[list[Any]], Any]) -> tuple[dict[str, int], str]:
    """An example's sizes; the collator's output for it alone where it has none a scan can read."""
    import torch

    sizes = example_sizes(example)
    if sizes:
        how = "length column" if isinstance(example, dict) and ("length" in example or "lengths" in example) else (
            "input_ids" if "input_ids" in sizes else "sequence sizes")
        return sizes, how
    collated = collate(collator, [example], [index])
    return {k: v.numel() for k, v in collated.items() if isinstance(v, torch.Tensor)}, "collator"


def scan(trainer: Any, count: int, *, sample: int = SAMPLE_DEFAULT) -> Scan:
    """The ``count`` costliest examples of the trainer's train dataset (every sequence its collator pads or packs
    counted), holding at most ``count`` of them at a time; an iterable dataset's first ``sample`` examples."""
    dataset = trainer.train_dataset
    collated_dataset, collator = trainer_collation(trainer, dataset)
    iterable = _is_iterable(dataset)
    heap: list[tuple[int, int, Ranked]] = []
    seen, how = 0, "input_ids"
    if iterable:
        numbered: Iterator[tuple[int, dict[str, int], Any]] = (
            (index, *_sizes_of(index, example, collator)[:1], example)
            for index, example in enumerate(itertools.islice(iter(collated_dataset), sample))
        )
    else:
        column = _column_sizes(collated_dataset) if _is_hf_dataset(collated_dataset) else None
        if column is not None:
            numbered = ((index, sizes, None) for index, sizes in column)
            how = "length column" if "length" in _sequence_columns(collated_dataset) or "lengths" in \
                _sequence_columns(collated_dataset) else "input_ids"
        else:
            numbered = ((index, _sizes_of(index, collated_dataset[index], collator)[0], None)
                        for index in range(len(collated_dataset)))
            if len(collated_dataset):
                how = _sizes_of(0, collated_dataset[0], collator)[1]
    for index, sizes, example in numbered:
        seen += 1
        item = Ranked(index, example_cost(sizes), sizes, example)
        entry = (item.cost, -index, item)
        if len(heap) < count:
            heapq.heappush(heap, entry)
        elif entry[:2] > heap[0][:2]:
            heapq.heapreplace(heap, entry)
    if iterable and heap and how == "input_ids":
        how = _sizes_of(heap[0][2].index, heap[0][2].example, collator)[1]
    if not seen:
        raise MemlabError("the trainer's train dataset is empty; give it examples or pass a batch yourself")
    ranked = tuple(entry[2] for entry in sorted(heap, key=lambda entry: entry[:2], reverse=True))
    return Scan(ranked, seen, iterable, how, collated_dataset, collator)


def worst_batch(trainer: Any, micro_batch: int | None = None, *, sample: int = SAMPLE_DEFAULT) -> WorstBatch:
    """The micro-batch of the trainer's train dataset that costs the most memory: its ``micro_batch`` costliest
    examples collated with the trainer's collator (padding or packing as the trainer does them).

    Every sequence the collator pads or packs counts (``input_ids``, ``labels``, a seq2seq model's decoder inputs,
    packed lengths, image sizes): where an example's sequences differ in length, the longest by each are collated
    in turn and the largest collated batch is the worst (``measured_by`` says so). A map-style dataset is scanned
    in full, by sizes only (no forward), holding at most ``micro_batch`` examples' sizes; an iterable one is
    sampled: its first ``sample`` examples. Nothing on the trainer changes.

    Args:
        trainer: a ``transformers.Trainer`` (TRL's included).
        micro_batch: rows; default the trainer's ``per_device_train_batch_size``.
        sample: how many examples of an iterable dataset to read.

    Raises:
        MemlabError: no train dataset, examples without lengths, or a collator that fails (naming the examples).

    Example (a tiny trainer: ``tests/trainer/test_trainer.py`` builds one)::

        worst = memlab.trainer.worst_batch(trainer)
        print(worst.describe())   # rows 17, 3 of the train dataset, 512 and 498 tokens; scanned 2,000 ...
    """
    check_dataset(trainer)
    rows = micro_batch if micro_batch is not None else trainer.args.per_device_train_batch_size
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise MemlabError(f"micro_batch={micro_batch!r} is not allowed; write a whole number >= 1, or None")
    if not isinstance(sample, int) or sample < 1:
        raise MemlabError(f"sample={sample!r} is not allowed; write a whole number of examples >= 1")
    found = scan(trainer, 2 * rows, sample=sample)
    group, how = found.worst_group(rows)
    batch = found.collate(group)
    lengths = tuple(item.sizes.get("input_ids", item.cost) for item in group)
    return WorstBatch(batch, tuple(item.index for item in group), lengths, found.scanned, found.sampled, how)


def check_dataset(trainer: Any) -> None:
    """The checks every read of a train dataset makes first: a trainer, one process, a train dataset."""
    TrainerSource.from_trainer(trainer)
    if getattr(trainer, "train_dataset", None) is None:
        raise MemlabError(
            "this trainer has no train dataset, so memlab has no batch to measure; build it with "
            "Trainer(..., train_dataset=...) or pass a batch yourself"
        )


def trainer_batches(trainer: Any, rows: int | None = None, *, sample: int = SAMPLE_DEFAULT) -> StepBatches:
    """The trainer's micro-batches for any plan, as its collator makes them: a plan of ``micro_batch`` rows and
    ``accumulation`` steps gets the worst micro-batch (:func:`worst_batch`) first, then the next costliest
    examples collated ``micro_batch`` at a time: never slices or repeats of one collated batch. ``rows`` is the
    micro-batch of a plan without one (default ``per_device_train_batch_size``).

    Example (a tiny trainer: ``make_trainer`` in ``tests/trainers.py`` builds one)::

        batches = memlab.trainer.worst_batch.trainer_batches(trainer)
        first, second = batches.micro_batches(2, 2)   # the two costliest pairs, each collated
    """
    check_dataset(trainer)
    rows = rows or trainer.args.per_device_train_batch_size
    scans: list[Scan] = []

    def ranked(count: int) -> Scan:
        if not scans or (len(scans[0].ranked) < count and scans[0].scanned > len(scans[0].ranked)):
            scans[:] = [scan(trainer, max(count, 2 * rows), sample=sample)]
        return scans[0]

    def make(micro_batch: int, accumulation: int) -> list[dict[str, Any]]:
        found = ranked(micro_batch * accumulation)
        group, _ = found.worst_group(micro_batch)
        chosen = {item.index for item in group}
        rest = [item for item in found.ranked if item.index not in chosen] or list(found.ranked)
        parts = [found.collate(group)]
        for step in range(1, accumulation):
            start = (step - 1) * micro_batch
            parts.append(found.collate([rest[(start + k) % len(rest)] for k in range(micro_batch)]))
        return parts

    return StepBatches(make, rows, "the train dataset's costliest examples, collated by the trainer")
