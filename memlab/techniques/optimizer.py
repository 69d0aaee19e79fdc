"""The optimizer of a plan, over the trainable parameters only: torch AdamW (fused where the device has it, as
the Trainer builds it, or foreach, as a plain loop's ``torch.optim.AdamW(params)`` runs on CUDA), bitsandbytes'
8-bit AdamW (paged on CUDA), or Adafactor; how each is named in each export (:data:`OPTIMIZER_FORMS`, once), what
the search may assume of them (:data:`OPTIMIZER_RANK`), and the lever's declaration."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError
from memlab.techniques.core.fragments import Accelerate, Code, Elsewhere, Export, Fragment, Keys, per_target
from memlab.techniques.core.lever import Lever, PlanLike
from memlab.techniques.core.technique import PlanFields, StepParts, Technique, Undo

# Devices whose fused AdamW kernel torch 2.x has (the Trainer's default optim is "adamw_torch_fused" from torch 2.8).
FUSED_ADAMW_DEVICES = ("cuda", "cpu")

EIGHT_BIT_OPTIMIZERS = ("adamw8bit", "paged_adamw8bit")
"""bitsandbytes' 8-bit AdamWs: their state is sized, not the weights' dtype (2 bytes a trained weight, and scales)."""
PAGED_ON_CPU = "paged_adamw8bit pages its state only on CUDA: on cpu this is the unpaged 8-bit AdamW (same state)"
PAGED_ESTIMATED = (
    "paged_adamw8bit is estimated as the unpaged 8-bit AdamW: its state counted on the device, where it stays "
    "until the GPU runs short"
)
FOREACH_ON_CPU = (
    "adamw_foreach runs torch's foreach AdamW on cpu too, as a plain loop's torch.optim.AdamW(params) does on CUDA "
    "(on a CPU that loop gets the for-loop update, whose temporaries are one weight's size)"
)
PAGED_OUTSIDE_ALLOCATOR = (
    "paged_adamw8bit: bitsandbytes keeps the 8-bit state of tensors of 100k elements or more in CUDA unified memory, "
    "outside PyTorch's allocator, so it is not in the peak; the driver pages it to CPU memory when the GPU runs short"
)


def build_optimizer(
    parameters: Sequence[nn.Parameter],
    plan: PlanFields,
    lr: float,
    *,
    device_type: str | None = None,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """A fresh optimizer of the plan's kind for ``parameters``, as the Hugging Face Trainer builds it on
    ``device_type`` (default: the parameters' device).

    - ``"adamw"``: ``torch.optim.AdamW``, fused where torch has the kernel (CUDA and CPU; the Trainer's default
      ``optim="adamw_torch_fused"`` from torch 2.8): one kernel per update, no temporaries the size of the
      weights. ``fused=False`` asks for torch's own choice without fusing (foreach on CUDA, whose temporaries are
      part of the peak); ``fused=True`` insists.
    - ``"adamw8bit"`` / ``"paged_adamw8bit"``: bitsandbytes' ``AdamW8bit`` / ``PagedAdamW8bit``; paging exists only
      on CUDA, so elsewhere the paged plan builds the unpaged optimizer (:func:`optimizer_notes` says so).
    - ``"adafactor"``: ``transformers.optimization.Adafactor`` with the Trainer's settings for
      ``optim="adafactor"`` (``scale_parameter=False, relative_step=False``, the given ``lr``, no first moment).
    - ``"adamw_foreach"``: ``torch.optim.AdamW(parameters, lr=lr, foreach=True)`` on every device: what a plain
      loop's ``torch.optim.AdamW(params)`` runs on CUDA (and the Trainer's ``optim="adamw_torch"``). Its update
      holds ``torch._foreach_sqrt`` of the second moments, a temporary as large as the trained weights (per
      group of one device and dtype); the bias corrections are Python numbers, not tensors.

    Example:
        >>> from memlab.plan import Plan
        >>> layer = nn.Linear(4, 4)
        >>> optimizer = build_optimizer(list(layer.parameters()), Plan(), lr=1e-3)
        >>> type(optimizer).__name__, optimizer.defaults["fused"]
        ('AdamW', True)
        >>> type(build_optimizer(list(layer.parameters()), Plan(optimizer="adafactor"), lr=1e-3)).__name__
        'Adafactor'
        >>> build_optimizer(list(layer.parameters()), Plan(optimizer="adamw_foreach"), lr=1e-3).defaults["foreach"]
        True
    """
    if not parameters:
        raise MemlabError("the model has no trainable parameters; set requires_grad=True on what should train")
    device_type = device_type or parameters[0].device.type
    if plan.optimizer in EIGHT_BIT_OPTIMIZERS:
        # Imported here: bitsandbytes is heavy and prints at import; `import memlab` must not pull it in.
        import bitsandbytes

        paged = plan.optimizer == "paged_adamw8bit" and device_type == "cuda" and _real_cuda(parameters[0])
        kind = bitsandbytes.optim.PagedAdamW8bit if paged else bitsandbytes.optim.AdamW8bit
        optimizer = kind(parameters, lr=lr)
        optimizer.mng = _own_override_manager(optimizer, parameters)
        return optimizer
    if plan.optimizer == "adafactor":
        # transformers' Adafactor rather than torch.optim.Adafactor: it is what the Trainer's optim="adafactor"
        # (memlab's export) builds, so the plan measured is the plan exported. torch's differs in its defaults
        # (a relative step size, a beta2 decay schedule) and keeps a step tensor per parameter.
        from transformers.optimization import Adafactor

        return Adafactor(parameters, lr=lr, scale_parameter=False, relative_step=False)
    if plan.optimizer == "adamw_foreach":
        # Asked for on any device: a CPU run and a dry run on CPU kernels then hold the temporaries CUDA's does.
        return torch.optim.AdamW(parameters, lr=lr, foreach=True)
    if fused is None:
        fused = device_type in FUSED_ADAMW_DEVICES and all(p.is_floating_point() for p in parameters)
    if fused:
        return torch.optim.AdamW(parameters, lr=lr, fused=True)
    # torch picks foreach by itself on real CUDA tensors; a dry run for CUDA on CPU kernels must ask for it.
    return torch.optim.AdamW(parameters, lr=lr, foreach=True if device_type == "cuda" else None)


def optimizer_notes(plan: PlanFields, device_type: str, parameters: Sequence[torch.Tensor] = ()) -> list[str]:
    """What a trial's notes say about the plan's optimizer on ``device_type`` for ``parameters`` (fake ones: a dry
    run, which pages nothing).

    Example:
        >>> from memlab.plan import Plan
        >>> optimizer_notes(Plan(optimizer="paged_adamw8bit"), "cpu") == [PAGED_ON_CPU]
        True
        >>> optimizer_notes(Plan(), "cpu")
        []
    """
    if plan.optimizer == "adamw_foreach" and device_type == "cpu":
        return [FOREACH_ON_CPU]
    if plan.optimizer != "paged_adamw8bit":
        return []
    if device_type != "cuda":
        return [PAGED_ON_CPU]
    if parameters and not _real_cuda(parameters[0]):
        return [PAGED_ESTIMATED]
    return [PAGED_OUTSIDE_ALLOCATOR]


def _real_cuda(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return tensor.device.type == "cuda" and not is_fake(tensor)


def _own_override_manager(optimizer: torch.optim.Optimizer, parameters: Sequence[nn.Parameter]) -> Any:
    """A bitsandbytes override manager holding only the overrides that name these parameters.

    bitsandbytes keeps overrides on a process-wide singleton, keyed partly by (group, position) and never cleared:
    after the Trainer has registered 32-bit embeddings for one model, every later 8-bit optimizer would keep
    32-bit state at those positions. A private copy keeps what the user set for these parameters and nothing else.
    """
    from bitsandbytes.optim import GlobalOptimManager

    shared = GlobalOptimManager.get_instance()
    own = GlobalOptimManager.__new__(GlobalOptimManager)
    own.initialize()
    ours = {id(p) for p in parameters}
    own.module_weight_config_triple = [
        (module, name, config)
        for module, name, config in shared.module_weight_config_triple
        if id(getattr(module, name, None)) in ours
    ]
    own.pid2config = {key: config for key, config in shared.pid2config.items() if key in ours}
    own.uses_config_override = bool(own.pid2config or own.module_weight_config_triple)
    for group_index, group in enumerate(optimizer.param_groups):
        for position, parameter in enumerate(group["params"]):
            if id(parameter) in own.pid2config:
                own.index2config[(group_index, position)] = own.pid2config[id(parameter)]
    return own


def state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor the optimizer keeps as state (moments, quantization maps, step counters)."""
    target = getattr(optimizer, "inner", optimizer)
    return [value for state in target.state.values() for value in state.values() if isinstance(value, torch.Tensor)]


