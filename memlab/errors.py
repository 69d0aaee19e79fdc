"""The errors memlab raises on bad input, each with a message that says what to write instead."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable
from pathlib import Path


class MemlabError(ValueError):
    """Bad input to memlab: the message names the problem and what to write instead.

    Example:
        >>> raise MemlabError("accumulation must be >= 1; write accumulation=1 or more")
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: accumulation must be >= 1; write accumulation=1 or more
    """


class UnsupportedTechnique(MemlabError):
    """A technique cannot run on this model or device (for example bf16 on a GPU without it)."""


class MemlabWarning(UserWarning):
    """memlab's own remarks; shown even while third-party warnings are kept quiet (:func:`memlab.live.quiet.quiet`).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warnings.warn("memlab: the plan was undone first", MemlabWarning)
        >>> caught[0].category.__name__
        'MemlabWarning'
    """


_PACKAGE = str(Path(__file__).resolve().parent)


def warn_the_caller(message: str, category: type[Warning] | None = None) -> None:
    """Warn with ``message`` (a :class:`MemlabWarning` by default) at the first line outside memlab that led here,
    however many of memlab's own calls sit between (``plan.to_training_arguments()`` reaches the export through a
    seam): the user's line, as a warning's location should be.

    Example:
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_the_caller("the plan was undone first")
        >>> caught[0].category.__name__, caught[0].filename.endswith("errors.py")
        ('MemlabWarning', False)
    """
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category or MemlabWarning, stacklevel=level)


def nearest(name: str, known: Iterable[str], *, most: int = 3, cutoff: float = 0.6) -> list[str]:
    """The names among ``known`` nearest to a misspelt ``name`` (at most ``most``, the nearest first; difflib's
    likeness of at least ``cutoff``): what the user meant, for a message that asks "did you mean ...?".

    Example:
        >>> nearest("lama-7b", ["llama-7b", "llama-13b", "gpt2"])
        ['llama-7b', 'llama-13b']
        >>> nearest("nosuchknob", ["precision", "checkpointing"])
        []
    """
    import difflib

    return difflib.get_close_matches(name.lower(), list(known), n=most, cutoff=cutoff)


SHORT_LIST = 6
"""The most names an error lists whole; a longer list is named by where it is (:func:`unknown_name`)."""


def unknown_name(name: str, known: Iterable[str], what: str, listed: str) -> MemlabError:
    """The error for a ``name`` that is not ``what``: ``known`` whole where it is short (:data:`SHORT_LIST`), else
    the nearest of them (:func:`nearest`) and where the whole list is (``listed``).

    Example:
        >>> settings = ["micro_batch", "accumulation", "checkpointing", "precision", "weights", "optimizer", "offload"]
        >>> print(unknown_name("precison", settings, "a plan setting", "memlab.plan.LEVERS"))
        'precison' is not a plan setting; did you mean precision? write one of those memlab.plan.LEVERS lists, with \
their values
        >>> print(unknown_name("colour", settings, "a plan setting", "memlab.plan.LEVERS"))
        'colour' is not a plan setting, nor near one; write one of those memlab.plan.LEVERS lists, with their values
        >>> print(unknown_name("colour", ["weights", "kv_cache"], "an inference setting", "INFERENCE_LEVERS"))
        'colour' is not an inference setting; write one of weights, kv_cache
    """
    known = list(known)
    if len(known) <= SHORT_LIST:
        return MemlabError(f"{name!r} is not {what}; write one of {', '.join(known)}")
    near = nearest(name, known)
    said = f"; did you mean {' or '.join(near)}?" if near else ", nor near one;"
    return MemlabError(f"{name!r} is not {what}{said} write one of those {listed} lists, with their values")



def class_refusal(value: object, call: str, *, trainer_only: bool = False) -> MemlabError | None:
    """The error for a class given where ``memlab.<call>`` takes an object built from it (``type(model)``, or
    ``GPT2LMHeadModel`` written for ``model``), saying what to build and pass; None for anything else. The kind of
    class is read from its bases' names, so that nothing is imported: a transformers Trainer, config or model, a
    torch module. ``trainer_only``: the call takes a trainer alone (``watch``).

    Example:
        >>> import torch
        >>> print(class_refusal(torch.nn.Linear, "measure"))
        memlab.measure was given the class Linear, not a model built from it; build one and pass it: model = \
Linear(...), then memlab.measure(model, ...)
        >>> print(class_refusal(torch.nn.Linear, "watch", trainer_only=True))
        memlab.watch takes a trainer, and was given the class Linear; build the trainer and pass it: trainer = \
Trainer(model=model, args=..., train_dataset=...), then memlab.watch(trainer)
        >>> class_refusal(torch.nn.Linear(2, 2), "measure") is None
        True
    """
    if not isinstance(value, type):
        return None
    name = value.__name__
    bases = {(cls.__module__.split(".")[0], cls.__name__) for cls in value.__mro__}
    if ("transformers", "Trainer") in bases:
        built, how = "trainer", f"{name}(model=model, args=..., train_dataset=...)"
    elif trainer_only:
        return MemlabError(f"memlab.{call} takes a trainer, and was given the class {name}; build the trainer and "
                           f"pass it: trainer = Trainer(model=model, args=..., train_dataset=...), then "
                           f"memlab.{call}(trainer)")
    elif bases & {("transformers", "PreTrainedConfig"), ("transformers", "PretrainedConfig")}:
        built, how = "config", f"{name}(...) (or {name}.from_pretrained(name_or_path))"
    elif ("transformers", "PreTrainedModel") in bases:
        built, how = "model", f"{name}(config) (or {name}.from_pretrained(name_or_path))"
    else:
        built, how = "model", f"{name}(...)"
    return MemlabError(f"memlab.{call} was given the class {name}, not a {built} built from it; build one and pass "
                       f"it: {built} = {how}, then memlab.{call}({built}, ...)")


def refuse_class(value: object, call: str, *, trainer_only: bool = False) -> None:
    """Raise :func:`class_refusal`'s error for a class given where an object is taken, before anything is touched.

    Example:
        >>> refuse_class(object(), "measure")
        >>> refuse_class(object, "measure")
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: memlab.measure was given the class object, not a model built from it; build one \
and pass it: model = object(...), then memlab.measure(model, ...)
    """
    refusal = class_refusal(value, call, trainer_only=trainer_only)
    if refusal is not None:
        raise refusal
