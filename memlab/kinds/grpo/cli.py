"""What a GRPOTrainer adds to ``memlab estimate MODEL --trainer grpo``: its options (``--num-generations``,
``--max-completion-length``, ``--beta``, the colocated vLLM engine's share and sleep), prompts of ``--prompt-length``
tokens and a reward function that returns zeros as its stand-in dataset, and where no lever fits, the GRPOConfig
changes that do (:func:`memlab.kinds.grpo.suggest.grpo_suggestions`, each changing the training).

Example:
    >>> GRPO_CLI.word, [option.name for option in GRPO_CLI.options][:2]
    ('grpo', ['num_generations', 'max_completion_length'])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memlab.errors import MemlabError
from memlab.kinds.options import BETA
from memlab.live.trainer_kinds import CliOption, CliWords, TrainerCli

__all__ = ["GRPO_CLI"]

MULTIPLE = 64
"""The completion lengths the command's GRPOConfig changes try are multiples of this (fewer dry runs on a large
model)."""


def _settings(args: Any, positions: int | None) -> dict[str, Any]:
    settings: dict[str, Any] = {name: getattr(args, name) for name in ("beta", "num_generations",
                                                                        "max_completion_length")
                                if getattr(args, name) is not None}
    prompt = args.prompt_length or 64
    completion = settings.get("max_completion_length", 512)
    if positions is not None and prompt + completion > positions:
        said = "" if args.prompt_length else " (the default)"
        said_too = "" if args.max_completion_length else " (TRL's default)"
        raise MemlabError(f"--prompt-length {prompt}{said} and --max-completion-length {completion}{said_too} make "
                          f"sequences of {prompt + completion} tokens, more than the model's {positions} positions; "
                          f"write --max-completion-length {max(1, positions - prompt)} or less")
    if args.vllm_gpu_memory_utilization is not None:
        settings.update(use_vllm=True, vllm_mode="colocate",
                        vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                        vllm_enable_sleep_mode=bool(args.vllm_enable_sleep_mode))
        if args.vllm_tensor_parallel_size is not None:
            settings["vllm_tensor_parallel_size"] = args.vllm_tensor_parallel_size
    if args.vllm_mode == "server":
        settings.update(use_vllm=True, vllm_mode="server")
    settings["prompt_length"] = prompt
    return settings


def _zero_reward(completions: list[Any], **_: Any) -> list[float]:
    return [0.0 for _ in completions]


def _examples(args: Any, settings: dict[str, Any], tokenizer: Any, text: Callable[[int, int], str],
              count: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return [{"prompt": text(settings["prompt_length"], i)} for i in range(count)], {"reward_funcs": _zero_reward}


def _question(settings: dict[str, Any]) -> CliWords:
    engine = ""
    if settings.get("vllm_mode") == "server":
        engine = "generating on a vLLM server"
    elif settings.get("use_vllm"):
        engine = (f"vLLM share {settings['vllm_gpu_memory_utilization']:g}"
                  + (" (sleeps while training)" if settings.get("vllm_enable_sleep_mode") else ""))
    return CliWords(f"{settings.get('num_generations', 8)} generations of up to "
                    f"{settings.get('max_completion_length', 512)} tokens after {settings['prompt_length']}-token "
                    "prompts", loss=f"beta {settings.get('beta', 0.0):g}", engine=engine)


_SERVER = (
    CliOption("vllm_server_gpu", "GRPO with --vllm-mode server: the server's GPU kind (default: --gpu's)",
              metavar="GPU", value="text", example="H100-80GB"),
    CliOption("vllm_server_tensor_parallel_size", "GRPO with --vllm-mode server: trl vllm-serve's "
              "--tensor-parallel-size (default 1)", metavar="N", example="1"),
    CliOption("vllm_server_data_parallel_size", "GRPO with --vllm-mode server: trl vllm-serve's "
              "--data-parallel-size (default 1)", metavar="N", example="1"),
    CliOption("vllm_server_gpu_memory_utilization", "GRPO with --vllm-mode server: trl vllm-serve's "
              "--gpu-memory-utilization (default 0.9)", metavar="SHARE", value="fraction", example="0.9"),
    CliOption("vllm_server_max_model_len", "GRPO with --vllm-mode server: trl vllm-serve's --max-model-len "
              "(default: the model's)", metavar="TOKENS", example="4096"),
)
"""The options of the ``trl vllm-serve`` command a served trainer generates on (its GRPOConfig holds none of them)."""
_SERVER_OPTIONS = tuple(option.name for option in _SERVER)


def _check(args: Any) -> None:
    if getattr(args, "vllm_enable_sleep_mode", None) and getattr(args, "vllm_gpu_memory_utilization", None) is None:
        raise MemlabError("--vllm-enable-sleep-mode puts a colocated vLLM engine to sleep; add "
                          "--vllm-gpu-memory-utilization 0.3 (its share of the card)")
    if getattr(args, "vllm_tensor_parallel_size", None) is not None and getattr(
            args, "vllm_gpu_memory_utilization", None) is None:
        raise MemlabError("--vllm-tensor-parallel-size spreads a colocated vLLM engine over several ranks; add "
                          "--vllm-gpu-memory-utilization 0.3 (its share of each card) and --gpus 8 --strategy zero3 "
                          "(or --vllm-server-tensor-parallel-size for a trl vllm-serve server)")
    mode = getattr(args, "vllm_mode", None)
    if mode not in (None, "colocate", "server"):
        raise MemlabError(f"--vllm-mode {mode} is not one TRL runs; write --vllm-mode server (a trl vllm-serve "
                          "server's GPUs) or --vllm-gpu-memory-utilization 0.3 (an engine colocated on the card)")
    if mode == "colocate" and getattr(args, "vllm_gpu_memory_utilization", None) is None:
        raise MemlabError("--vllm-mode colocate shares the card with a vLLM engine; add "
                          "--vllm-gpu-memory-utilization 0.3 (its share of the card)")
    if mode == "server" and getattr(args, "vllm_gpu_memory_utilization", None) is not None:
        raise MemlabError("--vllm-gpu-memory-utilization is the share of a colocated engine, and --vllm-mode server "
                          "generates on the server's own GPUs; write --vllm-server-gpu-memory-utilization 0.9 (trl "
                          "vllm-serve's --gpu-memory-utilization) instead")
    given = [name for name in _SERVER_OPTIONS if getattr(args, name, None) is not None]
    if given and mode != "server":
        raise MemlabError(f"--{given[0].replace('_', '-')} is a setting of the trl vllm-serve server a trainer "
                          "generates on; add --vllm-mode server")


def _estimate_keywords(args: Any) -> dict[str, Any]:
    """A served trainer's server (``vllm_server=``), from the ``--vllm-server-*`` options (trl vllm-serve's
    defaults for the rest)."""
    if getattr(args, "vllm_mode", None) != "server":
        return {}
    from memlab.techniques.vllm import VLLMServer

    given = {name.removeprefix("vllm_server_"): getattr(args, name) for name in _SERVER_OPTIONS
             if getattr(args, name, None) is not None}
    return {"vllm_server": VLLMServer(**given)}


def _changes(trainer: Any, plan: Any, budget: int, estimate: dict[str, Any],
             say: Any) -> list[tuple[Any, dict[str, Any], str, str]]:
    """The GRPOConfig changes estimated to fit with ``plan`` (:func:`memlab.kinds.grpo.suggest.grpo_suggestions`):
    each trial, the options it changes, the option in words and what it changes in the training."""
    from memlab.kinds.grpo.suggest import grpo_suggestions

    completion = int(trainer.max_completion_length)
    lengths = (completion - 1) // MULTIPLE if completion > MULTIPLE else completion - 1
    say.expect(2 + max(1, lengths).bit_length() + max(0, int(trainer.num_generations) - 2))
    say("estimating GRPOConfig changes that change the training (beta 0, a shorter max_completion_length, fewer "
        "num_generations)")
    found, _ = grpo_suggestions(trainer, plan, budget=budget, device=estimate["device"], lr=1e-5, gpu=estimate["gpu"],
                                multiple=MULTIPLE)
    changed = []
    for trial in found:
        note = trial.notes[0]
        name, value = note.split("(", 1)[1].split(")", 1)[0].split("=", 1)
        changes: dict[str, Any] = {name: float(value) if name == "beta" else int(value)}
        if name == "num_generations":  # the same prompts per step: the rows per device follow
            rows = int(trainer.args.per_device_train_batch_size) * int(value) // int(trainer.num_generations)
            changes["per_device_train_batch_size"] = rows
        flag = "--" + name.replace("_", "-")
        option = f"{flag} {float(value):g}" if name == "beta" else f"{flag} {value}"
        changed.append((trial, changes, option, note.split("changes the training: ", 1)[-1]))
    return changed


class _vllm_stand_in:  # noqa: N801 - a context manager read as a phrase
    """TRL's colocated engine replaced, while the trainer is built, by a stand-in that holds its settings where vLLM
    is not installed: memlab never generates with it (the estimate counts its share by vLLM's arithmetic,
    :mod:`memlab.kinds.grpo.vllm`)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.wanted = bool(settings.get("use_vllm", False))
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
                # a served trainer asks its server's logprobs mode while it is built (TRL 1.16)
                info = {"model_config": {"logprobs_mode": "processed_logprobs"}}
                self.vllm_client = type("Client", (), {"get_server_info": staticmethod(lambda: info)})()

        self.patch = patched(grpo_module, VLLMGeneration=Engine)
        self.patch.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.patch is not None:
            self.patch.__exit__(*exc)


