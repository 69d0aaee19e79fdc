"""What one lever adds to each export, as data: the engines in :mod:`memlab.export` assemble these fragments and
name no lever.

A lever's declaration (:class:`memlab.techniques.core.lever.Lever`) maps each of :data:`TARGETS` to a function of the
plan that returns one of:

- its fragment: :class:`Keys` (Trainer keywords, DeepSpeed keys), :class:`Code` (the plain PyTorch loop's
  named slots of lines), :class:`Accelerate` (the accelerate YAML's keys and the script's lines, per strategy),
  :class:`Lora` (``peft.LoraConfig`` keywords); :class:`InLoraConfig` (a keyword of the adapter's ``LoraConfig``,
  carried inside it wherever the adapter goes);
- :class:`Elsewhere`: the export is not where this lever goes (peft for a lever that is not the adapter's,
  DeepSpeed for what the model or the training code does); ``note`` says where it goes (DeepSpeed writes it in
  its ``"_comment"``);
- a refusal: a non-empty ``str`` saying what to write instead (the export raises :class:`memlab.errors.MemlabError`
  with it).

This module imports neither torch nor :mod:`memlab.plan`.

Example:
    >>> merge_keys({"a": {"b": 1}}, {"a": {"c": 2}})
    {'a': {'b': 1, 'c': 2}}
    >>> Code(imports=("import torch",)) + Code(imports=("import torch", "import bitsandbytes as bnb"))
    Code(imports=('import torch', 'import bitsandbytes as bnb'), ...)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

TARGETS = ("trainer", "deepspeed", "code", "peft", "accelerate")
"""The exports: ``Plan.to_training_arguments`` (trainer), ``to_deepspeed``, ``to_code``, ``to_peft_config`` and
``to_accelerate_config`` + :func:`memlab.export.accelerate.accelerate_script` (accelerate, for each strategy)."""

STRATEGIES = ("fsdp2", "zero2", "zero3")
"""The accelerate export's strategies."""

THE_DEEPSPEED_CONFIG = "<the plan's DeepSpeed config>"
"""A Trainer keyword's value that the Trainer engine replaces by the plan's DeepSpeed config (``deepspeed=``)."""

PlanLike = Any
"""A :class:`memlab.Plan` (typed loosely here: plan builds on this module)."""

Lines = tuple[str, ...]


@dataclass(frozen=True)
class Keys:
    """Keys one lever adds to a dict export (Trainer keywords, a DeepSpeed config); nested dicts merge, and
    ``"_comment"`` texts join. ``legacy``: the Trainer's keys with transformers before 5 where they differ (None:
    the same), or a refusal (``str``) where those releases cannot carry the lever."""

    keys: Mapping[str, Any] = field(default_factory=dict)
    legacy: Mapping[str, Any] | str | None = None


@dataclass(frozen=True)
class Elsewhere:
    """The export is not where the lever goes (nothing dropped: it travels elsewhere); ``note`` says where."""

    note: str = ""


@dataclass(frozen=True)
class Lora:
    """The adapter's ``peft.LoraConfig`` keywords, given the model the config is for (or None): what
    :func:`memlab.techniques.adapters.lora_settings` writes."""

    settings: Callable[[Any], Mapping[str, Any]]


@dataclass(frozen=True)
class InLoraConfig:
    """The lever is a keyword of the adapter's ``LoraConfig`` (as ``lora_settings`` writes it): every export
    carries it inside the adapter's config (:func:`memlab.techniques.adapters.in_lora_config`)."""

    keyword: str


