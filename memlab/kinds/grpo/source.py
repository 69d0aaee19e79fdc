"""TRL's ``GRPOTrainer`` as the live object: its step as it runs, generation first (issue 59).

A GRPO step generates before it trains: the device's generation batch (``per_device_train_batch_size x
steps_per_generation`` completions, ``num_generations`` per prompt) is sampled with transformers' ``generate`` up
to ``max_completion_length`` tokens (its KV cache and logits), scored by the reward functions, the reference
model's (and, where the config needs them, the old policy's) per-token log-probabilities computed without
gradients, and only then does the policy run forward and backward over one optimizer step's generations. memlab
runs the trainer's own ``_generate_and_score_completions`` and ``compute_loss`` for that, with:

- the worst case: the dataset's longest prompts, every completion full length (``min_new_tokens`` set to
  ``max_completion_length`` for the trial, so no early end-of-sequence shortens the KV cache or the logits);
- the step's phases named on the timeline: ``"generation"``, then ``"reference"`` (``beta != 0``) and
  ``"old-policy"`` (where TRL computes them), then the training phases;
- everything the trainer's methods change put back afterwards (its generation settings, metrics, logs, state).

Nothing here imports TRL or the runner; :mod:`memlab.kinds.grpo.step` runs the step.

Example:
    >>> GRPO_PHASES
    ('generation', 'reference', 'old-policy')
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import math
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Protocol

import torch

from memlab.errors import MemlabError
from memlab.export.trainer_arguments import check_single_process, plan_from_trainer, trainer_model
from memlab.live.batch import StepBatches
from memlab.live.patching import patched
from memlab.plan import Plan
from memlab.trainer.source import (
    accelerate_outputs_fp32,
    dry_run_models,
    fp32_outputs_forward,
    trainer_bookkeeping_kept,
)
from memlab.trainer.worst_batch import SAMPLE_DEFAULT

__all__ = ["GRPO_PHASES", "VLLM_NOT_RUN", "GRPOPrompts", "GRPOSource", "RewardFailed", "check_generations",
           "check_processes", "completion_room", "computes_old_logps", "grpo_split", "prepared_forward", "split_on"]

VLLM_NOT_RUN = (
    "memlab measures a GRPOTrainer's generation by running it, and this trainer generates with vLLM "
    "(use_vllm=True), which cannot run here (memlab does not start its engine); estimate it instead, "
    "memlab.estimate(trainer, gpu='H100-80GB') (the engine's share by vLLM's arithmetic), or fit it in a dry run, "
    "memlab.fit(trainer, budget=..., dry_run=True); or measure the step with GRPOConfig(use_vllm=False), which "
    "generates with transformers (the policy's training is the same); memlab.watch(trainer) records a real run"
)
"""Why a GRPOTrainer that generates with vLLM is not measured, and what works instead."""

GRPO_PHASES = ("generation", "reference", "old-policy")
"""The phases a GRPO step has before its training phases, in the order they run."""

# What _generate_and_score_completions and compute_loss write on the trainer; each put back after a trial.
_BOOKKEEPING = ("_metrics", "_logs", "_pending_metrics", "_pending_extra_logs")
_SCAN_CHUNK = 256


class Sections(Protocol):
    """What the step offers the generation: a category for new allocations, and named parts of the step."""

    def phase(self, category: str) -> contextlib.AbstractContextManager[None]: ...

    def section(self, name: str) -> contextlib.AbstractContextManager[Any]: ...

    def mark(self, tensors: Any, category: str) -> None: ...


class RewardFailed(MemlabError):
    """A reward function raised while a GRPO trial scored its completions: the user's code, not the plan's."""


@dataclass
class GRPOSource:
    """What memlab takes from a live GRPOTrainer.

    Attributes:
        trainer: the trainer.
        model: its policy, unwrapped.
        plan: the trainer as set up (:meth:`memlab.Plan.from_trainer`).
        generations: completions per optimizer step on this device (``per_device_train_batch_size x
            gradient_accumulation_steps``): the rows the policy trains on.
        generation_batch: completions generated at once (``per_device_train_batch_size x steps_per_generation``).
        examples: the generation batch's dataset rows (the longest prompts, each ``num_generations`` times).
        prompt_tokens: the longest prompt's tokens, as the trainer tokenizes it.
        completion_tokens: ``max_completion_length``.
        note: which prompts, how found, and the full-length completions, for the trial's notes.
        failure: the reward function's failure in the last trial, if one raised.
    """

    trainer: Any
    model: Any
    plan: Plan
    generations: int
    generation_batch: int
    examples: list[Any]
    prompt_tokens: int
    completion_tokens: int
    note: str
    failure: RewardFailed | None = field(default=None)

    @classmethod
    def from_trainer(cls, trainer: Any, *, vllm: bool = False, within_positions: bool = True,
                     sharded: bool = False) -> GRPOSource:
        """Read a GRPOTrainer and find its worst generation batch; nothing on it changes. ``vllm=True``: a trainer
        that generates with vLLM is taken too (an estimate, which counts the engine's share by vLLM's arithmetic:
        :mod:`memlab.kinds.grpo.vllm`); a measurement runs the generation, so it refuses one.
        ``within_positions=False`` takes completions past the model's positions (``limits``, which reads the prompts
        to find the longest completion that fits). ``sharded=True``: a trainer set up for DeepSpeed or FSDP is taken
        (the per-GPU estimate: each rank generates and trains on the same per-device batch as one GPU would).

        Raises:
            MemlabError: a vLLM engine where the generation runs (``vllm=False``), a custom rollout, several
                processes (without ``sharded``), a dataset without prompts, or completions that reach past the
                model's positions.
        """
        args = trainer.args
        if not sharded:
            check_single_process(args)
        if getattr(trainer, "use_vllm", False) and not vllm:
            raise MemlabError(VLLM_NOT_RUN)
        if getattr(trainer, "rollout_func", None) is not None or getattr(trainer, "environment_factories", None):
            raise MemlabError(
                "memlab runs a GRPOTrainer's own generation, and this one generates through a rollout_func or "
                "environments, which memlab does not call outside training; memlab.watch(trainer) measures it "
                "during trainer.train()"
            )
        per_device, steps = int(args.per_device_train_batch_size), int(args.gradient_accumulation_steps)
        per_generation = int(args.steps_per_generation)
        generations = per_device * steps
        # TRL generates per_device x steps_per_generation completions at once; one optimizer step trains on the
        # first of them (steps_per_generation >= accumulation) or on several rounds of them (fewer).
        generation_batch = per_device * max(per_generation, 1)
        # a rank's share of the generation batch may end inside a prompt's group: that prompt counted whole
        prompts = -(-generation_batch // trainer.num_generations)
        examples, lengths, scanned = _longest_prompts(trainer, prompts)
        completion = int(trainer.max_completion_length)
        if within_positions:
            _check_positions(trainer_model(trainer), max(lengths), completion)
        rows = sorted({index for index, _ in examples})
        note = (f"generated from the train dataset's {len(rows)} longest prompt(s) (rows "
                f"{', '.join(str(i) for i in rows[:8])}{'...' if len(rows) > 8 else ''}, {max(lengths)} tokens; "
                f"scanned {scanned:,} examples), {trainer.num_generations} completions each, every completion "
                f"forced to max_completion_length={completion} tokens (the worst case: no early end-of-sequence)")
        repeated = [example for _, example in examples for _ in range(trainer.num_generations)][:generation_batch]
        return cls(trainer, trainer_model(trainer), plan_from_trainer(trainer), generations, generation_batch,
                   repeated, max(lengths), completion, note)

    def prompts_batch(self) -> GRPOPrompts:
        """The runner's batch: the step's rows as placeholders (see :class:`GRPOPrompts`)."""
        return GRPOPrompts(self)

    def loss_fn(self) -> Callable[[Any, Any], Any]:
        """``loss_fn(model, micro_batch)``: the trainer's ``compute_loss`` on a micro-batch of generations, its
        token count as ``num_items_in_batch`` (memlab scales the loss for accumulation itself); under mixed precision
        the outputs copied to fp32 as accelerate does (:func:`~memlab.trainer.source.accelerate_outputs_fp32`)."""
        trainer = self.trainer

        def loss_fn(model: Any, micro_batch: Any) -> Any:
            inputs = dict(micro_batch)
            inputs["num_items_in_batch"] = inputs["completion_mask"].sum()
            context = getattr(trainer, "compute_loss_context_manager", contextlib.nullcontext)
            with trainer_bookkeeping_kept(trainer), dry_run_models(trainer, model), context(), \
                    accelerate_outputs_fp32(model):
                return trainer.compute_loss(model, inputs)

        return loss_fn

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """The trainer set to generate full-length completions for a session of trials, and put back exactly after:
        ``min_new_tokens`` in its generation config and kwargs, ``current_gradient_accumulation_steps`` (which
        ``compute_loss`` reads and only ``train()`` sets), its metrics, logs and state."""
        trainer = self.trainer
        # A trainer that generates with vLLM has no generation config (its SamplingParams are vLLM's).
        config = getattr(trainer, "generation_config", None) or SimpleNamespace(min_new_tokens=None)
        kwargs = getattr(trainer, "generation_kwargs", None)
        kwargs = kwargs if isinstance(kwargs, dict) else None
        saved_kwargs = dict(kwargs) if kwargs is not None else None
        saved_state = copy.deepcopy(vars(trainer.state))
        saved = {name: copy.deepcopy(getattr(trainer, name)) for name in _BOOKKEEPING if hasattr(trainer, name)}
        with (patched(config, min_new_tokens=self.completion_tokens),
              patched(trainer, current_gradient_accumulation_steps=1)):  # memlab scales the loss for accumulation
            try:
                if kwargs is not None:
                    kwargs["min_new_tokens"] = self.completion_tokens
                yield
            finally:
                if kwargs is not None and saved_kwargs is not None:
                    kwargs.clear()
                    kwargs.update(saved_kwargs)
                vars(trainer.state).clear()
                vars(trainer.state).update(saved_state)
                for name, contents in saved.items():
                    _put_back(trainer, name, contents)

    def generate(self, sections: Sections) -> dict[str, torch.Tensor]:
        """One optimizer step's generations as the trainer makes them (``_generate_and_score_completions``, once per
        generation batch, as many times as the step needs): generation, reward scoring, the reference and
        old-policy log-probs, each in its named section; the generated tensors then marked as the step's batch
        (``"other"``). ``num_items_in_batch`` is left out (each micro-batch counts its own).

        Raises:
            RewardFailed: a reward function raised; it is named (also kept as :attr:`failure`).
        """
        trainer = self.trainer
        old_first = computes_old_logps(trainer)
        calls = itertools.count()
        generate, logps, rewards = trainer._generate, trainer._get_per_token_logps_and_entropies, \
            trainer._calculate_rewards

        def generating(*args: Any, **kwargs: Any) -> Any:
            with sections.section("generation"):
                return generate(*args, **kwargs)

        def log_probs(*args: Any, **kwargs: Any) -> Any:
            if torch.is_grad_enabled():  # the policy's forward in compute_loss: the training phases' own
                return logps(*args, **kwargs)
            name = "old-policy" if old_first and next(calls) == 0 else "reference"
            with sections.section(name):
                return logps(*args, **kwargs)

        def scored(*args: Any, **kwargs: Any) -> Any:
            try:
                return rewards(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - the user's reward function: said as what to fix
                self.failure = _reward_failure(trainer, error)
                raise self.failure from None

        patches = {"_generate": generating, "_get_per_token_logps_and_entropies": log_probs,
                   "_calculate_rewards": scored}
        self.failure = None
        with patched(trainer, **patches), sections.phase("activations"):
            was_training = trainer.model.training
            trainer.model.train()  # TRL generates in training mode ("train" metrics, num_generations)
            rounds: list[dict[str, torch.Tensor]] = []
            try:
                while len(rounds) * self.generation_batch < self.generations:  # each round's KV cache let go
                    output = trainer._generate_and_score_completions(list(self.examples))
                    output.pop("num_items_in_batch", None)
                    rounds.append({key: value for key, value in output.items() if isinstance(value, torch.Tensor)})
                    sections.mark(list(rounds[-1].values()), "other")
                    del output
            finally:
                trainer.model.train(was_training)
        if len(rounds) == 1:
            return rounds[0]
        return {key: torch.cat([part[key] for part in rounds]) for key in rounds[0]}


class GRPOPrompts(StepBatches):
    """A GRPO trial's batch before generation: ``rows x (prompt + completion)`` placeholders, one stored element
    each (an expanded view), so that the runner counts rows and tokens and holds no memory the real step would
    not; the GRPO workload generates the real batch in each step (``source``).

    Example:
        >>> from types import MethodType, SimpleNamespace
        >>> prompts = GRPOPrompts(SimpleNamespace(generations=4, prompt_tokens=5, completion_tokens=3))
        >>> part = prompts.micro_batches(2, 2)[0]["input_ids"]
        >>> tuple(part.shape), part.untyped_storage().nbytes()
        ((2, 8), 8)
    """

    def __init__(self, source: Any) -> None:
        width = source.prompt_tokens + source.completion_tokens

        def make(rows: int, steps: int) -> list[Any]:
            return [{"input_ids": torch.zeros(1, 1, dtype=torch.long).expand(rows, width)} for _ in range(steps)]

        super().__init__(make, source.generations, f"{source.generations} generations of {width} tokens")
        self.source = source

    @property
    def trainer(self) -> Any:
        """The GRPOTrainer whose step makes the real batch (:class:`~memlab.live.trainer_kinds.OwnBatch`): an entry
        point given these prompts alone (the panel's) runs that trainer's own step."""
        return self.source.trainer


def check_generations(plan: Plan, source: Any) -> None:
    """Refuse a plan whose step would train on other than the trainer's generations per optimizer step (its
    generation is the trainer's, and so is the number of completions it makes).

    Example:
        >>> from types import MethodType, SimpleNamespace
        >>> check_generations(Plan(micro_batch=2, accumulation=2), SimpleNamespace(generations=4))
        >>> check_generations(Plan(micro_batch=8), SimpleNamespace(generations=4))
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: a plan on this GRPOTrainer trains on its 4 generations per optimizer step ...
    """
    if plan.micro_batch is not None and plan.micro_batch * plan.accumulation != source.generations:
        raise MemlabError(
            f"a plan on this GRPOTrainer trains on its {source.generations} generations per optimizer step "
            f"(per_device_train_batch_size x gradient_accumulation_steps), and micro_batch={plan.micro_batch} x "
            f"accumulation={plan.accumulation} is {plan.micro_batch * plan.accumulation}; write "
            f"memlab.Plan(accumulation=k) with k dividing {source.generations}, or change the trainer's GRPOConfig"
        )
    generation_batch = getattr(source, "generation_batch", None)
    if plan.micro_batch is not None and generation_batch and generation_batch % plan.micro_batch:
        raise MemlabError(
            f"this GRPOTrainer generates {generation_batch} completions at once (its generation_batch_size), which "
            f"micro_batch={plan.micro_batch} generations per device does not divide: TRL then trains on them "
            f"steps_per_generation={generation_batch}/{plan.micro_batch} micro-batches at a time; write a micro_batch "
            f"that divides both {generation_batch} and {source.generations} (memlab.Plan(accumulation=k), k = "
            f"{source.generations} / micro_batch)"
        )


def check_processes(args: Any, gpus: int) -> None:
    """TRL's checks of a GRPOConfig's batches (TRL 1.16, ``GRPOConfig.__post_init__``) for ``gpus`` processes, which
    TRL made for the processes the config was built in: the generation batch (``per_device_train_batch_size x
    processes x steps_per_generation``, its ``generation_batch_size``) holds whole prompt groups of
    ``num_generations``, and so does the evaluation's (``per_device_eval_batch_size x processes``, of
    ``num_generations_eval``) where the config evaluates. ``steps_per_generation`` is read as the config holds it
    (a script that sets ``generation_batch_size`` instead is held to it in the message).

    Raises:
        MemlabError: a batch that ``gpus`` processes make which num_generations does not divide; it says which numbers
            to write.

    Example:
        >>> from types import SimpleNamespace
        >>> args = SimpleNamespace(per_device_train_batch_size=1, steps_per_generation=1, num_generations=8,
        ...                        do_eval=False)
        >>> check_processes(args, 8)
        >>> check_processes(args, 4)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: this GRPOTrainer on 4 GPUs generates per_device_train_batch_size 1 x 4 processes \
