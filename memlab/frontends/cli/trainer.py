"""``memlab estimate MODEL --trainer grpo|dpo ...``: a TRL trainer's step answered from a model name or config, the
policy built on the meta device (:func:`memlab.trainer_on_meta`), in one command.

Example (nothing is downloaded with a built-in shape or a local config)::

    memlab estimate llama-7b --trainer grpo --num-generations 8 --max-completion-length 1024 --prompt-length 64 \\
        --per-device-train-batch-size 8 --gradient-accumulation-steps 4 --beta 0.0 --lora 16 --gpu RTX4090-24GB

builds ``trl.GRPOConfig(...)`` (or ``trl.DPOConfig``) from the options (named after its fields), the policy on the
meta device from the config ``memlab estimate`` reads, a tokenizer (the model's own where a local folder has its
files; otherwise a small word-level one whose ids stay inside the config's vocabulary), prompts of
``--prompt-length`` tokens and a reward function that returns zeros, and answers ``memlab.estimate(trainer, gpu=...)``
with the table ``memlab estimate`` prints, the phase that holds the peak said (a GRPO step's generation or its
training). Options of one trainer given to the other, or without ``--trainer``, are one error that says what to
write (exit 2). trl, peft and transformers are imported only when a trainer is asked.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, TextIO

from memlab.errors import MemlabError
from memlab.frontends.cli.errors import DEFAULT_BATCH
from memlab.frontends.cli.options import cli_kinds, option_kinds, trainer_options
from memlab.live.sharding import ENGINE_NAMES
from memlab.live.trainer_kinds import CliOption, TrainerCli, TrainerKind, cli_kind

__all__ = ["add_trainer_arguments", "asks_trainer", "build_trainer", "keeps_whole_answer", "levers_asked",
           "run_trainer", "word_tokenizer"]


def levers_asked() -> dict[str, str]:
    """How the trainer question asks each lever only a built trainer has (the plain command refuses them, saying so):
    each kind's CLI facet's ``asks``.

    Example:
        >>> levers_asked()["precompute_ref"]
        '--trainer dpo --lora 16 --try precompute_ref=off,on'
    """
    return {lever: options for kind in cli_kinds() for lever, options in _cli(kind).asks.items()}


def _cli(kind: TrainerKind) -> TrainerCli:
    assert kind.cli is not None
    return kind.cli


_WORDS = 1000
"""At most this many words in the word-level tokenizer (fewer where the config's vocabulary is smaller)."""
_LOAD_OPTIONS = ("load_in_4bit", "load_in_8bit")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _positive(option: str, example: int) -> Any:
    from memlab.frontends.cli.errors import whole_number

    return whole_number(option, "tokens" if "length" in option else "rows" if "batch" in option else "steps"
                        if "steps" in option else "generations" if "generations" in option else "ranks", example)


def _add_option(group: Any, option: CliOption) -> None:
    """``option`` declared on ``group`` as its value says."""
    from memlab.frontends.cli.errors import fraction

    flag = _flag(option.name)
    if option.value == "flag":
        group.add_argument(flag, action="store_true", default=None, help=option.help)
    elif option.value == "on_off":
        group.add_argument(flag, choices=("on", "off"), default=None, help=option.help)
    else:
        kind: Any = {"count": lambda: _positive(flag, int(option.example)), "float": lambda: float,
                     "fraction": lambda: fraction(flag, option.example), "text": lambda: None}[option.value]()
        group.add_argument(flag, metavar=option.metavar, type=kind, default=None, help=option.help)


def add_trainer_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the trainer options of ``memlab estimate`` on ``parser``, each named after the TRL config's field:
    those every kind takes and each kind's own (:mod:`memlab.frontends.cli.options`).

    Example:
        >>> parser = argparse.ArgumentParser(prog="memlab estimate")
        >>> add_trainer_arguments(parser)
        >>> args = parser.parse_args(["--trainer", "grpo", "--num-generations", "8", "--beta", "0"])
        >>> args.trainer, args.num_generations, args.beta, args.max_completion_length
        ('grpo', 8, 0.0, None)
    """
    kinds = cli_kinds()
    configs = " / ".join(f"{kind.config_module}.{kind.config}(...)" for kind in kinds)
    group = parser.add_argument_group(
        "trainer", f"a TRL trainer's step instead of a plain training step (TRL's config fields, as {configs} take "
        "them; the policy built on the meta device, loaded as the load options say: memlab.model_on_meta, "
        "memlab.trainer_on_meta; --gpu, --budget, the load options and --json as above)")
    names = [kind.name for kind in kinds]
    group.add_argument("--trainer", choices=[_cli(kind).word for kind in kinds], default=None,
                       help=f"the trainer: TRL's {', '.join(names[:-1])} or {names[-1]}")
    for option in trainer_options().values():
        _add_option(group, option)
    group.add_argument("--accelerate-config", metavar="FILE", default=None,
                       help="with --gpus N --strategy S: write the accelerate config of the run answered to FILE (the "
                            "answer prints the accelerate launch command that reads it)")


def asks_trainer(args: argparse.Namespace) -> bool:
    """Whether ``args`` ask a trainer's step: ``--trainer``, or one of its options (refused without it)."""
    return any(getattr(args, name, None) is not None for name in ("trainer", *option_kinds()))


def _check(args: argparse.Namespace) -> None:
    """Each option a trainer question cannot take, refused with what to write."""
    taken = option_kinds()
    given = [name for name in taken if getattr(args, name, None) is not None]
    if args.trainer is None:
        raise MemlabError(f"{_flag(given[0])} is a setting of a TRL trainer; add --trainer {taken[given[0]][0]} (or "
                          "leave it out for a plain training step)")
    for name in given:
        kinds = taken[name]
        if args.trainer not in kinds:
            said = " or ".join(f"--trainer {kind}" for kind in kinds)
            raise MemlabError(f"{_flag(name)} is a setting of {said}, not --trainer {args.trainer}; leave it out, or "
                              f"write {said}")
    own_check = _cli(cli_kind(args.trainer)).check  # its own options that do not go together
    if own_check is not None:
        own_check(args)
    if args.bf16 == "on" and args.fp16 == "on":
        raise MemlabError("--bf16 on and --fp16 on ask two autocast dtypes; write one of them")
    if args.optim is not None:
        _check_optim(args.optim)
    quantized = [_flag(name) for name in _LOAD_OPTIONS if getattr(args, name, False)]
    if quantized and args.lora is None:
        raise MemlabError(f"{quantized[0]} loads a quantized base, which trains adapters only; add --lora 16 "
                          "(QLoRA with --load-in-4bit)")
    _check_tries(args)
    _check_sharding(args)
    plain = {"--max-tokens": bool(args.max_tokens), "--max-rows": bool(args.max_rows),
             "--batch": args.batch is not DEFAULT_BATCH}
    for option, set_ in plain.items():
        if set_:
            instead = {"--batch": "--per-device-train-batch-size 8 and --prompt-length 64"}.get(
                option, "the question without it")
            raise MemlabError(f"{option} is not answered with --trainer {args.trainer} yet; write {instead}, or build "
                              "the trainer in Python: memlab.estimate(memlab.trainer_on_meta(...), gpu=...)")



def _check_sharding(args: argparse.Namespace) -> None:
    """``--gpus N --strategy S`` with a trainer: the step per GPU, as ``memlab.estimate(trainer, gpus=N,
    strategy=S)`` answers it; what it cannot take refused with what to write."""
    from memlab.live.sharding import check_sharding, parse_gpus

    if args.gpus is None and args.strategy in (None, "none"):
        if getattr(args, "accelerate_config", None):
            raise MemlabError("--accelerate-config writes the accelerate config of a run over several GPUs; add "
                              "--gpus 8 --strategy zero3 (the GPUs and the engine the run is launched with)")
        return
    if args.gpus is not None:
        args.gpus = parse_gpus(args.gpus)  # "8" as an int from here on
    if args.gpus == "auto":
        if args.budget is None and args.gpu is None:
            raise MemlabError("--gpus auto needs a budget; write for example --gpus auto --budget 80GiB (or --gpu "
                              "A100-80GB: the GPU's memory is then the budget)")
        if args.strategy in (None, "none"):
            args.strategy = "zero3"  # TRL's and open-r1's multi-GPU recipes; the header says it
            args.strategy_assumed = True
        return
    if isinstance(args.gpus, int) and args.gpus > 1 and args.strategy in (None, "none"):
        raise MemlabError(f"--gpus {args.gpus} needs a strategy; add --strategy fsdp2, zero2 or zero3 (the engine the "
                          "run is launched with)")
    gpus, strategy = check_sharding(args.gpus if args.gpus is not None else 1, args.strategy or "none")
    if gpus == 1 and strategy != "none":
        raise MemlabError(f"--strategy {strategy} shards over several GPUs; add --gpus 8 (the GPUs the run is "
                          "launched on)")

def _check_optim(name: str) -> None:
    """``--optim``: a name transformers knows and memlab estimates, or one error naming what to write."""
    from transformers.training_args import OptimizerNames

    from memlab.errors import unknown_name
    from memlab.techniques.optimizer import TRAINER_OPTIMIZERS

    known = [option.value for option in OptimizerNames]
    if name not in known:
        raise unknown_name(name, known, "an optimizer transformers knows", "transformers' OptimizerNames")
    if name not in TRAINER_OPTIMIZERS:
        raise MemlabError(f"--optim {name} is not an optimizer memlab estimates; write one of "
                          f"{', '.join(TRAINER_OPTIMIZERS)}")


def _check_tries(args: argparse.Namespace) -> None:
    """``--try``'s levers a trainer question cannot take (its own options say them), refused with what to write."""
    from memlab.plan import parse_axes
    from memlab.techniques.core.registry import REGISTRY

    if not getattr(args, "try_", None):
        return
    axes = parse_axes(args.try_)  # an unknown lever or value: its own error
    trainer = args.trainer
    split = [name for name in ("micro_batch", "accumulation") if name in axes]
    if split:
        raise MemlabError(f"--try {split[0]}=... is the trainer's batch split; write --per-device-train-batch-size N "
                          "--gradient-accumulation-steps M instead (rows per micro-batch, micro-batches per optimizer "
                          "step: the trainer's own options)")
    if "qlora" in axes.get("adapter", ()):
        raise MemlabError("--try adapter=qlora is how the trainer's model is loaded: write --load-in-4bit "
                          "--bnb-4bit-quant-type nf4 --lora 16 (QLoRA: LoRA adapters on a 4-bit base)")
    adapter = [name for name in axes if name == "adapter" or name.startswith("lora_")]
    if adapter:
        raise MemlabError(f"--try {adapter[0]}=... sets the trainer's adapters, which --lora sets; write --lora 16 "
                          "(LoRA of rank 16 on all linear layers), or leave it out for full fine-tuning")
    if "weights" in axes:
        raise MemlabError("--try weights=... is the dtype the trainer's model is built in; write --dtype bf16 (or "
                          "--dtype fp32)")
    tries = _cli(cli_kind(trainer)).tries  # a lever its own options say
    said = [name for name in tries if name in axes]
    if said:
        raise MemlabError(f"--try {said[0]}=... {tries[said[0]]}")
    for name in axes:  # a built trainer's setting (the lever's needs_trainer) of the other --trainer
        needs = REGISTRY[name].needs_trainer
        owner = next((_cli(kind).word for kind in cli_kinds() if needs and kind.name in needs), trainer)
        if owner != trainer:
            raise MemlabError(f"--try {name}=... is a setting of --trainer {owner} ({needs}), not --trainer "
                              f"{trainer}; leave it out, or write --trainer {owner}")


def _load(args: argparse.Namespace) -> dict[str, Any]:
    """The ``from_pretrained`` keywords the load options say (:func:`memlab.frontends.cli.load.load_from_args`),
    the policy in bf16 where ``--dtype`` is not given."""
    import torch

    from memlab.frontends.cli.load import load_from_args

    load = load_from_args(args) or {}
    load.setdefault("dtype", torch.bfloat16)
    return load


def word_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer (words ``w0``, ``w1``...) whose ids stay below ``vocab_size``: a built-in shape or a
    bare config has no tokenizer of its own, and an estimate reads only the prompts' lengths.

    Example:
        >>> tokenizer = word_tokenizer(32)
        >>> tokenizer("w0 w1 w28")["input_ids"], tokenizer.pad_token_id, len(tokenizer)
        ([3, 4, 31], 0, 32)
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 4:
        raise MemlabError(f"a vocabulary of {vocab_size} tokens is too small for a trainer's prompts; give a config "
                          "whose vocab_size is 4 or more")
    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, **{f"w{i}": i + 3 for i in range(min(vocab_size - 3, _WORDS))}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]")


