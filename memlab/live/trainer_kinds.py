"""A trainer kind as one declaration (issue 59): transformers' Trainer, TRL's SFTTrainer, DPOTrainer and GRPOTrainer.

A :class:`TrainerKind` says everything memlab does differently for one kind of trainer: how it is recognised (its
class in the trainer's class hierarchy), what its step runs on (the train dataset's worst batch, collated by the
trainer, or a batch of its own), the phases its step has before the training phases, its own step and dry run where
the Trainer's do not do (GRPO generates first), the changes it makes to the trainer's arguments when a plan goes on,
the config changes it suggests where nothing fits (they change the training), and the config class its plans are
exported to. Its hooks are typed by the protocols below (:class:`MakeBatch`, :class:`OwnStep`...), each with the
parameters memlab passes. :func:`kind_of` is the one lookup every entry point makes, and a trainer of no declared kind
(TRL's PPO, RLOO, online DPO...) gets one refusal naming the kinds memlab takes.

The kinds are declared in :mod:`memlab.kinds`, one folder a kind, above the runner and the estimation that their
hooks call, and listed there in one tuple; the package (``memlab/__init__.py``) provides that tuple as the seam
``"trainer kinds"`` (:mod:`memlab.seams`), which :func:`kinds` asks, so that no import registers a kind and nothing
below :mod:`memlab.kinds` imports it. :func:`register` (and :func:`declared`, for a while) adds a kind of a user's
on top of them. This module imports nothing of memlab but :mod:`memlab.errors` and :mod:`memlab.seams`, so every part
of the trainer code may ask it.

Example:
    >>> [kind.name for kind in kinds()]
    ['Trainer', 'SFTTrainer', 'DPOTrainer', 'GRPOTrainer']
    >>> kinds()[-1].phases, kinds()[-1].config, kinds()[-1].generates
    (('generation', 'reference', 'old-policy'), 'GRPOConfig', True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from memlab.errors import MemlabError
from memlab.seams import Seam, provided

__all__ = ["WATCH", "WORST_BATCH", "Arguments", "CheckPlan", "CliChanges", "CliCheck", "CliExamples", "CliOption",
           "CliQuestion", "CliSettings", "CliWords", "CompletionRoom", "Elsewhere", "Estimate", "ExportRefusal",
           "FitDryRuns", "KindSizes", "MakeBatch", "OldLogps", "OwnBatch", "OwnStep", "Sizes", "TrainerCli",
           "TrainerKind", "cli_kind", "declared", "generates", "is_trainer", "kind_for_config", "kind_of",
           "kind_or_none", "kinds", "register"]

WORST_BATCH = "the train dataset's costliest examples, each micro-batch collated by the trainer"

# The hooks' types. Their parameters' types live in the layers above (live/ imports none of them), so they are Any
# here, and each protocol's docstring names the real type.


class MakeBatch(Protocol):
    """``make_batch(trainer) -> batch``: the batch its trials run on, with the trainer's ``compute_loss``
    (``trainer``: a ``transformers.Trainer``)."""

    def __call__(self, trainer: Any) -> Any: ...


class OwnStep(Protocol):
    """``target(trainer, loss_fn) -> LiveTarget``: a step of its own for ``measure``, ``compare`` and ``fit``
    (its batch, its runner; :class:`memlab.trainer.entry.LiveTarget`); ``loss_fn`` None for the trainer's own."""

    def __call__(self, trainer: Any, loss_fn: Any) -> Any: ...


class Estimate(Protocol):
    """``estimate(request) -> Trial``: its own dry run for ``memlab.estimate`` (``request``:
    :class:`memlab.estimation.request.EstimateRequest`; the answer a :class:`memlab.report.Trial`)."""

    def __call__(self, request: Any) -> Any: ...


class FitDryRuns(Protocol):
    """``fit_dry_runs(target, trainer, loss_fn) -> LiveTarget``: :class:`~memlab.trainer.entry.LiveTarget`
    ``target`` with the dry run ``fit`` prunes with and the suggestions it makes where nothing fits."""

    def __call__(self, target: Any, trainer: Any, loss_fn: Any) -> Any: ...


