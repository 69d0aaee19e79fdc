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
from memlab.frontends.cli_errors import DEFAULT_BATCH

__all__ = ["OPTION_KINDS", "TRAINER_LEVERS_ASKED", "add_trainer_arguments", "asks_trainer", "build_trainer",
           "keeps_whole_answer", "run_trainer", "word_tokenizer"]

TRAINER_CLASSES = {"sft": "SFTTrainer", "dpo": "DPOTrainer", "grpo": "GRPOTrainer"}
"""Each ``--trainer`` and the TRL class it builds (a lever a built trainer sets names that class: its
``needs_trainer``)."""
_ALL = tuple(TRAINER_CLASSES)
OPTION_KINDS: dict[str, tuple[str, ...]] = {
    "num_generations": ("grpo",), "max_completion_length": ("grpo",), "vllm_gpu_memory_utilization": ("grpo",),
    "vllm_enable_sleep_mode": ("grpo",), "max_length": ("sft", "dpo"), "packing": ("sft",),
    "padding_free": ("sft",), "completion_only_loss": ("sft",), "beta": ("dpo", "grpo"),
    **{name: _ALL for name in ("prompt_length", "per_device_train_batch_size", "gradient_accumulation_steps", "lora",
                               "gradient_checkpointing", "optim", "activation_offloading", "use_liger_kernel", "bf16",
                               "fp16")},
}
"""Each trainer option (as ``args`` names it) and the ``--trainer`` kinds that take it."""
TRAINER_LEVERS_ASKED = {
    "precompute_ref": "--trainer dpo --lora 16 --try precompute_ref=off,on",
    "vllm_memory": "--trainer grpo --vllm-gpu-memory-utilization 0.3",
    "vllm_sleep": "--trainer grpo --vllm-gpu-memory-utilization 0.3 --vllm-enable-sleep-mode",
}
"""How the trainer question asks each lever only a built trainer has (the plain command refuses them, saying so)."""
_WORDS = 1000
"""At most this many words in the word-level tokenizer (fewer where the config's vocabulary is smaller)."""
_LOAD_OPTIONS = ("load_in_4bit", "load_in_8bit")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _positive(option: str, example: int) -> Any:
    from memlab.frontends.cli_errors import whole_number

    return whole_number(option, "tokens" if "length" in option else "rows" if "batch" in option else "steps"
                        if "steps" in option else "generations" if "generations" in option else "ranks", example)


