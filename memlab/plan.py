"""Plan: one setting of the memory techniques, and InferencePlan, one inference setting, on one lever machinery;
the parsing of --try grids over either (budgets: :mod:`memlab.sizes`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import SimpleNamespace
from typing import Any, Protocol, TypeVar

from memlab.errors import MemlabError, unknown_name
from memlab.seams import Seam, provided
from memlab.sizes import format_bytes as format_bytes
from memlab.sizes import parse_budget as parse_budget
from memlab.techniques.adapters import LORA_RANK_DEFAULT
from memlab.techniques.core.lever import LeverSpec, check_levers, lever_specs
from memlab.techniques.core.registry import REGISTRY, conflicts
from memlab.techniques.offload import offloads


class _Replaceable(Protocol):
    def replace(self: PlanT, **changes: Any) -> PlanT: ...


PlanT = TypeVar("PlanT", bound=_Replaceable)

PRECISIONS: tuple[str, ...] = REGISTRY["precision"].choices
OPTIMIZERS: tuple[str, ...] = REGISTRY["optimizer"].choices
OFFLOADS: tuple[str, ...] = REGISTRY["offload"].choices
WEIGHTS: tuple[str, ...] = REGISTRY["weights"].choices
ADAPTERS: tuple[str, ...] = REGISTRY["adapter"].choices
LOSSES: tuple[str, ...] = REGISTRY["loss"].choices


def lever(default: Any, *, help: str = "", short: str = "", choices: tuple[str, ...] = ()) -> Any:
    """A plan field that is a lever (of a :class:`Plan` or an :class:`memlab.inference.InferencePlan`).

    A Plan's levers give only their default: what they mean (help, label, choices, and everything the search and
    the exports need) is declared once in :data:`memlab.techniques.core.registry.REGISTRY`. An InferencePlan's give
    their help and choices here.

    Args:
        default: the value that changes nothing (the plain plan's).
        help: what the lever does and what it costs, one sentence each (the panel's tooltip, the magic's help).
        short: how a plan's label shows a value other than the default: a format string (``"offload-{}"``), or
            for a boolean the text shown when it is True.
        choices: the allowed values of a text lever; the plan checks them and front ends offer them.

    Example:
        >>> [LEVERS[f.name].help.split(":")[0] for f in fields(Plan)][:2]
        ['rows per forward/backward', 'micro-batches per optimizer step']
    """
    return field(default=default, metadata={"help": help, "short": short, "choices": choices})


@dataclass(frozen=True)
class Plan:
    """One training setting: how a batch is split and which memory levers are on.

    Each field is a lever: its default here, and what it means (help, label, choices, its technique, what the
    search may assume of it, its exports) declared once in :data:`memlab.techniques.core.registry.REGISTRY`, from which
    the panel, the magic, the search and the exports read it. A new lever is a field here, its declaration and its
    technique in ``memlab/techniques/``.

    Args:
        micro_batch: rows per forward/backward; ``None`` means all rows of the batch given.
        accumulation: micro-batches per optimizer step (effective batch = micro_batch * accumulation).
        checkpointing: activation (gradient) checkpointing: False, True (every repeated block), or ``k`` (an int):
            that many of the model's ``L`` repeated blocks, spread evenly from the first: blocks ``i * L // k`` for
            ``i < k`` (:func:`memlab.techniques.checkpointing.chosen_blocks`); 0 is False, ``k = L`` is True, and
            ``k > L`` is refused.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (fp16 uses dynamic loss scaling).
        weights: ``"fp32"`` or ``"bf16"``: the dtype of the trained weights, their grads and optimizer state.
        optimizer: ``"adamw"`` (torch's, fused where the device has it, as the Trainer builds it), ``"adamw8bit"``
            or ``"paged_adamw8bit"`` (bitsandbytes; paged on CUDA only), ``"adafactor"`` (factored second
            moments, transformers' implementation as the Trainer's ``optim="adafactor"`` builds it), or
            ``"adamw_foreach"`` (torch's foreach AdamW, what a plain loop's ``torch.optim.AdamW(params)`` runs on
            CUDA: its update holds a temporary the size of the weights; for estimating your own loop, never
            searched).
        offload: ``"none"``, ``"optimizer"``, ``"activations"``, ``"all"``, or ``"params"`` (sharded training
            only: each GPU's shard of the weights, gradients and optimizer state in CPU memory, FSDP's
            ``offload_params`` or DeepSpeed ZeRO-3's ``offload_param``; one GPU refuses it, saying what to write).
        adapter: ``"none"``, ``"lora"`` (peft LoRA on the linear layers of a frozen base) or ``"qlora"`` (the
            same on a base whose linear weights are held in 4-bit NF4).
        lora_rank: the adapters' rank (only with an adapter; without one it is always the default, 16).
        lora_targets: the layers that get adapters: ``"all-linear"`` (every linear layer but the output head),
            ``"attention"`` (peft's default for the model's type: q and v projections for Llama-style models), or a
            list of module names (stored as a tuple; names of fused MoE expert parameters, such as
            ``"mlp.experts.gate_up_proj"``, become peft's ``target_parameters``); without an adapter, the default.
        loss: ``"full"`` or ``"chunked"``: for a causal LM with an LM head and the default loss, the head and the
            cross-entropy computed over chunks of tokens, so that only one chunk's logits exist at a time.
        lora_alpha: the adapters' scaling numerator (their update is scaled by ``lora_alpha / lora_rank``);
            ``None`` means ``2 * lora_rank``, what memlab's exports write (only with an adapter).
        lora_dropout: dropout on each adapter's input, from 0.0 (none) to below 1; its mask is kept for backward
            (only with an adapter).
        optimizer_in_backward: each trained weight gets its own optimizer (the plan's), stepped in backward as
            soon as its gradient is accumulated, so the gradients never all exist at once; refused with
            accumulation > 1, optimizer offload and fp16.
        attention: transformers' ``attn_implementation`` for the trial: ``None`` (as the model is), ``"eager"``,
            ``"sdpa"``, ``"flash_attention_2"`` or ``"flex_attention"``; switched on the live model and back.
        expandable_segments: the CUDA caching allocator's expandable segments: a live CUDA trial switches them on (and
            back), an estimate's card figure assumes them, the exports write the line; nothing changes off CUDA.
        compile: ``torch.compile`` on the model's forward (and so its backward) for the trial; the first step
            compiles, and its time is the trial's ``compile_seconds``, never part of its speed. The peak measured is
            the compiled step's; an estimate runs the compiled step's AOTAutograd partition on fake tensors (the
            eager step where dynamo cannot trace it there) and says which. Refused with ``loss="chunked"``.
        fp8: torchao's float8 training on the linear layers but the first and last (accelerate's fp8 with torchao),
            with bf16; a live trial needs torchao and a GPU of compute capability 8.9+ (elsewhere an error trial says
            so); an estimate runs torchao's ``Float8Linear`` on fake tensors, its notes name what stays high precision.
        vllm_memory: a GRPOTrainer's colocated vLLM engine's share of the card (:mod:`memlab.techniques.vllm`).
        vllm_sleep: that engine's sleep mode; for both, None is the trainer's own, and anything else refuses them.
        precompute_ref: a DPOTrainer's reference log-probs computed before training (TRL's
            ``precompute_ref_log_probs``; :mod:`memlab.techniques.precompute_ref`); None is the trainer's own.

    Example:
        >>> Plan(micro_batch=2, accumulation=4, precision="bf16").label()
        'mb2x4 bf16'
        >>> Plan(adapter="qlora", lora_rank=8, checkpointing=True).label()
        'ckpt qlora r8'
        >>> Plan(precision="fp8")
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: precision='fp8' is not known; write one of fp32, bf16, fp16
    """

    micro_batch: int | None = lever(None)
    accumulation: int = lever(1)
    checkpointing: bool | int = lever(False)
    precision: str = lever("fp32")
    weights: str = lever("fp32")
    optimizer: str = lever("adamw")
    offload: str = lever("none")
    adapter: str = lever("none")
    lora_rank: int = lever(LORA_RANK_DEFAULT)
    lora_targets: str | tuple[str, ...] = lever("all-linear")
    lora_alpha: int | None = lever(None)
    lora_dropout: float = lever(0.0)
    loss: str = lever("full")
    optimizer_in_backward: bool = lever(False)
    attention: str | None = lever(None)
    expandable_segments: bool = lever(False)
    compile: bool = lever(False)
    fp8: bool = lever(False)
    vllm_memory: float | None = lever(None)
    vllm_sleep: bool | None = lever(None)
    precompute_ref: bool | None = lever(None)

    def __new__(cls, *args: Any, **kwargs: Any) -> Plan:
        # A dataclass would raise a bare TypeError for a misspelt field; a Plan says which fields there are.
        unknown = [key for key in kwargs if key not in PLAN_FIELDS]
        if unknown:
            raise unknown_name(unknown[0], PLAN_FIELDS, "a plan setting", LEVERS_LISTED)
        if len(args) > len(PLAN_FIELDS):
            raise MemlabError(f"a Plan takes at most {len(PLAN_FIELDS)} settings; name them, e.g. Plan(accumulation=4)")
        return super().__new__(cls)

    def __eq__(self, other: object) -> bool:
        # True == 1 in Python, but checkpointing every block is not checkpointing one
        return type(other) is type(self) and _typed(self) == _typed(other)

    def __hash__(self) -> int:
        return hash(_typed(self))

    def __post_init__(self) -> None:
        check_levers(self, LEVERS)
        for name, declared in REGISTRY.items():
            # A lever that means nothing in this plan (a LoRA setting without an adapter) holds its default: one
            # value keeps grids free of duplicate plans.
            if declared.applies is not None and not declared.applies(self):
                object.__setattr__(self, name, declared.default)
        problems = conflicts(self)
        if problems:
            raise MemlabError(problems[0])

    @property
    def offloads_optimizer(self) -> bool:
        """Whether the optimizer's state and update live on the CPU (:mod:`memlab.techniques.offload` says)."""
        return offloads(self, "optimizer")

    @property
    def offloads_activations(self) -> bool:
        """Whether the tensors saved for backward live in CPU memory (:mod:`memlab.techniques.offload` says)."""
        return offloads(self, "activations")

    def rows_per_step(self, batch_rows: int) -> int:
        """Rows one optimizer step consumes: ``micro_batch * accumulation`` (micro_batch defaults to the batch)."""
        return (self.micro_batch or batch_rows) * self.accumulation

    def _batch_words(self, split: str, accumulated: str) -> list[str]:
        """How the batch is taken, in ``split`` (micro-batch, accumulation) or, with no micro-batch, ``accumulated``
        (accumulation alone, where it is not 1); the label's and the description's first words."""
        if self.micro_batch is not None:
            return [split.format(self.micro_batch, self.accumulation)]
        return [accumulated.format(self.accumulation)] if self.accumulation != 1 else []

    def _changed_levers(self) -> Iterator[tuple[str, LeverSpec, Any]]:
        """``(name, spec, value)`` of every lever but the batch's two whose value is not its default."""
        for name, spec in LEVERS.items():
            value = getattr(self, name)
            if name not in ("micro_batch", "accumulation") and value != spec.default:
                yield name, spec, value

    def label(self) -> str:
        """A short name for tables and plots: only what differs from the plain plan is shown.

        Example:
            >>> Plan(micro_batch=2, accumulation=4, checkpointing=True, offload="all").label()
            'mb2x4 ckpt offload-all'
        """
        parts = self._batch_words("mb{}x{}", "accum{}")
        for _, spec, value in self._changed_levers():
            if not spec.short:
                continue
            shown = "+".join(value) if isinstance(value, tuple) else value
            on = "{" not in spec.short and (spec.type == "bool" or value is True)
            counted = f"{spec.short}{shown}" if "{" not in spec.short else spec.short.format(shown)
            parts.append(spec.short if on else counted)
        return " ".join(parts) or "plain"

    def describe(self) -> str:
        """The label spelled out, for a figure's hover and key: every lever that differs from the plain plan.

        Example:
            >>> Plan(micro_batch=2, accumulation=4, checkpointing=True, precision="bf16").describe()
            'micro-batch 2 x accumulation 4, checkpointing, precision bf16'
            >>> Plan().describe()
            'plain: every lever off'
        """
        parts = self._batch_words("micro-batch {} x accumulation {}", "accumulation {}")
        for name, spec, value in self._changed_levers():
            words = name.replace("_", " ")
            blocks = " blocks" if spec.type == "blocks" else ""
            switch = "{" not in spec.short and (spec.type == "bool" or value is True)
            parts.append(words if switch else f"{words} {value}{blocks}")
        return ", ".join(parts) or "plain: every lever off"

    def replace(self, **changes: Any) -> Plan:
        """A copy with some fields changed (validated like a new Plan)."""
        return replace(self, **changes)

    def to_training_arguments(self, *, trl: Any = False) -> dict[str, Any]:
        """Keyword arguments for ``transformers.TrainingArguments`` that do what this plan does; ``trl=True`` for a
        TRL config (activation offload as its ``activation_offloading=True``); ``trl=trl.GRPOConfig`` (or
        ``"DPOConfig"``, or a trainer: its config class) for that config class: only keywords it takes
        (:func:`memlab.export.training_arguments`, :func:`memlab.export.trl_training_arguments`)."""
        return _exports().plan_training_arguments(self, trl=trl)

    def to_peft_config(self, model: Any = None) -> Any:
        """The ``peft.LoraConfig`` of an adapter plan; with ``model``, on exactly the layers memlab measured (see
        :func:`memlab.export.peft_config`)."""
        return _exports().peft_config(self, model)

    def to_deepspeed(self) -> dict[str, Any]:
        """A DeepSpeed config dict for this plan (ZeRO offload where the plan offloads;
        :func:`memlab.export.deepspeed_config`)."""
        return _exports().deepspeed_config(self)

    def to_code(self) -> str:
        """A plain PyTorch training-loop snippet that does what this plan does (:func:`memlab.export.pytorch_code`)."""
        return _exports().pytorch_code(self)

    @classmethod
    def from_training_arguments(cls, args: Any) -> Plan:
        """The plan a ``transformers.TrainingArguments`` trains: the inverse of :meth:`to_training_arguments`
        (:func:`memlab.export.plan_from_training_arguments`; settings memlab cannot express are a MemlabError).

        Example:
            >>> plan = Plan(micro_batch=4, accumulation=8, checkpointing=True, precision="bf16")
            >>> from transformers import TrainingArguments
            >>> args = TrainingArguments(output_dir="out", report_to=[], use_cpu=True, **plan.to_training_arguments())
            >>> Plan.from_training_arguments(args) == plan
            True
        """
        return _exports().plan_from_training_arguments(args)

    @classmethod
    def from_trainer(cls, trainer: Any) -> Plan:
        """The plan a ``transformers.Trainer`` (TRL's included) trains as set up: its arguments
        (:meth:`from_training_arguments`: its own micro-batch and accumulation among them) and what its model says
        (bf16 weights, its peft adapters; :func:`memlab.export.plan_from_trainer`). This is what ``plan=None`` means
        on a trainer; ``Plan()`` there, as everywhere, is the whole effective batch in one micro-batch.

        Example (a tiny trainer: ``tests/trainer/test_trainer_contract.py`` builds one)::

            own = memlab.Plan.from_trainer(trainer)   # Plan(micro_batch=2, accumulation=2, ...)
            memlab.measure(trainer, own) == memlab.measure(trainer)   # the same plan measured
        """
        return _exports().plan_from_trainer(trainer)

    def to_accelerate_config(
        self, *, gpus: int, strategy: str = "fsdp2", layer_classes: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """A config for ``accelerate launch --config_file`` (written as YAML) training this plan on ``gpus`` GPUs
        with ``strategy`` (``"fsdp2"``, ``"fsdp1"``, ``"zero2"``, ``"zero3"``); the script that uses the plan's other
        levers is :func:`memlab.export.accelerate.accelerate_script` (see
        :func:`memlab.export.accelerate.accelerate_config`)."""
        return _exports().accelerate_config(self, gpus=gpus, strategy=strategy, layer_classes=layer_classes)


class PlanExports(Protocol):
    """What :mod:`memlab.export` gives the Plan's ``to_*``/``from_*`` (the seam :data:`PLAN_EXPORTS`,
    :mod:`memlab.seams`): the exports build on the Plan, so the Plan asks for them instead of importing them. The
    package's loader returns the module :mod:`memlab.export` as this protocol, so mypy checks each function here
    against the export's own signature."""

    def plan_training_arguments(self, plan: Plan, *, trl: Any = False) -> dict[str, Any]: ...
    def peft_config(self, plan: Plan, model: Any = None) -> Any: ...
    def deepspeed_config(self, plan: Plan) -> dict[str, Any]: ...
    def pytorch_code(self, plan: Plan) -> str: ...
    def plan_from_training_arguments(self, args: Any) -> Plan: ...
    def plan_from_trainer(self, trainer: Any) -> Plan: ...
    def accelerate_config(
        self, plan: Plan, *, gpus: int, strategy: str = ..., layer_classes: Sequence[str] | None = None
    ) -> dict[str, Any]: ...


PLAN_EXPORTS: Seam[PlanExports] = Seam("plan exports")
"""The seam the Plan asks for its exports (:mod:`memlab.seams`): ``memlab/__init__.py`` provides it with
:mod:`memlab.export`, which the type checker holds to :class:`PlanExports`."""


def _exports() -> PlanExports:
    return provided(PLAN_EXPORTS)


PLAN_FIELDS = tuple(f.name for f in fields(Plan))


def field_signature(cls: type) -> None:
    """Give a dataclass whose ``__new__`` takes ``*args, **kwargs`` (to name a misspelt field) the signature of its
    fields, so that ``help()``, ``inspect.signature`` and the API page show ``Plan(micro_batch=None, ...)``, each
    field with its type and default, not ``Plan(*args, **kwargs)``.

    Example:
        >>> import inspect
        >>> str(inspect.signature(Plan)).startswith("(micro_batch: 'int | None' = None, accumulation: 'int' = 1")
        True
    """
    import inspect

    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]  # type: ignore[misc]
    cls.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]


field_signature(Plan)


def _typed(plan: Plan) -> tuple[tuple[bool, Any], ...]:
    return tuple((isinstance(value, bool), value) for value in (getattr(plan, name) for name in PLAN_FIELDS))

LEVERS_LISTED = "memlab.plan.LEVERS"
"""Where a message sends a user for every plan setting with its values; each front end names its own list instead
(``memlab estimate --help``, ``%%memfit?``)."""
LEVERS: dict[str, LeverSpec] = lever_specs(Plan, REGISTRY)
"""Every Plan field's :class:`LeverSpec`, in field order (from :data:`memlab.techniques.core.registry.REGISTRY`).

Example:
    >>> LEVERS["precision"].choices, LEVERS["checkpointing"].type
    (('fp32', 'bf16', 'fp16'), 'bool')
"""

def trainer_levers_refusal(axes: Mapping[str, Iterable[Any]], here: str, instead: str) -> str:
    """Why a step without a built trainer cannot take ``axes`` (``{lever: values}``): the first lever set (to a value
    other than None, the trainer's own) that is a built trainer's setting (:attr:`LeverSpec.needs_trainer`), said with
    whose setting it is, ``here`` (what was given instead of that trainer) and ``instead`` (what to write, where
    ``{name}`` is the lever's name); ``""`` where none is. Every front end and entry point that takes a model, not a
    trainer, refuses with it before anything runs.

    Example:
        >>> trainer_levers_refusal({"precision": ["bf16"], "precompute_ref": [None]}, "x", "y")
        ''
        >>> trainer_levers_refusal({"precompute_ref": [True]}, "fit was given a Linear", "pass the trainer")[:58]
        'precompute_ref is a setting of a TRL DPOTrainer, and fit w'
        >>> trainer_levers_refusal({"precompute_ref": [True]}, "x", "y, {name}=...")[-42:]
        'precompute_ref=..., or drop precompute_ref'
    """
    for name, values in axes.items():
        owner = LEVERS[name].needs_trainer if name in LEVERS else ""
        if owner and any(value is not None for value in values):
            return (f"{name} is a setting of {owner}, and {here}, not that trainer: {instead.format(name=name)}, or "
                    f"drop {name}")
    return ""


_BOOLEANS = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False, "0": False}


