"""What an SFTTrainer adds to ``memlab estimate MODEL --trainer sft``: ``--max-length``, ``--packing``,
``--padding-free`` and ``--completion-only-loss``, plain text (or prompt and completion examples) as its stand-in
dataset.

Example:
    >>> [option.name for option in SFT_CLI.options]
    ['max_length', 'packing', 'padding_free', 'completion_only_loss']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memlab.errors import MemlabError
from memlab.kinds.options import MAX_LENGTH, max_length_settings
from memlab.live.trainer_kinds import CliOption, CliWords, TrainerCli

__all__ = ["SFT_CLI"]


def _settings(args: Any, positions: int | None) -> dict[str, Any]:
    settings: dict[str, Any] = {name: getattr(args, name) for name in ("packing", "padding_free")
                                if getattr(args, name) is not None}
    if args.completion_only_loss is not None:
        settings["completion_only_loss"] = args.completion_only_loss == "on"
    settings.update(max_length_settings(args, positions, args.prompt_length or None))
    if settings.get("completion_only_loss") and settings["prompt_length"] is None:
        raise MemlabError("--completion-only-loss on needs prompt and completion examples; add --prompt-length 64 "
                          "(the prompt's tokens; the completion fills --max-length)")
    return settings


def _examples(args: Any, settings: dict[str, Any], tokenizer: Any, text: Callable[[int, int], str],
              count: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    prompt, length = settings["prompt_length"], settings["max_length"]
    if prompt is not None:  # prompt and completion examples, each as long as --max-length allows
        # A completion starts after a space, as text does: the prompt's last word and the completion's first
        # would otherwise merge into one token, which TRL warns of and cuts from the prompt.
        return [{"prompt": text(prompt, i), "completion": " " + text(length - prompt, i + 1)}
                for i in range(count)], {}
    return [{"text": text(length, i)} for i in range(count)], {}  # plain text: the costliest rows (packed or not)


def _question(settings: dict[str, Any]) -> CliWords:
    how = ", packed" if settings.get("packing") else ", padding-free" if settings.get("padding_free") else ""
    what = (f"{settings['prompt_length']}-token prompts and their completions"
            if settings["prompt_length"] is not None else "text")
    return CliWords(f"{what} of up to {settings['max_length']} tokens{how}")


SFT_CLI = TrainerCli(
    "sft", settings=_settings, examples=_examples, question=_question, options=(
        MAX_LENGTH,
        CliOption("packing", "SFT: examples packed into rows of --max-length tokens", value="flag",
                  before="per_device_train_batch_size"),
        CliOption("padding_free", "SFT: rows concatenated without padding (TRL's padding_free=True)", value="flag",
                  before="per_device_train_batch_size"),
        CliOption("completion_only_loss", "SFT: the loss on the completion's tokens only (TRL's default: on for "
                  "prompt and completion examples)", value="on_off", before="per_device_train_batch_size"),
    ),
)
"""``--trainer sft``: an SFTConfig on plain text, or on prompt and completion examples with ``--prompt-length``."""
