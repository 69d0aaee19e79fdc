"""The declarations of the levers that change the model itself: checkpointing, pure bf16 weights and LoRA / QLoRA
adapters (techniques: :mod:`memlab.techniques.checkpointing`, :mod:`memlab.techniques.weights`,
:mod:`memlab.techniques.adapters`; facets: :mod:`memlab.techniques.lever`). The LoRA settings every export writes
are here too (:func:`lora_settings`), once.

Example:
    >>> [lever.name for lever in DECLARATIONS]
    ['checkpointing', 'weights', 'adapter', 'lora_rank', 'lora_targets', 'lora_alpha', 'lora_dropout']
"""

from __future__ import annotations

from typing import Any

from memlab.techniques.adapters import ADAPTERS
from memlab.techniques.checkpointing import CHECKPOINTING
from memlab.techniques.lever import TARGETS, Lever, PlanLike, carried, concerns_adapters_only
from memlab.techniques.weights import WEIGHTS

LORA_RANK_DEFAULT = 16
"""The adapters' rank when none is given (and the rank of every plan without an adapter)."""


def lora_settings(plan: PlanLike) -> dict[str, Any]:
    """The ``peft.LoraConfig`` keywords memlab measures an adapter plan with: rank ``plan.lora_rank``, alpha
    ``plan.lora_alpha`` (None: twice the rank), dropout ``plan.lora_dropout`` on the adapters' input, on the plan's
    ``lora_targets``: every linear layer but the output head (``target_modules="all-linear"``), peft's default layers
    for the model's type (``None``: q and v projections for Llama-style models), or the names given (a list).

    Example:
        >>> from memlab.plan import Plan
        >>> lora_settings(Plan(adapter="lora", lora_rank=8))
        {'r': 8, 'lora_alpha': 16, 'lora_dropout': 0.0, 'target_modules': 'all-linear'}
        >>> lora_settings(Plan(adapter="lora", lora_targets=("q_proj", "k_proj"), lora_dropout=0.05))["lora_dropout"]
        0.05
    """
    targets = plan.lora_targets
    modules: Any = targets if targets == "all-linear" else None if targets == "attention" else list(targets)
    alpha = plan.lora_alpha if plan.lora_alpha is not None else 2 * plan.lora_rank
    return {"r": plan.lora_rank, "lora_alpha": alpha, "lora_dropout": plan.lora_dropout, "target_modules": modules}


def _alpha_from_peft(config: Any) -> int | None:
    """A LoraConfig's alpha as the plan holds it: None where it is twice the rank (the plan's own default)."""
    alpha = config.lora_alpha
    if not isinstance(alpha, (int, float)) or alpha == 2 * config.r:
        return None
    return int(alpha) if float(alpha).is_integer() else None


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


def _pure_bf16_elsewhere(target: str, instead: str) -> Any:
    def refusal(plan: PlanLike) -> str:
        if plan.weights != "bf16":
            return ""
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


def _adapters_for_the_trainer(plan: PlanLike) -> str:
    if plan.adapter == "none":
        return ""
    return (
        f"adapter={plan.adapter!r} is not a TrainingArguments setting: wrap the model with "
        "peft.get_peft_model(model, plan.to_peft_config())"
        + (" after loading it in 4-bit NF4 (plan.to_code() shows the BitsAndBytesConfig)" if plan.adapter == "qlora"
           else "")
        + " and export plan.replace(adapter='none').to_training_arguments(), or use plan.to_code()"
    )


DECLARATIONS = (
    Lever(
        "checkpointing",
        False,
        short="ckpt",
        help="activation checkpointing: keeps fewer activations and recomputes them in backward (about 30% slower)",
        technique=CHECKPOINTING,
        needs_at_least=lambda mine, theirs: not mine,
        slower=((True, False),),
        activation_key=lambda value: value,
        speed={True: (0.75, 0.75)},
        exports=dict(dict.fromkeys(TARGETS, carried), peft=concerns_adapters_only),
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
        exports={
            "trainer": _pure_bf16_elsewhere("a TrainingArguments setting", "plan.to_code()"),
            "deepspeed": _pure_bf16_elsewhere(
                "a DeepSpeed setting (its bf16 mode keeps fp32 master weights)", "plan.to_code()"
            ),
            "code": carried,
            "peft": concerns_adapters_only,
            "accelerate": carried,
        },
    ),
    Lever(
        "adapter",
        "none",
        short="{}",
        choices=("none", "lora", "qlora"),
        help="train LoRA adapters (peft) on a frozen base instead of every weight: far fewer grads and optimizer "
        "state; qlora also holds the base's linear weights in 4-bit NF4 (bitsandbytes)",
        technique=ADAPTERS,
        family=True,
        slower=(("qlora", "lora"),),
        activation_key=lambda value: value,
        least_params={"qlora": 0.125},
        least_trained={"lora": 0.0, "qlora": 0.0},
        speed={"lora": (1.3, 1.2), "qlora": (1.0, 0.8)},
        suggest=("lora", "qlora"),
        exports={
            "trainer": _adapters_for_the_trainer,
            "deepspeed": carried,
            "code": carried,
            "peft": carried,
            "accelerate": carried,
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
        exports=dict.fromkeys(TARGETS, carried),
    ),
    Lever(
        "lora_targets",
        "all-linear",
        short="{}",
        choices=("all-linear", "attention"),
        open_choices=True,
        help="the layers that get LoRA adapters (with adapter lora or qlora): all-linear (every linear layer but the "
        "head), attention (peft's default: q and v projections), or module names joined with +; fewer layers, "
        "fewer adapter weights",
        technique=ADAPTERS,
        applies=with_adapter,
        family=True,
        # Carried wherever the adapter is (and refused with it): LoraConfig(target_modules=...).
        exports=dict.fromkeys(TARGETS, carried),
    ),
    Lever(
        "lora_alpha",
        None,
        short="alpha{}",
        help="LoRA's alpha, with adapter lora or qlora: the adapters' output is scaled by alpha / rank; auto (None): "
        "twice the rank; no memory of its own",
        technique=ADAPTERS,
        applies=with_adapter,
        from_peft=_alpha_from_peft,
        # Carried wherever the adapter is (and refused with it): LoraConfig(lora_alpha=...).
        exports=dict.fromkeys(TARGETS, carried),
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
        # Carried wherever the adapter is (and refused with it): LoraConfig(lora_dropout=...).
        exports=dict.fromkeys(TARGETS, carried),
    ),
)
