"""The answers of ``memlab estimate``'s dry runs, kept: on disk between asks, in memory within one ask.

A dry run of a 7B model takes seconds; the same question asked again (or a suggestion that estimates a plan the
table already did) gets the trials it made before. An answer is keyed by everything that decides it
(:meth:`Answers.key`): the model's whole config, the batch's shapes, the plan, the load, the GPU kind (every field),
the device, the sharding, the budget, the allocator assumed, the versions of the stack and a hash of memlab's own
files (memlab's version does not change between commits; its files do). What is kept is the trials as data
(:meth:`memlab.report.Trial.to_dict`), never the printed text: the words come from the code that runs. (A whole
question's printed answer is kept apart, keyed by its words, the config it read and memlab's files:
:mod:`memlab.frontends.cli.estimate.kept`.) The folder, the stack's stamp and the entries' layout are
:mod:`memlab.live.cache`'s, torch-free.

Only the command line keeps answers (:func:`answers_kept` around one ask); :func:`memlab.estimate` and every other
caller of the dry runs outside it run them as always. The folder: ``$MEMLAB_CACHE_DIR``, else
``$XDG_CACHE_HOME/memlab``, else ``~/.cache/memlab`` (:func:`cache_folder`); an entry that cannot be read is made
again, never an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from memlab.live import cache

__all__ = [
    "CACHE_ENV", "ENVIRONMENT", "STACK", "Answers", "answers_kept", "cache_folder", "dry_run_inputs", "files_hash",
    "kept", "kept_estimate", "kept_model_facts", "kept_sharded", "stack_stamp", "trial_from_row", "trial_row",
]

CACHE_ENV, ENVIRONMENT, STACK = cache.CACHE_ENV, cache.ENVIRONMENT, cache.STACK
cache_folder, files_hash = cache.cache_folder, cache.files_hash  # where answers go, and memlab's files hashed


def stack_stamp() -> dict[str, Any]:
    """What every key holds of the installed stack (:func:`memlab.live.cache.stack_stamp`, which keys every answer)."""
    return cache.stack_stamp()


_CURRENT: ContextVar[Answers | None] = ContextVar("memlab_answers", default=None)


def _config_of(model_or_config: Any) -> dict[str, Any]:
    """The whole config (its ``to_dict()``) of a transformers config, or of the meta model built from one."""
    config = getattr(model_or_config, "config", model_or_config)
    return {"class": type(model_or_config).__name__, "config_class": type(config).__name__,
            "config": config.to_dict()}


class Answers:
    """The answers of one ask: a memo that every dry run of the ask reads first, then the folder (None: no disk).

    Example:
        >>> import tempfile
        >>> answers = Answers(Path(tempfile.mkdtemp()))
        >>> key = answers.key("example", {"rows": 1})
        >>> answers.load(key) is None
        True
        >>> answers.keep(key, [{"peak_bytes": 5}])
        >>> Answers(answers.folder).load(key)  # a later ask, from the disk
        [{'peak_bytes': 5}]
    """

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.memo: dict[str, list[Any]] = {}

    def key(self, route: str, inputs: Mapping[str, Any]) -> str:
        """The key of the answer ``route`` gives ``inputs``, with the stack's stamp (:func:`stack_stamp`)."""
        return cache.answer_key(route, inputs)

    def load(self, key: str) -> list[Any] | None:
        """The rows kept under ``key``, or None (none kept, or an entry that cannot be read)."""
        if key in self.memo:
            return self.memo[key]
        rows = None if self.folder is None else cache.read_rows(self.folder, key)
        if rows is not None:
            self.memo[key] = rows
        return rows

    def keep(self, key: str, rows: list[Any]) -> None:
        """Keep ``rows`` under ``key``: in the memo, and on disk where it can be written (else only in the memo)."""
        self.memo[key] = rows
        if self.folder is not None:
            cache.write_rows(self.folder, key, rows)


