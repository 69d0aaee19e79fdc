"""The declarations of the levers that change the model itself, in the registry's order: checkpointing, pure bf16
weights, the LoRA / QLoRA adapters' (declared whole in :mod:`memlab.techniques.adapters`, with the LoRA settings every
export writes) and the attention kernel (techniques: :mod:`memlab.techniques.checkpointing`,
:mod:`memlab.techniques.weights`, :mod:`memlab.techniques.attention`; facets: :mod:`memlab.techniques.lever`).

Example:
    >>> [lever.name for lever in DECLARATIONS]
    ['checkpointing', 'weights', 'adapter', 'lora_rank', 'lora_targets', 'lora_alpha', 'lora_dropout', 'attention']
"""

from __future__ import annotations

from memlab.techniques.adapters import ADAPTER_LEVERS
from memlab.techniques.attention import ATTENTION, IMPLEMENTATIONS
from memlab.techniques.checkpointing import CHECKPOINTING
from memlab.techniques.fragments import (
    Accelerate,
    Code,
    Elsewhere,
    Export,
    Fragment,
    Keys,
    per_target,
)
from memlab.techniques.lever import Lever, PlanLike
from memlab.techniques.weights import WEIGHTS


def _pure_bf16_elsewhere(target: str, instead: str) -> Export:
    def refusal(plan: PlanLike) -> Fragment:
        if plan.weights != "bf16":
            return Keys()
        return (
            f"weights='bf16' (pure bf16, no fp32 master copy) is not {target}: load the model in bf16 "
            f"(from_pretrained(name, dtype=torch.bfloat16)) and export plan.replace(weights='fp32'), or use {instead}"
        )

    return refusal


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
    *ADAPTER_LEVERS,
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
