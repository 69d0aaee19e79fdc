"""What ``memlab estimate`` says after its table: the next step, as a command to copy.

- When no plan fits: the plans outside what was tried that are estimated to fit, single levers or combinations
  (the search's :func:`memlab.search.suggest.combined_suggestions`), the fastest expected first, each with the
  command that tries it, the command that finds the longest sequences that fit (``--max-tokens``), and the command
  that shards the training over several GPUs (:func:`suggestion_lines`).
- After ``--gpus auto``: which plans and strategies it searched, and the commands for the plans it did not (bf16,
  and adapters, which train on one GPU: :func:`searched_lines`).

A command repeats the user's own (:func:`command_for`): the model, ``--config``, ``--batch``, the budget, ``--gpu``
and ``--device`` as given, with the new ``--try``.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterable, Sequence
from typing import Any

from memlab.frontends.gpu_cli import gpu_flags

__all__ = ["command_for", "plan_try", "searched_lines", "suggestion_lines"]


def plan_try(plan: Any) -> list[str]:
    """The ``--try`` items that make ``plan`` (only its fields that differ from the plain plan's).

    Example:
        >>> from memlab.plan import Plan
        >>> plan_try(Plan(checkpointing=True, adapter="lora"))
        ['checkpointing=on', 'adapter=lora']
        >>> plan_try(Plan())
        []
    """
    from memlab.plan import PLAN_FIELDS, Plan

    default = Plan()
    items = []
    for name in PLAN_FIELDS:
        value = getattr(plan, name)
        if value == getattr(default, name):
            continue
        text = ("on" if value else "off") if isinstance(value, bool) else str(value)
        items.append(f"{name}={text}")
    return items


def command_for(args: argparse.Namespace, tries: Sequence[str], *, gpus: str | None = None,
                options: Sequence[str] | None = None) -> str:
    """The ``memlab estimate`` command the user wrote, with ``tries`` as its ``--try`` and ``gpus`` as ``--gpus``
    (None: none). ``options``: the words that say the step instead of ``--batch`` (a TRL trainer's own options,
    ``--trainer grpo --beta 0 ...``: :func:`memlab.frontends.trainer_cli.trainer_command`).

    Example:
        >>> args = argparse.Namespace(model="llama-7b", config=None, batch="1x512", budget="24GiB", gpu=None,
        ...                           device=None)
        >>> command_for(args, ["adapter=lora"])
        'memlab estimate llama-7b --batch 1x512 --budget 24GiB --try adapter=lora'
        >>> command_for(args, [], gpus="auto")
        'memlab estimate llama-7b --batch 1x512 --budget 24GiB --gpus auto'
        >>> command_for(args, ["checkpointing=on"], options=["--trainer", "grpo", "--beta", "0"])
        'memlab estimate llama-7b --trainer grpo --beta 0 --budget 24GiB --try checkpointing=on'
    """
    words = ["memlab", "estimate", args.model]
    step = [("--batch", args.batch)] if options is None else []
    for option, value in (("--config", args.config), *step):
        if value is not None:
            words += [option, str(value)]
    words += list(options or [])
    if args.budget is not None:
        words += ["--budget", str(args.budget)]
    words += gpu_flags(args)
    if getattr(args, "device", None) is not None:
        words += ["--device", args.device]
    if gpus is not None:
        words += ["--gpus", gpus]
    if tries:
        words += ["--try", *tries]
    return shlex.join(words)


def suggestion_lines(args: argparse.Namespace, suggested: Iterable[Any], *, sharded: bool = True,
                     best_named: bool = False) -> list[str]:
    """The lines after a table where nothing fits: each suggested trial (estimated to fit) with the command that
    tries it, then the command that shards the plans over the fewest GPUs that fit (``sharded``). ``best_named``:
    the answer above named the first suggestion as its best, so it is not named again (its command comes first),
    and each command stands on its own line.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report import Trial
        >>> args = argparse.Namespace(model="llama-7b", config=None, batch="1x512", budget="24GiB", gpu=None,
        ...                           device=None)
        >>> lora = Trial(Plan(adapter="lora"), "ok", 15 * 2**30, {}, None, None, None, "cuda", estimated=True)
        >>> print("\\n".join(suggestion_lines(args, [lora])))  # doctest: +NORMALIZE_WHITESPACE
        Next: estimated to fit, outside what you tried:
          lora (peak 15.00 GiB): memlab estimate llama-7b --batch 1x512 --budget 24GiB --try adapter=lora
        Or the longest sequences that fit with lora:
          memlab estimate llama-7b --batch 1x512 --budget 24GiB --try adapter=lora --max-tokens
        Or shard the training over the fewest GPUs that fit:
          memlab estimate llama-7b --batch 1x512 --budget 24GiB --gpus auto
    """
    from memlab.plan import format_bytes

    lines = []
    suggested = list(suggested)
    if suggested and best_named:  # the answer's "Best:" line named the first: its command, then the others'
        lines += ["Next: try the best:", f"  {command_for(args, plan_try(suggested[0].plan))}"]
        for trial in suggested[1:]:
            figure = "card" if trial.card_bytes is not None else "peak"
            size = format_bytes(trial.card_bytes if trial.card_bytes is not None else trial.peak_bytes)
            lines += [f"Also estimated to fit: {trial.label} ({figure} {size}):",
                      f"  {command_for(args, plan_try(trial.plan))}"]
    elif suggested:
        lines.append("Next: estimated to fit, outside what you tried:")
        for trial in suggested:
            figure = "card" if trial.card_bytes is not None else "peak"
            size = format_bytes(trial.card_bytes if trial.card_bytes is not None else trial.peak_bytes)
            lines.append(f"  {trial.label} ({figure} {size}): {command_for(args, plan_try(trial.plan))}")
    else:
        lines.append("Next: no plan memlab estimated on one GPU (bf16 weights, LoRA, QLoRA, 8-bit Adam, Adafactor, "
                     "checkpointing, micro-batches, the chunked loss, offload, alone or combined) fits.")
    # With the first suggestion, or the user's own plans where none fits: how long the sequences may be (limits).
    tries = plan_try(suggested[0].plan) if suggested else list(getattr(args, "try_", None) or [])
    with_plan = (" with the best" if best_named else " with " + suggested[0].label) if suggested else ""
    if best_named:  # the commands on their own lines: each within a terminal's width
        lines += [f"Or the longest sequences that fit{with_plan}:", f"  {command_for(args, tries)} --max-tokens"]
        if sharded:
            lines += ["Or shard the training over the fewest GPUs that fit:",
                      f"  {command_for(args, [], gpus='auto')}"]
        return lines
    lines.append(f"Or the longest sequences that fit{with_plan}: {command_for(args, tries)} --max-tokens")
    if sharded:
        lines.append(f"Or shard the training over the fewest GPUs that fit: {command_for(args, [], gpus='auto')}")
    return lines


def searched_lines(args: argparse.Namespace, plans: Sequence[Any], strategies: Sequence[str]) -> list[str]:
    """After ``--gpus auto``: the plans and strategies searched, and the commands for the ones it did not search:
    pure bf16 training (where no plan had it) and adapters (LoRA, QLoRA), which are estimated on one GPU.

    Example:
        >>> from memlab.plan import Plan
        >>> args = argparse.Namespace(model="llama-70b", config=None, batch="1x512", budget="80GiB", gpu=None,
        ...                           device=None)
        >>> print("\\n".join(searched_lines(args, [Plan()], ["fsdp2", "zero2", "zero3"])))
        ... # doctest: +NORMALIZE_WHITESPACE
        Searched: plain (fp32 weights, fp32 compute, adamw) with fsdp2, zero2, zero3 on 1, 2, 4, ... 1024 GPUs
        (powers of two; --gpus N estimates another number).
        Not searched: pure bf16 training:
          memlab estimate llama-70b --batch 1x512 --budget 80GiB --gpus auto --try precision=bf16 weights=bf16
        Not searched: adapters, which train on one GPU:
          memlab estimate llama-70b --batch 1x512 --budget 80GiB --try adapter=lora,qlora precision=bf16
    """
    described = ", ".join(
        f"{plan.label()} ({plan.weights} weights, {plan.precision} compute, {plan.optimizer})" for plan in plans
    )
    lines = [f"Searched: {described} with {', '.join(strategies)} on 1, 2, 4, ... 1024 GPUs (powers of two; "
             "--gpus N estimates another number)."]
    if not any(plan.weights == "bf16" for plan in plans):
        lines += ["Not searched: pure bf16 training:",
                  "  " + command_for(args, ["precision=bf16", "weights=bf16"], gpus="auto")]
    lines += ["Not searched: adapters, which train on one GPU:",
              "  " + command_for(args, ["adapter=lora,qlora", "precision=bf16"])]
    return lines