@contextlib.contextmanager
def answers_kept(folder: Path | None) -> Iterator[Answers]:
    """Answers kept for the dry runs :func:`kept` makes inside: in memory, and in ``folder`` (None: in memory only).

    Example:
        >>> with answers_kept(None) as answers:
        ...     first = kept("example", {"n": 1}, lambda: [1], dump=str, restore=int)
        ...     again = kept("example", {"n": 1}, lambda: [2], dump=str, restore=int)
        >>> first, again
        ([1], [1])
    """
    answers = Answers(folder)
    token = _CURRENT.set(answers)
    try:
        yield answers
    finally:
        _CURRENT.reset(token)


def kept(route: str, inputs: Mapping[str, Any] | Callable[[], Mapping[str, Any]], make: Callable[[], list[Any]],
         *, dump: Callable[[Any], Any], restore: Callable[[Any], Any]) -> list[Any]:
    """``make()``'s answer, or the one kept for the same ``route`` and ``inputs`` (a mapping, or a function that
    makes it, called only inside :func:`answers_kept`; each row ``dump``-ed to JSON data, ``restore``-d from it);
    outside :func:`answers_kept`, ``make()`` as it is. A kept row that does not restore is made again.

    Example:
        >>> kept("example", {"n": 1}, lambda: [3], dump=str, restore=int)  # nothing kept outside answers_kept
        [3]
    """
    answers = _CURRENT.get()
    if answers is None:
        return make()
    key = answers.key(route, inputs() if callable(inputs) else inputs)
    rows = answers.load(key)
    if rows is not None:
        try:
            return [restore(row) for row in rows]
        except (TypeError, ValueError, KeyError, AttributeError):
            pass
    made = make()
    answers.keep(key, [dump(item) for item in made])
    return made


def dry_run_inputs(model_or_config: Any, batch: Any, plan: Any, **settings: Any) -> dict[str, Any]:
    """What decides a dry run of ``plan`` on ``model_or_config`` (a config, or the meta model built from one) for
    ``batch`` (shapes), with ``settings`` (``device``, ``budget``, ``load``, ``strategies``...) as they are given
    and ``gpu`` as the whole GPU kind (a described one too; the default where None), the allocator assumed beside
    them.

    Example:
        >>> from transformers import LlamaConfig
        >>> from memlab.plan import Plan
        >>> from memlab.estimation.cuda.gpus import GPUS
        >>> inputs = dry_run_inputs(LlamaConfig(num_hidden_layers=2), {"input_ids": (1, 8)}, Plan(),
        ...                         gpu=GPUS["T4-16GB"])
        >>> inputs["model"]["config"]["num_hidden_layers"], inputs["gpu"]["capability"], inputs["plan"]["precision"]
        (2, (7, 5), 'fp32')
    """
    from memlab.estimation.cuda.allocator import expandable_segments_assumed
    from memlab.estimation.cuda.gpus import kind_or_default

    return {"model": _config_of(model_or_config), "batch": batch, "plan": dataclasses.asdict(plan),
            **settings, "gpu": dataclasses.asdict(kind_or_default(settings.get("gpu"))),
            "expandable_segments": expandable_segments_assumed(),
            "environment": {name: os.environ.get(name) for name in ENVIRONMENT}}


def kept_estimate(model_or_config: Any, batch: Any, plan: Any, **settings: Any) -> list[Any]:
    """The trials of :func:`~memlab.estimation.estimate.estimate_plans` for ``plan`` alone (``settings``
    its keywords: ``budget``, ``device``, ``gpu``, ``load``), kept (:func:`kept`).

    Example:
        >>> from transformers import LlamaConfig
        >>> from memlab.plan import Plan
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        ...                      vocab_size=256)
        >>> with answers_kept(None) as answers:
        ...     first = kept_estimate(config, {"input_ids": (1, 16), "labels": (1, 16)}, Plan(), device="cpu")
        ...     again = kept_estimate(config, {"input_ids": (1, 16), "labels": (1, 16)}, Plan(), device="cpu")
        >>> again == first, len(answers.memo)
        (True, 1)
    """
    from memlab.estimation.estimate import estimate_plans  # the entry's name for it, which tests may replace

    return kept("one GPU", lambda: dry_run_inputs(model_or_config, batch, plan, **settings),
                lambda: estimate_plans(model_or_config, batch, [plan], **settings).trials,
                dump=trial_row, restore=trial_from_row)