class CheckPlan(Protocol):
    """``check_plan(trainer, plan)``: raise :class:`~memlab.errors.MemlabError` for a :class:`memlab.Plan` that
    ``memlab.apply`` cannot put on this kind."""

    def __call__(self, trainer: Any, plan: Any) -> None: ...


class Arguments(Protocol):
    """``arguments(args, plan) -> dict``: the config fields ``memlab.apply`` changes besides the Trainer's own
    (``args``: the trainer's ``TrainingArguments`` or TRL config; ``plan``: a :class:`memlab.Plan`)."""

    def __call__(self, args: Any, plan: Any) -> dict[str, Any]: ...


class ExportRefusal(Protocol):
    """``export_refusal(plan) -> str``: why its config cannot carry the :class:`memlab.Plan` (what to write
    instead), ``""`` when it can."""

    def __call__(self, plan: Any) -> str: ...


class Elsewhere(Protocol):
    """``elsewhere(trainer) -> str``: what an entry point that does not run the kind's own step says of it."""

    def __call__(self, trainer: Any) -> str: ...


class OldLogps(Protocol):
    """``old_logps(trainer) -> bool``: whether its step computes the old policy's log-probs, before the
    reference's (:func:`memlab.watch` names the first no-grad pass of a generation round ``"old-policy"``)."""

    def __call__(self, trainer: Any) -> bool: ...


class CompletionRoom(Protocol):
    """``completion_room(trainer) -> int | None``: the most tokens a completion can take past its longest prompt
    (the model's positions less the prompt's), None where the model does not say (:func:`memlab.limits`'s ceiling
    when it varies the completion's length)."""

    def __call__(self, trainer: Any) -> int | None: ...


class StartAfresh(Protocol):
    """``start_afresh(trainer)``: what ``memlab.apply`` resets, after a plan is put on, so that the trainer's next
    ``train()`` starts as a new trainer's does (a GRPOTrainer's buffered generations, cut for the old split);
    ``undo()`` puts it back with the rest of the trainer's attributes."""

    def __call__(self, trainer: Any) -> None: ...


class Sizes(Protocol):
    """``sizes(trainer, vary) -> KindSizes``: what :func:`memlab.limits` varies on a kind that :attr:`generates`
    (``vary``: ``"tokens"`` or ``"rows"``), in place of a Trainer's ``per_device_train_batch_size``: its size now,
    the step between sizes, the unit the answer names and each size set on the trainer while its dry run runs."""

    def __call__(self, trainer: Any, vary: str) -> KindSizes: ...


@dataclass(frozen=True)
class KindSizes:
    """A generating kind's sizes for :func:`memlab.limits` (:class:`Sizes`): ``current``, the trainer's own size;
    ``multiple``, the step between sizes that keeps its batches whole (1: any); ``unit``, the answer's word for a
    size (``"completion tokens"``); ``sized(size)``, a context manager that holds ``size`` on the trainer while an
    estimate runs and puts every attribute back after; ``why``: what keeps the sizes multiples of ``multiple``, said
    where a ``multiple`` given is not one."""

    current: int
    multiple: int
    unit: str
    sized: Callable[[int], AbstractContextManager[None]]
    why: str = ""


# --- what a kind adds to the command line (memlab estimate MODEL --trainer WORD): its CLI facet -------------------


@dataclass(frozen=True)
class CliOption:
    """One option a kind adds to ``memlab estimate --trainer``, named after its config's field (``name`` as the
    parsed arguments hold it: ``"num_generations"`` is ``--num-generations``).

    Args:
        name: the config field it sets, as ``args`` names it.
        help: its help text.
        metavar: the word its help shows for the value (None for a flag or a choice).
        value: what it takes: ``"count"`` (a whole number >= 1), ``"fraction"`` (a share above 0, at most 1),
            ``"float"``, ``"flag"`` (no value: True when given) or ``"on_off"``.
        example: the value an error's fix writes (``"8"``).
        before: the option every kind takes (or another kind's) it is listed before, in the help and in a repeated
            command; None: after every kind's options.
    """

    name: str
    help: str
    metavar: str | None = None
    value: str = "count"
    example: str = ""
    before: str | None = None