class Optimizer(Technique):
    """``optimizer``: how the step's optimizer is built (:func:`build_optimizer`, as the Trainer builds it on
    ``parts.optimizer_device_type``); a dry run of paged 8-bit AdamW for CUDA counts its state on the device.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.techniques.core.technique import StepParts
        >>> parts = StepParts(nn.Linear(2, 2), Plan(optimizer="adafactor"), torch.device("cpu"))
        >>> OPTIMIZER.put_on(parts); type(parts.make_optimizer(parts.parameters)).__name__
        'Adafactor'
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        plan, lr, device_type = parts.plan, parts.lr, parts.optimizer_device_type
        parts.make_optimizer = lambda parameters: build_optimizer(parameters, plan, lr, device_type=device_type)
        return None

    def notes(self, parts: StepParts) -> list[str]:
        if self._paged_estimated(parts):
            return []
        return optimizer_notes(parts.plan, parts.optimizer_device_type, parts.parameters)

    def dry_run(self, parts: StepParts) -> list[str]:
        return [PAGED_ESTIMATED] if self._paged_estimated(parts) else []

    @staticmethod
    def _paged_estimated(parts: StepParts) -> bool:
        return parts.plan.optimizer == "paged_adamw8bit" and parts.optimizer_device_type == "cuda" and parts.fake


OPTIMIZER = Optimizer()


@dataclass(frozen=True)
class OptimizerForm:
    """How one of memlab's optimizers is written in each export.

    Args:
        title: its name in words.
        trainer: the Trainer's ``optim`` name.
        imports: the import line code needs (empty: torch's own).
        make: the class as code calls it, after ``imports``.
        full_name: the class with its module, for messages.
        keywords: keywords code passes besides the parameters and ``lr``.
        deepspeed: DeepSpeed's own optimizer type, or empty where DeepSpeed takes it as a client optimizer.
    """

    title: str
    trainer: str
    imports: str
    make: str
    full_name: str
    keywords: str = ""
    deepspeed: str = ""


OPTIMIZER_FORMS = {
    # "adamw_torch_fused" is the Trainer's own default optim from torch 2.8: memlab's "adamw" is that optimizer.
    "adamw": OptimizerForm("AdamW", "adamw_torch_fused", "", "torch.optim.AdamW", "torch.optim.AdamW",
                           deepspeed="AdamW"),
    "adamw8bit": OptimizerForm("8-bit AdamW", "adamw_bnb_8bit", "import bitsandbytes as bnb", "bnb.optim.AdamW8bit",
                               "bitsandbytes.optim.AdamW8bit"),
    "paged_adamw8bit": OptimizerForm("paged 8-bit AdamW", "paged_adamw_8bit", "import bitsandbytes as bnb",
                                     "bnb.optim.PagedAdamW8bit", "bitsandbytes.optim.PagedAdamW8bit"),
    "adafactor": OptimizerForm("Adafactor", "adafactor", "from transformers.optimization import Adafactor",
                               "Adafactor", "transformers.optimization.Adafactor",
                               keywords="scale_parameter=False, relative_step=False"),
    # What a plain loop's torch.optim.AdamW(params) runs on CUDA. The Trainer's "adamw_torch" builds torch's AdamW
    # with its defaults, so foreach on CUDA too; DeepSpeed's own "AdamW" is its fused kernel, so DeepSpeed takes
    # this one as a client optimizer.
    "adamw_foreach": OptimizerForm("torch's foreach AdamW", "adamw_torch", "", "torch.optim.AdamW",
                                   "torch.optim.AdamW", keywords="foreach=True"),
}
"""Each optimizer's :class:`OptimizerForm`, by memlab's name.

Example:
    >>> OPTIMIZER_FORMS["adafactor"].trainer
    'adafactor'
"""

OPTIMIZER_RANK = {"paged_adamw8bit": -1, "adamw8bit": 0, "adamw": 1, "adamw_foreach": 2}
"""Lower rank = fewer optimizer bytes for the same parameters; optimizers not listed compare only with themselves.
Paged 8-bit AdamW ranks below the unpaged one: on CUDA its large states live outside PyTorch's allocator. The
foreach AdamW ranks above the fused one: the same state, and its update holds a temporary the size of the weights
(``torch._foreach_sqrt`` of the second moments) where the fused kernel holds none. Adafactor is not ranked: its
state is far smaller, but its update's temporaries can be larger than fused AdamW's."""

SEARCHED_OPTIMIZERS = ("adamw", "adamw8bit")
"""The optimizers fit searches by default (:func:`memlab.search.space.default_space`): the same training with less
state. Adafactor's updates differ from Adam's (:data:`SUGGESTED_OPTIMIZERS`); the foreach AdamW is a user's own loop,
to be estimated as it is: more memory than the fused one and no faster, so neither searched nor suggested."""

SUGGESTED_OPTIMIZERS = ("adafactor",)
"""The optimizers suggested outside fit's space, since they change what is trained (the lever's ``suggest``)."""


def _optimizer_needs_at_least(mine: str, theirs: str) -> bool:
    if mine not in OPTIMIZER_RANK or theirs not in OPTIMIZER_RANK:
        return False
    return OPTIMIZER_RANK[mine] >= OPTIMIZER_RANK[theirs]


def optimizer_code(plan: PlanLike, *, fused: bool = True) -> str:
    """The expression that builds the plan's optimizer over ``{params}`` with ``lr`` (a template the engines fill
    in), as memlab builds it: fused AdamW where ``{device}`` has the kernel (``fused=False``: torch's default, what
    the accelerate script's sharded parameters take), after the import line of :data:`OPTIMIZER_FORMS`.

    Example:
        >>> from memlab.plan import Plan
        >>> optimizer_code(Plan(optimizer="adafactor"))
        'Adafactor({params}, lr=lr, scale_parameter=False, relative_step=False)'
    """
    form = OPTIMIZER_FORMS[plan.optimizer]
    extra = f", {form.keywords}" if form.keywords else ""
    if plan.optimizer == "adamw" and fused:
        extra = ', fused={device}.type in ("cuda", "cpu")'
    return f"{form.make}({{params}}, lr=lr{extra})"


def _optimizer_for_deepspeed(plan: PlanLike) -> Fragment:
    form = OPTIMIZER_FORMS[plan.optimizer]
    if form.deepspeed:
        return Keys({"optimizer": {
            "type": form.deepspeed,
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }})
    keywords = f" ({form.keywords})" if form.keywords else ""
    comments = [
        f"{form.title} is not a DeepSpeed optimizer: create {form.full_name}{keywords} yourself and pass it "
        f"(Trainer(optimizers=(optimizer, None)), or TrainingArguments(optim={form.trainer!r}), or "
        "deepspeed.initialize(optimizer=optimizer))"
    ]
    keys: dict[str, object] = {"zero_allow_untested_optimizer": True}
    if plan.offloads_optimizer:
        keys["zero_force_ds_cpu_optimizer"] = False
        comments.append(
            "optimizer offload with a client optimizer: DeepSpeed's own CPU Adam is not used, so the "
            "update runs wherever that optimizer runs it"
        )
    return Keys({**keys, "_comment": "; ".join(comments)})


def _optimizer(target: str) -> Export:
    def fragment(plan: PlanLike) -> Fragment:
        form = OPTIMIZER_FORMS[plan.optimizer]
        imports = (form.imports,) if form.imports else ()
        if target == "trainer":
            return Keys({"optim": form.trainer})
        if target == "deepspeed":
            return _optimizer_for_deepspeed(plan)
        if target == "code":
            note = ("# Fused AdamW where torch has the kernel: the Trainer's default optim adamw_torch_fused",) if (
                plan.optimizer == "adamw") else ()
            return Code(imports=imports, before_optimizer=note, optimizer=optimizer_code(plan))
        if target == "accelerate":
            return Accelerate(script=Code(imports=imports, optimizer=optimizer_code(plan, fused=False)))
        return Elsewhere()

    return fragment


TRAINER_OPTIMIZERS = {
    **{form.trainer: name for name, form in OPTIMIZER_FORMS.items()},
    "adamw_8bit": "adamw8bit",
}
"""The Trainer's ``optim`` names that are memlab optimizers (``TrainingArguments.optim`` -> ``Plan.optimizer``): the
names the export writes (:data:`OPTIMIZER_FORMS`) and the alias transformers also takes. ``"adamw_torch"`` is torch's
AdamW with its defaults (foreach on CUDA): memlab's ``"adamw_foreach"``, not the fused ``"adamw"``."""


def optimizer_from_arguments(args: Any) -> str:
    """The optimizer a ``TrainingArguments`` builds (its ``optim``, an enum or its text), or a MemlabError naming the
    ``optim`` names memlab measures.

    Example:
        >>> from types import SimpleNamespace
        >>> optimizer_from_arguments(SimpleNamespace(optim="adamw_bnb_8bit"))
        'adamw8bit'
        >>> optimizer_from_arguments(SimpleNamespace())
        'adamw'

    """
    optim = getattr(args, "optim", "adamw_torch_fused")
    optim = str(getattr(optim, "value", optim))  # an enum (OptimizerNames.ADAFACTOR) or its text
    if optim not in TRAINER_OPTIMIZERS:
        raise MemlabError(
            f"optim={optim!r} is not an optimizer memlab measures; write optim= one of {', '.join(TRAINER_OPTIMIZERS)}"
        )
    return TRAINER_OPTIMIZERS[optim]


DECLARATIONS = (
    Lever(
        "optimizer",
        "adamw",
        short="{}",
        choices=tuple(OPTIMIZER_FORMS),
        help="adamw keeps 8 bytes of state per weight; adamw8bit (bitsandbytes) about 2, at a small cost in accuracy; "
        "paged_adamw8bit the same, paged to CPU memory under pressure (CUDA only); adafactor factors its second "
        "moments (a row and a column per matrix, no first moment): far less state, updates differ from Adam's; "
        "adamw_foreach is the AdamW a plain loop builds on CUDA (foreach): adamw's state plus a temporary the size "
        "of the weights in its update (to estimate your own loop, never searched)",
        technique=OPTIMIZER,
        needs_at_least=_optimizer_needs_at_least,
        optimizer_state={"adamw8bit": 0.25, "paged_adamw8bit": 0.0, "adafactor": 0.0},
        speed={"adamw8bit": (0.97, 0.97), "paged_adamw8bit": (0.97, 0.97), "adafactor": (0.9, 0.9),
               "adamw_foreach": (0.98, 0.95)},
        suggest=SUGGESTED_OPTIMIZERS,  # never searched by default (SEARCHED_OPTIMIZERS says why)
        on_cpu=lambda value: "adamw8bit" if value == "paged_adamw8bit" else value,
        on_cpu_note="paged 8-bit AdamW pages only on CUDA; on a CPU it is the unpaged 8-bit AdamW",
        from_arguments=optimizer_from_arguments,
        exports=per_target(_optimizer),
    ),
)
"""The ``optimizer`` lever (:data:`memlab.techniques.core.registry.REGISTRY` gathers it)."""
