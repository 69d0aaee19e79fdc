"""What ``memlab estimate`` says after its table: the next step, as a command to copy.

- When no plan fits: the plans outside what was tried that are estimated to fit, single levers or combinations
  (the search's :func:`memlab.search.suggest.combined_suggestions`), the fastest expected first, each with the
  command that tries it, the command that finds the longest sequences that fit (``--max-tokens``), and the command
  that shards the training over several GPUs (:func:`suggestion_lines`).
- After ``--gpus auto``: which plans and strategies it searched, and the commands for the plans it did not (bf16,
  and adapters, which train on one GPU: :func:`searched_lines`).

A command repeats the user's own (:func:`command_for`): the model, ``--config``, ``--batch``, the budget, ``--gpu``
and ``--device`` as given, with the new ``--try``. For a TRL trainer's step (``--trainer grpo|dpo``), the trainer's
own options stand for ``--batch`` (:func:`trainer_command`), and what no plan fits is answered by
:func:`trainer_suggestions`: lever combinations on the trainer's plan, then (GRPO) the GRPOConfig changes.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from memlab.frontends.cli.gpu import gpu_flags
from memlab.frontends.cli.options import cli_kinds, option_order, trainer_options
from memlab.live.trainer_kinds import CliChanges, cli_kind

__all__ = ["command_for", "largest_split", "plan_try", "searched_lines", "suggestion_lines", "trainer_command",
           "trainer_next_lines", "trainer_plan_options", "trainer_suggestions"]


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
    ``--trainer grpo --beta 0 ...``: :func:`trainer_command`).

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


# --- a TRL trainer's step (memlab estimate --trainer): the user's command with the trainer's own options -------

_ADAPTERS = ("adapter", "lora_rank", "lora_targets", "lora_alpha", "lora_dropout")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def trainer_suggestions(args: argparse.Namespace, trainer: Any, own: Any, report: Any, say: Any, *,
                        words: Callable[[str], str] = str) -> list[tuple[Any, str, str | None]]:
    """Where no plan of ``report`` fits, what does, as the plain command answers it: first the trainer's own batch
    split (the most rows per device that fit, the effective batch kept: ``--per-device-train-batch-size`` and
    ``--gradient-accumulation-steps``, the rest as set up: :func:`largest_split`); where no split fits, the lever
    combinations on the trainer's plan ``own`` estimated to fit (the training the same:
    :func:`memlab.search.suggest.combined_suggestions`, each ``memlab.estimate(trainer, plan, ...)``; those the command
    cannot say, :func:`trainer_plan_options`, passed over); and where none does, the config changes its kind's CLI
    facet estimates (GRPO's: :func:`memlab.kinds.grpo.suggest.grpo_suggestions`, which change the training).
    ``(trial, command, what it changes or None)`` each, every command estimated to fit. ``words``: a message's
    config fields as the command's options.

    Example (``tests/frontends/cli/test_trainer_cli.py`` asks a budget nothing fits)::

        for trial, command, changes in trainer_suggestions(args, trainer, memlab.Plan.from_trainer(trainer),
                                                           report, say):
            print(trial.label, command, changes)
    """
    import re

    import memlab
    from memlab.estimation.cuda.gpus import kind_or_default
    from memlab.frontends.cli.gpu import cli_gpu
    from memlab.search.speed import speed_prior
    from memlab.search.suggest import combinations, combined_suggestions

    ran = [trial for trial in report.trials if trial.status == "ok"]
    if not ran:
        return []
    lowest = min(ran, key=lambda trial: trial.verdict_bytes)
    budget = report.budget

    def estimate_one(plan: Any) -> Any:
        return memlab.estimate(trainer, plan, gpu=cli_gpu(args), device=args.device, budget=budget)

    split = largest_split(lowest, estimate_one, budget, say)
    if split is not None:
        changes, tried = trainer_plan_options(split.plan, own) or ({}, [])
        return [(split, trainer_command(args, changes, tried), None)]
    rows = int(own.micro_batch or 1) * int(own.accumulation)
    prior = speed_prior("cpu" if args.device == "cpu" else "cuda")
    half = "fp16" if args.device != "cpu" and not kind_or_default(cli_gpu(args)).bf16 else "bf16"
    # The combinations the command cannot say (another dtype of the built model, QLoRA, adapters off...) are not
    # estimated; they take no place among the few tried.
    ordered = combinations(lowest, budget=budget, rows=rows, prior=prior, half=half)
    unsaid = {plan for plan in ordered if trainer_plan_options(plan, own) is None}
    tries, said_ones = 4, 0  # dry runs of a large model take seconds each: the few most promising
    for plan in ordered:
        if said_ones >= 4:
            break
        if plan in unsaid:
            tries += 1  # passed over, not estimated
        else:
            said_ones += 1
    say.expect(4)
    unsaid_labels = {plan.label() for plan in unsaid}

    counted = iter(range(1, tries + 1))

    def quiet(text: str) -> None:  # the combinations passed over unsaid, the others numbered among the 4
        if text.rsplit(": ", 1)[-1] not in unsaid_labels:
            say(re.sub(r"\d+ of at most \d+", f"{next(counted)} of at most 4", text, count=1))

    def estimate(plans: list[Any]) -> list[Any]:
        return [estimate_one(plan) for plan in plans if plan not in unsaid]

    found = combined_suggestions(lowest, estimate, budget=budget, rows=rows, prior=prior, want=2, tries=tries,
                                 say=quiet, half=half)
    suggested: list[tuple[Any, str, str | None]] = []
    for trial in found:
        changes, tried = trainer_plan_options(trial.plan, own) or ({}, [])
        suggested.append((trial, trainer_command(args, changes, tried), None))
    facet = cli_kind(args.trainer).cli
    if suggested or facet is None or facet.changes is None:
        return suggested
    return _config_changes(args, facet.changes, trainer, own, lowest, budget, say, words)


def largest_split(base: Any, estimate: Callable[[Any], Any], budget: int, say: Any) -> Any | None:
    """The estimate of ``base``'s plan with the most rows per micro-batch that fits ``budget`` (with the search's
    margin), the rows per optimizer step kept (``micro_batch`` x ``accumulation``, each a whole divisor) and every
    other lever as it is; None where not even one row per micro-batch fits. ``base`` is the trial of the plan as it
    is: the size tried first is the largest its activations per row predict to fit, then the next smaller ones, so a
    split that fits costs one dry run where the prediction holds (a large model's dry run takes seconds).

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report import Trial
        >>> def estimate(plan):  # a stand-in: 3 units a row, 2 of weights
        ...     size = plan.micro_batch
        ...     return Trial(plan, "ok", 2 + 3 * size, {"params": 2, "activations": 3 * size}, None, None, None,
        ...                  "cuda", estimated=True)
        >>> tried = []
        >>> base = estimate(Plan(micro_batch=8))
        >>> largest_split(base, estimate, 16, tried.append).plan.label(), len(tried)
        ('mb4x2', 1)
        >>> largest_split(base, lambda plan: estimate(plan.replace(micro_batch=9)), 16, tried.append) is None
        True
    """
    from memlab.search.memory import FIT_MARGIN

    plan = base.plan
    rows = int(plan.micro_batch or 1) * int(plan.accumulation)
    sizes = [size for size in range(1, int(plan.micro_batch or rows)) if rows % size == 0]
    if not sizes:
        return None
    # What grows with the rows: the verdict's figure less the weights, gradients, optimizer state and CUDA context
    # (the allocator's reserve grows with the activations, so it is counted with them).
    fixed = sum(base.breakdown.get(name, 0) for name in ("params", "grads", "optimizer")) + (base.context_bytes or 0)
    per_row = max(base.verdict_bytes - fixed, 0) / max(int(plan.micro_batch or rows), 1)
    predicted = [size for size in sizes if (fixed + per_row * size) * FIT_MARGIN <= budget] or sizes[:1]
    for size in reversed(sizes[:len([s for s in sizes if s <= predicted[-1]])]):
        split = plan.replace(micro_batch=size, accumulation=rows // size)
        say(f"estimating the batch split {size} x {rows // size} (rows per device x accumulation steps)")
        trial = estimate(split)
        if trial.status == "ok" and trial.verdict_bytes * FIT_MARGIN <= budget:
            return trial
    return None


def _config_changes(args: argparse.Namespace, changes: CliChanges, trainer: Any, own: Any, lowest: Any, budget: int,
                    say: Any, words: Callable[[str], str]) -> list[tuple[Any, str, str | None]]:
    """The config changes of the trainer's kind (its CLI facet's ``changes``: GRPO's,
    :func:`memlab.kinds.grpo.suggest.grpo_suggestions`) estimated to fit with ``lowest``'s plan, each with its command
    and what it changes in the training."""
    from memlab.frontends.cli.gpu import cli_gpu

    found = changes(trainer, lowest.plan, budget, {"device": args.device, "gpu": cli_gpu(args)}, say)
    base, tried = trainer_plan_options(lowest.plan, own) or ({}, [])
    return [(trial, trainer_command(args, {**base, **changed}, tried), f"{option}: {words(what)}")
            for trial, changed, option, what in found]


def trainer_next_lines(args: argparse.Namespace, suggested: list[tuple[Any, str, str | None]], *,
                       levers_tried: bool = True) -> list[str]:
    """The lines after the answer where nothing asked fits: each of :func:`trainer_suggestions` with its command;
    where no lever combination fits (``levers_tried``: some were estimated), the changes to the training that do
    (a GRPOConfig change, a 4-bit base), each with what it changes; or that nothing was found.

    Example:
        >>> args = argparse.Namespace(trainer="dpo")
        >>> trainer_next_lines(args, [])[0][:48]
        'Next: no combination of levers memlab estimated '
    """
    from memlab.report.views.tables import judged_text

    levers = [(trial, command) for trial, command, changes in suggested if changes is None]
    changes = [(trial, command, what) for trial, command, what in suggested if what is not None]
    lines: list[str] = []
    if levers:
        lines.append("Next: estimated to fit, the training the same (levers outside what you tried):")
        for trial, command in levers:
            lines += [f"  {trial.label} ({judged_text(trial)}):", f"    {command}"]
        return lines
    if not changes:
        facet = cli_kind(args.trainer).cli
        if facet is not None and facet.none_fit:
            return [facet.none_fit]
        return ["Next: no combination of levers memlab estimated (8-bit Adam, Adafactor, checkpointing, micro-batches, "
                "the chunked loss, offload...) fits, nor a 4-bit base; a shorter --max-length or a smaller --lora rank "
                "changes the training."]
    first = "Next: no combination of levers memlab estimated fits; " if levers_tried else "Next: "
    lines.append(f"{first}these changes do, each changing the training:")
    for trial, command, what in changes:
        lines += [f"  {what} ({judged_text(trial)}):", f"    {command}"]
    return lines


_LOAD_ORDER = ("load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_compute_dtype",
               "bnb_4bit_use_double_quant", "bnb_4bit_quant_storage", "llm_int8_skip_modules")
"""The load options, as a command repeats them after the trainer's."""