@dataclass(frozen=True, repr=False)
class Code:
    """One lever's lines in a training script, by slot (what :func:`memlab.export.engines.pytorch_code` and
    :func:`memlab.export.accelerate.accelerate_script` assemble, in this order).

    Args:
        imports: import lines (each written once).
        settings: lines after the imports (constants such as ``accumulation = 4``; each written once).
        load: keywords of the accelerate script's ``from_pretrained`` (name -> code).
        model: lines that change the model (in the registry's order), after the loss function.
        loss: a ``compute_loss(model, micro)`` definition replacing the default one.
        loss_model: what the loss is computed on in the accelerate script (replacing ``model``).
        optimizer: the optimizer expression, with ``{params}`` and ``{device}`` to fill in.
        optimizer_over: ``(params, device)``: what the optimizer is built over instead of ``params``, ``device``.
        before_optimizer: lines before the optimizer is built (after ``params`` exists).
        after_optimizer: lines after the optimizer is built.
        contexts: context managers the forward runs in (code text).
        backward: how backward runs on ``loss`` (replacing ``loss.backward()``).
        before_step: lines before the optimizer step.
        step: the optimizer step lines (replacing ``optimizer.step()``).
        after_step: lines after ``optimizer.zero_grad``.
        loop: the loop over ``batches`` (plain code): lines where ``FORWARD`` and ``STEP`` stand for the forward and
            backward of ``micro`` (the loss divided by ``divisor``) and the optimizer step, at their indentation.
        data: the accelerate script's DataLoader keywords (name -> code).
        accelerator: the accelerate script's ``Accelerator`` keywords (name -> code).
        environment: lines at the top of the script, before torch is imported (the allocator's settings).
    """

    imports: Lines = ()
    settings: Lines = ()
    load: Mapping[str, str] = field(default_factory=dict)
    model: Lines = ()
    loss: Lines = ()
    loss_model: str = ""
    optimizer: str = ""
    optimizer_over: tuple[str, str] = ("", "")
    before_optimizer: Lines = ()
    after_optimizer: Lines = ()
    contexts: Lines = ()
    backward: str = ""
    before_step: Lines = ()
    step: Lines = ()
    after_step: Lines = ()
    loop: Lines = ()
    data: Mapping[str, str] = field(default_factory=dict)
    accelerator: Mapping[str, str] = field(default_factory=dict)
    environment: Lines = ()

    def __add__(self, other: Code) -> Code:
        """Both fragments' lines, slot by slot; a slot that one fragment replaces is taken from the one that sets
        it (two levers replacing the same slot is a declaration error)."""
        merged: dict[str, Any] = {}
        for slot in fields(self):
            mine, theirs = getattr(self, slot.name), getattr(other, slot.name)
            if slot.name in ("imports", "settings"):
                merged[slot.name] = mine + tuple(line for line in theirs if line not in mine)
            elif isinstance(mine, tuple) and slot.name not in _REPLACED:
                merged[slot.name] = mine + theirs
            elif isinstance(mine, Mapping):
                merged[slot.name] = {**mine, **theirs}
            else:
                if _set(mine) and _set(theirs) and mine != theirs:
                    raise ValueError(f"two levers write the code slot {slot.name!r}: {mine!r} and {theirs!r}")
                merged[slot.name] = theirs if _set(theirs) else mine
        return Code(**merged)

    def __repr__(self) -> str:
        set_slots = [f"{slot.name}={getattr(self, slot.name)!r}" for slot in fields(self)
                     if _set(getattr(self, slot.name))]
        return "Code(" + ", ".join([*set_slots, "..."]) + ")"


_REPLACED = ("loss", "step", "loop", "optimizer_over")


def _set(value: Any) -> bool:
    return bool(value) and value != ("", "")


@dataclass(frozen=True)
class Accelerate:
    """One lever's part of the accelerate export: keys of the YAML and lines of the script, per strategy.

    Args:
        config: top-level YAML keys (every strategy).
        fsdp2: ``fsdp_config`` keys (FSDP2).
        zero2: ``deepspeed_config`` keys with ZeRO-2.
        zero3: ``deepspeed_config`` keys with ZeRO-3.
        script: the script's lines (every strategy).
        by_strategy: the script's lines for one strategy only (what the YAML cannot carry there).
        refused: why the lever's value cannot be exported with a strategy (one sentence saying what to write), by
            strategy (ZeRO-2 cannot offload the parameters).
    """

    config: Mapping[str, Any] = field(default_factory=dict)
    fsdp2: Mapping[str, Any] = field(default_factory=dict)
    zero2: Mapping[str, Any] = field(default_factory=dict)
    zero3: Mapping[str, Any] = field(default_factory=dict)
    script: Code = field(default_factory=Code)
    by_strategy: Mapping[str, Code] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)

    def section(self, strategy: str) -> Mapping[str, Any]:
        """The keys of the strategy's own section (``fsdp_config`` or ``deepspeed_config``)."""
        found: Mapping[str, Any] = getattr(self, strategy)
        return found

    def lines(self, strategy: str) -> Code:
        """The script's lines with ``strategy``."""
        return self.script + self.by_strategy.get(strategy, Code())


