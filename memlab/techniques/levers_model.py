"""The declarations of the levers that change the model itself: checkpointing, pure bf16 weights and LoRA / QLoRA
adapters (techniques: :mod:`memlab.techniques.checkpointing`, :mod:`memlab.techniques.weights`,
:mod:`memlab.techniques.adapters`; facets: :mod:`memlab.techniques.lever`). The LoRA settings every export writes
are here too (:func:`lora_settings`), once.

Example:
    >>> [lever.name for lever in DECLARATIONS]
    ['checkpointing', 'weights', 'adapter', 'lora_rank', 'lora_targets', 'lora_alpha', 'lora_dropout', 'attention']
"""

from __future__ import annotations

from typing import Any

from memlab.errors import MemlabError
from memlab.techniques.adapters import ADAPTERS
from memlab.techniques.attention import ATTENTION, IMPLEMENTATIONS
from memlab.techniques.checkpointing import CHECKPOINTING
from memlab.techniques.fragments import (
    TARGETS,
    Accelerate,
    Code,
    Elsewhere,
    Export,
    Fragment,
    InLoraConfig,
    Keys,
    Lora,
    per_target,
)
from memlab.techniques.lever import Lever, PlanLike
from memlab.techniques.weights import WEIGHTS

LORA_RANK_DEFAULT = 16
"""The adapters' rank when none is given (and the rank of every plan without an adapter)."""


def lora_settings(plan: PlanLike, model: Any = None) -> dict[str, Any]:
    """The ``peft.LoraConfig`` keywords memlab measures an adapter plan with: rank ``plan.lora_rank``, alpha
    ``plan.lora_alpha`` (None: twice the rank), dropout ``plan.lora_dropout`` on the adapters' input, on the plan's
    ``lora_targets``: every linear layer but the output head (``target_modules="all-linear"``), peft's default layers
    for the model's type (``None``: q and v projections for Llama-style models), or the names given (a list);
    ``modules_to_save`` names the new heads of task models (``classifier``, ``score``, ``qa_outputs``), so that on
    a sequence classifier peft trains the head whole and adapts it not, as memlab measures it (peft matches
    the ends of module names: on a model without such a head they match nothing). peft resolves this config on a
    transformers model with an output head or a task head to what
    :func:`memlab.techniques.targets.lora_targets_on` measures; a model with neither (a base model, a plain
    ``nn.Module``, where memlab leaves the last linear layer out as the head) and DistilBERT (whose
    ``pre_classifier`` peft's name matching takes for the head) need ``model=``.

    With ``model``, the targets are what LoRA trains on it, computed once
    (:func:`memlab.techniques.targets.lora_targets_on`): ``target_modules`` the list of layers, and where the model
    has them, ``target_parameters`` (fused MoE experts, with peft's ``rank_pattern``/``alpha_pattern``) and
    ``modules_to_save`` (a task model's new head, trained whole). The adapter's technique injects exactly these
    keywords, and every export writes an adapter's ``LoraConfig`` from here (a lever of the LoraConfig extends this
    function and declares :func:`in_lora_config`).

    Example:
        >>> from memlab.plan import Plan
        >>> lora_settings(Plan(adapter="lora", lora_rank=8))  # doctest: +NORMALIZE_WHITESPACE
        {'r': 8, 'lora_alpha': 16, 'lora_dropout': 0.0, 'target_modules': 'all-linear',
         'modules_to_save': ['classifier', 'score', 'qa_outputs']}
        >>> lora_settings(Plan(adapter="lora", lora_targets=("q_proj", "k_proj"), lora_dropout=0.05))["lora_dropout"]
        0.05
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> bert = BertForSequenceClassification(BertConfig(hidden_size=16, num_hidden_layers=1,
        ...                                                 num_attention_heads=2, intermediate_size=32))
        >>> lora_settings(Plan(adapter="lora"), bert)["modules_to_save"]
        ['classifier']
    """
    targets = plan.lora_targets
    alpha = plan.lora_alpha if plan.lora_alpha is not None else 2 * plan.lora_rank
    settings: dict[str, Any] = {"r": plan.lora_rank, "lora_alpha": alpha, "lora_dropout": plan.lora_dropout}
    if model is None:
        from memlab.techniques.targets import HEAD_NAMES, split_targets

        if isinstance(targets, str):
            settings["target_modules"] = targets if targets == "all-linear" else None
        else:
            modules, parameters = split_targets(targets)
            settings["target_modules"] = modules
            if parameters:
                settings["target_parameters"] = parameters
        # peft then trains a task model's new head whole and adapts it not, as memlab measured; on a model without
        # such a head the names match nothing (peft matches the ends of module names)
        settings["modules_to_save"] = list(HEAD_NAMES)
        return settings
    from torch import nn  # imported here: the declarations stay free of torch

    if not isinstance(model, nn.Module):
        raise MemlabError(f"model must be the torch nn.Module the config is for, not {type(model).__name__}")
    from memlab.techniques.targets import lora_targets_on

    return {**settings, **lora_targets_on(model, targets).settings(plan.lora_rank, alpha)}