def add_trainer_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the trainer options of ``memlab estimate`` on ``parser``, each named after the TRL config's field.

    Example:
        >>> parser = argparse.ArgumentParser(prog="memlab estimate")
        >>> add_trainer_arguments(parser)
        >>> args = parser.parse_args(["--trainer", "grpo", "--num-generations", "8", "--beta", "0"])
        >>> args.trainer, args.num_generations, args.beta, args.max_completion_length
        ('grpo', 8, 0.0, None)
    """
    from memlab.frontends.cli_errors import fraction

    group = parser.add_argument_group(
        "trainer", "a TRL trainer's step instead of a plain training step (TRL's config fields, as "
        "trl.SFTConfig(...) / trl.DPOConfig(...) / trl.GRPOConfig(...) take them; the policy built on the meta "
        "device, loaded as the load options say: memlab.model_on_meta, memlab.trainer_on_meta; --gpu, --budget, the "
        "load options and --json as above)")
    on_off = ("on", "off")
    group.add_argument("--trainer", choices=_ALL, default=None,
                       help="the trainer: TRL's SFTTrainer, DPOTrainer or GRPOTrainer")
    group.add_argument("--num-generations", metavar="N", type=_positive("--num-generations", 8), default=None,
                       help="GRPO: completions per prompt (TRL's default: 8)")
    group.add_argument("--max-completion-length", metavar="TOKENS",
                       type=_positive("--max-completion-length", 1024), default=None,
                       help="GRPO: the longest completion, in tokens (TRL's default: 512)")
    group.add_argument("--max-length", metavar="TOKENS", type=_positive("--max-length", 1024), default=None,
                       help="SFT: the longest (or packed) sequence; DPO: the longest prompt and answer together; in "
                       "tokens (TRL's default: 1024)")
    group.add_argument("--prompt-length", metavar="TOKENS", type=_positive("--prompt-length", 64), default=None,
                       help="tokens in each prompt (default: 64 for GRPO, half of --max-length for DPO; SFT: prompt "
                       "and completion examples, default none: plain text)")
    group.add_argument("--packing", action="store_true", default=None,
                       help="SFT: examples packed into rows of --max-length tokens")
    group.add_argument("--padding-free", action="store_true", default=None,
                       help="SFT: rows concatenated without padding (TRL's padding_free=True)")
    group.add_argument("--completion-only-loss", choices=on_off, default=None,
                       help="SFT: the loss on the completion's tokens only (TRL's default: on for prompt and "
                       "completion examples)")
    group.add_argument("--per-device-train-batch-size", metavar="ROWS",
                       type=_positive("--per-device-train-batch-size", 8),
                       default=None, help="rows per device and micro-batch (TRL's default: 8)")
    group.add_argument("--gradient-accumulation-steps", metavar="STEPS",
                       type=_positive("--gradient-accumulation-steps", 4),
                       default=None, help="micro-batches per optimizer step (default: 1)")
    group.add_argument("--beta", metavar="BETA", type=float, default=None,
                       help="DPO, GRPO: the KL coefficient: above 0 keeps a reference model (TRL's default: 0.0 for "
                       "GRPO, 0.1 for DPO)")
    group.add_argument("--lora", metavar="R", type=_positive("--lora", 16), default=None,
                       help="LoRA adapters of rank R on all linear layers (peft.LoraConfig(r=R, lora_alpha=2R, "
                       "target_modules='all-linear')); without it every weight trains; with --load-in-4bit, QLoRA")
    group.add_argument("--gradient-checkpointing", choices=on_off, default=None,
                       help="activation checkpointing (TRL's default: on)")
    group.add_argument("--optim", metavar="NAME", default=None,
                       help="the optimizer as transformers names it: adamw_torch_fused (the default), adamw_torch, "
                       "adamw_8bit, paged_adamw_8bit, adafactor")
    group.add_argument("--activation-offloading", action="store_true", default=None,
                       help="the step's saved activations held in CPU memory (TRL's activation_offloading=True, "
                       "transformers' gradient_checkpointing_kwargs={'offload': True})")
    group.add_argument("--use-liger-kernel", action="store_true", default=None,
                       help="Liger's kernels: its fused losses and model patches (needs liger-kernel installed)")
    group.add_argument("--bf16", choices=on_off, default=None,
                       help="autocast in bf16 (TRL's default: on, unless --fp16 on)")
    group.add_argument("--fp16", choices=on_off, default=None, help="autocast in fp16, loss-scaled (default: off)")
    group.add_argument("--vllm-gpu-memory-utilization", metavar="SHARE",
                       type=fraction("--vllm-gpu-memory-utilization", "0.3"),
                       default=None, help="GRPO: generate with a vLLM engine colocated on the card, holding this "
                       "share of its memory (use_vllm=True, vllm_mode='colocate')")
    group.add_argument("--vllm-enable-sleep-mode", action="store_true", default=None,
                       help="GRPO with --vllm-gpu-memory-utilization: the engine sleeps while the policy trains")


def asks_trainer(args: argparse.Namespace) -> bool:
    """Whether ``args`` ask a trainer's step: ``--trainer``, or one of its options (refused without it)."""
    return any(getattr(args, name, None) is not None for name in ("trainer", *OPTION_KINDS))


