"""Estimates of a deep model from a dry run of three of its layers: the first, one between, and the last.

A 7B Llama has 32 identical decoder layers, a 70B one 80; a dry run spends nearly all its time in them, one fake
operator at a time. Where a transformers config builds its layers as one block repeated (the same modules,
shapes and settings in every layer), the dry run of three layers shows everything each layer does, and
:func:`~memlab.estimation.depth.extend.extend` plays it at the model's depth: the same events a dry run of every
layer would tell the allocator's model and the step's tracker, replayed through them
(:mod:`memlab.estimation.depth.replay`). The result is the estimate of the whole model, not an extrapolation of its
numbers: the peak, its breakdown, the reserved peak and the timeline come out of the same consumers, told the same
things.

Each plan is also dry-run at two layers, and the three-layer log carried to two layers must tell its consumers
exactly what that real dry run told them (:func:`~memlab.estimation.depth.extend.canonical`): where a plan's step
does not repeat layer by layer (a layer that differs, work that grows with the depth outside the layers), the two
disagree and the plan is dry-run at its full depth instead. So is a model whose layers differ in the config
(``layer_types`` that mix sliding and full attention, dense layers before mixture-of-experts ones), and a plan
that checkpoints only some blocks. A live model on the meta device whose layers repeat (a TRL trainer's, built by
:func:`memlab.trainer_on_meta`: :func:`live_shallow_model`) is carried the same way, copied with its first three
layers and with two, its adapters, hooks and wrapped forwards as they are.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memlab.estimation.configs import built_from, is_transformers_config, load_config, meta_model
from memlab.estimation.depth.extend import NotRepeating, canonical, check_layers, extend, source_layers
from memlab.estimation.depth.log import ALLOCATOR, STEP, Event, LayerPaths
from memlab.estimation.depth.replay import replay_allocator, replay_step
from memlab.plan import Plan
from memlab.report import Trial
from memlab.report.timeline import Timeline

__all__ = ["ShallowModel", "ShallowRun", "carried_trial", "live_shallow_model", "plan_carries", "shallow_model"]


@dataclass(frozen=True)
class ShallowModel:
    """A config whose layers repeat: where they are, how many, and the model with fewer of them."""

    paths: LayerPaths
    depth: int
    """The model's layers."""
    config: Any
    """The model's config (memlab's own copy)."""
    built: bool = False
    """Whether the estimate is of memlab's model of the config on the meta device (estimated as it is, in fp32)
    rather than of the config (loaded as the plan implies)."""
    _made: dict[Any, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    live: nn.Module | None = dataclasses.field(default=None, compare=False, repr=False)
    """A live model whose first layers stand for all of them (:func:`live_shallow_model`; the dry run copies it
    with fewer: :func:`memlab.live.rebind.first_layers`); None: the config's."""

    def with_layers(self, layers: int) -> Any:
        """The config with ``layers`` layers (its per-layer settings, all alike, cut to as many).

        Example:
            >>> shallow_model("llama-7b").with_layers(3).num_hidden_layers
            3
        """
        if layers not in self._made:
            self._made[layers] = _with_layers(self.config, layers)
        return self._made[layers]

    def shallow(self, layers: int) -> Any:
        """What a dry run of ``layers`` layers estimates: the config of that many, or memlab's meta model of it
        where the estimate is of a meta model (:attr:`built`).

        Example:
            >>> type(shallow_model(meta_model(load_config("llama-7b"))).shallow(3)).__name__
            'LlamaForCausalLM'
        """
        return meta_model(self.with_layers(layers)) if self.built else self.with_layers(layers)

    def carries(self, edge: int = 1) -> bool:
        """Whether the model is deeper than the dry run that would stand for it (:func:`~memlab.estimation.
        depth_extend.source_layers`).

        Example:
            >>> shallow_model("llama-7b").carries(), shallow_model("llama-7b").carries(edge=16)
            (True, False)
        """
        return self.depth > source_layers(edge)


@dataclass
class ShallowRun:
    """One plan's dry run of a few layers: its trial (notes included, before it is made an estimate) and the
    events its :class:`~memlab.estimation.depth.log.DepthLog` kept."""

    trial: Trial
    reserved: int | None
    events: list[Event]
    root: str = ""
    """The name the model itself ran under (its class's), which the carried timeline names "" as the dry run's
    own does."""


# Configs asked about, by id (a config is not hashable): the config (weakly), what it said then (its attributes,
# private ones such as the attention implementation included), and the answer, which holds a copy of the config.
_KNOWN: dict[int, tuple[weakref.ref[Any], str, ShallowModel | None]] = {}


def shallow_model(model_or_config: Any) -> ShallowModel | None:
    """The model's repeated layers, and the model with fewer of them, where ``model_or_config`` is a transformers
    config (or a name of one), or memlab's model of one on the meta device (:func:`~memlab.estimation.configs.
    meta_model`, as it built it), whose layers are one block repeated more than three times; None otherwise (a live
    model, a changed meta model, a config with layers that differ, no ``num_hidden_layers``).

    Example:
        >>> shallow = shallow_model("llama-7b")
        >>> shallow.depth, shallow.paths.container, shallow.with_layers(3).num_hidden_layers
        (32, 'model.layers', 3)
        >>> from transformers import Gemma2Config
        >>> shallow_model(Gemma2Config(num_hidden_layers=8)) is None  # sliding and full attention layers alternate
        True
    """
    if isinstance(model_or_config, (str, os.PathLike)):
        model_or_config = load_config(model_or_config)
    if isinstance(model_or_config, nn.Module):
        # memlab's own model of a config on the meta device, as it built it: a dry run of fewer layers is of that
        # config's meta model too; any other model is estimated as it is
        built = built_from(model_or_config)
        if built is None or _model_signature(model_or_config) != _model_signature(meta_model(built)):
            return None
        found = _cached(built)
        return found and dataclasses.replace(found, built=True, _made={})
    if not is_transformers_config(model_or_config):
        return None
    return _cached(model_or_config)


def live_shallow_model(model: nn.Module) -> ShallowModel | None:
    """The repeated layers of a live model on the meta device, its weights plain tensors (a Trainer's, as built:
    every block alike, more than three; not a quantized one), which a dry run copies with its first few layers only
    (its config as it is: a forward that loops over ``config.num_hidden_layers`` layers fails, and the plan is
    dry-run whole); None otherwise.

    Each carried plan is still checked against a real dry run of two layers (:func:`carried_trial`).

    Example:
        >>> shallow = live_shallow_model(meta_model(load_config("llama-7b")))
        >>> shallow.depth, shallow.paths.container, shallow.live is not None
        (32, 'model.layers', True)
        >>> live_shallow_model(nn.Linear(2, 2)) is None
        True
    """
    config = getattr(model, "config", None)
    depth = getattr(config, "num_hidden_layers", None)
    if type(depth) is not int or depth <= source_layers() or _with_layers(config, source_layers()) is None:
        return None  # a per-layer setting that differs (sliding and full attention) is read by the layer's index
    tensors = (*model.parameters(), *model.buffers())
    # A copy of a few layers copies no data only on the meta device; bitsandbytes' quantized weights (tensor
    # subclasses) are made fake by the dry run from the live model's own layers, and are dry-run whole.
    if any(tensor.device.type != "meta" or type(tensor) not in (torch.Tensor, nn.Parameter) for tensor in tensors):
        return None
    paths = _layer_paths(model, depth)
    if paths is None:
        return None
    if len({_signature(layer, devices=True) for layer in _layers(model, paths)}) != 1:
        return None
    return ShallowModel(paths, depth, config, live=model)


def _cached(config: Any) -> ShallowModel | None:
    snapshot = repr(sorted(vars(config).items()))
    key = id(config)
    known = _KNOWN.get(key)
    if known is not None and known[0]() is config and known[1] == snapshot:
        return known[2]
    found = _shallow_model(copy.deepcopy(config))

    def forget(_: Any, pop: Any = _KNOWN.pop) -> None:  # pop bound now: at exit the module's names may be gone
        pop(key, None)

    _KNOWN[key] = (weakref.ref(config, forget), snapshot, found)
    return found


def _shallow_model(config: Any) -> ShallowModel | None:
    depth = getattr(config, "num_hidden_layers", None)
    source = source_layers()
    if type(depth) is not int or depth <= source:
        return None
    three = _with_layers(config, source)
    if three is None:
        return None
    try:
        full, shallow = meta_model(config), meta_model(three)
    except Exception:  # noqa: BLE001 - a model that cannot be built shallow is dry-run whole
        return None
    paths = _layer_paths(full, depth)
    if paths is None or _layer_paths(shallow, source) != paths:
        return None
    signatures = {_signature(layer) for layer in (*_layers(full, paths), *_layers(shallow, paths))}
    return ShallowModel(paths, depth, config) if len(signatures) == 1 else None


def _model_signature(model: nn.Module) -> tuple[Any, ...]:
    """Everything of ``model`` a dry run could see: each module (its class, plain settings, tensors and their
    devices, hooks and a forward of its own)."""
    return _signature(model, devices=True)


def _with_layers(config: Any, layers: int) -> Any | None:
    """A copy of ``config`` with ``layers`` layers; None where a per-layer setting differs between layers."""
    depth = config.num_hidden_layers
    shallow = copy.deepcopy(config)
    for name, value in vars(config).items():
        if isinstance(value, (list, tuple)) and len(value) == depth and depth > 1:
            if any(item != value[0] for item in value):
                return None
            setattr(shallow, name, type(value)(value[:layers]))
    shallow.num_hidden_layers = layers
    return shallow


def _layer_paths(model: nn.Module, depth: int) -> LayerPaths | None:
    """Where ``model``'s ``depth`` layers are: its one ``nn.ModuleList`` of that length."""
    found = [name for name, module in model.named_modules() if isinstance(module, nn.ModuleList) and
             len(module) == depth]
    if len(found) != 1 or not found[0]:
        return None
    container = found[0]
    runner = container.rpartition(".")[0] or type(model).__name__  # ModuleWatch names the root by its class
    return LayerPaths(container, runner)


def _layers(model: nn.Module, paths: LayerPaths) -> list[nn.Module]:
    return list(model.get_submodule(paths.container).children())


_INDEX_WORDS = ("idx", "index", "layer_id", "layer_number")


def _signature(layer: nn.Module, *, devices: bool = False) -> tuple[Any, ...]:
    """What makes two layers the same block: their modules, tensors and plain settings (not their numbers); with
    ``devices``, the tensors' devices, and each module's hooks and any forward of its own too."""
    parts = []
    for name, module in layer.named_modules():
        tensors = tuple((key, tuple(t.shape), t.dtype, t.requires_grad, *((t.device.type,) if devices else ()))
                        for key, t in (*module.named_parameters(recurse=False), *module.named_buffers(recurse=False))
                        if t is not None)
        settings = tuple(sorted((key, _frozen(value)) for key, value in vars(module).items()
                                if not key.startswith("_") and _plain(value)
                                and not any(word in key for word in _INDEX_WORDS)))
        extra = (len(module._forward_hooks), len(module._forward_pre_hooks), len(module._backward_hooks),
                 len(module._backward_pre_hooks), "forward" in vars(module)) if devices else ()
        parts.append((name, type(module).__name__, tensors, settings, extra))
    return tuple(parts)


def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _frozen(value: Any) -> Any:
    """A plain setting that can be compared in a set (lists made tuples)."""
    return tuple(_frozen(item) for item in value) if isinstance(value, (list, tuple)) else value


def plan_carries(plan: Any) -> bool:
    """Whether a plan's dry run of a few layers can stand for every layer: a training plan that checkpoints every
    block or none (``k`` blocks of the model's are spread over all its layers), with an optimizer that steps the
    parameters together (Adafactor's per-parameter loop is not one layer's events after another; bitsandbytes'
    8-bit state is computed from its size after the dry run), and adapters on the same layers of every block:
    ``lora_targets`` that name a module by an index (``"layers.0.self_attn.q_proj"``) may adapt some blocks only,
    while every block of the few-layer runs matches them, and the two runs would agree on a step the model's
    other blocks do not take.

    Example:
        >>> plan_carries(Plan(checkpointing=True)), plan_carries(Plan(checkpointing=4))
        (True, False)
        >>> plan_carries(Plan(optimizer="adafactor"))
        False
        >>> lora = Plan(adapter="lora", precision="bf16")
        >>> plan_carries(lora.replace(lora_targets=("q_proj",))), plan_carries(lora.replace(lora_targets=("0.q_proj",)))
        (True, False)
    """
    return (isinstance(plan, Plan) and isinstance(plan.checkpointing, bool) and plan.optimizer not in _WHOLE_OPTIMIZERS
            and not (plan.adapter != "none" and _names_an_index(plan.lora_targets)))


def _names_an_index(targets: str | tuple[str, ...]) -> bool:
    # A name with a number between its dots may pick one block of a module list (or one expert of a block's,
    # which would be alike in every block): the conservative answer, a dry run of every layer, is exact either way.
    return isinstance(targets, tuple) and any(part.isdigit() for name in targets for part in name.split("."))


_WHOLE_OPTIMIZERS = ("adafactor", "adamw8bit", "paged_adamw8bit")


_SAME_FIELDS = ("plan", "status", "error", "rows_per_step", "notes", "model_weights", "device", "preexisting_bytes",
                "context_bytes")


def carried_trial(shallow: ShallowModel, runs: dict[int, ShallowRun], categories: Sequence[str],
                  capacity: int | None) -> tuple[Trial, int | None] | None:
    """The plan's trial at the model's depth and its reserved peak, from its dry runs of three and two layers;
    None where the two do not show one step repeating layer by layer (the plan is then dry-run whole).

    The three-layer log is first replayed as it is, and must give that dry run's own results (so its consumers
    were told everything); carried to two layers, it must tell them exactly what the two-layer dry run did.

    Example:
        >>> from memlab.measure.tracker import CATEGORIES
        >>> shallow = shallow_model("llama-7b")
        >>> failed = Trial(Plan(), "error", 0, {}, None, None, None, "cuda")
        >>> runs = {3: ShallowRun(failed, None, []), 2: ShallowRun(failed, None, [])}
        >>> carried_trial(shallow, runs, CATEGORIES, None) is None  # a failed dry run carries nothing: run it whole
        True
    """
    three, two = runs[source_layers()], runs[check_layers()]
    if three.trial.status != "ok" or any(getattr(three.trial, name) != getattr(two.trial, name)
                                         for name in _SAME_FIELDS):
        return None
    allocator = any(event.consumer == ALLOCATOR for event in three.events)
    try:
        if not _replays_itself(three, categories, capacity, allocator):
            return None
        checked = extend(three.events, check_layers(), shallow.paths)
        if any(canonical(checked, consumer) != canonical(two.events, consumer) for consumer in (ALLOCATOR, STEP)):
            return None
        deep = extend(three.events, shallow.depth, shallow.paths)
        step = replay_step(deep, categories, root=three.root)
        reserved = replay_allocator(deep, capacity) if allocator else None
    except (NotRepeating, KeyError, ValueError):  # a log its consumers could not have been told: dry-run whole
        return None
    breakdown = {key: value for key, value in step.breakdown.items() if key in categories}
    timeline = three.trial.timeline and Timeline.from_recording(
        step.recording, peak_bytes=step.peak_bytes, breakdown=breakdown, device=three.trial.timeline.device)
    # What the levers keep on the host (offloaded optimizer state and activations, a paged optimizer's spill) grows
    # by one layer's worth a layer, as the two shallow runs show
    host = three.trial.host_bytes + (three.trial.host_bytes - two.trial.host_bytes) * (shallow.depth - source_layers())
    trial = dataclasses.replace(three.trial, peak_bytes=step.peak_bytes, breakdown=breakdown, timeline=timeline,
                                host_bytes=host)
    return trial, (reserved[0] if reserved is not None and three.reserved is not None else None)


def _replays_itself(run: ShallowRun, categories: Sequence[str], capacity: int | None, allocator: bool) -> bool:
    step = replay_step(run.events, categories)
    if step.peak_bytes != run.trial.peak_bytes or {k: v for k, v in step.breakdown.items() if k in categories} != \
            run.trial.breakdown:
        return False
    if not allocator:
        return run.reserved is None
    read = replay_allocator(run.events, capacity)
    return read is not None and read[0] == run.reserved