def _targets_from_peft(config: Any) -> Any:
    """A LoraConfig's ``target_modules`` as the plan's ``lora_targets``: ``"all-linear"``, ``"attention"`` for
    peft's defaults (None), or the layers' names (a tuple); None (the plan's default) for a regular expression.

    Example:
        >>> from types import SimpleNamespace
        >>> _targets_from_peft(SimpleNamespace(target_modules={"model.layers.0.q_proj", "model.layers.1.q_proj"}))
        ('q_proj',)
    """
    from memlab.techniques.targets import unfused_targets

    modules = config.target_modules
    # a config get_peft_model converted for fused MoE experts: the layer names it fused, so the plan's conversion
    # builds them fused at the rank peft gave them (rank_pattern), not at the plain rank of a named parameter
    unfused, fused = unfused_targets(config)
    if unfused and not isinstance(modules, str):
        modules = {*(modules or ()), *unfused}
    # target_parameters (fused MoE experts) as the config names them: peft matches the end of a parameter's name
    parameters = tuple(sorted(str(name) for name in getattr(config, "target_parameters", None) or ()
                              if str(name) not in fused))
    if modules is None:
        return ("attention", *parameters) if parameters else "attention"
    if isinstance(modules, str):
        if modules.lower() != "all-linear":
            return None
        return ("all-linear", *parameters) if parameters else "all-linear"
    # peft stores "all-linear" resolved into full paths; by peft's matching a leaf name adapts that layer in every
    # block, which is what such a list means
    return tuple(sorted({str(name).rpartition(".")[2] for name in modules})) + parameters or None


def _alpha_from_peft(config: Any) -> int | None:
    """A LoraConfig's alpha as the plan holds it: None where it is twice the rank (the plan's own default)."""
    alpha = config.lora_alpha
    if not isinstance(alpha, (int, float)) or alpha == 2 * config.r:
        return None
    return int(alpha) if float(alpha).is_integer() else None


def lora_config_code(plan: PlanLike, **extra: Any) -> str:
    """The ``LoraConfig(...)`` of an adapter plan as code (:func:`lora_settings`, plus ``extra`` keywords).

    Example:
        >>> from memlab.plan import Plan
        >>> lora_config_code(Plan(adapter="lora", lora_rank=4))[:75]
        "LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules='all-linear'"
    """
    settings = {**lora_settings(plan), **extra}
    return "LoraConfig(" + ", ".join(f"{key}={value!r}" for key, value in settings.items()) + ")"


def in_lora_config(keyword: str) -> dict[str, Export]:
    """The ``exports`` of a lever that is a setting of the adapter's ``LoraConfig`` (``keyword``, as
    :func:`lora_settings` writes it): every export carries it inside the adapter's config, or refuses it with the
    adapter (the Trainer), or sends it where the adapter goes (DeepSpeed).

    Example:
        >>> in_lora_config("r")["peft"](None)
        InLoraConfig(keyword='r')
    """
    return dict.fromkeys(TARGETS, lambda plan: InLoraConfig(keyword))