class CliSettings(Protocol):
    """``settings(args, positions) -> dict``: the config's keywords its own options set (its defaults for the
    others where the question needs them), checked against the model's ``positions`` (None: the config does not
    say), and ``"prompt_length"``: each prompt's tokens (None: plain text); ``args``: the parsed options. Raises
    :class:`~memlab.errors.MemlabError` for settings that do not go together, saying what to write."""

    def __call__(self, args: Any, positions: int | None) -> dict[str, Any]: ...


class CliExamples(Protocol):
    """``examples(args, settings, tokenizer, text, count) -> (examples, keywords)``: the stand-in train dataset's
    ``count`` examples (``text(tokens, start)``: words ``tokenizer`` makes that many tokens of) and the trainer's
    other keywords (a reward function); raises :class:`~memlab.errors.MemlabError` for a trainer it cannot build on
    a meta model."""

    def __call__(self, args: Any, settings: dict[str, Any], tokenizer: Any, text: Callable[[int, int], str],
                 count: int) -> tuple[list[dict[str, Any]], dict[str, Any]]: ...


class CliQuestion(Protocol):
    """``question(settings) -> CliWords``: the answer's header's words for the question (its examples, its loss,
    its engine)."""

    def __call__(self, settings: dict[str, Any]) -> CliWords: ...


@dataclass(frozen=True)
class CliWords:
    """What a kind's question says in the answer's header: ``examples`` after its name (``"4 generations of up to
    64 tokens after 16-token prompts"``), ``loss`` after the batch (``"beta 0"``), ``engine`` at the end."""

    examples: str
    loss: str = ""
    engine: str = ""


class CliCheck(Protocol):
    """``check(args)``: raise :class:`~memlab.errors.MemlabError` for its options that do not go together."""

    def __call__(self, args: Any) -> None: ...


class CliChanges(Protocol):
    """``changes(trainer, plan, budget, estimate, say) -> [(trial, {option: value}, option words, what changes)]``:
    where no lever combination fits, the config changes that do (they change the training), each estimated on
    ``plan`` (``estimate``: the keywords ``memlab.estimate`` takes: ``device``, ``gpu``; ``say(text)`` each step,
    ``say.expect(n)`` the steps to come)."""

    def __call__(self, trainer: Any, plan: Any, budget: int, estimate: dict[str, Any],
                 say: Any) -> list[tuple[Any, dict[str, Any], str, str]]: ...


@dataclass(frozen=True)
class TrainerCli:
    """What a kind adds to ``memlab estimate MODEL --trainer WORD`` (:mod:`memlab.frontends.cli.trainer`), beside
    the options every kind takes (the batch split, ``--lora``, the precision...).

    Args:
        word: its ``--trainer`` value (``"grpo"``).
        settings: its config's keywords from its options (:class:`CliSettings`).
        examples: the stand-in dataset its trainer is built on (:class:`CliExamples`).
        question: the header's words (:class:`CliQuestion`).
        options: its own options (:class:`CliOption`); one two kinds take is one declaration.
        check: its options that do not go together, refused before anything runs (:class:`CliCheck`).
        asks: how the question asks each lever only its built trainer has (``{lever: options}``), which the plain
            command's refusal says.
        tries: ``--try LEVER=...`` on it refused, ``{lever: what to write instead}`` (its options say them).
        changes: the config changes that fit where no lever does (:class:`CliChanges`; they change the training).
        none_fit: what the answer says where nothing fits ("" for the words every kind's answer says).
        said_by: the levers its options say (``{lever: option}``: a suggested plan's value written as that option;
            a flag given where the value is true, left out otherwise; None cannot be said by an option that takes a
            value).
        building: what holds while its trainer is built, given its settings (GRPO's: a stand-in for a vLLM engine
            where vLLM is not installed); None: nothing.
        estimate_keywords: what its options add to each ``memlab.estimate(trainer, ...)`` beyond the trainer
            (GRPO's: the vLLM server a served trainer generates on, ``vllm_server=``); None: nothing.
    """

    word: str
    settings: CliSettings
    examples: CliExamples
    question: CliQuestion
    options: tuple[CliOption, ...] = ()
    check: CliCheck | None = None
    asks: Mapping[str, str] = field(default_factory=dict)
    tries: Mapping[str, str] = field(default_factory=dict)
    changes: CliChanges | None = None
    none_fit: str = ""
    said_by: Mapping[str, str] = field(default_factory=dict)
    building: Callable[[dict[str, Any]], AbstractContextManager[None]] | None = None
    estimate_keywords: Callable[[Any], dict[str, Any]] | None = None


