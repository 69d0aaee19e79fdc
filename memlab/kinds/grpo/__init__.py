"""TRL's GRPOTrainer as a trainer kind (:class:`~memlab.live.trainer_kinds.TrainerKind`): its declaration, and its
folder: the trainer as the live object (:mod:`memlab.kinds.grpo.source`), its step, generation first
(:mod:`memlab.kinds.grpo.step`), its dry run (:mod:`memlab.kinds.grpo.estimate`), the config changes suggested where
nothing fits (:mod:`memlab.kinds.grpo.suggest`), its colocated vLLM engine's share
(:mod:`memlab.kinds.grpo.vllm`), what ``limits`` varies on it (:mod:`memlab.kinds.grpo.sizes`) and what it adds to
``memlab estimate --trainer grpo`` (:mod:`memlab.kinds.grpo.cli`). Listed in :data:`memlab.kinds.KINDS`; a next
kind with a step of its own is a folder like this one.

Example:
    >>> GRPO.name, GRPO.config, GRPO.phases
    ('GRPOTrainer', 'GRPOConfig', ('generation', 'reference', 'old-policy'))
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from memlab.kinds.grpo.cli import GRPO_CLI
from memlab.kinds.grpo.estimate import estimate_grpo
from memlab.kinds.grpo.sizes import grpo_sizes
from memlab.kinds.grpo.source import (
    check_generations,
    completion_room,
    computes_old_logps,
    fresh_generations,
    grpo_split,
)
from memlab.kinds.grpo.step import grpo_target
from memlab.kinds.grpo.suggest import with_grpo_dry_runs
from memlab.live.trainer_kinds import WATCH, TrainerKind

__all__ = ["GRPO"]


def _grpo_check_plan(trainer: Any, plan: Any) -> None:
    args = trainer.args  # its generations per optimizer step kept, its generation batch whole micro-batches
    check_generations(plan, SimpleNamespace(generations=args.per_device_train_batch_size
                                            * args.gradient_accumulation_steps,
                                            generation_batch=args.generation_batch_size))


def _grpo_arguments(args: Any, plan: Any) -> dict[str, Any]:
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
    phases=("generation", "reference", "old-policy"), target=grpo_target, estimate=estimate_grpo,
    fit_dry_runs=with_grpo_dry_runs, suggestions=("beta", "max_completion_length", "num_generations"),
    check_plan=_grpo_check_plan, arguments=_grpo_arguments, export_refusal=_grpo_export_refusal,
    elsewhere=_grpo_elsewhere, old_logps=computes_old_logps, completion_room=completion_room,
    start_afresh=fresh_generations, sizes=grpo_sizes, cli=GRPO_CLI,
    # TRL's methods memlab.watch wraps to mark a generation round, its generation, its no-grad log-prob passes
    generation_methods=("_generate_and_score_completions", "_generate", "_get_per_token_logps_and_entropies"),
)
"""TRL's GRPOTrainer: its step generates first (:mod:`memlab.kinds.grpo.step`), its dry run has a generation phase
(:mod:`memlab.kinds.grpo.estimate`), ``fit`` suggests the config changes of :mod:`memlab.kinds.grpo.suggest`
where nothing fits, and ``memlab.apply`` splits its generations (:func:`memlab.kinds.grpo.source.grpo_split`)."""
