"""A trainer kind as one declaration (issue 59): transformers' Trainer, TRL's SFTTrainer, DPOTrainer and GRPOTrainer.

A :class:`TrainerKind` says everything memlab does differently for one kind of trainer: how it is recognised (its
class in the trainer's class hierarchy), what its step runs on (the train dataset's worst batch, collated by the
trainer, or a batch of its own), the phases its step has before the training phases, its own step and dry run where
the Trainer's do not do (GRPO generates first), the changes it makes to the trainer's arguments when a plan goes on,
the config changes it suggests where nothing fits (they change the training), and the config class its plans are
exported to. :data:`KINDS` holds them in order; :func:`kind_of` is the one lookup every entry point makes, and a
trainer of no declared kind (TRL's PPO, RLOO, online DPO...) gets one refusal naming the kinds memlab takes.

The Trainer, SFTTrainer and DPOTrainer are declared here; a kind with a step of its own is one module that
declares it and registers it (:func:`register`), imported by :mod:`memlab.trainer`: GRPO's is
:mod:`memlab.trainer.grpo.kind`, whose hooks name GRPO's own modules (:mod:`memlab.trainer.grpo`,
:mod:`memlab.trainer.grpo.estimate`, :mod:`memlab.trainer.grpo.suggest`, :mod:`memlab.runner.grpo`) and import them
when called: the runner and the estimation build on this package, never the reverse at load. This module imports
nothing of memlab but :mod:`memlab.errors`, so every part of the trainer code may ask it.

Example:
    >>> [kind.name for kind in KINDS]
    ['Trainer', 'SFTTrainer', 'DPOTrainer', 'GRPOTrainer']
    >>> KINDS[-1].phases, KINDS[-1].config
    (('generation', 'reference', 'old-policy'), 'GRPOConfig')
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from memlab.errors import MemlabError

__all__ = ["KINDS", "WATCH", "TrainerKind", "declared", "is_trainer", "kind_for_config", "kind_of", "register"]

WORST_BATCH = "the train dataset's costliest examples, each micro-batch collated by the trainer"


@dataclass(frozen=True)
class TrainerKind:
    """One kind of trainer, declared once.

    Args:
        name: the class that makes a trainer this kind, found in the trainer's class hierarchy (a user's class
            derived from it is this kind too); the most derived declared class wins.
        module: where that class comes from (a module prefix: ``"transformers."``, ``"trl."``); ``""`` any module.
        config: the name of its config class, which :meth:`memlab.Plan.to_training_arguments` writes keywords for
            (``"TrainingArguments"``, ``"SFTConfig"``...).
        config_module: the package that config class comes from (``"transformers"`` or ``"trl"``).
        batch: what its step runs on, in words (a trial's notes and the kind's documentation).
        phases: the phases its step has before the training phases, in order (``"generation"``...), as the
            timeline names them.
        make_batch: ``make_batch(trainer) -> batch``: the batch its trials run on, with the trainer's
            ``compute_loss``; None: the train dataset's worst batch (:func:`memlab.trainer.worst_batch.worst_batch`).
        target: ``target(trainer, loss_fn) -> LiveTarget``: a step of its own for ``measure``, ``compare`` and
            ``fit`` (its batch, its runner); None: the Trainer's step on :attr:`make_batch`'s batch.
        estimate: ``estimate(request) -> Trial``: its own dry run for ``memlab.estimate`` (the request is
            :class:`~memlab.estimation.request.EstimateRequest`); None: the Trainer's on its batch.
        levers: what ``fit`` searches on this kind beyond its default space (``{lever: values}``, as ``space=``
            takes them), under what the user's ``space`` says.
        dry_run_levers: the same for levers a built trainer cannot switch (``memlab.apply`` refuses them: a new
            trainer's setting, such as a DPOTrainer's ``precompute_ref``): searched by ``fit(..., dry_run=True)``
            only, so that a measured search's answer is one ``apply`` takes; a value the trainer sets itself is kept.
        fit_dry_runs: ``fit_dry_runs(target, trainer, loss_fn) -> LiveTarget``: ``target`` with the dry run ``fit``
            prunes with and the suggestions it makes where nothing fits (needed with a ``target``).
        suggestions: the config fields those suggestions change; each changes the training, and says so.
        check_plan: ``check_plan(trainer, plan)``: refuse a plan ``memlab.apply`` cannot put on this kind.
        arguments: ``arguments(args, plan) -> dict``: the config fields ``memlab.apply`` changes besides the
            Trainer's own (:func:`memlab.export.engines.training_arguments`).
        export_refusal: ``export_refusal(plan) -> str``: why its config cannot carry ``plan`` (what to write
            instead), ``""`` when it can.
        elsewhere: ``elsewhere(trainer) -> str``: what an entry point that does not run :attr:`target`'s step says.
        rows_per_example: rows of the batch its ``compute_loss`` takes per example its
            ``per_device_train_batch_size`` counts (a DPOTrainer's chosen and rejected, 2): what
            :func:`memlab.watch` counts a step's samples in, as the trainer's own samples per second does.
    """

    name: str
    module: str
    config: str
    config_module: str = "trl"
    batch: str = WORST_BATCH
    phases: tuple[str, ...] = ()
    make_batch: Callable[[Any], Any] | None = None
    target: Callable[[Any, Any], Any] | None = None
    estimate: Callable[[Any], Any] | None = None
    levers: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    dry_run_levers: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    fit_dry_runs: Callable[[Any, Any, Any], Any] | None = None
    suggestions: tuple[str, ...] = ()
    check_plan: Callable[[Any, Any], None] | None = None
    arguments: Callable[[Any, Any], dict[str, Any]] | None = None
    export_refusal: Callable[[Any], str] | None = None
    elsewhere: Callable[[Any], str] | None = None
    rows_per_example: int = 1

    def recognises(self, cls: type) -> bool:
        """Whether ``cls`` is this kind's class (by name and module, so nothing is imported).

        Example:
            >>> KINDS[0].recognises(object)
            False
        """
        return cls.__name__ == self.name and cls.__module__.startswith(self.module)

    def config_class(self) -> type:
        """Its config class, imported (transformers' or TRL's).

        Example:
            >>> KINDS[0].config_class().__name__
            'TrainingArguments'
        """
        import importlib

        try:
            return getattr(importlib.import_module(self.config_module), self.config)  # type: ignore[no-any-return]
        except (ImportError, AttributeError):
            raise MemlabError(f"a {self.name}'s config is {self.config_module}.{self.config}, which is not "
                              f"installed; pip install {self.config_module}") from None


WATCH = ("memlab.watch(trainer, budget=...) works on it today: call it, then trainer.train(), and "
         "watched.peak_bytes is every step's peak, generation included")
"""What works on every trainer, said in each refusal."""

KINDS: list[TrainerKind] = [
    TrainerKind("Trainer", "transformers.", "TrainingArguments", "transformers"),
    TrainerKind("SFTTrainer", "trl.", "SFTConfig"),
    TrainerKind("DPOTrainer", "trl.", "DPOConfig",
                batch=f"{WORST_BATCH} (chosen and rejected together, as the trainer batches them)",
                # the same reference log-probs, computed before training (memlab.techniques.precompute_ref)
                dry_run_levers={"precompute_ref": [None, True]}, rows_per_example=2),
]
"""Every kind memlab takes, in order (the Trainer first); :func:`register` adds one. A kind whose step is its own
is declared in its own module, which :mod:`memlab.trainer` imports (it registers the kind): GRPO's is
:mod:`memlab.trainer.grpo.kind`, so that its hooks' modules import this one, never the reverse."""

def is_trainer(obj: Any) -> bool:
    """True for a ``transformers.Trainer`` or a subclass of it (TRL's ``SFTTrainer``...), without importing them.

    Example:
        >>> import torch
        >>> is_trainer(torch.nn.Linear(2, 2))
        False
        >>> class Trainer:  # a class of that name only counts when it comes from transformers
        ...     pass
        >>> is_trainer(Trainer())
        False
    """
    return any(
        cls.__name__ == "Trainer" and cls.__module__.startswith("transformers.") for cls in type(obj).__mro__
    )


# TRL's own bases: not a kind of their own, the Trainer's beneath them decides.
_TRL_BASES = ("BaseTrainer", "_BaseTrainer")


def kind_of(trainer: Any) -> TrainerKind:
    """The kind of ``trainer``: the declared class nearest to its own in its class hierarchy (a user's subclass of
    TRL's GRPOTrainer is a GRPOTrainer).

    Raises:
        MemlabError: not a ``transformers.Trainer``, or a TRL trainer of no declared kind (PPO, RLOO, online
            DPO, KTO...): one error naming the kinds memlab takes and what to write instead.

    Example:
        >>> kind_of(object())
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: a object is not a transformers Trainer; pass a Trainer (TRL's SFTTrainer, \
DPOTrainer and GRPOTrainer too), or a model and a batch
    """
    if not is_trainer(trainer):
        raise MemlabError(f"a {type(trainer).__name__} is not a transformers Trainer; pass a Trainer (TRL's "
                          f"{_names(KINDS[1:])} too), or a model and a batch")
    for cls in type(trainer).__mro__:
        for kind in reversed(KINDS):  # a kind registered later may name a class an earlier one also matches
            if kind.recognises(cls):
                return kind
        if cls.__module__.startswith("trl.") and cls.__name__.endswith("Trainer") and cls.__name__ not in _TRL_BASES:
            raise MemlabError(_refusal(cls.__name__, trainer))
    raise MemlabError(f"no trainer kind recognises a {type(trainer).__name__}; memlab takes {_names(KINDS)}")


def kind_for_config(config: type) -> TrainerKind | None:
    """The kind whose config class ``config`` is (or derives from); None for a config no kind declares.

    Example:
        >>> from transformers import TrainingArguments
        >>> kind_for_config(TrainingArguments).name
        'Trainer'
    """
    for cls in config.__mro__:
        for kind in reversed(KINDS):
            if cls.__name__ == kind.config and cls.__module__.startswith(kind.config_module):
                return kind
    return None


def register(kind: TrainerKind) -> None:
    """Add ``kind`` to :data:`KINDS` (a kind of the same name is replaced); :func:`declared` does it for a while.

    Example:
        >>> register(TrainerKind("Trainer", "transformers.", "TrainingArguments", "transformers"))
        >>> [kind.name for kind in KINDS].count("Trainer")
        1
    """
    if not isinstance(kind, TrainerKind):
        raise MemlabError(f"register takes a memlab.live.trainer_kinds.TrainerKind, not {type(kind).__name__}; write "
                          "register(TrainerKind('MyTrainer', 'my_package.', 'MyConfig', ...))")
    for index, known in enumerate(KINDS):
        if known.name == kind.name:
            KINDS[index] = kind
            return
    KINDS.append(kind)


@contextmanager
def declared(kind: TrainerKind) -> Iterator[TrainerKind]:
    """``kind`` registered inside the ``with`` block, and the registry as it was after it.

    Example:
        >>> with declared(TrainerKind("KTOTrainer", "trl.", "KTOConfig")):
        ...     [kind.name for kind in KINDS][-1]
        'KTOTrainer'
        >>> [kind.name for kind in KINDS][-1]
        'GRPOTrainer'
    """
    before = list(KINDS)
    register(kind)
    try:
        yield kind
    finally:
        KINDS[:] = before


def _names(kinds: list[TrainerKind]) -> str:
    names = [kind.name for kind in kinds]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def _refusal(name: str, trainer: Any) -> str:
    """What a TRL trainer of no declared kind gets: the kinds memlab takes, and what to write instead."""
    args = getattr(trainer, "args", None)
    rows = getattr(args, "per_device_train_batch_size", "N")
    if hasattr(args, "num_generations"):  # an online trainer: it generates before it trains
        completion = getattr(args, "max_completion_length", None) or "max_completion_length"
        generations = getattr(args, "num_generations", None) or "num_generations"
        vocab = getattr(getattr(getattr(trainer, "model", None), "config", None), "vocab_size", None) or "vocab_size"
        return (
            f"memlab does not yet measure, estimate or fit a {name}'s step (it takes {_names(KINDS)}): its dataset is "
            f"prompts, and each step first generates {generations} completions per prompt (up to {completion} "
            f"tokens) before the policy's forward and backward, which memlab does not run for a {name}; {WATCH}. "
            f"To size the policy's training step alone, measure the model on a batch of full-length generations: "
            f"ids = torch.randint({vocab}, ({rows}, longest_prompt + {completion})); memlab.measure(trainer.model, "
            "{'input_ids': ids, 'labels': ids}, memlab.Plan.from_trainer(trainer)) (the generation's KV cache and "
            "the reference model come on top)"
        )
    return (
        f"memlab does not measure, estimate or fit a TRL {name}: it takes {_names(KINDS)}; {WATCH}. To size the "
        "training step, measure the model on a batch yourself: memlab.measure(trainer.model, batch, "
        "memlab.Plan(...))"
    )