def trainer_command(args: argparse.Namespace, changes: dict[str, Any] | None = None,
                    tries: Any = ()) -> str:
    """The user's trainer command (the model, ``--trainer`` and each trainer option given, ``--dtype``, the budget,
    ``--gpu`` and ``--device``) with ``changes`` (``{option as args names it: value}``; None leaves the option
    out, True is a bare flag) and ``tries`` as its ``--try`` (:func:`memlab.frontends.cli.estimate.next.command_for`).

    Example:
        >>> parser = argparse.ArgumentParser(prog="memlab estimate")
        >>> from memlab.frontends.cli.estimate.command import add_arguments
        >>> add_arguments(parser)
        >>> args = parser.parse_args(["llama-7b", "--trainer", "grpo", "--beta", "0.04", "--lora", "16",
        ...                           "--gpu", "L4-24GB"])
        >>> trainer_command(args, {"beta": 0.0, "gradient_checkpointing": "on"}, ["optimizer=adamw8bit"])
        'memlab estimate llama-7b --trainer grpo --beta 0 --lora 16 --gradient-checkpointing on --gpu L4-24GB \
--try optimizer=adamw8bit'
    """
    changes = changes or {}
    words: list[str] = []
    for name in ("trainer", *option_order(), *_LOAD_ORDER):  # the trainer's options as the help lists them
        value = changes[name] if name in changes else getattr(args, name, None)
        if value is None or value is False:
            continue
        words += [_flag(name)] if value is True else [_flag(name), f"{value:g}" if isinstance(value, float)
                                                      else str(value)]
    if getattr(args, "dtype", None) is not None:
        words += ["--dtype", args.dtype]
    return command_for(args, list(tries), options=words)