def _check(args: argparse.Namespace) -> None:
    """Each option a trainer question cannot take, refused with what to write."""
    given = [name for name in OPTION_KINDS if getattr(args, name, None) is not None]
    if args.trainer is None:
        kinds = OPTION_KINDS[given[0]]
        kind = "grpo" if "grpo" in kinds and len(kinds) < len(_ALL) else kinds[0]
        raise MemlabError(f"{_flag(given[0])} is a setting of a TRL trainer; add --trainer {kind} (or leave it out "
                          "for a plain training step)")
    for name in given:
        kinds = OPTION_KINDS[name]
        if args.trainer not in kinds:
            said = " or ".join(f"--trainer {kind}" for kind in kinds)
            raise MemlabError(f"{_flag(name)} is a setting of {said}, not --trainer {args.trainer}; leave it out, or "
                              f"write {said}")
    if getattr(args, "vllm_enable_sleep_mode", None) and getattr(args, "vllm_gpu_memory_utilization", None) is None:
        raise MemlabError("--vllm-enable-sleep-mode puts a colocated vLLM engine to sleep; add "
                          "--vllm-gpu-memory-utilization 0.3 (its share of the card)")
    if args.bf16 == "on" and args.fp16 == "on":
        raise MemlabError("--bf16 on and --fp16 on ask two autocast dtypes; write one of them")
    if args.optim is not None:
        _check_optim(args.optim)
    quantized = [_flag(name) for name in _LOAD_OPTIONS if getattr(args, name, False)]
    if quantized and args.lora is None:
        raise MemlabError(f"{quantized[0]} loads a quantized base, which trains adapters only; add --lora 16 "
                          "(QLoRA with --load-in-4bit)")
    _check_tries(args)
    plain = {"--gpus": args.gpus is not None,
             "--strategy": args.strategy not in (None, "none"), "--max-tokens": bool(args.max_tokens),
             "--max-rows": bool(args.max_rows), "--batch": args.batch is not DEFAULT_BATCH}
    for option, set_ in plain.items():
        if set_:
            instead = {"--batch": "--per-device-train-batch-size 8 and --prompt-length 64"}.get(
                option, "the question without it")
            raise MemlabError(f"{option} is not answered with --trainer {args.trainer} yet; write {instead}, or build "
                              "the trainer in Python: memlab.estimate(memlab.trainer_on_meta(...), gpu=...)")


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
    vllm = [name for name in ("vllm_memory", "vllm_sleep") if name in axes]
    if vllm and trainer == "grpo":
        raise MemlabError(f"--try {vllm[0]}=... is a setting of the colocated vLLM engine; write "
                          "--vllm-gpu-memory-utilization 0.3 (and --vllm-enable-sleep-mode to put it to sleep while "
                          "the policy trains)")
    for name in axes:  # a built trainer's setting (the lever's needs_trainer) of the other --trainer
        needs = REGISTRY[name].needs_trainer
        owner = next((option for option, cls in TRAINER_CLASSES.items() if cls in needs), trainer)
        if owner != trainer:
            raise MemlabError(f"--try {name}=... is a setting of --trainer {owner} ({needs}), not --trainer "
                              f"{trainer}; leave it out, or write --trainer {owner}")