@runtime_checkable
class OwnBatch(Protocol):
    """A kind's own batch that carries its trainer (a GRPO step's prompts,
    :class:`memlab.kinds.grpo.source.GRPOPrompts`): an entry point given only the batch (the panel's) runs that
    trainer's own step on it."""

    @property
    def trainer(self) -> Any: ...


@dataclass(frozen=True)
class TrainerKind:
    """One kind of trainer, declared once (in :mod:`memlab.kinds`, its folder).

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
        make_batch: the batch its trials run on (:class:`MakeBatch`); None: the train dataset's worst batch
            (:func:`memlab.trainer.worst_batch.worst_batch`).
        target: a step of its own for ``measure``, ``compare`` and ``fit`` (:class:`OwnStep`); None: the Trainer's
            step on :attr:`make_batch`'s batch.
        estimate: its own dry run for ``memlab.estimate`` (:class:`Estimate`); None: the Trainer's on its batch.
        levers: what ``fit`` searches on this kind beyond its default space (``{lever: values}``, as ``space=``
            takes them), under what the user's ``space`` says. A lever a built trainer cannot change (its
            declaration's :attr:`~memlab.techniques.core.lever.Lever.refuses_change`: ``memlab.apply`` refuses it,
            such as a DPOTrainer's ``precompute_ref``) is searched by ``fit(..., dry_run=True)`` only, so that a
            measured search's answer is one ``apply`` takes; a value the trainer sets itself is kept.
        fit_dry_runs: ``target`` with the dry run ``fit`` prunes with and the suggestions it makes where nothing
            fits (:class:`FitDryRuns`; needed with a ``target``).
        suggestions: the config fields those suggestions change; each changes the training, and says so.
        check_plan: refuse a plan ``memlab.apply`` cannot put on this kind (:class:`CheckPlan`).
        arguments: the config fields ``memlab.apply`` changes besides the Trainer's own (:class:`Arguments`;
            the Trainer's: :func:`memlab.export.engines.training_arguments`).
        export_refusal: why its config cannot carry a plan (:class:`ExportRefusal`).
        elsewhere: what an entry point that does not run :attr:`target`'s step says (:class:`Elsewhere`).
        old_logps: whether its step computes the old policy's log-probs (:class:`OldLogps`), which
            :func:`memlab.watch` marks; None: it computes none.
        completion_room: the completion tokens its model's positions leave past the longest prompt
            (:class:`CompletionRoom`), for a kind that :attr:`generates`.
        start_afresh: what ``memlab.apply`` resets once the plan is on (:class:`StartAfresh`); None: nothing.
        rows_per_example: rows of the batch its ``compute_loss`` takes per example its
            ``per_device_train_batch_size`` counts (a DPOTrainer's chosen and rejected, 2): what
            :func:`memlab.watch` counts a step's samples in, as the trainer's own samples per second does.
        sizes: what :func:`memlab.limits` varies on a kind that :attr:`generates` (:class:`Sizes`: its completions'
            length or its generations per device); None: a Trainer's examples per device.
        generation_methods: the trainer's methods :func:`memlab.watch` wraps for one ``train()`` to mark its
            phases on the timeline: the generation round's, the generation's, and the no-grad log-prob pass's (the
            old policy's or the reference's), in that order; ``()``: none to mark.
        cli: what it adds to ``memlab estimate MODEL --trainer WORD`` (:class:`TrainerCli`); None: not asked there.
    """

    name: str
    module: str
    config: str
    config_module: str = "trl"
    batch: str = WORST_BATCH
    phases: tuple[str, ...] = ()
    make_batch: MakeBatch | None = None
    target: OwnStep | None = None
    estimate: Estimate | None = None
    levers: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    fit_dry_runs: FitDryRuns | None = None
    suggestions: tuple[str, ...] = ()
    check_plan: CheckPlan | None = None
    arguments: Arguments | None = None
    export_refusal: ExportRefusal | None = None
    elsewhere: Elsewhere | None = None
    old_logps: OldLogps | None = None
    completion_room: CompletionRoom | None = None
    start_afresh: StartAfresh | None = None
    rows_per_example: int = 1
    sizes: Sizes | None = None
    generation_methods: tuple[str, ...] = ()
    cli: TrainerCli | None = None

    @property
    def generates(self) -> bool:
        """Whether its step generates its batch first (its first phase is ``"generation"``, as GRPO's): its batch
        is what it generates, and :func:`memlab.limits` varies its completions' length or its generations.

        Example:
            >>> kinds()[0].generates
            False
        """
        return self.phases[:1] == ("generation",)

    def recognises(self, cls: type) -> bool:
        """Whether ``cls`` is this kind's class (by name and module, so nothing is imported).

        Example:
            >>> kinds()[0].recognises(object)
            False
        """
        return cls.__name__ == self.name and cls.__module__.startswith(self.module)

    def trainer_class(self) -> type:
        """Its trainer class, imported from its config's package (transformers' or TRL's).

        Example:
            >>> kinds()[0].trainer_class().__name__
            'Trainer'
        """
        return self._imported(self.name)

    def config_class(self) -> type:
        """Its config class, imported (transformers' or TRL's).

        Example:
            >>> kinds()[0].config_class().__name__
            'TrainingArguments'
        """
        return self._imported(self.config)

    def _imported(self, name: str) -> type:
        import importlib

        try:
            return getattr(importlib.import_module(self.config_module), name)  # type: ignore[no-any-return]
        except (ImportError, AttributeError):
            raise MemlabError(f"a {self.name}'s {'config' if name == self.config else 'class'} is "
                              f"{self.config_module}.{name}, which is not installed; pip install "
                              f"{self.config_module}") from None