def parse_lever_value(spec: LeverSpec, text: str) -> Any:
    """One ``--try`` value of a lever, from text, for any plan's :class:`LeverSpec`: ``on``/``off`` for a switch
    (``off``, ``all`` or a number of blocks for ``checkpointing``), a whole number (``all`` or ``none`` where None
    is allowed) for a count, the text of a choice (names joined with ``+`` for a list of module names where the
    lever takes one).

    Example:
        >>> parse_lever_value(LEVERS["micro_batch"], "all"), parse_lever_value(LEVERS["checkpointing"], "off")
        (None, False)
        >>> [parse_lever_value(LEVERS["checkpointing"], text) for text in ("off", "8", "all", "on")]
        [False, 8, True, True]
    """
    text = text.strip()
    name = spec.name
    if spec.type == "blocks":  # a digit is a count of blocks here, never a switch
        if text.isdigit() or text.lower() not in (*_BOOLEANS, "all"):
            if not text.isdigit():
                raise MemlabError(f"{name}={text!r} is not understood; write off, all, or a number of blocks such as 4")
            return int(text) or False
        return text.lower() == "all" or _BOOLEANS[text.lower()]
    if spec.type == "bool":
        if text.lower() not in _BOOLEANS:
            raise MemlabError(f"{name}={text!r} is not understood; write on or off")
        return _BOOLEANS[text.lower()]
    if spec.type == "float":
        try:
            return float(text)
        except ValueError:
            raise MemlabError(f"{name}={text!r} is not a number; write for example {name}=0.05") from None
    if spec.type == "int":
        if spec.default is None and text.lower() in ("all", "none", "auto"):
            return None
        try:
            return int(text)
        except ValueError:
            raise MemlabError(f"{name}={text!r} is not a whole number; write for example {name}=4") from None
    if spec.default is None and text.lower() in ("none", "auto", "model"):
        return None  # a choice whose default is None: the model as it is (attention)
    if spec.open_choices and "+" in text:
        return tuple(part.strip() for part in text.split("+") if part.strip())
    return text