_SAID_BY_OPTIONS = ("micro_batch", "accumulation", "checkpointing", "weights", *_ADAPTERS)


def _said_by_options() -> dict[str, str]:
    """The levers a kind's own options say (its CLI facet's ``said_by``), every kind's."""
    return {lever: option for kind in cli_kinds() if kind.cli is not None for lever, option in kind.cli.said_by.items()}


def trainer_plan_options(plan: Any, own: Any) -> tuple[dict[str, Any], list[str]] | None:
    """What makes ``plan`` from the trainer's own plan ``own`` in the command: the trainer's options changed
    (``{option: value}``: the batch split, checkpointing, ``--lora`` where adapters are added, the vLLM engine's
    share), and the ``--try`` items for the other levers; None where the command cannot say it (another dtype of
    the built model, QLoRA, adapters changed or taken off).

    Example:
        >>> from memlab.plan import Plan
        >>> own = Plan(micro_batch=4, accumulation=2, checkpointing=True)
        >>> trainer_plan_options(Plan(micro_batch=2, accumulation=4, optimizer="adamw8bit"), own)
        ({'per_device_train_batch_size': 2, 'gradient_accumulation_steps': 4, 'gradient_checkpointing': 'off'}, \
['optimizer=adamw8bit'])
        >>> trainer_plan_options(own.replace(adapter="qlora"), own) is None
        True
    """
    from memlab.plan import PLAN_FIELDS

    changes: dict[str, Any] = {}
    tries: list[str] = []
    rows = int(own.micro_batch or 1) * int(own.accumulation)
    size = plan.micro_batch if plan.micro_batch is not None else rows // max(int(plan.accumulation), 1)
    if (size, plan.accumulation) != (own.micro_batch, own.accumulation):
        changes.update(per_device_train_batch_size=size, gradient_accumulation_steps=plan.accumulation)
    if plan.checkpointing != own.checkpointing:
        if isinstance(plan.checkpointing, bool):
            changes["gradient_checkpointing"] = "on" if plan.checkpointing else "off"
        else:
            tries.append(f"checkpointing={plan.checkpointing}")
    if plan.weights != own.weights:
        return None
    adapters = tuple(getattr(plan, name) for name in _ADAPTERS)
    if adapters != tuple(getattr(own, name) for name in _ADAPTERS):
        if (own.adapter, plan.adapter) != ("none", "lora") or plan.lora_targets != "all-linear" \
                or plan.lora_alpha not in (None, 2 * plan.lora_rank) or plan.lora_dropout != own.lora_dropout:
            return None
        changes["lora"] = plan.lora_rank
    said = _said_by_options()
    flags = {name for name, option in trainer_options().items() if option.value == "flag"}
    for lever, option in said.items():  # a lever a kind's own option says (GRPO's vLLM engine)
        value = getattr(plan, lever)
        if value != getattr(own, lever):
            if option in flags:
                changes[option] = True if value else None
            elif value is None:
                return None
            else:
                changes[option] = value
    for name in PLAN_FIELDS:
        value = getattr(plan, name)
        if name in _SAID_BY_OPTIONS or name in said or value == getattr(own, name):
            continue
        if not isinstance(value, (bool, int, float, str)):
            return None
        tries.append(f"{name}={('on' if value else 'off') if isinstance(value, bool) else value}")
    return changes, tries