def qlora_compute_dtype(plan: PlanLike) -> str:
    """The dtype a QLoRA base computes in, as torch's name: the plan's half precision (autocast or pure bf16),
    else float32.

    Example:
        >>> from memlab.plan import Plan
        >>> qlora_compute_dtype(Plan(adapter="qlora", precision="bf16"))
        'bfloat16'
    """
    if plan.precision == "bf16" or plan.weights == "bf16":
        return "bfloat16"
    return "float16" if plan.precision == "fp16" else "float32"


def _qlora_compute_conflict(plan: PlanLike) -> str:
    """Why a QLoRA plan's 4-bit base cannot compute in its dtype: with pure bf16 weights it computes in bf16, and
    fp16 autocast cannot mix its bf16 outputs with fp16 (the step fails, measured and exported alike)."""
    if plan.adapter == "qlora" and plan.weights == "bf16" and plan.precision == "fp16":
        return ("adapter='qlora' with weights='bf16' computes its 4-bit base in bf16, which fp16 autocast cannot mix "
                "with fp16; write precision='bf16' (or 'fp32') with weights='bf16', or weights='fp32' with fp16")
    return ""


def _pure_bf16_elsewhere(target: str, instead: str) -> Export:
    def refusal(plan: PlanLike) -> Fragment:
        if plan.weights != "bf16":
            return Keys()
        return (
            f"weights='bf16' (pure bf16, no fp32 master copy) is not {target}: load the model in bf16 "
            f"(from_pretrained(name, dtype=torch.bfloat16)) and export plan.replace(weights='fp32'), or use {instead}"
        )

    return refusal


def with_adapter(plan: PlanLike) -> bool:
    """Whether ``plan`` trains adapters (the LoRA settings mean something only then).

    Example:
        >>> from memlab.plan import Plan
        >>> with_adapter(Plan(adapter="qlora")), with_adapter(Plan())
        (True, False)
    """
    return bool(plan.adapter != "none")


def _adapters_for_the_trainer(plan: PlanLike) -> Fragment:
    if plan.adapter == "none":
        return Keys()
    return (
        f"adapter={plan.adapter!r} is not a TrainingArguments setting: wrap the model with "
        "peft.get_peft_model(model, plan.to_peft_config())"
        + (" after loading it in 4-bit NF4 (plan.to_code() shows how)" if plan.adapter == "qlora" else "")
        + " and export plan.replace(adapter='none').to_training_arguments(), or use plan.to_code()"
    )


def _attention_export(target: str) -> Export:
    """Where each export writes ``attention``: the plain code switches the loaded model, the accelerate script loads
    it with ``attn_implementation=``; the Trainer, DeepSpeed and peft exports leave it to the loading code."""

    def export(plan: PlanLike) -> Fragment:
        if plan.attention is None:
            nothing: dict[str, Fragment] = {"code": Code(), "accelerate": Accelerate(), "trainer": Keys()}
            return nothing.get(target, Elsewhere())
        if target == "code":
            return Code(model=(f"model.set_attn_implementation({plan.attention!r})  # or from_pretrained(..., "
                               f"attn_implementation={plan.attention!r})",))
        if target == "accelerate":
            return Accelerate(script=Code(load={"attn_implementation": repr(plan.attention)}))
        return Elsewhere(f"load the model with from_pretrained(..., attn_implementation={plan.attention!r})")

    return export


CHECKPOINTING_CODE = (
    "# Activation checkpointing: keep only each block's input, recompute the rest in backward",
    'if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5',
    '    model.activation_checkpointing_enable({"use_reentrant": False})',
    "else:",
    '    model.gradient_checkpointing_enable({"use_reentrant": False})',
)
"""The lines that turn a Hugging Face model's activation checkpointing on (the code, the ZeRO scripts)."""

_CHECKPOINTING_ELSEWHERE = (
    "activation checkpointing is the model's, not a DeepSpeed setting: pass TrainingArguments("
    "activation_checkpointing=True) (plan.to_training_arguments()), or call "
    'model.gradient_checkpointing_enable({"use_reentrant": False}) as plan.to_code() does'
)


_BLOCKS_IMPORT = "from transformers.modeling_layers import GradientCheckpointingLayer"