def parse_value(name: str, text: str) -> Any:
    """One ``--try`` value for a Plan field, from text: ``checkpointing=on``, ``micro_batch=8``, ``micro_batch=all``.

    Example:
        >>> parse_value("checkpointing", "on"), parse_value("micro_batch", "all"), parse_value("precision", "bf16")
        (True, None, 'bf16')
    """
    return parse_lever_value(LEVERS[name], text)


def parse_lever_axes(
    items: str | Iterable[str] | Mapping[str, Any], specs: Mapping[str, LeverSpec], *, what: str, example: str,
    listed: str = "",
) -> dict[str, list[Any]]:
    """``KEY=V1,V2`` items (or a mapping of lever to values) as ``{lever: [values]}`` for any plan's levers
    (``specs``), values parsed; ``what`` names a setting in messages (``"a plan setting"``), ``example`` is shown
    when an item cannot be read, ``listed`` says where every setting is listed (default :data:`LEVERS_LISTED`);
    an unknown key is said with the nearest ones (:func:`memlab.errors.unknown_name`).

    Example:
        >>> parse_lever_axes("checkpointing=on,off", LEVERS, what="a plan setting", example="precision=fp32,bf16")
        {'checkpointing': [True, False]}
    """

    def check_key(key: str) -> None:
        if key not in specs:
            raise unknown_name(key, specs, what, listed)

    listed = listed or LEVERS_LISTED
    return parse_axis_items(
        items, check_key=check_key, parse_value=lambda key, text: parse_lever_value(specs[key], text), example=example
    )


