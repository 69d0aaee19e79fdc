"""A trainer around a model on the meta device: what ``memlab.estimate(trainer, gpu=...)`` takes for a model too large
to build, and the refusal of every entry point that runs the step for real.

A model on the meta device has its shapes and dtypes and no values (``with torch.device("meta"):
AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)``: an 8B model in a second, no memory). transformers'
Trainer moves its model to ``args.device`` as it starts, which a meta model refuses ("Cannot copy out of meta
tensor"), unless ``place_model_on_device`` is False: the Trainer's documented switch, which ``TrainingArguments``
leaves to a subclass to override (model parallelism, DeepSpeed and FSDP turn it off themselves).
:func:`trainer_on_meta` builds the trainer with a copy of the user's arguments that overrides it, and nothing else
changes: the trainer's peft config, dtypes, reward functions and datasets are the user's, and memlab estimates it as
it would the same trainer built with its weights (its dry runs copy the meta model onto fake tensors, as they do
the model of a config).

Example:
    >>> import torch
    >>> with torch.device("meta"):
    ...     model = torch.nn.Linear(2, 2)
    >>> meta_refusal(model, "measure") is not None, meta_refusal(torch.nn.Linear(2, 2), "measure")
    (True, None)
"""

from __future__ import annotations

import copy
from typing import Any

from memlab.errors import MemlabError
from memlab.live.trainer_kinds import is_trainer

__all__ = ["meta_refusal", "on_meta", "refuse_meta", "trainer_on_meta"]


def on_meta(model: Any) -> bool:
    """Whether ``model`` (a module, or a trainer's) has a parameter or buffer on the meta device.

    Example:
        >>> import torch
        >>> on_meta(torch.nn.Linear(2, 2, device="meta")), on_meta(torch.nn.Linear(2, 2)), on_meta(None)
        (True, False, False)
    """
    module = getattr(model, "model", None) if is_trainer(model) else model
    tensors = [*getattr(module, "parameters", list)(), *getattr(module, "buffers", list)()]
    return any(getattr(tensor, "device", None) is not None and tensor.device.type == "meta" for tensor in tensors)


def meta_refusal(model: Any, call: str) -> str | None:
    """What ``memlab.<call>`` says of a model (or a trainer's) on the meta device, whose step it would run for real:
    that it has no values to run, and the estimate to write instead; None for any other model.

    Example:
        >>> import torch
        >>> print(meta_refusal(torch.nn.Linear(2, 2, device="meta"), "compare"))  # doctest: +ELLIPSIS
        memlab.compare runs the step for real, and this Linear's weights are on the meta device...
    """
    if not on_meta(model):
        return None
    trainer = is_trainer(model)
    name = type(getattr(model, "model", None) if trainer else model).__name__
    asked = "trainer" if trainer else "model, {'input_ids': (rows, tokens), 'labels': (rows, tokens)}, plan"
    instead = f"memlab.estimate({asked}, gpu='H100-80GB') (or another gpu=)"
    if call == "fit":
        instead += " or memlab.fit(..., dry_run=True)"
    return (f"memlab.{call} runs the step for real, and this {name}'s weights are on the meta device (shapes, no "
            f"values); estimate it instead, nothing runs: {instead}; to measure, load the weights (from_pretrained) "
            "and build it again")


def refuse_meta(model: Any, call: str) -> None:
    """Raise :func:`meta_refusal`'s MemlabError for a model on the meta device, before anything is touched.

    Example:
        >>> import torch
        >>> refuse_meta(torch.nn.Linear(2, 2), "measure")
    """
    refusal = meta_refusal(model, call)
    if refusal is not None:
        raise MemlabError(refusal)


def trainer_on_meta(trainer_class: type, /, *, model: Any, args: Any, **keywords: Any) -> Any:
    """``trainer_class(model=model, args=..., **keywords)`` built around a ``model`` on the meta device, for
    :func:`memlab.estimate` (``measure``, ``compare``, ``fit`` and ``apply`` refuse it: it cannot run). The Trainer
    would move the model to ``args.device`` as it starts; ``args`` is copied as a subclass of its own class whose
    ``place_model_on_device`` is False (the Trainer's documented switch), and the rest is the user's: the same
    keywords (``peft_config``, ``reward_funcs``, ``train_dataset``, ``processing_class``...) and the same settings.
    ``args`` itself is not changed.

    Raises:
        MemlabError: ``model`` not on the meta device (build the trainer as usual), or building failed on the
            meta device (a DPOTrainer without ``peft_config`` places the reference model it holds apart itself:
            pass a ``peft_config``, whose reference is the policy with its adapters off).

    Example (``tests/trainer/test_meta.py`` runs it)::

        with torch.device("meta"):
            policy = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        trainer = memlab.trainer_on_meta(trl.GRPOTrainer, model=policy, args=trl.GRPOConfig(...),
                                         reward_funcs=reward, train_dataset=prompts, processing_class=tokenizer,
                                         peft_config=peft.LoraConfig(r=16, target_modules="all-linear"))
        trial = memlab.estimate(trainer, gpu="H100-80GB")
    """
    if not isinstance(trainer_class, type) or not any(
            cls.__name__ == "Trainer" and cls.__module__.startswith("transformers.") for cls in trainer_class.__mro__):
        raise MemlabError(f"trainer_on_meta takes a Trainer class first, not {trainer_class!r}; write "
                          "memlab.trainer_on_meta(trl.GRPOTrainer, model=policy, args=trl.GRPOConfig(...), ...)")
    if isinstance(model, type):  # a class given for the model: one error, not Module.parameters()'s
        raise MemlabError(f"trainer_on_meta takes a model on the meta device as model=, and was given the class "
                          f"{model.__name__}; write model=memlab.model_on_meta(config or name, dtype=...) (the model "
                          "built on the meta device as from_pretrained loads it)")
    if not on_meta(model):
        raise MemlabError(
            f"this {type(model).__name__} is not on the meta device; build its trainer as usual and estimate it "
            "(memlab.estimate(trainer)), or build the model on the meta device first: with torch.device('meta'): "
            "policy = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)")
    if getattr(args, "place_model_on_device", None) is False:
        placed = args  # already the user's own subclass (or a copy made here before)
    else:
        kept = type(args)
        subclass = type(kept.__name__, (kept,), {
            "place_model_on_device": property(lambda self: False, doc="False: the model is on the meta device"),
            "__module__": __name__, "__qualname__": kept.__qualname__})
        placed = copy.copy(args)
        placed.__class__ = subclass
    try:
        return trainer_class(model=model, args=placed, **keywords)
    except NotImplementedError as error:
        if "meta tensor" not in str(error):
            raise
        raise MemlabError(
            f"building the {trainer_class.__name__} moved a model off the meta device ({str(error).split('!')[0]}): "
            "TRL places a reference model it holds apart itself (a DPOTrainer without peft_config); pass a "
            "peft_config, whose reference is the policy with its adapters off, or estimate the policy's config "
            "(memlab.estimate(config, shapes, plan))") from None