def _chosen_lines(blocks: int) -> tuple[str, ...]:
    """Code for the blocks ``checkpointing=blocks`` checkpoints (as
    :func:`memlab.techniques.checkpointing.chosen_blocks` chooses them): ``blocks`` and ``chosen``."""
    return (
        "blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]",
        f"chosen = {{i * len(blocks) // {blocks} for i in range({blocks})}}  # the last one only when it is every one",
    )


def selective_checkpointing_code(blocks: int) -> Code:
    """The code lines that checkpoint ``blocks`` of a Hugging Face model's layers, spread evenly: the model's own
    switch, then its per-layer flag put back off on the layers not chosen.

    Example:
        >>> selective_checkpointing_code(4).model[-1]
        '    block.gradient_checkpointing = index in chosen'
    """
    return Code(imports=(_BLOCKS_IMPORT,), model=(
        *CHECKPOINTING_CODE,
        f"# ... on {blocks} of its layers only, spread evenly: the others keep their activations and run once",
        *_chosen_lines(blocks),
        "for index, block in enumerate(blocks):",
        "    block.gradient_checkpointing = index in chosen",
    ))


def _fsdp2_selective(blocks: int) -> Code:
    """FSDP2's ``fsdp_activation_checkpointing`` is all or nothing: ``blocks`` layers wrapped before
    ``accelerator.prepare`` with torch's ``apply_activation_checkpointing`` and a check function."""
    return Code(imports=(
        "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing",
        _BLOCKS_IMPORT,
    ), model=(
        f"# Activation checkpointing of {blocks} of the model's layers, spread evenly (non-reentrant)",
        *_chosen_lines(blocks),
        "checkpointed = [blocks[index] for index in sorted(chosen)]",
        "apply_activation_checkpointing(model, check_fn=lambda module: any(module is b for b in checkpointed))",
    ))


def _checkpointing(target: str) -> Export:
    def fragment(plan: PlanLike) -> Fragment:
        on = bool(plan.checkpointing)
        some = plan.checkpointing if on and plan.checkpointing is not True else 0
        if target == "trainer":  # transformers before 5 names it gradient_checkpointing
            if some:
                return (
                    f"checkpointing={some} blocks is not a TrainingArguments setting (its activation_checkpointing is "
                    "every block or none): export plan.replace(checkpointing=True), or keep checkpointing off in the "
                    "arguments and checkpoint the blocks on the model before Trainer(...) as plan.to_code() does"
                )
            keys = {"checkpointing": on, **({"checkpointing_kwargs": {"use_reentrant": False}} if on else {})}
            return Keys({f"activation_{key}": value for key, value in keys.items()},
                        legacy={f"gradient_{key}": value for key, value in keys.items()})
        if target == "deepspeed":
            return Elsewhere(_CHECKPOINTING_ELSEWHERE if on else "")
        if target == "code":
            return selective_checkpointing_code(some) if some else Code(model=CHECKPOINTING_CODE if on else ())
        if target == "accelerate":  # FSDP2 checkpoints from its config; DeepSpeed leaves it to the model
            script = selective_checkpointing_code(some) if some else Code(model=CHECKPOINTING_CODE if on else ())
            return Accelerate(fsdp2={"fsdp_activation_checkpointing": on and not some},
                              by_strategy={"zero2": script, "zero3": script,
                                           **({"fsdp2": _fsdp2_selective(some)} if some else {})})
        return Elsewhere()

    return fragment


def blocks_needed(mine: bool | int, theirs: bool | int) -> bool:
    """Whether checkpointing ``mine`` blocks keeps at least the activations of ``theirs`` (fewer blocks keep more).

    Example:
        >>> blocks_needed(False, 4), blocks_needed(4, 8), blocks_needed(8, 4), blocks_needed(True, 4)
        (True, True, False, False)
    """
    def count(value: bool | int) -> float:
        return float("inf") if value is True else float(value)

    return count(mine) <= count(theirs)