def parse_axes(items: str | Iterable[str] | Mapping[str, Any]) -> dict[str, list[Any]]:
    """``KEY=V1,V2`` items (or a mapping of field to values) as ``{field: [values]}``, values parsed, keys checked.

    Example:
        >>> parse_axes(["precision=fp32,bf16", "micro_batch=all,2"])
        {'precision': ['fp32', 'bf16'], 'micro_batch': [None, 2]}
    """
    return parse_lever_axes(items, LEVERS, what="a plan setting", example="precision=fp32,bf16")


def parse_axis_items(
    items: str | Iterable[str] | Mapping[str, Any],
    *,
    check_key: Callable[[str], None],
    parse_value: Callable[[str, str], Any],
    example: str,
) -> dict[str, list[Any]]:
    """The ``KEY=V1,V2`` reading under :func:`parse_lever_axes`: ``check_key`` raises for a key that is not a
    setting, ``parse_value(key, text)`` reads one value, ``example`` is shown when an item cannot be read.

    Example:
        >>> parse_axis_items("n=1,2", check_key=lambda key: None, parse_value=lambda k, v: int(v), example="n=1")
        {'n': [1, 2]}
    """
    axes: dict[str, list[Any]] = {}
    if isinstance(items, str):
        items = items.split()
    if isinstance(items, Mapping):
        for key, values in items.items():
            check_key(key)
            axes[key] = [values] if isinstance(values, (str, bool, int)) or values is None else list(values)
        return axes
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not values.strip():
            raise MemlabError(f"{item!r} is not KEY=V1,V2; write for example {example}")
        check_key(key)
        if key in axes:
            raise MemlabError(f"{key} is given twice; write all its values once, as {key}=V1,V2")
        axes[key] = [parse_value(key, v) for v in values.split(",") if v.strip()]
        if not axes[key]:
            raise MemlabError(f"{item!r} gives no values; write for example {key}=V1,V2")
    return axes


