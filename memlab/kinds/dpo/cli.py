"""What a DPOTrainer adds to ``memlab estimate MODEL --trainer dpo``: ``--max-length`` and ``--beta``, pairs of a
prompt and two answers as its stand-in dataset, and ``precompute_ref`` asked with ``--try``.

Example:
    >>> DPO_CLI.word, [option.name for option in DPO_CLI.options]
    ('dpo', ['max_length', 'beta'])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memlab.errors import MemlabError
from memlab.kinds.options import BETA, MAX_LENGTH, max_length_settings
from memlab.live.trainer_kinds import CliWords, TrainerCli

__all__ = ["DPO_CLI"]


def _settings(args: Any, positions: int | None) -> dict[str, Any]:
    settings = {"beta": args.beta} if args.beta is not None else {}
    length = args.max_length or 1024
    return {**settings, **max_length_settings(args, positions, args.prompt_length or length // 2)}


def _examples(args: Any, settings: dict[str, Any], tokenizer: Any, text: Callable[[int, int], str],
              count: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    if args.lora is None:
        raise MemlabError("--trainer dpo on a model built on the meta device needs adapters (its reference model is "
                          "then the policy with its adapters off); add --lora 16")
    prompt = settings["prompt_length"]
    answer = settings["max_length"] - prompt
    # An answer starts after a space, as text does (the prompt's last word and its first would merge).
    return [{"prompt": text(prompt, i), "chosen": " " + text(answer, i + 1), "rejected": " " + text(answer, i + 2)}
            for i in range(count)], {}


def _question(settings: dict[str, Any]) -> CliWords:
    return CliWords(f"pairs of up to {settings['max_length']} tokens, {settings['prompt_length']}-token prompts",
                    loss=f"beta {settings.get('beta', 0.1):g}")


DPO_CLI = TrainerCli(
    "dpo", settings=_settings, examples=_examples, question=_question, options=(MAX_LENGTH, BETA),
    asks={"precompute_ref": "--trainer dpo --lora 16 --try precompute_ref=off,on"},
)
"""``--trainer dpo``: a DPOConfig from ``--max-length``, ``--prompt-length`` (half of it by default) and ``--beta``."""
