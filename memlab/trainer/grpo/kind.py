"""TRL's GRPOTrainer as a trainer kind (:class:`~memlab.live.trainer_kinds.TrainerKind`): its declaration, whose hooks
are GRPO's own modules (:mod:`memlab.trainer.grpo`, :mod:`memlab.trainer.grpo.estimate`,
:mod:`memlab.trainer.grpo.suggest`, :mod:`memlab.runner.grpo`), each imported when the hook is called: the runner and
the estimation build on :mod:`memlab.trainer`, never the reverse at load. Importing this module registers the kind
(:mod:`memlab.trainer` does); a next kind with a step of its own is a module like this one.

Example:
    >>> GRPO.name, GRPO.config, GRPO.phases
    ('GRPOTrainer', 'GRPOConfig', ('generation', 'reference', 'old-policy'))
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from memlab.live.trainer_kinds import WATCH, TrainerKind, register

__all__ = ["GRPO"]


def _grpo_target(trainer: Any, loss_fn: Any) -> Any:
    from memlab.runner.grpo import grpo_target

    return grpo_target(trainer, loss_fn)


def _grpo_estimate(request: Any) -> Any:
    from memlab.trainer.grpo.estimate import estimate_grpo

    return estimate_grpo(request)


def _grpo_fit_dry_runs(target: Any, trainer: Any, loss_fn: Any) -> Any:
    from memlab.trainer.grpo.suggest import with_grpo_dry_runs

    return with_grpo_dry_runs(target, trainer, loss_fn)


def _grpo_check_plan(trainer: Any, plan: Any) -> None:
    from memlab.trainer.grpo import check_generations

    args = trainer.args  # its generations per optimizer step kept, its generation batch whole micro-batches
    check_generations(plan, SimpleNamespace(generations=args.per_device_train_batch_size
                                            * args.gradient_accumulation_steps,
                                            generation_batch=args.generation_batch_size))


def _grpo_arguments(args: Any, plan: Any) -> dict[str, Any]:
    from memlab.trainer.grpo import grpo_split

    # GRPOConfig's __post_init__ takes one of generation_batch_size and steps_per_generation: the split sets the latter
    return {**grpo_split(args, plan), "generation_batch_size": None}


def _grpo_export_refusal(plan: Any) -> str:
    if plan.loss == "full":
        return ""
    return ("a GRPOTrainer refuses Liger's fused linear cross-entropy (liger_kernel_config={'fused_linear_cross_"
            "entropy': True}), which loss='chunked' exports to; export plan.replace(loss='full') for a GRPOConfig")


def _grpo_elsewhere(trainer: Any) -> str:
    args = getattr(trainer, "args", None)
    completion = getattr(args, "max_completion_length", None) or "max_completion_length"
    generations = getattr(args, "num_generations", None) or "num_generations"
    return (
        f"memlab measures a GRPOTrainer's step as it runs (generation of {generations} completions per prompt up to "
        f"{completion} tokens, the reference log-probs, then forward, backward and the optimizer) and estimates "
        "it: write memlab.measure(trainer) or memlab.estimate(trainer) for the trainer as set up, "
        "memlab.compare(trainer, plans=[memlab.Plan(...)]) to measure plans, memlab.fit(trainer, budget=...) "
        "to search them and memlab.apply(trainer, plan) to train with one; this call does not take a GRPOTrainer "
        f"yet; {WATCH}"
    )


GRPO = TrainerKind(
    "GRPOTrainer", "trl.", "GRPOConfig",
    batch="the generation batch made in each step from the train dataset's longest prompts, every completion full "
          "length",
    phases=("generation", "reference", "old-policy"), target=_grpo_target, estimate=_grpo_estimate,
    fit_dry_runs=_grpo_fit_dry_runs, suggestions=("beta", "max_completion_length", "num_generations"),
    check_plan=_grpo_check_plan, arguments=_grpo_arguments, export_refusal=_grpo_export_refusal,
    elsewhere=_grpo_elsewhere,
)
"""TRL's GRPOTrainer: its step generates first (:mod:`memlab.runner.grpo`), its dry run has a generation phase
(:mod:`memlab.trainer.grpo.estimate`), ``fit`` suggests the config changes of :mod:`memlab.trainer.grpo.suggest`
where nothing fits, and ``memlab.apply`` splits its generations (:func:`memlab.trainer.grpo.grpo_split`)."""

register(GRPO)