def _weights(target: str) -> Export:
    pure = "torch.bfloat16" if target != "peft" else ""

    def fragment(plan: PlanLike) -> Fragment:
        bf16 = plan.weights == "bf16"
        if target == "code":
            return Code(model=("# Pure bf16: weights, gradients and optimizer state in bf16 (no fp32 master copy)",
                               f"model = model.to({pure})") if bf16 else ())
        if target == "accelerate":
            return Accelerate(script=Code(load={"dtype": pure if bf16 else "torch.float32"}))
        return Elsewhere()

    if target == "trainer":
        return _pure_bf16_elsewhere("a TrainingArguments setting", "plan.to_code()")
    if target == "deepspeed":
        return _pure_bf16_elsewhere("a DeepSpeed setting (its bf16 mode keeps fp32 master weights)", "plan.to_code()")
    return fragment


def quantize_code(plan: PlanLike) -> tuple[str, ...]:
    """The lines that hold the base's linear layers in 4-bit NF4 on the model the code receives, as memlab's
    QLoRA does (:func:`memlab.techniques.adapters.qlora_targets`, transformers' own choice: every ``nn.Linear``
    and GPT-2-style ``Conv1D`` but the output head, the tied and last modules and those the model keeps in fp32;
    and a task model's new head, which LoRA trains whole, kept in full precision),
    replaced by a ``bitsandbytes.nn.Linear4bit`` computing in the plan's dtype.

    Example:
        >>> from memlab.plan import Plan
        >>> quantize_code(Plan(adapter="qlora", precision="bf16"))[-1]
        'quantize_nf4(model, torch.bfloat16)'
    """
    from memlab.techniques.targets import HEAD_NAMES  # torch-free names; the module imports torch lazily

    compute = f"torch.{qlora_compute_dtype(plan)}"
    return (
        "# QLoRA: the base's linear layers (all but the output head) hold their weights in 4-bit NF4. Loading from",
        "# a checkpoint does the same with from_pretrained(name, quantization_config=BitsAndBytesConfig(",
        f"#     load_in_4bit=True, bnb_4bit_quant_type='nf4', bnb_4bit_compute_dtype={compute})); here the model",
        "# you have is quantized in place.",
        "def quantize_nf4(model, compute_dtype):",
        "    # The layers transformers' bitsandbytes load quantizes: nn.Linear and GPT-2's Conv1D, less the output",
        "    # head, the tied and last modules and those the model keeps in fp32 (a 4-bit layer stays as it is).",
        "    from transformers.pytorch_utils import Conv1D",
        "",
        "    layers = [(name, module) for name, module in model.named_modules()",
        "              if name and (type(module) is torch.nn.Linear or isinstance(module, Conv1D))]",
        "    try:",
        "        from transformers.quantizers.base import HfQuantizer",
        "        from transformers.quantizers.quantizers_utils import should_convert_module",
        "",
        '        keep = list(getattr(model, "_keep_in_fp32_modules", None) or ())',
        "        skip = HfQuantizer.get_modules_to_not_convert(model, None, keep)",
        "        # a task model's new head trains whole (modules_to_save below): it stays in full precision, as",
        "        # llm_int8_skip_modules=[*skip, *heads] keeps it when loading",
        "        if model.get_output_embeddings() is None:",
        f"            skip += [name for name in {HEAD_NAMES!r}",
        "                     if isinstance(getattr(model, name, None), torch.nn.Module)]",
        "        layers = [(name, module) for name, module in layers",
        "                  if should_convert_module(name, skip)]",
        "    except (ImportError, AttributeError, TypeError, IndexError):  # not a transformers model",
        '        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else layers[-1][1]',
        "        layers = [(name, module) for name, module in layers if module is not head]",
        "    if not layers and not any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules()):",
        '        raise ValueError("QLoRA holds in 4-bit the layers a bitsandbytes load quantizes (nn.Linear, "',
        '                         "Conv1D), and this model has none besides its head; train it with LoRA instead")',
        "    for name, linear in layers:",
        "        weight = linear.weight.data.detach()",
        "        weight = weight.t() if isinstance(linear, Conv1D) else weight  # Conv1D keeps (in, out)",
        "        layer = bnb.nn.Linear4bit(weight.shape[1], weight.shape[0], bias=False,",
        '                                  compute_dtype=compute_dtype, quant_type="nf4", device="meta")',
        "        layer.weight = bnb.nn.Params4bit(weight.contiguous().cpu(), requires_grad=False,",
        '                                         quant_type="nf4").to(weight.device)  # moving it quantizes it',
        "        layer.bias = linear.bias",
        '        parent, _, child = name.rpartition(".")',
        "        setattr(model.get_submodule(parent) if parent else model, child, layer)",
        "",
        "",
        f"quantize_nf4(model, {compute})",
    )