def _tokenizer(source: str, config: Any) -> tuple[Any, str]:
    """The model's own tokenizer where a local folder has its files (or, for a Hub name, the Hub cache has it),
    else :func:`word_tokenizer`; and what it is."""
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    if os.path.isdir(source) and any(os.path.exists(os.path.join(source, name)) for name in names):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(source)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer, "its own tokenizer"
    from memlab.estimation.configs import KNOWN_SHAPES

    if not os.path.exists(source) and source.lower() not in KNOWN_SHAPES:  # a Hub name: its tokenizer if it can be had
        cached: Any = None
        try:
            from transformers import AutoTokenizer

            cached = AutoTokenizer.from_pretrained(source, local_files_only=True)  # the cached one: no wait
        except Exception:  # noqa: BLE001 - not cached, gated, none: the word-level one (an estimate reads lengths only)
            pass
        if cached is not None and len(cached) <= int(config.vocab_size):
            if cached.pad_token is None:
                cached.pad_token = cached.eos_token
            return cached, "its own tokenizer"
    return word_tokenizer(int(config.vocab_size)), "a word-level tokenizer"


def _text(tokenizer: Any, tokens: int, start: int = 0) -> str:
    """Words that ``tokenizer`` makes ``tokens`` tokens of (without special tokens)."""
    words = [f"w{(start + i) % _WORDS}" for i in range(tokens)]
    text = " ".join(words)
    for _ in range(4):  # another tokenizer may split a word in several: scaled until the count is right
        count = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if count == tokens or count == 0:
            break
        words = (words * (tokens // max(1, count) + 2))[:max(1, len(words) * tokens // count)]
        text = " ".join(words)
    return text


def _positions(config: Any) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _settings(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """The TRL config's keywords the options set (TRL's defaults for the others): those every kind takes, and its
    kind's own (its CLI facet's ``settings``, checked against the model), with the prompt's length
    (``"prompt_length"``: None for plain text)."""
    settings: dict[str, Any] = {}
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "optim", "use_liger_kernel"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    for name in ("gradient_checkpointing", "bf16", "fp16"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name) == "on"
    if settings.get("fp16") and "bf16" not in settings:
        settings["bf16"] = False  # TRL's default bf16 gives way to the fp16 asked
    return {**settings, **_cli(cli_kind(args.trainer)).settings(args, _positions(config))}


def question_settings(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """What ``args`` ask of the trainer, before it is built: the TRL config's keywords (:func:`_settings`) with the
    prompt's length, the policy's dtype, its quantization in words and whether activations are offloaded (what the
    answer's header says)."""
    from memlab.estimation.dryrun.load import loaded_dtype

    load = _load(args)
    dtype = loaded_dtype(config, _parsed_load(load))
    # TRL's activation offloading is not set on the config: TRL's OffloadActivations needs an accelerator to be
    # built (none here); the estimate runs it as memlab's offload lever, which is what it is (Plan.from_trainer
    # reads activation_offloading=True as offload="activations").
    return {**_settings(args, config), "dtype": str(dtype).split(".")[-1], "load": _load_words(load),
            "activation_offloading": bool(args.activation_offloading)}


_SAID_ONLY = ("prompt_length", "dtype", "load", "activation_offloading", "tokenizer")
"""The keys of :func:`question_settings` that are not the TRL config's keywords."""


def build_trainer(args: argparse.Namespace, config: Any, source: str, folder: str,
                  policy: Any = None) -> tuple[Any, dict[str, Any]]:
    """The trainer ``args`` ask around a meta policy of ``config`` loaded as the load options say
    (:func:`memlab.model_on_meta`; ``policy``: that policy, built already), its TRL config's files under ``folder``;
    and the settings it was built with (:func:`question_settings`, and the tokenizer in words)."""
    try:
        import peft
        import trl  # noqa: F401 - the trainers the command builds are TRL's
    except ImportError as error:
        raise MemlabError(f"--trainer {args.trainer} needs TRL and peft, and {error.name} is not installed; write pip "
                          "install trl peft") from None
    import contextlib

    from datasets import Dataset

    from memlab.estimation.dryrun.load import model_on_meta
    from memlab.trainer.meta import trainer_on_meta

    said = question_settings(args, config)
    settings = {key: value for key, value in said.items() if key not in _SAID_ONLY}
    prompt = said["prompt_length"]
    if policy is None:
        policy = model_on_meta(config, **_load(args))
    tokenizer, told = _tokenizer(source, config)
    common: dict[str, Any] = dict(output_dir=folder, report_to=[], save_strategy="no", use_cpu=True,
                                  disable_tqdm=True, max_steps=1, seed=0)
    rows = settings.get("per_device_train_batch_size", 8) * settings.get("gradient_accumulation_steps", 1)
    count = max(rows, 8)
    keywords: dict[str, Any] = {}
    kind = cli_kind(args.trainer)
    config_class: Any = kind.config_class()
    trainer_class: Any = kind.trainer_class()
    if args.lora is not None:
        keywords["peft_config"] = peft.LoraConfig(r=args.lora, lora_alpha=2 * args.lora, target_modules="all-linear")
    data, own = _cli(kind).examples(args, {**settings, "prompt_length": prompt}, tokenizer,
                                    lambda tokens, start: _text(tokenizer, tokens, start), count)
    keywords.update(own)
    try:
        trl_args = config_class(**common, **settings)
        building = _cli(kind).building
        with building(settings) if building is not None else contextlib.nullcontext():
            trainer = trainer_on_meta(trainer_class, model=policy, args=trl_args, train_dataset=Dataset.from_list(data),
                                      processing_class=tokenizer, **keywords)
    except ImportError as error:  # TRL's check of an optional package it needs (Liger)
        if "liger" in str(error).lower():
            raise MemlabError("--use-liger-kernel needs Liger's kernels, and liger-kernel is not installed; write pip "
                              "install liger-kernel, or leave --use-liger-kernel out") from None
        raise
    except ValueError as error:  # TRL's own checks of its settings (generations dividing the batch...)
        raise MemlabError(f"TRL refuses these settings: {_trl_words(str(error))}") from None
    return trainer, {**said, "tokenizer": told}


def _parsed_load(load: dict[str, Any]) -> Any:
    from memlab.estimation.dryrun.load import parse_load

    return parse_load(load, None)


def _load_words(load: dict[str, Any]) -> str | None:
    """The quantization a load asks, in the header's words (None where it quantizes nothing)."""
    parsed = _parsed_load(load)
    if parsed.quantize == "none":
        return None
    return "8-bit" if parsed.quantize == "int8" else f"4-bit {parsed.quantize.upper()}"


def _trl_words(message: str) -> str:
    """A TRL or memlab message about the config's fields in the command's options (a name already written as an
    option stays as it is).

    Example:
        >>> _trl_words("`max_completion_length` must be positive; or add --lora 16")
        '--max-completion-length must be positive; or add --lora 16'
        >>> _trl_words("GRPOConfig(vllm_gpu_memory_utilization=0.3) leaves no room")
        '--vllm-gpu-memory-utilization 0.3 leaves no room'
    """
    import re

    options = option_kinds()
    message = re.sub(r"\b\w+Config\((\w+)=([0-9.]+)\)",  # GRPOConfig(vllm_gpu_memory_utilization=0.3)
                     lambda found: f"{_flag(found[1])} {found[2]}" if found[1] in options else found[0], message)
    for name in options:
        # not after "-": "--lora" in memlab's own messages was made "----lora"
        message = re.sub(rf"(?<![-\w])`?{name}\b`?", _flag(name), message)
    return message


def keeps_whole_answer(args: argparse.Namespace) -> bool:
    """Whether ``memlab estimate`` may keep the whole answer of ``args`` under its words
    (:mod:`memlab.frontends.cli.estimate.kept`): not a trainer's read from a folder, which reads the tokenizer's files
    too, which the kept answer's key does not hold (asked again each time).

    Example:
        >>> keeps_whole_answer(argparse.Namespace(trainer="grpo", config=None, model="llama-7b"))
        True
    """
    return not (asks_trainer(args) and os.path.isdir(args.config or args.model))


def run_trainer(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Answer the trainer question ``args`` ask: the table, the verdict and the phase of the peak (or ``--json``);
    the exit status as for a plain step (0 fits or nothing judged, 1 does not fit, 3 could not be estimated); each
    step said on ``err``."""
    import contextlib

    from memlab.frontends.cli.estimate.progress import EstimateProgress
    from memlab.live.quiet import collecting

    # What a library prints while the trainer is built (DeepSpeed's accelerator line) goes to err: out is the table.
    # What TRL, transformers, datasets and bitsandbytes say of the stand-in trainer memlab builds (its deprecated
    # names, its datasets' progress bars, a CPU kernel bitsandbytes did not find) is about memlab's code, not the
    # user's: only their errors are said, once each, after the answer.
    with collecting(rule=_errors_only) as remarks:
        with EstimateProgress(err, dry_runs=1) as say, contextlib.redirect_stdout(err), _no_progress_bars():
            status = _answer(args, out, say)
    for line in remarks.lines():
        print(f"memlab estimate: a library said while the trainer was estimated: {line}", file=err)
    return status


def _errors_only(source: str, kind: type[Warning] | int) -> bool:
    """Which library remarks the trainer question shows: log records at ERROR or above, and warnings of libraries
    memlab does not drive (a reward function's, say)."""
    import logging

    from memlab.live.quiet import QUIET_LOGGERS

    return kind >= logging.ERROR if isinstance(kind, int) else source not in QUIET_LOGGERS


class _no_progress_bars:  # noqa: N801 - a context manager read as a phrase
    """The datasets library's progress bars (TRL maps memlab's stand-in examples through it) off while the trainer
    is built, and back as they were."""

    def __enter__(self) -> None:
        from datasets.utils import logging as datasets_logging

        self.was_on = datasets_logging.is_progress_bar_enabled()
        datasets_logging.disable_progress_bar()

    def __exit__(self, *exc: Any) -> None:
        from datasets.utils import logging as datasets_logging

        if self.was_on:
            datasets_logging.enable_progress_bar()


def _answer(args: argparse.Namespace, out: TextIO, say: Any) -> int:
    import dataclasses
    import tempfile

    from memlab.estimation.cuda.gpus import kind_or_default
    from memlab.estimation.dryrun.adapters import loaded_weight_bytes
    from memlab.estimation.dryrun.load import model_on_meta
    from memlab.estimation.estimate import load_config
    from memlab.estimation.sharded.composed import one_gpu_runs_kept
    from memlab.frontends.cli.errors import estimate_status
    from memlab.frontends.cli.estimate.text import json_with_verdicts
    from memlab.frontends.cli.gpu import check_gpu_flags, cli_gpu, gpu_budget
    from memlab.frontends.cli.host import host_judged
    from memlab.plan import parse_budget, parse_grid
    from memlab.report import Report

    _check(args)
    check_gpu_flags(args)  # a GPU named beside --device cpu is refused, as without --trainer
    budget = parse_budget(args.budget)
    if budget is None:
        budget = gpu_budget(args)
    source = args.config or args.model
    say(f"reading the config of {source}")
    config = load_config(source)
    if args.config and args.model:  # the name the answer's commands load (trl vllm-serve --model), not the file's
        config._name_or_path = args.model
    say(f"building the {args.trainer.upper()} trainer around the model on the meta device (shapes only, no memory)")
    suggested: list[tuple[Any, str, str | None]] = []  # (trial, command, what it changes in the training)
    with tempfile.TemporaryDirectory(prefix="memlab-trainer-") as folder:
        # Known before the trainer is built and any dry run made: the weights as loaded, which no lever lowers.
        policy = model_on_meta(config, **_load(args))
        weights = loaded_weight_bytes(policy)
        context = 0 if args.device == "cpu" else kind_or_default(cli_gpu(args)).context_bytes
        sharded = {"gpus": args.gpus, "strategy": args.strategy} if args.gpus not in (None, 1) else {}
        if budget is not None and weights + context > budget and not sharded:
            return _foregone(args, config, source, question_settings(args, config), policy,
                             (weights, context, budget), out, say)
        trainer, settings = build_trainer(args, config, source, folder, policy)
        import memlab
        own = _own_plan(trainer, settings)
        # --try: the trainer's own plan with the levers replaced; without it, the trainer as set up
        plans: list[Any] = parse_grid(args.try_, base=own) if args.try_ else [
            own if settings["activation_offloading"] else None]
        if len(plans) > 1:
            say.expect(len(plans) - 1)
        trials = []
        asked = _cli(cli_kind(args.trainer)).estimate_keywords
        keywords = asked(args) if asked is not None else {}
        with one_gpu_runs_kept():  # --gpus auto's search and the answer share one dry run per plan
            if args.gpus == "auto":
                found = _fewest_gpus(args, trainer, plans[0], budget, keywords, say)
                if found is None:
                    print(_header(args, trainer.model, settings, plans, budget), file=out)
                    print(f"Verdict: does not fit on up to {FEWEST_GPUS[-1]} GPUs under "
                          f"{_STRATEGY_WORDS[args.strategy]}; ask with a 4-bit base (--load-in-4bit), LoRA (--lora 16) "
                          "or offload (--try offload=optimizer)", file=out)
                    return 1
                args.gpus, args.gpus_searched = found, True
                sharded = {"gpus": found, "strategy": args.strategy}
            for number, plan in enumerate(plans, start=1):
                said = f" plan {number} of {len(plans)}: {plan.label()}" if args.try_ else ""
                say(f"estimating the {args.trainer.upper()} step{said}")
                trials.append(memlab.estimate(trainer, plan, gpu=cli_gpu(args), device=args.device, budget=budget,
                                              **keywords, **sharded))
        for trial in trials:  # a vLLM engine that would not start: the options that start it, as one error
            if trial.status == "error" and ("vllm_gpu_memory_utilization=" in str(trial.error)
                                            or "trl vllm-serve" in str(trial.error)):
                raise MemlabError(_trl_words(str(trial.error)))
        report = Report(host_judged(trials, args), budget=budget)
        fits = any(report.fits(trial) for trial in report.trials)
        if budget is not None and not fits and not sharded:  # the suggestions are one GPU's
            from memlab.frontends.cli.estimate.next import trainer_suggestions

            suggested = trainer_suggestions(args, trainer, own, report, say, words=_trl_words)
            if not suggested:
                suggested = _quantized_alternative(args, config, source, budget, say)
    levers = [trial for trial, _, changes in suggested if changes is None]
    model_name = str(getattr(config, "_name_or_path", "") or args.model)
    if sharded and args.accelerate_config:
        _write_accelerate_config(args, report.trials[0])
    if args.json:
        import json

        everything = dataclasses.replace(report, suggestions=[trial for trial, _, _ in suggested])
        data = json.loads(json_with_verdicts(everything))
        for row, (_, command, changes) in zip(data["suggestions"], suggested, strict=True):
            row["command"] = command
            row["changes_training"] = changes
        for row, trial in zip(data["trials"], report.trials, strict=True):
            row["phases"] = _phase_peaks(trial)
            row["peak_phase"] = trial.timeline.peak.phase if trial.timeline is not None else None
            load = getattr(trial, "load_bytes", None)
            if load is not None:  # the load per GPU and the host per node meanwhile
                row["load"] = {"gpu_bytes": load, "host_node_bytes": getattr(trial, "load_host_bytes", None)}
        data["trainer"] = {"kind": args.trainer, **{key: value for key, value in settings.items()}}
        if sharded:
            data["launch"] = launch_lines(args, report.trials[0], wrap=False, model_name=model_name)
        data["phases"] = data["trials"][0]["phases"]
        data["peak_phase"] = data["trials"][0]["peak_phase"]
        print(json.dumps(data, indent=2, default=str), file=out)
    else:
        from memlab.frontends.cli.estimate.text import single_text

        report = dataclasses.replace(report, suggestions=levers)
        header = _header(args, trainer.model, settings, plans, budget)
        from memlab.frontends.cli.estimate.next import trainer_next_lines

        after = trainer_next_lines(args, suggested) if budget is not None and not fits else []
        if sharded and budget is not None and not fits:
            after = [f"Next: nothing is suggested per GPU yet; ask again with more --gpus than {args.gpus}, or with "
                     "--strategy zero3 (every GPU holds a share of the weights)"]
        if sharded:
            after += launch_lines(args, report.trials[0], model_name=model_name)
        lines = single_text(args, header, report, budget, after)
        from memlab.frontends.cli.host import load_lines

        peaks = _peak_lines(report.trials) + load_lines(report.trials, budget)
        at = lines.index("") if "" in lines else len(lines)
        lines[at:at] = peaks  # before the table, after the verdict and the best
        print("\n".join(lines), file=out)
    return estimate_status(fits=fits, judged=budget is not None or getattr(args, "host_budget", None) is not None,
                           errors=sum(trial.status == "error" for trial in report.trials))


FEWEST_GPUS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""The numbers of GPUs ``--gpus auto`` searches with a trainer (as the plain question's: powers of two)."""


def _fewest_gpus(args: argparse.Namespace, trainer: Any, plan: Any, budget: int | None, keywords: dict[str, Any],
                 say: Any) -> int | None:
    """``--gpus auto``: the fewest of :data:`FEWEST_GPUS` whose per-GPU step of ``trainer`` under ``--strategy`` fits
    ``budget``, found as the plain question's search finds it (:func:`~memlab.estimation.sharded.per_gpu.
    search_gpus`); None where none does. Its estimates share their one-GPU dry run (the caller's
    :func:`~memlab.estimation.sharded.composed.one_gpu_runs_kept`)."""
    import memlab
    from memlab.estimation.sharded.per_gpu import search_gpus
    from memlab.frontends.cli.gpu import cli_gpu

    def run(gpus: int) -> Any:
        say(f"estimating the {args.trainer.upper()} step per GPU of {gpus} under {_STRATEGY_WORDS[args.strategy]}")
        return memlab.estimate(trainer, plan, gpu=cli_gpu(args), device=args.device, budget=budget, gpus=gpus,
                               strategy=args.strategy, **keywords)

    found = search_gpus(run, list(FEWEST_GPUS))
    return found.gpus if found is not None and found.status == "ok" and found.fits else None


def _engine_plan(plan: Any) -> Any:
    """What the accelerate config of a trainer's run carries of ``plan``: its mixed precision and CPU offload (the
    trainer's arguments carry the rest)."""
    from memlab.plan import Plan

    return Plan(precision=plan.precision, offload=plan.offload if plan.offload in ("optimizer", "params", "all")
                else "none")


def _write_accelerate_config(args: argparse.Namespace, trial: Any) -> None:
    """``--accelerate-config FILE``: the accelerate config of the run answered, written as YAML."""
    import yaml

    try:
        config = _engine_plan(trial.plan).to_accelerate_config(gpus=args.gpus, strategy=args.strategy)
    except MemlabError as error:
        raise MemlabError(f"--accelerate-config: {error}") from None
    with open(args.accelerate_config, "w", encoding="utf-8") as file:
        yaml.safe_dump(config, file, sort_keys=False)


def launch_lines(args: argparse.Namespace, trial: Any, *, model_name: str, wrap: bool = True) -> list[str]:
    """The commands that start the run answered per GPU, as TRL's docs lay them out: ``accelerate launch`` with the
    config of its engine (written to ``--accelerate-config FILE``: the strategy, its CPU offload and the mixed
    precision; the trainer's own arguments keep the rest, checkpointing included), and for a GRPO trainer that
    generates on a vLLM server, ``trl vllm-serve`` on GPUs of its own.

    Example:
        >>> from types import SimpleNamespace
        >>> from memlab.plan import Plan
        >>> args = SimpleNamespace(gpus=7, strategy="zero3", accelerate_config=None, vllm_mode="server",
        ...                        vllm_server_tensor_parallel_size=None, vllm_server_data_parallel_size=None,
        ...                        vllm_server_gpu_memory_utilization=None, vllm_server_max_model_len=None)
        >>> for line in launch_lines(args, SimpleNamespace(plan=Plan(precision="bf16")),
        ...                          model_name="Qwen/Qwen2.5-7B"):
        ...     print(line)
        Launch: CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6 accelerate launch --config_file accelerate.yaml --num_processes 7
          train.py (--accelerate-config accelerate.yaml writes its config: DeepSpeed ZeRO-3, mixed precision bf16)
        Serve: CUDA_VISIBLE_DEVICES=7 trl vllm-serve --model Qwen/Qwen2.5-7B
    """
    from memlab.techniques.vllm import VLLMServer

    engine = _engine_plan(trial.plan)
    written = args.accelerate_config
    said = _STRATEGY_WORDS[args.strategy]
    said += "" if engine.offload == "none" else f", offload {engine.offload}"
    said += f", mixed precision {engine.precision}" if engine.precision != "fp32" else ", no mixed precision"
    server = getattr(args, "vllm_mode", None) == "server"
    devices = f"CUDA_VISIBLE_DEVICES={','.join(str(i) for i in range(args.gpus))} " if server else ""
    how = f"written to {written}: {said}" if written else (
        f"--accelerate-config accelerate.yaml writes its config: {said}")
    lines = [f"Launch: {devices}accelerate launch --config_file {written or 'accelerate.yaml'} --num_processes "
             f"{args.gpus} train.py ({how})"]
    if server:
        given = {name.removeprefix("vllm_server_"): getattr(args, name) for name in (
            "vllm_server_tensor_parallel_size", "vllm_server_data_parallel_size", "vllm_server_gpu_memory_utilization",
            "vllm_server_max_model_len") if getattr(args, name, None) is not None}
        served = VLLMServer(**given)
        own = ",".join(str(args.gpus + i) for i in range(served.gpus))
        lines.append(f"Serve: CUDA_VISIBLE_DEVICES={own} {served.command(model_name)}")
    import textwrap

    from memlab.frontends.cli.estimate.text import WIDTH

    # whole words only: a command's paths and options are copied from it
    return ["\n".join(textwrap.wrap(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False,
                                     break_long_words=False)) for line in lines] if wrap else lines


def _own_plan(trainer: Any, settings: dict[str, Any]) -> Any:
    """The trainer's plan as the user's config sets it up (:meth:`memlab.Plan.from_trainer`), with the activation
    offloading :func:`build_trainer` could not set on the config."""
    from memlab.plan import Plan

    own = Plan.from_trainer(trainer)
    if settings["activation_offloading"]:
        own = own.replace(offload="all" if own.offload == "optimizer" else "activations")
    return own


def _quantized_alternative(args: argparse.Namespace, config: Any, source: str, budget: int,
                           say: Any) -> list[tuple[Any, str, str | None]]:
    """The same trainer on a 4-bit base (QLoRA: :data:`memlab.frontends.cli.trainer_floor.QUANTIZED_BASE`, computing in
    the GPU's half precision, LoRA of rank 16 where none was asked), estimated; ``[(trial, command, what it
    changes)]`` where it fits, else nothing. None for a base already quantized."""
    import copy
    import tempfile

    import memlab
    from memlab.frontends.cli.estimate.next import largest_split, trainer_command, trainer_plan_options
    from memlab.frontends.cli.gpu import cli_gpu
    from memlab.frontends.cli.trainer_floor import four_bit_changes
    from memlab.search.memory import FIT_MARGIN

    if args.load_in_4bit or args.load_in_8bit:
        return []
    changes = four_bit_changes(args)
    asked = copy.copy(args)
    vars(asked).update(changes)
    say("estimating the same trainer on a 4-bit base (QLoRA: --load-in-4bit)")
    with tempfile.TemporaryDirectory(prefix="memlab-trainer-") as folder:
        trainer, settings = build_trainer(asked, config, source, folder)
        own = _own_plan(trainer, settings)

        def estimate(plan: Any) -> Any:
            return memlab.estimate(trainer, plan, gpu=cli_gpu(args), device=args.device, budget=budget)

        trial = estimate(own if settings["activation_offloading"] else None)
        if trial.status == "ok" and trial.verdict_bytes * FIT_MARGIN > budget:  # no margin: a smaller batch split
            split = largest_split(trial, estimate, budget, say)
            if split is not None:
                split_changes, _ = trainer_plan_options(split.plan, own) or ({}, [])
                changes.update(split_changes)
                trial = split
    if trial.status != "ok" or trial.verdict_bytes > budget:
        return []
    what = ("--load-in-4bit: the base held in 4-bit NF4 (QLoRA), whose adapters train against the quantized weights"
            + ("" if args.lora else "; --lora 16: LoRA adapters instead of every weight"))
    if trial.verdict_bytes * FIT_MARGIN > budget:
        what += f"; less than {round((FIT_MARGIN - 1) * 100)}% of the budget to spare"
    return [(trial, trainer_command(args, changes), what)]


def _foregone(args: argparse.Namespace, config: Any, source: str, settings: dict[str, Any], policy: Any,
              sizes: tuple[int, int, int], out: TextIO, say: Any) -> int:
    """The answer where the weights as loaded and the CUDA context are over the budget (``sizes``: those and the
    budget), said at once, with no dry run (exit status 1): what changes that, each from the weights' layout alone
    (a 4-bit base's weights, computed on the meta device; a GPU with more memory), with the command that asks it."""
    import json

    from memlab.estimation.dryrun.adapters import loaded_weight_bytes
    from memlab.estimation.dryrun.load import model_on_meta
    from memlab.frontends.cli.estimate.next import trainer_command
    from memlab.frontends.cli.trainer_floor import floor_verdict, four_bit_changes, remedies

    weights, context, budget = sizes
    quantized = bool(args.load_in_4bit or args.load_in_8bit)
    four_bit: int | None = None
    command = None
    if not quantized:
        say("weighing the same model on a 4-bit base (its layout on the meta device, no dry run)")
        changes = four_bit_changes(args)
        load = {**_load(args), "quantization_config": {key: value for key, value in changes.items()
                                                       if key.startswith(("load_in", "bnb_"))}}
        four_bit = loaded_weight_bytes(model_on_meta(config, **load))
        command = trainer_command(args, changes)
    if args.json:
        data = {"trials": [], "fits": False, "weights_bytes": weights, "context_bytes": context, "budget": budget,
                "four_bit_weights_bytes": four_bit, "four_bit_command": command,
                "trainer": {"kind": args.trainer, **settings}}
        print(json.dumps(data, indent=2, default=str), file=out)
        return 1
    lines = [_header(args, policy, settings, [None], budget),
             floor_verdict(weights, context, budget, settings["dtype"])]
    lines += remedies(weights + context, budget, four_bit, context, command)
    print("\n".join(lines), file=out)
    return 1


def _header(args: argparse.Namespace, model: Any, settings: dict[str, Any], plans: list[Any],
            budget: int | None) -> str:
    """The answer's first line, wrapped to the answer's width: the model (the trainer's, or the policy), its
    parameters, the question and the GPU with its budget."""
    import textwrap

    from memlab.frontends.cli.estimate.text import WIDTH, budget_words, count_text, for_gpu

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    parameters = sum(p.numel() for name, p in base.named_parameters() if "lora_" not in name)
    sharded = (f", per GPU of {args.gpus} under {_STRATEGY_WORDS[args.strategy]}"
               if isinstance(args.gpus, int) and args.gpus > 1 else "")
    if getattr(args, "gpus_searched", False):
        assumed = " (assumed: --strategy sets another)" if getattr(args, "strategy_assumed", False) else ""
        sharded = (f", per GPU of the fewest GPUs that fit (--gpus auto, powers of two): {args.gpus} under "
                   f"{_STRATEGY_WORDS[args.strategy]}{assumed}")
    if sharded and getattr(args, "vllm_mode", None) == "server":
        serving = (args.vllm_server_tensor_parallel_size or 1) * (args.vllm_server_data_parallel_size or 1)
        sharded += f" (and {serving} more serving vLLM: {args.gpus + serving} GPUs in all)"
    text = (f"{args.model}: {type(base).__name__}, {count_text(parameters)} parameters, "
            f"{_question(args, settings)}{_plans_words(plans)}{sharded}{for_gpu(args)}{budget_words(args, budget)}")
    return "\n".join(textwrap.wrap(text, WIDTH, subsequent_indent="  "))


_STRATEGY_WORDS = {name: f"DeepSpeed {words}" if name.startswith("zero") else words
                   for name, words in ENGINE_NAMES.items()}


def _plans_words(plans: list[Any]) -> str:
    return f", {len(plans)} plans (--try)" if len(plans) > 1 else ""


def _peak_lines(trials: list[Any]) -> list[str]:
    """Where each plan's peak is: the phase that holds it and each phase's highest (one plan), or each plan's phase."""
    import textwrap

    from memlab.frontends.cli.estimate.text import WIDTH

    if len(trials) == 1:
        phases = _phase_peaks(trials[0])
        if not phases:
            return []
        said = ", ".join(f"{name} {_bytes(nbytes)}" for name, nbytes in phases.items())
        peak_phase = trials[0].timeline.peak.phase
        return textwrap.wrap(f"Peak: in the {peak_phase} phase (each phase's highest: {said})", WIDTH,
                             subsequent_indent="  ")
    said = "; ".join(f"{trial.label} in the {trial.timeline.peak.phase} phase" for trial in trials
                     if trial.timeline is not None)
    return textwrap.wrap(f"Peak: {said}", WIDTH, subsequent_indent="  ") if said else []


def _bytes(nbytes: int) -> str:
    from memlab.plan import format_bytes

    return format_bytes(nbytes)


def _question(args: argparse.Namespace, settings: dict[str, Any]) -> str:
    """The trainer question in words, for the header."""
    batch = settings.get("per_device_train_batch_size", 8)
    steps = settings.get("gradient_accumulation_steps", 1)
    words = _cli(cli_kind(args.trainer)).question(settings)
    parts = [f"{args.trainer.upper()}", words.examples]
    parts.append(f"batch {batch} x {steps} accumulation steps")
    if words.loss:
        parts.append(words.loss)
    adapters = f"LoRA r{args.lora}" if args.lora is not None else "full fine-tuning"
    if settings.get("load"):
        kind = "QLoRA" if settings["load"].startswith("4") else "LoRA"
        article = "an" if settings["load"].startswith("8") else "a"
        adapters = f"{kind} r{args.lora} on {article} {settings['load']} base"
    parts.append(adapters)
    for name, said in (("optim", "{}"), ("use_liger_kernel", "Liger's kernels")):
        if settings.get(name):
            parts.append(said.format(settings[name]))
    if args.activation_offloading:
        parts.append("activations offloaded")
    if words.engine:
        parts.append(words.engine)
    return ", ".join(parts)


def _phase_peaks(trial: Any) -> dict[str, int]:
    """The highest total of each named phase of ``trial``'s timeline (a phase that repeats, per micro-batch, once)."""
    return {} if trial.timeline is None else trial.timeline.phase_peaks()