WATCH = ("memlab.watch(trainer, budget=...) works on it today: call it, then trainer.train(), and "
         "watched.peak_bytes is every step's peak, generation included")
"""What works on every trainer, said in each refusal."""

TRAINER_KINDS: Seam[tuple[TrainerKind, ...]] = Seam("trainer kinds")
"""The seam :func:`kinds` asks for the declared kinds; ``memlab/__init__.py`` provides :data:`memlab.kinds.KINDS`."""

_REGISTERED: list[TrainerKind] = []
"""The kinds :func:`register` added on top of those :mod:`memlab.kinds` declares (a user's, a test's)."""


def kinds() -> tuple[TrainerKind, ...]:
    """Every kind memlab takes, in order (the Trainer first): those :mod:`memlab.kinds` lists (the seam ``"trainer
    kinds"``), a registered kind of the same name in its place, then the other registered ones.

    Example:
        >>> [kind.config for kind in kinds()]
        ['TrainingArguments', 'SFTConfig', 'DPOConfig', 'GRPOConfig']
    """
    registered = {kind.name: kind for kind in _REGISTERED}
    listed = tuple(registered.pop(kind.name, kind) for kind in provided(TRAINER_KINDS))
    return (*listed, *registered.values())


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


def _nearest(trainer: Any) -> TrainerKind | str:
    """The declared kind nearest to ``trainer``'s class in its hierarchy; else the name of the TRL trainer class of
    no declared kind it is (``""``: none)."""
    known = kinds()
    for cls in type(trainer).__mro__:
        for kind in reversed(known):  # a kind registered later may name a class an earlier one also matches
            if kind.recognises(cls):
                return kind
        if cls.__module__.startswith("trl.") and cls.__name__.endswith("Trainer") and cls.__name__ not in _TRL_BASES:
            return cls.__name__
    return ""


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
                          f"{_names(kinds()[1:])} too), or a model and a batch")
    kind = _nearest(trainer)
    if isinstance(kind, TrainerKind):
        return kind
    if kind:
        raise MemlabError(_refusal(kind, trainer))
    raise MemlabError(f"no trainer kind recognises a {type(trainer).__name__}; memlab takes {_names(kinds())}")