def _adapter_code(plan: PlanLike) -> Code:
    if plan.adapter == "none":
        return Code()
    quantized = Code(imports=("import bitsandbytes as bnb",), model=quantize_code(plan)) if plan.adapter == "qlora" \
        else Code()
    # peft makes a bf16 model's adapters fp32 (autocast_adapter_dtype); pure bf16 trains them in bf16, as measured
    bf16 = ("model = model.to(torch.bfloat16)  # the adapters in bf16 too",) if plan.weights == "bf16" else ()
    return quantized + Code(imports=("from peft import LoraConfig, get_peft_model",), model=(
        "# LoRA adapters on the plan's layers; only the adapters train",
        f"model = get_peft_model(model, {lora_config_code(plan)})",
        *bf16,
    ))


def _adapter_script(plan: PlanLike) -> Accelerate:
    if plan.adapter == "none":
        return Accelerate()
    script = Code(imports=("from peft import LoraConfig, get_peft_model",), model=(
        f"model = get_peft_model(model, {lora_config_code(plan, task_type='CAUSAL_LM')})",))
    if plan.adapter == "qlora":
        compute = f"torch.{qlora_compute_dtype(plan)}"
        script = Code(
            imports=("from transformers import BitsAndBytesConfig",),
            settings=(
                "# QLoRA: the base's linear weights in 4-bit NF4 (stored as the compute dtype, so FSDP can shard "
                "them)",
                f'quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", '
                f"bnb_4bit_compute_dtype={compute}, bnb_4bit_quant_storage={compute})",
            ),
            load={"quantization_config": "quantization"},
        ) + script
    return Accelerate(script=script)


def _adapter_for_peft(plan: PlanLike) -> Fragment:
    if plan.adapter == "none":  # not a refusal of the plan's other exports: peft has nothing to write
        return Elsewhere(
            f"{plan.label()!r} trains every weight and has no adapters; a peft config needs adapter='lora' or 'qlora'"
        )
    return Lora(lambda model: lora_settings(plan, model))


def _adapter_elsewhere(plan: PlanLike) -> Fragment:
    if plan.adapter == "none":
        return Elsewhere()
    return Elsewhere(
        f"the {plan.adapter} adapters are the model's: wrap it with peft.get_peft_model(model, "
        "plan.to_peft_config()) before DeepSpeed takes it (QLoRA: hold its base in 4-bit NF4 first, as plan.to_code() "
        "does)"
    )


