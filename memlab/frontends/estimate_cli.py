"""``memlab estimate``: predict, without the hardware, which plans fit a memory budget (a dry run on fake tensors).

Example (nothing is downloaded with a built-in shape or a local config)::

    memlab estimate meta-llama/Llama-2-7b-hf --config llama-7b --batch 1x512 --budget 24GiB \\
        --try precision=bf16 checkpointing=off,on optimizer=adamw,adamw8bit

prints one line per plan (the predicted allocated peak, what the card will show: the allocator's reserve and the
CUDA context of the GPU ``--gpu`` names, where it goes, fits or does not fit, judged on the card figure where it is
known) and exits with 0 when a plan fits (or no budget was given), 1 when none fits, 2 on wrong input. A dry run
of a large model takes minutes, so each step (the config, each plan, each number of GPUs and strategy tried) is
said on stderr as it starts, with the time so far (:func:`progress_lines`); stdout holds only the table (or the
JSON).

``memlab.frontends.cli`` builds the sub-command with :func:`add_arguments` and runs it with :func:`run`; this module
imports
neither torch nor transformers until :func:`run` is called.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["add_arguments", "estimate_each", "load_from_args", "progress_lines", "run", "run_sharded"]

_DESCRIPTION = (
    "Predict the peak memory of one training step for each plan, on fake tensors: nothing is downloaded but the "
    "config, nothing is computed, no memory is taken. MODEL is a Hub name, a path to a config.json (or its folder), "
    "or a built-in shape: {shapes}."
)
_EPILOG = (
    "Exit status: 0 when a plan fits the budget (or no budget was given), 1 when none fits, 2 on wrong input. "
    "On CUDA a plan fits when what the card will show (the allocator's reserve and the CUDA context of --gpu, both "
    "modelled) is within the budget; where that card figure is unknown, its allocated peak, which leaves out "
    "allocator rounding and fragmentation and the CUDA context: keep a margin. Workspaces kernels take inside "
    "themselves (other than cuBLAS's) are never included."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``memlab estimate``'s arguments on ``parser`` (a sub-command parser of ``memlab``).

    Example:
        >>> parser = argparse.ArgumentParser(prog="memlab estimate")
        >>> add_arguments(parser)
        >>> args = parser.parse_args(["llama-7b", "--batch", "1x512", "--try", "checkpointing=off,on"])
        >>> args.model, args.batch, args.try_
        ('llama-7b', '1x512', ['checkpointing=off,on'])
    """
    from memlab.estimation.estimate import KNOWN_SHAPES
    from memlab.estimation.gpus import DEFAULT_GPU, GPUS

    parser.description = _DESCRIPTION.format(shapes=", ".join(KNOWN_SHAPES))
    parser.epilog = _EPILOG
    parser.add_argument("model", metavar="MODEL", help="a Hub model name, a path to a config.json, or a built-in shape")
    parser.add_argument(
        "--config",
        metavar="PATH_OR_NAME",
        default=None,
        help="where the config comes from, when not from MODEL (a config.json, its folder, a shape or a Hub name)",
    )
    parser.add_argument(
        "--batch", metavar="ROWSxTOKENS", default="1x512", help="rows and tokens per batch (default: 1x512)"
    )
    parser.add_argument("--budget", metavar="SIZE", default=None, help="memory budget such as 24GiB or 16GB")
    parser.add_argument(
        "--try",
        dest="try_",
        metavar="KEY=V1,V2",
        nargs="+",
        action="extend",
        default=None,
        help="plan settings to combine, e.g. precision=fp32,bf16 checkpointing=off,on micro_batch=1,2 "
        "accumulation=4 optimizer=adamw,adamw8bit (default: the plain plan)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="the device to predict for (default: cuda, even on a machine without a GPU)",
    )
    parser.add_argument(
        "--gpu",
        choices=tuple(GPUS),
        default=None,
        help=f"the kind of GPU a CUDA estimate is for: its attention kernels and the CUDA context on the card "
        f"(default: {DEFAULT_GPU})",
    )
    parser.add_argument(
        "--gpus",
        metavar="N|auto",
        default=None,
        help="GPUs the training is sharded over: the peak is then per GPU, for --batch per GPU; 'auto' (with "
        "--budget) finds the smallest power of two that fits, for each strategy (default: 1)",
    )
    parser.add_argument(
        "--strategy",
        choices=("none", "fsdp2", "zero2", "zero3"),
        default=None,
        help="how training is sharded: FSDP2 (accelerate), DeepSpeed ZeRO-2 or ZeRO-3 (default with --gpus: all three)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    _add_load_arguments(parser)


_LOAD_EXAMPLE = (
    "how you load the model, as you pass it to from_pretrained (default: what the plan implies: weights=bf16 loads "
    "in bf16, adapter=qlora in 4-bit NF4 with bf16 compute, else fp32); e.g. --torch-dtype bfloat16 --load-in-4bit "
    "--bnb-4bit-quant-type nf4 --bnb-4bit-compute-dtype bfloat16 --bnb-4bit-use-double-quant is "
    "from_pretrained(name, torch_dtype=torch.bfloat16, quantization_config=BitsAndBytesConfig(load_in_4bit=True, "
    "bnb_4bit_quant_type='nf4', bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_use_double_quant=True))"
)
_DTYPE_NAMES = ("bfloat16", "float16", "float32", "bf16", "fp16", "fp32", "auto")


def _add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The load flags: one per ``from_pretrained`` / ``BitsAndBytesConfig`` keyword (:func:`load_from_args`)."""
    group = parser.add_argument_group("load", _LOAD_EXAMPLE)
    group.add_argument("--torch-dtype", choices=_DTYPE_NAMES, default=None,
                       help="from_pretrained(torch_dtype=...): the dtype of the weights not quantized")
    group.add_argument("--load-in-4bit", action="store_true", help="BitsAndBytesConfig(load_in_4bit=True)")
    group.add_argument("--load-in-8bit", action="store_true", help="BitsAndBytesConfig(load_in_8bit=True)")
    group.add_argument("--bnb-4bit-quant-type", choices=("nf4", "fp4"), default=None,
                       help="BitsAndBytesConfig(bnb_4bit_quant_type=...) (bitsandbytes' default: fp4)")
    group.add_argument("--bnb-4bit-compute-dtype", choices=_DTYPE_NAMES[:-1], default=None,
                       help="BitsAndBytesConfig(bnb_4bit_compute_dtype=...) (bitsandbytes' default: float32)")
    group.add_argument("--bnb-4bit-use-double-quant", action="store_true",
                       help="BitsAndBytesConfig(bnb_4bit_use_double_quant=True)")
    group.add_argument("--llm-int8-skip-modules", metavar="NAME+NAME", default=None,
                       help="BitsAndBytesConfig(llm_int8_skip_modules=[...]): modules kept unquantized, e.g. lm_head")


def load_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``load=`` of :func:`memlab.estimate` that the load flags say; None where none is given. A 4-bit setting
    without ``--load-in-4bit`` is a MemlabError saying what to add.

    Example:
        >>> parser = argparse.ArgumentParser(prog="memlab estimate")
        >>> add_arguments(parser)
        >>> load_from_args(parser.parse_args(["llama-7b", "--torch-dtype", "bf16", "--load-in-4bit",
        ...                                   "--bnb-4bit-quant-type", "nf4"]))
        {'torch_dtype': 'bf16', 'quantization_config': {'load_in_4bit': True, 'bnb_4bit_quant_type': 'nf4'}}
    """
    from memlab.errors import MemlabError

    config: dict[str, Any] = {}
    if getattr(args, "load_in_4bit", False):
        config["load_in_4bit"] = True
    if getattr(args, "load_in_8bit", False):
        config["load_in_8bit"] = True
    four_bit = {"bnb_4bit_quant_type": getattr(args, "bnb_4bit_quant_type", None),
                "bnb_4bit_compute_dtype": getattr(args, "bnb_4bit_compute_dtype", None),
                "bnb_4bit_use_double_quant": getattr(args, "bnb_4bit_use_double_quant", False) or None}
    for key, value in four_bit.items():
        if value is not None:
            if not config.get("load_in_4bit"):
                raise MemlabError(f"--{key.replace('_', '-')} sets a 4-bit load; add --load-in-4bit")
            config[key] = value
    skip = getattr(args, "llm_int8_skip_modules", None)
    if skip:
        if not config:
            raise MemlabError("--llm-int8-skip-modules keeps modules out of a quantized load; add --load-in-4bit or "
                              "--load-in-8bit")
        config["llm_int8_skip_modules"] = [name for name in skip.split("+") if name]
    load: dict[str, Any] = {}
    if getattr(args, "torch_dtype", None) is not None:
        load["torch_dtype"] = args.torch_dtype
    if config:
        load["quantization_config"] = config
    return load or None


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``memlab estimate`` with parsed ``args``; returns the exit status (0 fits, 1 none fits, 2 wrong input).

    Example:
        >>> parser = argparse.ArgumentParser(prog="memlab estimate")
        >>> add_arguments(parser)
        >>> run(parser.parse_args(["llama-7b", "--batch", "1 by 512"]), err=sys.stdout)
        memlab estimate: batch '1 by 512' is not ROWSxTOKENS; write for example --batch 1x512
        2
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    from memlab.errors import MemlabError

    try:
        return _run(args, out, err)
    except MemlabError as error:
        print(f"memlab estimate: {error}", file=err)
        return 2


def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import dataclasses

    from memlab.errors import MemlabError
    from memlab.estimation.cuda_context import card_contexts
    from memlab.estimation.estimate import load_config, meta_model, parse_batch_shape
    from memlab.plan import parse_budget, parse_grid

    batch = parse_batch_shape(args.batch)
    budget = parse_budget(args.budget)
    plans = parse_grid(args.try_ or [])
    gpus = getattr(args, "gpus", None)
    strategy = getattr(args, "strategy", None)
    if gpus is None and strategy not in (None, "none"):
        raise MemlabError(f"--strategy {strategy} needs a number of GPUs; add --gpus N, e.g. --gpus 8, or --gpus auto "
                          "with --budget")
    gpus = "1" if gpus is None else gpus
    load = load_from_args(args)
    if load is not None and (gpus != "1" or strategy not in (None, "none")):
        raise MemlabError("the load flags are estimated on one GPU; drop --gpus/--strategy, or the load flags (the "
                          "plan's weights= sets the dtype of sharded weights)")
    if gpus == "auto" and budget is None:
        raise MemlabError("--gpus auto needs a budget; write for example --gpus auto --budget 80GiB")
    from memlab.estimation.sharded import parse_gpus

    try:
        parse_gpus(gpus)
    except MemlabError:
        raise MemlabError(f"--gpus {args.gpus!r} is not a number of GPUs; write for example --gpus 8, or --gpus auto "
                          "with --budget") from None
    source = args.config or args.model
    say = progress_lines(err)
    say(f"reading the config of {source}")
    config = load_config(source)
    say("building the model on the meta device (shapes only, no memory)")
    model = meta_model(config)
    parameters = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    if gpus != "1" or strategy not in (None, "none"):
        args.gpus = gpus
        return run_sharded(args, model, batch, plans, budget, out, say=say)
    report = estimate_each(model, batch, plans, budget=budget, device=args.device, say=say,
                           gpu=getattr(args, "gpu", None), load=load)
    report = dataclasses.replace(report, trials=card_contexts(report.trials, getattr(args, "gpu", None)))
    if args.json:
        print(report.to_json(), file=out)
    else:
        rows, tokens = batch["input_ids"]
        print(
            f"{args.model}: {type(model).__name__}, {_count(parameters)} parameters, batch {rows}x{tokens}, "
            f"{len(plans)} plan{'s' if len(plans) != 1 else ''}{_for_gpu(args)}",
            file=out,
        )
        print(report.to_text(), file=out)
    if budget is None:
        return 0
    return 0 if any(report.fits(trial) for trial in report) else 1


def _for_gpu(args: argparse.Namespace) -> str:
    """``, for an H100-80GB`` where the estimate is for CUDA (the GPU kind whose CUDA context it models)."""
    from memlab.estimation.gpus import gpu_kind

    return "" if args.device == "cpu" else f", for an {gpu_kind(getattr(args, 'gpu', None)).name}"


def _count(number: int) -> str:
    for size, unit in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if number >= size:
            return f"{number / size:.2f}{unit}"
    return str(number)


def run_sharded(
    args: argparse.Namespace, model: Any, batch: Any, plans: Any, budget: int | None, out: TextIO,
    say: Callable[[str], None] | None = None,
) -> int:
    """``memlab estimate --gpus N|auto [--strategy S]``: one line per plan and strategy, the peak per GPU (``say``
    is told each dry run as it starts: :func:`progress_lines`).

    Example:
        >>> parser = argparse.ArgumentParser(prog="memlab estimate")
        >>> add_arguments(parser)
        >>> run(parser.parse_args(["llama-7b", "--gpus", "auto"]), err=sys.stdout)
        memlab estimate: --gpus auto needs a budget; write for example --gpus auto --budget 80GiB
        2
    """
    from memlab.estimation.sharded import sharded_lines, sharded_trials

    strategies = [args.strategy] if args.strategy not in (None, "none") else None
    trials = sharded_trials(model, batch, plans, gpus=args.gpus, strategies=strategies, budget=budget,
                            device=args.device, gpu=getattr(args, "gpu", None), say=say)
    if args.json:
        import json

        rows = [{"strategy": name, **(trial.to_dict() if trial is not None else {"plan": plan.label()}),
                 **({"gpus": trial.gpus, "model_state_bytes": trial.model_state_bytes, "detail": trial.detail}
                    if trial is not None else {"gpus": None})} for plan, name, trial in trials]
        print(json.dumps(rows, indent=2, default=str), file=out)
    else:
        print(f"{args.model}: {type(model).__name__}, per-GPU batch {batch['input_ids'][0]}x{batch['input_ids'][1]}"
              f"{_for_gpu(args)}", file=out)
        for line in sharded_lines(trials, budget):
            print(line, file=out)
    fits = [trial for _, _, trial in trials if trial is not None and trial.fits]
    return 0 if budget is None or fits else 1


# --- progress on stderr -----------------------------------------------------------------------------------------


def progress_lines(err: TextIO, clock: Callable[[], float] = time.perf_counter) -> Callable[[str], None]:
    """A ``say(text)`` that prints ``memlab estimate: text ... (N s so far)`` on ``err`` as each step starts.

    Example:
        >>> seconds = iter([0.0, 0.4, 12.6])
        >>> say = progress_lines(sys.stdout, clock=lambda: next(seconds))
        >>> say("reading the config of llama-70b"); say("estimating zero3 on 8 GPUs")
        memlab estimate: reading the config of llama-70b ... (0 s so far)
        memlab estimate: estimating zero3 on 8 GPUs ... (13 s so far)
    """
    started = clock()

    def say(text: str) -> None:
        print(f"memlab estimate: {text} ... ({clock() - started:.0f} s so far)", file=err, flush=True)

    return say


def estimate_each(
    model: Any, batch: Any, plans: Any, *, budget: int | None, device: str | None, say: Callable[[str], None],
    gpu: str | None = None, load: dict[str, Any] | None = None,
) -> Any:
    """The single-GPU estimates of ``plans``, one dry run at a time so that each is said as it starts (building the
    fake model again per plan costs a fraction of a second; a dry run of a large model, seconds to minutes). ``gpu``:
    the GPU kind whose kernels a CUDA dry run made without CUDA emulates (``--gpu``); ``load``: how the model is
    loaded (:func:`load_from_args`).

    Example:
        >>> from transformers import LlamaConfig
        >>> from memlab.plan import Plan
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        ...                      vocab_size=256)
        >>> shapes = {"input_ids": (1, 16), "labels": (1, 16)}
        >>> report = estimate_each(config, shapes, [Plan(), Plan(checkpointing=True)], budget=None, device="cpu",
        ...                        say=print)
        estimating plan 1 of 2: plain
        estimating plan 2 of 2: ckpt
        >>> [trial.status for trial in report]
        ['ok', 'ok']
    """
    from memlab.estimation.estimate import estimate_plans
    from memlab.report import Report

    trials = []
    for number, plan in enumerate(plans, start=1):
        say(f"estimating plan {number} of {len(plans)}: {plan.label()}")
        trials += estimate_plans(model, batch, [plan], budget=budget, device=device, gpu=gpu, load=load).trials
    return Report(trials, budget=budget)