def _load(args: argparse.Namespace) -> dict[str, Any]:
    """The ``from_pretrained`` keywords the load options say (:func:`memlab.frontends.load_cli.load_from_args`),
    the policy in bf16 where ``--dtype`` is not given."""
    import torch

    from memlab.frontends.load_cli import load_from_args

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
    """The TRL config's keywords the options set (TRL's defaults for the others), checked against the model, and the
    prompt's length (``"prompt_length"``: None for SFT on plain text)."""
    settings: dict[str, Any] = {}
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "beta", "optim", "packing",
                 "padding_free", "use_liger_kernel"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    for name in ("gradient_checkpointing", "completion_only_loss", "bf16", "fp16"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name) == "on"
    if settings.get("fp16") and "bf16" not in settings:
        settings["bf16"] = False  # TRL's default bf16 gives way to the fp16 asked
    positions = _positions(config)
    prompt: int | None
    if args.trainer == "grpo":
        for name in ("num_generations", "max_completion_length"):
            if getattr(args, name) is not None:
                settings[name] = getattr(args, name)
        prompt = args.prompt_length or 64
        completion = settings.get("max_completion_length", 512)
        if positions is not None and prompt + completion > positions:
            said = "" if args.prompt_length else " (the default)"
            said_too = "" if args.max_completion_length else " (TRL's default)"
            raise MemlabError(f"--prompt-length {prompt}{said} and --max-completion-length {completion}{said_too} "
                              "make sequences of "
                              f"{prompt + completion} tokens, more than the model's {positions} positions; write "
                              f"--max-completion-length {max(1, positions - prompt)} or less")
        if args.vllm_gpu_memory_utilization is not None:
            settings.update(use_vllm=True, vllm_mode="colocate",
                            vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                            vllm_enable_sleep_mode=bool(args.vllm_enable_sleep_mode))
    else:
        length = args.max_length or 1024
        prompt = args.prompt_length or (length // 2 if args.trainer == "dpo" else None)
        if prompt is not None and prompt >= length:
            raise MemlabError(f"--prompt-length {prompt} leaves no answer within --max-length {length}; write "
                              f"--prompt-length {max(1, length // 2)}")
        if positions is not None and length > positions:
            raise MemlabError(f"--max-length {length} is more than the model's {positions} positions; write "
                              f"--max-length {positions} or less")
        settings["max_length"] = length
    if args.trainer == "sft" and settings.get("completion_only_loss") and prompt is None:
        raise MemlabError("--completion-only-loss on needs prompt and completion examples; add --prompt-length 64 "
                          "(the prompt's tokens; the completion fills --max-length)")
    settings["prompt_length"] = prompt
    return settings


def _zero_reward(completions: list[Any], **_: Any) -> list[float]:
    return [0.0 for _ in completions]


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
        import trl
    except ImportError as error:
        raise MemlabError(f"--trainer {args.trainer} needs TRL and peft, and {error.name} is not installed; write pip "
                          "install trl peft") from None
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
    config_class: Any = {"sft": trl.SFTConfig, "dpo": trl.DPOConfig, "grpo": trl.GRPOConfig}[args.trainer]
    trainer_class: Any = getattr(trl, TRAINER_CLASSES[args.trainer])
    if args.lora is not None:
        keywords["peft_config"] = peft.LoraConfig(r=args.lora, lora_alpha=2 * args.lora, target_modules="all-linear")
    if args.trainer == "dpo" and args.lora is None:
        raise MemlabError("--trainer dpo on a model built on the meta device needs adapters (its reference model is "
                          "then the policy with its adapters off); add --lora 16")
    if args.trainer == "grpo":
        assert prompt is not None
        data = [{"prompt": _text(tokenizer, prompt, i)} for i in range(count)]
        keywords["reward_funcs"] = _zero_reward
    elif args.trainer == "dpo":
        assert prompt is not None
        answer = settings["max_length"] - prompt
        data = [{"prompt": _text(tokenizer, prompt, i), "chosen": " " + _text(tokenizer, answer, i + 1),
                 "rejected": " " + _text(tokenizer, answer, i + 2)} for i in range(count)]
    elif prompt is not None:  # SFT on prompt and completion examples, each as long as --max-length allows
        data = [{"prompt": _text(tokenizer, prompt, i),
                 "completion": " " + _text(tokenizer, settings["max_length"] - prompt, i + 1)} for i in range(count)]
    # A completion starts after a space, as text does: the prompt's last word and the completion's first would
    # otherwise merge into one token, which TRL warns of and cuts from the prompt.
    else:  # SFT on plain text: each example as long as --max-length, the costliest rows (packed or not)
        data = [{"text": _text(tokenizer, settings["max_length"], i)} for i in range(count)]
    try:
        trl_args = config_class(**common, **settings)
        with _vllm_stand_in(settings.get("use_vllm", False)):
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


class _vllm_stand_in:  # noqa: N801 - a context manager read as a phrase
    """TRL's colocated engine replaced, while the trainer is built, by a stand-in that holds its settings where vLLM
    is not installed: memlab never generates with it (the estimate counts its share by vLLM's arithmetic,
    :mod:`memlab.kinds.grpo.vllm`)."""

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted
        self.patch: Any = None

    def __enter__(self) -> None:
        import importlib.util

        if not self.wanted or importlib.util.find_spec("vllm") is not None:
            return
        import trl.trainer.grpo_trainer as grpo_module

        from memlab.live.patching import patched

        class Engine:
            def __init__(self, **settings: Any) -> None:
                self.settings = settings

        self.patch = patched(grpo_module, VLLMGeneration=Engine)
        self.patch.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.patch is not None:
            self.patch.__exit__(*exc)


def _trl_words(message: str) -> str:
    """A TRL or memlab message about the config's fields in the command's options (a name already written as an
    option stays as it is).

    Example:
        >>> _trl_words("`max_completion_length` must be positive; or add --lora 16")
        '--max-completion-length must be positive; or add --lora 16'
    """
    import re

    message = re.sub(r"GRPOConfig\(vllm_gpu_memory_utilization=([0-9.]+)\)", r"--vllm-gpu-memory-utilization \1",
                     message)
    for name in OPTION_KINDS:
        # not after "-": "--lora" in memlab's own messages was made "----lora"
        message = re.sub(rf"(?<![-\w])`?{name}\b`?", _flag(name), message)
    return message


def keeps_whole_answer(args: argparse.Namespace) -> bool:
    """Whether ``memlab estimate`` may keep the whole answer of ``args`` under its words
    (:mod:`memlab.frontends.estimate.kept`): not a trainer's read from a folder, which reads the tokenizer's files
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

    from memlab.frontends.estimate.progress import EstimateProgress
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

    from memlab.estimation.cuda.gpus import gpu_kind
    from memlab.estimation.dryrun.adapters import loaded_weight_bytes
    from memlab.estimation.dryrun.load import model_on_meta
    from memlab.estimation.estimate import load_config
    from memlab.frontends.cli_errors import estimate_status
    from memlab.frontends.estimate.text import json_with_verdicts
    from memlab.frontends.gpu_cli import check_gpu_flags, cli_gpu, gpu_budget
    from memlab.frontends.host_cli import host_judged
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
    say(f"building the {args.trainer.upper()} trainer around the model on the meta device (shapes only, no memory)")
    suggested: list[tuple[Any, str, str | None]] = []  # (trial, command, what it changes in the training)
    with tempfile.TemporaryDirectory(prefix="memlab-trainer-") as folder:
        # Known before the trainer is built and any dry run made: the weights as loaded, which no lever lowers.
        policy = model_on_meta(config, **_load(args))
        weights = loaded_weight_bytes(policy)
        context = 0 if args.device == "cpu" else gpu_kind(cli_gpu(args)).context_bytes
        if budget is not None and weights + context > budget:
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
        for number, plan in enumerate(plans, start=1):
            said = f" plan {number} of {len(plans)}: {plan.label()}" if args.try_ else ""
            say(f"estimating the {args.trainer.upper()} step{said}")
            trials.append(memlab.estimate(trainer, plan, gpu=cli_gpu(args), device=args.device, budget=budget))
        for trial in trials:
            if trial.status == "error" and "vllm_gpu_memory_utilization=" in str(trial.error):
                raise MemlabError(_trl_words(str(trial.error)))
        report = Report(host_judged(trials, args), budget=budget)
        fits = any(report.fits(trial) for trial in report.trials)
        if budget is not None and not fits:
            from memlab.frontends.estimate.next import trainer_suggestions

            suggested = trainer_suggestions(args, trainer, own, report, say, words=_trl_words)
            if not suggested:
                suggested = _quantized_alternative(args, config, source, budget, say)
    levers = [trial for trial, _, changes in suggested if changes is None]
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
        data["trainer"] = {"kind": args.trainer, **{key: value for key, value in settings.items()}}
        data["phases"] = data["trials"][0]["phases"]
        data["peak_phase"] = data["trials"][0]["peak_phase"]
        print(json.dumps(data, indent=2, default=str), file=out)
    else:
        from memlab.frontends.estimate.text import single_text

        report = dataclasses.replace(report, suggestions=levers)
        header = _header(args, trainer.model, settings, plans, budget)
        from memlab.frontends.estimate.next import trainer_next_lines

        after = trainer_next_lines(args, suggested) if budget is not None and not fits else []
        lines = single_text(args, header, report, budget, after)
        peaks = _peak_lines(report.trials)
        at = lines.index("") if "" in lines else len(lines)
        lines[at:at] = peaks  # before the table, after the verdict and the best
        print("\n".join(lines), file=out)
    return estimate_status(fits=fits, judged=budget is not None or getattr(args, "host_budget", None) is not None,
                           errors=sum(trial.status == "error" for trial in report.trials))


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
    """The same trainer on a 4-bit base (QLoRA: :data:`memlab.frontends.trainer_floor.QUANTIZED_BASE`, computing in
    the GPU's half precision, LoRA of rank 16 where none was asked), estimated; ``[(trial, command, what it
    changes)]`` where it fits, else nothing. None for a base already quantized."""
    import copy
    import tempfile

    import memlab
    from memlab.frontends.estimate.next import largest_split, trainer_command, trainer_plan_options
    from memlab.frontends.gpu_cli import cli_gpu
    from memlab.frontends.trainer_floor import four_bit_changes
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
    from memlab.frontends.estimate.next import trainer_command
    from memlab.frontends.trainer_floor import floor_verdict, four_bit_changes, remedies

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

    from memlab.frontends.estimate.text import WIDTH, budget_words, count_text, for_gpu

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    parameters = sum(p.numel() for name, p in base.named_parameters() if "lora_" not in name)
    text = (f"{args.model}: {type(base).__name__}, {count_text(parameters)} parameters, "
            f"{_question(args, settings)}{_plans_words(plans)}{for_gpu(args)}{budget_words(args, budget)}")
    return "\n".join(textwrap.wrap(text, WIDTH, subsequent_indent="  "))


def _plans_words(plans: list[Any]) -> str:
    return f", {len(plans)} plans (--try)" if len(plans) > 1 else ""


def _peak_lines(trials: list[Any]) -> list[str]:
    """Where each plan's peak is: the phase that holds it and each phase's highest (one plan), or each plan's phase."""
    import textwrap

    from memlab.frontends.estimate.text import WIDTH

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
    parts = [f"{args.trainer.upper()}"]
    if args.trainer == "grpo":
        parts.append(f"{settings.get('num_generations', 8)} generations of up to "
                     f"{settings.get('max_completion_length', 512)} tokens after {settings['prompt_length']}-token "
                     "prompts")
    elif args.trainer == "dpo":
        parts.append(f"pairs of up to {settings['max_length']} tokens, {settings['prompt_length']}-token prompts")
    else:
        how = ", packed" if settings.get("packing") else ", padding-free" if settings.get("padding_free") else ""
        what = (f"{settings['prompt_length']}-token prompts and their completions"
                if settings["prompt_length"] is not None else "text")
        parts.append(f"{what} of up to {settings['max_length']} tokens{how}")
    parts.append(f"batch {batch} x {steps} accumulation steps")
    if args.trainer != "sft":
        parts.append(f"beta {settings.get('beta', 0.0 if args.trainer == 'grpo' else 0.1):g}")
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
    if settings.get("use_vllm"):
        parts.append(f"vLLM share {settings['vllm_gpu_memory_utilization']:g}"
                     + (" (sleeps while training)" if settings.get("vllm_enable_sleep_mode") else ""))
    return ", ".join(parts)


def _phase_peaks(trial: Any) -> dict[str, int]:
    """The highest total of each named phase of ``trial``'s timeline (a phase that repeats, per micro-batch, once)."""
    return {} if trial.timeline is None else trial.timeline.phase_peaks()