def grid_of(base: PlanT, axes: Mapping[str, Sequence[Any]], left_out: list[str] | None = None) -> list[PlanT]:
    """``base`` with every combination of the axes' values, in the given order, each distinct plan once (any plan
    with a ``replace`` method: a Plan or an InferencePlan).

    A combination whose settings cannot go together (the registry's ``conflicts``) is left out, unless every one is;
    ``left_out`` (a list) gets each one's settings and why, in words.

    Example:
        >>> [p.label() for p in grid_of(Plan(), {"checkpointing": [False, True]})]
        ['plain', 'ckpt']
        >>> said = []
        >>> [p.label() for p in grid_of(Plan(), {"optimizer_in_backward": [False, True], "accumulation": [1, 2]},
        ...                             said)]
        ['plain', 'accum2', 'opt-in-bwd']
        >>> said[0][:60]
        'optimizer_in_backward=on accumulation=2 (optimizer_in_backwa'
    """
    plans: list[PlanT] = []
    refused: MemlabError | None = None
    for combination in itertools.product(*axes.values()):
        changes = dict(zip(axes.keys(), combination, strict=True))
        try:
            plan = base.replace(**changes)
        except MemlabError as error:
            if not isinstance(base, Plan) or not conflicts(SimpleNamespace(**{**vars(base), **changes})):
                raise
            refused = refused or error
            if left_out is not None:
                words = " ".join(f"{name}={_said(value)}" for name, value in changes.items()
                                 if value != getattr(base, name))
                left_out.append(f"{words} ({error})")
            continue
        if plan not in plans:
            plans.append(plan)
    if not plans and refused is not None:
        raise refused
    return plans or [base]