x steps_per_generation 1 = 4 completions at once ... write per_device_train_batch_size=2, steps_per_generation=2, \
num_generations=4, or gpus=8 ...
    """
    per_device, per_generation = int(args.per_device_train_batch_size), int(args.steps_per_generation)
    generations = int(args.num_generations)
    strategy = str(getattr(getattr(args, "eval_strategy", "no"), "value", getattr(args, "eval_strategy", "no")))
    if getattr(args, "do_eval", False) and strategy != "no":
        evaluated = int(getattr(args, "num_generations_eval", None) or generations)
        per_eval = int(args.per_device_eval_batch_size)
        if per_eval * gpus % evaluated:
            raise MemlabError(
                f"this GRPOTrainer on {gpus} GPUs evaluates per_device_eval_batch_size {per_eval} x {gpus} processes "
                f"= {per_eval * gpus} completions at once, which num_generations_eval={evaluated} does not divide: "
                "GRPOConfig refuses it as each launched process builds it; write per_device_eval_batch_size="
                f"{_dividing(per_eval, gpus, evaluated)}, or gpus={_dividing(gpus, per_eval, evaluated)}"
            )
    total = per_device * gpus * per_generation
    if total % generations == 0:
        return
    options = [f"per_device_train_batch_size={_dividing(per_device, gpus * per_generation, generations)}",
               f"steps_per_generation={_dividing(per_generation, per_device * gpus, generations)}"]
    divisors = [d for d in range(generations - 1, 1, -1) if total % d == 0]
    options += [f"num_generations={divisors[0]}"] if divisors else []
    options.append(f"or gpus={_dividing(gpus, per_device * per_generation, generations)}")
    raise MemlabError(
        f"this GRPOTrainer on {gpus} GPUs generates per_device_train_batch_size {per_device} x {gpus} processes x "
        f"steps_per_generation {per_generation} = {total} completions at once (TRL's generation_batch_size), which "
        f"num_generations={generations} does not divide: GRPOConfig refuses it as each launched process builds it "
        f"(TRL checked it for the processes this one was built in); write {', '.join(options)} (a script that sets "
        f"generation_batch_size instead of steps_per_generation: a multiple of "
        f"{math.lcm(per_device * gpus, generations)})"
    )


def _dividing(value: int, times: int, groups: int) -> int:
    """The smallest number at least ``value`` that, times ``times``, ``groups`` divides.

    Example:
        >>> _dividing(1, 4, 8), _dividing(3, 2, 8)
        (2, 4)
    """
    step = groups // math.gcd(groups, times)
    return -(-value // step) * step


def grpo_split(args: Any, plan: Plan) -> dict[str, Any]:
    """The GRPOConfig fields that carry ``plan``'s split of the trainer's generations on a live GRPOTrainer: the
    generations per device (``per_device_train_batch_size``) and the accumulation, with the generation batch
    (``generation_batch_size``: completions generated at once, a multiple of ``num_generations`` as TRL 1.16
    requires) kept, so that ``steps_per_generation`` becomes ``generation_batch_size / micro_batch``; the
    effective batch, the prompts and the generation itself stay what they were. A plan that leaves the micro-batch
    open splits the trainer's generations per optimizer step into its ``accumulation`` (``Plan()``: all in one).

    Example:
        >>> from types import MethodType, SimpleNamespace
        >>> args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=1,
        ...                        generation_batch_size=4, steps_per_generation=1)
        >>> grpo_split(args, Plan(micro_batch=1, accumulation=4))
        {'per_device_train_batch_size': 1, 'gradient_accumulation_steps': 4, 'steps_per_generation': 4, \
'generation_batch_size': 4}
    """
    generations = int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)
    micro_batch = plan.micro_batch or max(generations // plan.accumulation, 1)
    generation_batch = int(args.generation_batch_size)
    return {"per_device_train_batch_size": micro_batch, "gradient_accumulation_steps": plan.accumulation,
            "steps_per_generation": generation_batch // micro_batch, "generation_batch_size": generation_batch}


@contextlib.contextmanager
def split_on(trainer: Any, plan: Plan) -> Iterator[None]:
    """The trainer's arguments set to ``plan``'s split (:func:`grpo_split`) for a trial, and put back after: TRL
    computes the reference and old-policy log-probs in chunks of ``per_device_train_batch_size``, so a trial of
    another split computes them as that split would.

    Example:
        >>> from types import MethodType, SimpleNamespace
        >>> args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=1,
        ...                        generation_batch_size=4, steps_per_generation=1)
        >>> trainer = SimpleNamespace(args=args)
        >>> with split_on(trainer, Plan(micro_batch=2, accumulation=2)):
        ...     args.per_device_train_batch_size
        2
        >>> args.per_device_train_batch_size, args.steps_per_generation
        (4, 1)
    """
    changes = grpo_split(trainer.args, plan)
    on_trainer = {"_train_batch_size": changes["per_device_train_batch_size"]} \
        if changes and "_train_batch_size" in vars(trainer) else {}  # the trainer's own copy, where it keeps one
    with patched(trainer.args, **changes), patched(trainer, **on_trainer):
        yield


@contextlib.contextmanager
def prepared_forward(model: Any, plan: Plan, device: torch.device) -> Iterator[None]:
    """``model``'s forward as ``trainer.train()`` runs it under a mixed-precision plan: accelerate's
    ``prepare_model`` wraps each call in autocast and copies its outputs to fp32, so TRL's generation and its
    reference / old-policy log-probs compute in bf16/fp16 there too, each forward its own autocast region (the
    weights' low-precision copies freed after each). A forward accelerate prepared already (after a ``train()``), or
    an fp32 plan, is left as it is; the model's own ``forward`` attribute comes back after.

    Example:
        >>> model = torch.nn.Linear(2, 2)
        >>> with prepared_forward(model, Plan(precision="bf16"), torch.device("cpu")):
        ...     model(torch.ones(1, 2)).dtype, torch.is_autocast_enabled("cpu")
        (torch.float32, False)
        >>> "forward" in vars(model)
        False
    """
    if plan.precision == "fp32" or "_original_forward" in vars(model):  # accelerate's mark of a prepared model
        yield
        return
    from memlab.techniques.precision import autocast

    def each_call_autocast(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)  # generate validates its keywords against the forward's signature
        def forward(*args: Any, **kwargs: Any) -> Any:
            with autocast(plan, device):
                return function(*args, **kwargs)

        return forward

    with patched(model, forward=fp32_outputs_forward(model, each_call_autocast)):
        yield


def fresh_generations(trainer: Any) -> None:
    """The GRPOTrainer starts its next ``train()`` as a new one does: no generations buffered from an earlier
    ``train()`` (cut for the old split, they would be indexed with the new ``steps_per_generation``: IndexError)
    and its micro-step count at 0, so that the first step generates (the kind's ``start_afresh``). ``undo()`` puts
    both back with the rest of the trainer's attributes (the buffer then matches the old split again).

    Example:
        >>> class Trainer:
        ...     pass
        >>> trainer = Trainer(); trainer._buffered_inputs, trainer._step = ["old"], 3
        >>> fresh_generations(trainer); trainer._buffered_inputs, trainer._step
        (None, 0)
    """
    if "_buffered_inputs" in vars(trainer):
        trainer._buffered_inputs = None
        if isinstance(vars(trainer).get("_step"), int):
            trainer._step = 0


def computes_old_logps(trainer: Any) -> bool:
    """Whether ``_generate_and_score_completions`` computes the old policy's log-probs (TRL 1.16's rule: the
    generation is reused past one optimizer step, or vLLM's importance sampling needs them).

    Example:
        >>> from types import MethodType, SimpleNamespace
        >>> args = SimpleNamespace(steps_per_generation=2, gradient_accumulation_steps=2)
        >>> computes_old_logps(SimpleNamespace(args=args, num_iterations=2))
        True
    """
    args = trainer.args
    every = args.steps_per_generation * trainer.num_iterations
    return bool(args.gradient_accumulation_steps % every != 0 or (
        getattr(trainer, "use_vllm", False) and getattr(trainer, "vllm_importance_sampling_correction", False)))


def completion_room(trainer: Any) -> int | None:
    """The tokens a completion can take past the trainer's longest prompt before the model's positions end
    (``max_position_embeddings`` less the prompt's tokens); None where the model's config does not say. The GRPO
    kind's :class:`~memlab.live.trainer_kinds.CompletionRoom`: ``memlab.limits(trainer, vary="tokens")``'s ceiling.

    Example:
        >>> completion_room(object())
        Traceback (most recent call last):
        ...
        AttributeError: 'object' object has no attribute 'args'
    """
    source = GRPOSource.from_trainer(trainer, within_positions=False)
    context = getattr(getattr(source.model, "config", None), "max_position_embeddings", None)
    if isinstance(context, int) and context > 0:
        return int(context - source.prompt_tokens)
    return None


def _longest_prompts(trainer: Any, count: int) -> tuple[list[tuple[int, Any]], list[int], int]:
    """The ``count`` dataset rows whose prompts the trainer tokenizes longest (ties: the first), their lengths, and
    how many rows were read (an iterable dataset: its first :data:`SAMPLE_DEFAULT`)."""
    dataset = trainer.train_dataset
    if dataset is None:
        raise MemlabError("the GRPOTrainer has no train_dataset; pass train_dataset=Dataset.from_list([{'prompt': "
                          "...}, ...]) to it")
    rows: Any = dataset if hasattr(dataset, "__len__") else itertools.islice(dataset, SAMPLE_DEFAULT)
    scored: list[tuple[int, int, Any]] = []
    chunk: list[tuple[int, Any]] = []
    scanned = 0

    def flush() -> None:
        prompts = []
        for index, example in chunk:
            if not isinstance(example, Mapping) or "prompt" not in example:
                keys = sorted(example) if isinstance(example, Mapping) else type(example).__name__
                raise MemlabError(f"row {index} of the GRPOTrainer's train_dataset has no 'prompt' ({keys}); a GRPO "
                                  "dataset holds prompts: write Dataset.from_list([{'prompt': text}, ...]) (or "
                                  "conversations as [{'role': 'user', 'content': text}])")
            prompts.append(example["prompt"])
        ids, _, _ = trainer._tokenize_prompts(prompts)
        scored.extend((len(tokens), index, example) for tokens, (index, example) in zip(ids, chunk, strict=True))
        chunk.clear()

    for index, example in enumerate(rows):
        chunk.append((index, example))
        scanned += 1
        if len(chunk) == _SCAN_CHUNK:
            flush()
    if chunk:
        flush()
    if not scored:
        raise MemlabError("the GRPOTrainer's train_dataset is empty; give it prompts")
    scored.sort(key=lambda item: (-item[0], item[1]))
    # A dataset with fewer prompts than a generation batch: its longest stands in for the rest (the worst case).
    picked = scored[:count] + [scored[0]] * max(count - len(scored), 0)
    return [(index, example) for _, index, example in picked], [length for length, _, _ in picked], scanned


def _reward_failure(trainer: Any, error: BaseException) -> RewardFailed:
    """The reward function that raised ``error``, named, with what it must return."""
    names = list(getattr(trainer, "reward_func_names", []) or [])
    funcs = list(getattr(trainer, "reward_funcs", []) or [])
    codes = {}
    for name, func in zip(names, funcs, strict=False):
        call = vars(type(func)).get("__call__")  # a callable object's own code
        code = getattr(func, "__code__", None) or getattr(call, "__code__", None)
        if code is not None:
            codes[code] = name
    name = next((codes[frame.f_code] for frame, _ in traceback.walk_tb(error.__traceback__)
                 if frame.f_code in codes), names[0] if len(names) == 1 else None)
    who = f"the reward function {name!r}" if name else "a reward function"
    first = (str(error).strip().splitlines() or [""])[0]
    return RewardFailed(
        f"{who} raised {type(error).__name__}: {first}; memlab scores full-length completions with it as "
        "trainer.train() does: fix it so that it takes (prompts, completions, completion_ids, **columns) and returns "
        "one float (or None) per completion"
    )


def _put_back(owner: Any, name: str, contents: Any) -> None:
    """``owner.name`` given back ``contents``: the same object where it is a dict or list (emptied and refilled),
    else bound again."""
    value = getattr(owner, name)
    if isinstance(value, dict) and isinstance(contents, dict):
        value.clear()
        value.update(contents)
    elif isinstance(value, list) and isinstance(contents, list):
        value[:] = contents
    else:
        setattr(owner, name, contents)


def _check_positions(model: Any, prompt: int, completion: int) -> None:
    """One error where the longest prompt and a full-length completion reach past the model's positions
    (``max_position_embeddings``): a model with learned positions fails there, and a rotary one generates past the
    context it was trained on; ``limits(trainer, vary="tokens")`` stops at the same ceiling."""
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(positions, bool) or not isinstance(positions, int) or positions < 1:
        return
    if prompt + completion > positions:
        longest = max(positions - prompt, 0)
        raise MemlabError(
            f"the longest prompt ({prompt} tokens) and max_completion_length={completion} make {prompt + completion} "
            f"tokens, past the model's max_position_embeddings={positions}; write GRPOConfig(max_completion_length="
            f"{longest}) or less, or a shorter max_prompt_length"
        )