def generates(obj: Any) -> bool:
    """Whether ``obj`` is a trainer whose kind's step generates its batch first (:attr:`TrainerKind.generates`:
    TRL's GRPOTrainer); False for anything else, a trainer of no declared kind included (no refusal).

    Example:
        >>> generates(object())
        False
    """
    if not is_trainer(obj):
        return False
    kind = _nearest(obj)
    return isinstance(kind, TrainerKind) and kind.generates


def kind_or_none(obj: Any) -> TrainerKind | None:
    """The kind of ``obj`` where it is a trainer of a declared kind; None for anything else (no refusal: what
    :func:`memlab.watch` asks, which takes every trainer).

    Example:
        >>> kind_or_none(object()) is None
        True
    """
    if not is_trainer(obj):
        return None
    kind = _nearest(obj)
    return kind if isinstance(kind, TrainerKind) else None


def cli_kind(word: str) -> TrainerKind:
    """The kind ``memlab estimate --trainer WORD`` asks (its :attr:`TrainerKind.cli`'s ``word``).

    Example:
        >>> cli_kind("grpo").name
        'GRPOTrainer'
    """
    for kind in kinds():
        if kind.cli is not None and kind.cli.word == word:
            return kind
    words = [kind.cli.word for kind in kinds() if kind.cli is not None]
    raise MemlabError(f"--trainer {word} names no trainer kind; write one of {', '.join(words)}")


def kind_for_config(config: type) -> TrainerKind | None:
    """The kind whose config class ``config`` is (or derives from); None for a config no kind declares.

    Example:
        >>> from transformers import TrainingArguments
        >>> kind_for_config(TrainingArguments).name
        'Trainer'
    """
    known = kinds()
    for cls in config.__mro__:
        for kind in reversed(known):
            if cls.__name__ == kind.config and cls.__module__.startswith(kind.config_module):
                return kind
    return None


def register(kind: TrainerKind) -> None:
    """Add ``kind`` on top of the kinds :mod:`memlab.kinds` lists (:func:`kinds`; one of the same name is replaced
    in its place); :func:`declared` does it for a while.

    Example:
        >>> register(TrainerKind("Trainer", "transformers.", "TrainingArguments", "transformers"))
        >>> [kind.name for kind in kinds()].count("Trainer")
        1
    """
    if not isinstance(kind, TrainerKind):
        raise MemlabError(f"register takes a memlab.live.trainer_kinds.TrainerKind, not {type(kind).__name__}; write "
                          "register(TrainerKind('MyTrainer', 'my_package.', 'MyConfig', ...))")
    for index, known in enumerate(_REGISTERED):
        if known.name == kind.name:
            _REGISTERED[index] = kind
            return
    _REGISTERED.append(kind)


@contextmanager
def declared(kind: TrainerKind) -> Iterator[TrainerKind]:
    """``kind`` registered inside the ``with`` block, and the kinds as they were after it.

    Example:
        >>> with declared(TrainerKind("KTOTrainer", "trl.", "KTOConfig")):
        ...     [kind.name for kind in kinds()][-1]
        'KTOTrainer'
        >>> [kind.name for kind in kinds()][-1]
        'GRPOTrainer'
    """
    before = list(_REGISTERED)
    register(kind)
    try:
        yield kind
    finally:
        _REGISTERED[:] = before


def _names(listed: Sequence[TrainerKind]) -> str:
    names = [kind.name for kind in listed]
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
            f"memlab does not yet measure, estimate or fit a {name}'s step (it takes {_names(kinds())}): its dataset "
            f"is prompts, and each step first generates {generations} completions per prompt (up to {completion} "
            f"tokens) before the policy's forward and backward, which memlab does not run for a {name}; {WATCH}. "
            f"To size the policy's training step alone, measure the model on a batch of full-length generations: "
            f"ids = torch.randint({vocab}, ({rows}, longest_prompt + {completion})); memlab.measure(trainer.model, "
            "{'input_ids': ids, 'labels': ids}, memlab.Plan.from_trainer(trainer)) (the generation's KV cache and "
            "the reference model come on top)"
        )
    return (
        f"memlab does not measure, estimate or fit a TRL {name}: it takes {_names(kinds())}; {WATCH}. To size the "
        "training step, measure the model on a batch yourself: memlab.measure(trainer.model, batch, "
        "memlab.Plan(...))"
    )