def kept_sharded(model_or_config: Any, batch: Any, plan: Any, *, say: Callable[[str], None] | None = None,
                 **settings: Any) -> list[Any]:
    """The rows ``(plan, strategy, trial)`` of :func:`~memlab.estimation.sharded.per_gpu.sharded_trials` for
    ``plan`` alone (``settings`` its keywords: ``gpus``, ``strategies``, ``budget``, ``device``, ``gpu``,
    ``load``), kept (:func:`kept`); ``say`` is told each dry run made.

    Example:
        >>> from transformers import LlamaConfig
        >>> from memlab.plan import Plan
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        ...                      vocab_size=256)
        >>> with answers_kept(None):
        ...     rows = kept_sharded(config, {"input_ids": (1, 16), "labels": (1, 16)}, Plan(), gpus=2,
        ...                         strategies=["zero3"], device="cpu")
        ...     again = kept_sharded(config, {"input_ids": (1, 16), "labels": (1, 16)}, Plan(), gpus=2,
        ...                          strategies=["zero3"], device="cpu")
        >>> [(name, trial.label) for _, name, trial in again], again == rows
        ([('zero3', 'zero3 x2')], True)
    """
    from memlab.estimation.sharded.per_gpu import sharded_trials

    return kept("sharded", lambda: dry_run_inputs(model_or_config, batch, plan, **settings),
                lambda: sharded_trials(model_or_config, batch, [plan], say=say, **settings),
                dump=lambda row: [row[1], None if row[2] is None else trial_row(row[2])],
                restore=lambda row: (plan, row[0], None if row[1] is None else trial_from_row(row[1])))


def kept_model_facts(config: Any, model: Any = None) -> tuple[str, int]:
    """The class name and the number of parameters (each counted once) of the meta model built from ``config``
    (``model``, where it is built already), kept (:func:`kept`): an answer asked again builds no model.

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        ...                      vocab_size=256)
        >>> kept_model_facts(config)
        ('LlamaForCausalLM', 115008)
    """
    from memlab.estimation.configs import meta_model
    from memlab.live.structure import unique_parameters

    def facts() -> list[Any]:
        built = meta_model(config) if model is None else model
        return [(type(built).__name__, sum(parameter.numel() for parameter in unique_parameters(built)))]

    called, count = kept("model", lambda: {"model": _config_of(config)}, facts, dump=list,
                         restore=lambda row: (str(row[0]), int(row[1])))[0]
    return called, count


def trial_row(trial: Any) -> dict[str, Any]:
    """A trial as JSON data: :meth:`~memlab.report.Trial.to_dict`, and a sharded trial's own fields
    (:func:`trial_from_row` reads it back).

    Example:
        >>> import json
        >>> from memlab.estimation.sharded.fsdp2 import ShardedTrial
        >>> from memlab.plan import Plan
        >>> trial = ShardedTrial(Plan(), "ok", 10, {"params": 10}, None, None, None, "cuda", gpus=8, strategy="zero3")
        >>> again = trial_from_row(json.loads(json.dumps(trial_row(trial))))
        >>> again == trial, again.label
        (True, 'zero3 x8')
    """
    row = trial.to_dict()
    row["sharded"] = ({name: getattr(trial, name) for name in ("gpus", "strategy", "detail", "model_state_bytes")}
                      if hasattr(trial, "model_state_bytes") else None)
    return row


def trial_from_row(row: Mapping[str, Any]) -> Any:
    """The trial :func:`trial_row` described (the same trial, its timeline left out)."""
    from memlab.report import Trial

    sharded = row.get("sharded")
    if sharded is None:
        return Trial.from_dict(row)
    from memlab.estimation.sharded.fsdp2 import ShardedTrial

    return dataclasses.replace(ShardedTrial.from_dict(row), **sharded)