def zero(keys: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The same ``deepspeed_config`` keys for ZeRO-2 and ZeRO-3 (``Accelerate(**zero({...}))``).

    Example:
        >>> Accelerate(**zero({"zero_stage_keys": 1})).zero3
        {'zero_stage_keys': 1}
    """
    return {"zero2": keys, "zero3": keys}


Fragment = Keys | Code | Accelerate | Lora | InLoraConfig | Elsewhere | str
"""What a lever's export function returns (see the module docstring); a ``str`` is a refusal (``""``: nothing)."""

Export = Callable[[PlanLike], Fragment]
"""One lever's declaration for one export."""


def per_target(make: Callable[[str], Export]) -> dict[str, Export]:
    """A lever's ``exports`` from one function of the target (``make("trainer")`` is the Trainer's declaration).

    Example:
        >>> sorted(per_target(lambda target: carried)) == sorted(TARGETS)
        True
    """
    return {target: make(target) for target in TARGETS}


def per_target_but_peft(make: Callable[[str], Export]) -> dict[str, Export]:
    """The ``exports`` of a lever that is not an adapter's: ``make(target)`` for each target but peft, whose is
    :func:`concerns_adapters_only`.

    Example:
        >>> per_target_but_peft(lambda target: carried)["peft"](None)
        Elsewhere(note='')
    """
    return {target: concerns_adapters_only if target == "peft" else make(target) for target in TARGETS}


def nothing_for(target: str) -> Fragment:
    """What ``target``'s export adds for a lever at its default that changes nothing there: empty keys (the
    Trainer's arguments, the DeepSpeed config), no code, no accelerate settings; peft's ``LoraConfig`` is not its place.

    Example:
        >>> nothing_for("trainer"), nothing_for("peft")
        (Keys(keys={}, legacy=None), Elsewhere(note=''))
    """
    empty: dict[str, Fragment] = {"trainer": Keys(), "deepspeed": Keys(), "code": Code(), "accelerate": Accelerate()}
    return empty.get(target, Elsewhere())


def merge_keys(into: Mapping[str, Any], keys: Mapping[str, Any]) -> dict[str, Any]:
    """``into`` with ``keys`` added: nested dicts merge, ``"_comment"`` texts join with ``"; "``, and two levers
    setting one key to different values is a declaration error.

    Example:
        >>> merge_keys({"_comment": "a"}, {"_comment": "b", "x": 1})
        {'_comment': 'a; b', 'x': 1}
    """
    merged = dict(into)
    for key, value in keys.items():
        if key not in merged:
            merged[key] = dict(value) if isinstance(value, Mapping) else value
        elif key == "_comment":
            merged[key] = f"{merged[key]}; {value}" if value not in merged[key] else merged[key]
        elif isinstance(merged[key], Mapping) and isinstance(value, Mapping):
            merged[key] = merge_keys(merged[key], value)
        elif merged[key] != value:
            raise ValueError(f"two levers set {key!r}: {merged[key]!r} and {value!r}")
    return merged


def carried(plan: PlanLike) -> Fragment:
    """The verdict of an export that carries the lever with nothing of its own to add (the engine's base carries
    it, or another lever's fragment does).

    Example:
        >>> carried(None)
        ''
    """
    return ""


def concerns_adapters_only(plan: PlanLike) -> Fragment:
    """peft's verdict on a lever that is not an adapter's: a ``LoraConfig`` describes the adapters only, and the
    plan's other levers travel in the other exports (it refuses plans without an adapter itself).

    Example:
        >>> concerns_adapters_only(None)
        Elsewhere(note='')
    """
    return Elsewhere()


def refusal_of(fragment: Fragment) -> str:
    """The refusal a fragment is (its text), or ``""`` where it carries the lever or sends it elsewhere.

    Example:
        >>> refusal_of("write x instead"), refusal_of(Keys({"a": 1}))
        ('write x instead', '')
    """
    return fragment if isinstance(fragment, str) else ""
