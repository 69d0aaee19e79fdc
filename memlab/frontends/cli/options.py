"""The trainer question's options (``memlab estimate MODEL --trainer WORD``): those every kind takes, declared here,
and those each kind's CLI facet adds (:class:`~memlab.live.trainer_kinds.TrainerCli`), in one order, the help's and a
repeated command's (:func:`option_order`), and the ``--trainer`` words that take each (:func:`option_kinds`). The
kinds are asked each time (:func:`~memlab.live.trainer_kinds.kinds`), so a kind listed in :data:`memlab.kinds.KINDS`
adds its options with nothing written here.

Example:
    >>> option_order()[:4]
    ['num_generations', 'max_completion_length', 'max_length', 'prompt_length']
    >>> option_kinds()["beta"]
    ('dpo', 'grpo')
"""

from __future__ import annotations

from memlab.live.trainer_kinds import CliOption, TrainerKind, kinds

__all__ = ["COMMON_OPTIONS", "cli_kinds", "option_kinds", "option_order", "trainer_options"]

COMMON_OPTIONS = (
    CliOption("prompt_length", "tokens in each prompt (default: 64 for GRPO, half of --max-length for DPO; SFT: prompt "
              "and completion examples, default none: plain text)", metavar="TOKENS", example="64"),
    CliOption("per_device_train_batch_size", "rows per device and micro-batch (TRL's default: 8)", metavar="ROWS",
              example="8"),
    CliOption("gradient_accumulation_steps", "micro-batches per optimizer step (default: 1)", metavar="STEPS",
              example="4"),
    CliOption("lora", "LoRA adapters of rank R on all linear layers (peft.LoraConfig(r=R, lora_alpha=2R, "
              "target_modules='all-linear')); without it every weight trains; with --load-in-4bit, QLoRA", metavar="R",
              example="16"),
    CliOption("gradient_checkpointing", "activation checkpointing (TRL's default: on)", value="on_off"),
    CliOption("optim", "the optimizer as transformers names it: adamw_torch_fused (the default), adamw_torch, "
              "adamw_8bit, paged_adamw_8bit, adafactor", metavar="NAME", value="text"),
    CliOption("activation_offloading", "the step's saved activations held in CPU memory (TRL's "
              "activation_offloading=True, transformers' gradient_checkpointing_kwargs={'offload': True})",
              value="flag"),
    CliOption("use_liger_kernel", "Liger's kernels: its fused losses and model patches (needs liger-kernel installed)",
              value="flag"),
    CliOption("bf16", "autocast in bf16 (TRL's default: on, unless --fp16 on)", value="on_off"),
    CliOption("fp16", "autocast in fp16, loss-scaled (default: off)", value="on_off"),
)
"""The options every kind takes, in the help's order."""


def cli_kinds() -> list[TrainerKind]:
    """The kinds ``--trainer`` asks (those with a CLI facet), in :func:`~memlab.live.trainer_kinds.kinds`' order.

    Example:
        >>> [kind.cli.word for kind in cli_kinds()]
        ['sft', 'dpo', 'grpo']
    """
    return [kind for kind in kinds() if kind.cli is not None]


def trainer_options() -> dict[str, CliOption]:
    """Every trainer option by name, in :func:`option_order`."""
    declared = {option.name: option for option in COMMON_OPTIONS}
    for kind in cli_kinds():
        assert kind.cli is not None
        declared.update((option.name, option) for option in kind.cli.options)
    return {name: declared[name] for name in option_order()}


def option_order() -> list[str]:
    """The trainer options in the help's order: before each option every kind takes, the kinds' own options listed
    before it (the kind listed last first, each kind's in its order), and after them those listed before none."""
    own: list[CliOption] = []
    for kind in reversed(cli_kinds()):
        assert kind.cli is not None
        own += [option for option in kind.cli.options if option.name not in {o.name for o in own}]
    order: list[str] = []
    for common in (*(option.name for option in COMMON_OPTIONS), None):
        order += [option.name for option in own if option.before == common and option.name not in order]
        if common is not None:
            order.append(common)
    return order


def option_kinds() -> dict[str, tuple[str, ...]]:
    """Each trainer option (as the parsed arguments name it) and the ``--trainer`` words that take it."""
    words = tuple(kind.cli.word for kind in cli_kinds() if kind.cli is not None)
    taken = {option.name: words for option in COMMON_OPTIONS}
    for kind in cli_kinds():
        assert kind.cli is not None
        for option in kind.cli.options:
            taken[option.name] = (*taken.get(option.name, ()), kind.cli.word)
    return {name: taken[name] for name in option_order()}