DECLARATIONS = (
    Lever(
        "checkpointing",
        False,
        short="ckpt",
        help="activation checkpointing: keeps fewer activations and recomputes them in backward (about 30% slower); "
             "a number checkpoints that many blocks, spread evenly (less recomputation)",
        technique=CHECKPOINTING,
        blocks=True,
        needs_at_least=blocks_needed,
        slower=((True, False),),
        activation_key=lambda value: "all" if value is True else value or "off",  # True == 1: never one key
        speed={True: (0.75, 0.75)},
        exports=per_target(_checkpointing),
    ),
    Lever(
        "weights",
        "fp32",
        short="{}-weights",
        choices=("fp32", "bf16"),
        help="dtype of the trained weights, their grads and optimizer state: bf16 halves all three (pure bf16, no "
        "fp32 master copy); updates are less exact",
        technique=WEIGHTS,
        family=True,
        activation_key=lambda value: value,
        least_params={"bf16": 0.5},
        least_trained={"bf16": 0.5},
        speed={"bf16": (1.6, 1.0)},
        suggest=("bf16",),
        exports=per_target(_weights),
    ),
    Lever(
        "adapter",
        "none",
        short="{}",
        choices=("none", "lora", "qlora"),
        help="train LoRA adapters (peft) on a frozen base instead of every weight: far fewer grads and optimizer "
        "state; qlora also holds the base's linear weights in 4-bit NF4 (bitsandbytes)",
        technique=ADAPTERS,
        conflicts=_qlora_compute_conflict,
        family=True,
        slower=(("qlora", "lora"),),
        activation_key=lambda value: value,
        least_params={"qlora": 0.125},
        least_trained={"lora": 0.0, "qlora": 0.0},
        speed={"lora": (1.3, 1.2), "qlora": (1.0, 0.8)},
        suggest=("lora", "qlora"),
        exports={
            "trainer": _adapters_for_the_trainer,
            "deepspeed": _adapter_elsewhere,
            "code": _adapter_code,
            "peft": _adapter_for_peft,
            "accelerate": _adapter_script,
        },
    ),
    Lever(
        "lora_rank",
        LORA_RANK_DEFAULT,
        short="r{}",
        help="rank of the LoRA adapters, used with adapter lora or qlora: a higher rank trains more weights",
        technique=ADAPTERS,
        applies=with_adapter,
        from_peft=lambda config: config.r if isinstance(config.r, int) else None,
        family=True,
        # Carried wherever the adapter is (and refused with it): the rank is part of the adapter's LoraConfig.
        exports=in_lora_config("r"),
    ),
    Lever(
        "lora_targets",
        "all-linear",
        short="{}",
        choices=("all-linear", "attention"),
        open_choices=True,
        help="the layers that get LoRA adapters (with adapter lora or qlora): all-linear (every linear layer but the "
        "head), attention (peft's default: q and v projections), or module names joined with +, fused MoE expert "
        "parameters among them (mlp.experts.gate_up_proj: peft's target_parameters); fewer layers, fewer adapter "
        "weights",
        technique=ADAPTERS,
        applies=with_adapter,
        from_peft=_targets_from_peft,
        family=True,
        # Carried wherever the adapter is (and refused with it): LoraConfig(target_modules=...).
        exports=in_lora_config("target_modules"),
    ),
    Lever(
        "lora_alpha",
        None,
        short="alpha{}",
        help="LoRA's alpha, with adapter lora or qlora: the adapters' output is scaled by alpha / rank; auto (None): "
        "twice the rank; no memory of its own",
        none_means="auto: twice the rank",
        technique=ADAPTERS,
        applies=with_adapter,
        from_peft=_alpha_from_peft,
        exports=in_lora_config("lora_alpha"),
    ),
    Lever(
        "lora_dropout",
        0.0,
        short="drop{}",
        help="dropout on the adapters' input, with adapter lora or qlora (peft's lora_dropout; recipes use 0.05): "
        "each adapted layer keeps its dropout mask and output for backward, a little more activation memory",
        technique=ADAPTERS,
        applies=with_adapter,
        conflicts=lambda plan: "" if plan.lora_dropout < 1 else (
            f"lora_dropout={plan.lora_dropout!r} drops every input; write a probability below 1, e.g. 0.05"),
        from_peft=lambda config: float(config.lora_dropout) if isinstance(config.lora_dropout, (int, float)) else None,
        needs_at_least=lambda mine, theirs: mine > 0 or theirs == 0,
        activation_key=lambda value: value > 0,
        exports=in_lora_config("lora_dropout"),
    ),
    Lever(
        "attention",
        None,
        short="attn-{}",
        help="transformers' attention implementation (attn_implementation), switched for the trial: eager keeps "
        "each layer's attention probabilities (rows x heads x tokens^2) for backward, sdpa and flash_attention_2 keep "
        "none; None: as the model was loaded; fit searches the model's own and sdpa where the model runs eager and "
        "sdpa can run, other values when you put them in space=",
        choices=IMPLEMENTATIONS,
        technique=ATTENTION,
        # what attention keeps for backward is activations: a plan with another kernel has its own activation line,
        # never the measured kernel's (fit skipped sdpa as "predicted not to fit" from eager's peak)
        activation_key=lambda value: value,
        exports=per_target(_attention_export),
    ),
)