_VLLM = ("is a setting of the colocated vLLM engine; write --vllm-gpu-memory-utilization 0.3 (and "
         "--vllm-enable-sleep-mode to put it to sleep while the policy trains)")

GRPO_CLI = TrainerCli(
    "grpo", settings=_settings, examples=_examples, question=_question, check=_check, changes=_changes,
    building=_vllm_stand_in, estimate_keywords=_estimate_keywords,
    said_by={"vllm_memory": "vllm_gpu_memory_utilization", "vllm_sleep": "vllm_enable_sleep_mode"},
    options=(
        CliOption("num_generations", "GRPO: completions per prompt (TRL's default: 8)", metavar="N", example="8",
                  before="prompt_length"),
        CliOption("max_completion_length", "GRPO: the longest completion, in tokens (TRL's default: 512)",
                  metavar="TOKENS", example="1024", before="prompt_length"),
        BETA,
        CliOption("vllm_gpu_memory_utilization", "GRPO: generate with a vLLM engine colocated on the card, holding "
                  "this share of its memory (use_vllm=True, vllm_mode='colocate')", metavar="SHARE",
                  value="fraction", example="0.3"),
        CliOption("vllm_enable_sleep_mode", "GRPO with --vllm-gpu-memory-utilization: the engine sleeps while the "
                  "policy trains", value="flag"),
        CliOption("vllm_tensor_parallel_size", "GRPO with --vllm-gpu-memory-utilization and --gpus: the colocated "
                  "engine spans this many ranks (default 1)", metavar="N", example="2"),
        CliOption("vllm_mode", "GRPO: 'server' generates on a trl vllm-serve server's own GPUs (use_vllm=True, "
                  "vllm_mode='server'), answered for them too", metavar="MODE", value="text", example="server"),
        *_SERVER,
    ),
    asks={"vllm_memory": "--trainer grpo --vllm-gpu-memory-utilization 0.3",
          "vllm_sleep": "--trainer grpo --vllm-gpu-memory-utilization 0.3 --vllm-enable-sleep-mode"},
    tries={"vllm_memory": _VLLM, "vllm_sleep": _VLLM},
    none_fit="Next: no combination of levers memlab estimated fits, nor a GRPOConfig change (--beta 0, a shorter "
             "--max-completion-length, fewer --num-generations).",
)
"""``--trainer grpo``: a GRPOConfig from its options, prompts of ``--prompt-length`` tokens (64 by default)."""