def parse_grid(items: str | Iterable[str] | Mapping[str, Any], base: Plan | None = None,
               left_out: list[str] | None = None) -> list[Plan]:
    """Plans for every combination of ``KEY=V1,V2`` items (or a mapping of field to values), in the given order;
    ``left_out`` gets the combinations that cannot go together, with why (:func:`grid_of`).

    Example:
        >>> [p.label() for p in parse_grid(["precision=fp32,bf16", "checkpointing=off,on"])]
        ['plain', 'ckpt', 'bf16', 'ckpt bf16']
    """
    return grid_of(base or Plan(), parse_axes(items), left_out)


def _said(value: Any) -> str:
    """A lever's value as ``--try`` writes it."""
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


# --- The inference plan: the same lever machinery, its own settings. ---

WEIGHT_DTYPES = ("fp32", "bf16", "fp16")
QUANTIZATIONS = ("none", "int8", "nf4")


@dataclass(frozen=True)
class InferencePlan:
    """One inference setting, measured under ``torch.inference_mode()``.

    Args:
        batch_size: rows (sequences) per forward; ``None`` means the rows of the batch given. More rows than the
            batch has repeat its rows, fewer take the first ones.
        weights: ``"fp32"``, ``"bf16"`` or ``"fp16"``: the dtype the model's floating-point weights and buffers are
            held in (and compute in) while the plan runs; the originals come back bit-exact.
        quantize: ``"none"``, ``"int8"`` (bitsandbytes ``Linear8bitLt``, LLM.int8() without outliers) or ``"nf4"``
            (bitsandbytes ``Linear4bit``, 4-bit NormalFloat with double-quantized scales): the linear layers'
            weights, the output head excepted, are held quantized and computed in ``weights``' dtype.
        new_tokens: 0: one forward over the batch (prefill / evaluation). N > 0: greedy generation of N new tokens
            for a causal LM: one prefill forward, then N - 1 decode forwards, as ``generate`` runs them.
        kv_cache: keep the keys and values of past tokens (transformers' ``DynamicCache``) so that a decode step
            runs on the new token only; off, every step runs the whole sequence again. With ``new_tokens=0`` it
            says whether the forward builds the cache of the prompt (what a prefill does). Only causal LMs have
            one; for other models it changes nothing.

    Example:
        >>> InferencePlan().label(), InferencePlan(quantize="nf4", weights="bf16").label()
        ('fp32', 'nf4 bf16')
        >>> InferencePlan(quantize="int4")
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: quantize='int4' is not known; write one of none, int8, nf4
    """

    batch_size: int | None = lever(None, help="rows (sequences) per forward; None: the rows of the batch")
    weights: str = lever(
        "fp32", help="dtype of the weights: bf16/fp16 halve the parameter bytes (and speed up GPUs)",
        choices=WEIGHT_DTYPES,
    )
    quantize: str = lever(
        "none",
        help="linear weights in 8-bit (int8) or 4-bit NF4 (bitsandbytes): a quarter / an eighth of fp32's bytes, "
        "some accuracy and (on CPU) speed",
        choices=QUANTIZATIONS,
    )
    new_tokens: int = lever(0, help="tokens to generate (0: one forward): the KV cache grows with every one")
    kv_cache: bool = lever(True, help="keep past keys/values: faster decoding, at 2 x layers x kv-heads x head-dim "
                                      "bytes per token and row")

    def __new__(cls, *args: Any, **kwargs: Any) -> InferencePlan:
        unknown = [key for key in kwargs if key not in INFERENCE_FIELDS]
        if unknown:
            raise unknown_name(unknown[0], INFERENCE_FIELDS, "an inference setting", INFERENCE_LISTED)
        if len(args) > len(INFERENCE_FIELDS):
            raise MemlabError(
                f"an InferencePlan takes at most {len(INFERENCE_FIELDS)} settings; name them, e.g. "
                "InferencePlan(batch_size=8)"
            )
        return super().__new__(cls)

    def __post_init__(self) -> None:
        check_levers(self, INFERENCE_LEVERS)

    @property
    def generates(self) -> bool:
        """True when the plan generates tokens (``new_tokens > 0``)."""
        return self.new_tokens > 0

    def rows(self, batch_rows: int) -> int:
        """Rows one step runs: ``batch_size``, or the batch's rows.

        Example:
            >>> InferencePlan().rows(4), InferencePlan(batch_size=16).rows(4)
            (4, 16)
        """
        return self.batch_size or batch_rows

    def rows_per_step(self, batch_rows: int) -> int:
        """The same as :meth:`rows` (the name a training :class:`memlab.Plan` uses).

        Example:
            >>> InferencePlan(batch_size=16).rows_per_step(4)
            16
        """
        return self.rows(batch_rows)

    def label(self) -> str:
        """A short name for tables and plots: the weights' form always, then what differs from one forward.

        Example:
            >>> InferencePlan(weights="fp16", quantize="int8", new_tokens=8, kv_cache=False).label()
            'int8 fp16 gen8 no-kv'
        """
        parts = [self.weights] if self.quantize == "none" else [self.quantize]
        if self.quantize != "none" and self.weights != "fp32":
            parts.append(self.weights)
        if self.batch_size is not None:
            parts.append(f"bs{self.batch_size}")
        if self.new_tokens:
            parts.append(f"gen{self.new_tokens}")
        if not self.kv_cache:
            parts.append("no-kv")
        return " ".join(parts)

    def describe(self) -> str:
        """The label spelled out, for a figure's hover and key.

        Example:
            >>> InferencePlan(quantize="nf4", batch_size=4, new_tokens=16).describe()
            'inference: nf4 weights computing in fp32, batch 4, 16 new tokens with KV cache'
        """
        weights = f"{self.weights} weights" if self.quantize == "none" else (
            f"{self.quantize} weights computing in {self.weights}"
        )
        parts = [weights]
        if self.batch_size is not None:
            parts.append(f"batch {self.batch_size}")
        cache = "with KV cache" if self.kv_cache else "without KV cache"
        parts.append(f"{self.new_tokens} new tokens {cache}" if self.new_tokens else f"one forward {cache}")
        return "inference: " + ", ".join(parts)

    def replace(self, **changes: Any) -> InferencePlan:
        """A copy with some fields changed (validated like a new plan).

        Example:
            >>> InferencePlan(weights="bf16").replace(new_tokens=8).label()
            'bf16 gen8'
        """
        return replace(self, **changes)


INFERENCE_FIELDS = tuple(f.name for f in fields(InferencePlan))
field_signature(InferencePlan)  # the API page and help() show its fields, not (*args, **kwargs)
"""The settings of an :class:`InferencePlan`, in order."""

INFERENCE_LEVERS: dict[str, LeverSpec] = lever_specs(InferencePlan)
"""Each setting's :class:`memlab.plan.LeverSpec` (default, help line, allowed values: for the magic's help and the
panel), the same machinery as a training Plan's :data:`memlab.plan.LEVERS`.

Example:
    >>> INFERENCE_LEVERS["quantize"]["choices"], INFERENCE_LEVERS["kv_cache"].type
    (('none', 'int8', 'nf4'), 'bool')
"""


INFERENCE_LISTED = "memlab.plan.INFERENCE_LEVERS"
"""Where every inference setting is listed, with its values (:func:`memlab.errors.unknown_name`)."""


def parse_inference_axes(items: str | Iterable[str] | Mapping[str, Any]) -> dict[str, list[Any]]:
    """``KEY=V1,V2`` items (or a mapping of setting to values) as ``{setting: [values]}``, values parsed.

    Example:
        >>> parse_inference_axes(["weights=fp32,bf16", "kv_cache=on,off", "batch_size=all,8"])
        {'weights': ['fp32', 'bf16'], 'kv_cache': [True, False], 'batch_size': [None, 8]}
        >>> parse_inference_axes(["precision=bf16"])
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: 'precision' is not an inference setting; write one of batch_size, weights, \
quantize, new_tokens, kv_cache
    """
    return parse_lever_axes(items, INFERENCE_LEVERS, what="an inference setting", example="weights=fp32,bf16",
                            listed=INFERENCE_LISTED)


def parse_inference_grid(
    items: str | Iterable[str] | Mapping[str, Any], base: InferencePlan | None = None
) -> list[InferencePlan]:
    """InferencePlans for every combination of ``KEY=V1,V2`` items, in the given order (duplicates once).

    Example:
        >>> [p.label() for p in parse_inference_grid("weights=fp32,bf16 batch_size=1,4")]
        ['fp32 bs1', 'fp32 bs4', 'bf16 bs1', 'bf16 bs4']
    """
    return grid_of(base or InferencePlan(), parse_inference_axes(items))
