"""The levers a front end offers, for either mode: one :class:`~memlab.plan.LeverSpec` per field of the plan class.

A training :class:`memlab.Plan` declares its levers as :data:`memlab.plan.LEVERS`; an :class:`memlab.InferencePlan`
as :data:`memlab.plan.INFERENCE_LEVERS`. Front ends (the magic's help, the panel's controls) read both
through :func:`lever_specs`, so that they build one thing per lever whatever the mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from memlab.errors import MemlabError
from memlab.plan import INFERENCE_LEVERS, LEVERS, InferencePlan, LeverSpec, Plan, trainer_levers_refusal

__all__ = ["lever_help", "lever_specs", "model_lever_specs", "panel_lever_specs", "refuse_trainer_levers",
           "trainer_levers_note"]


def lever_specs(plan_class: type[Plan] | type[InferencePlan]) -> dict[str, LeverSpec]:
    """Every lever of ``plan_class`` (:class:`memlab.Plan` or :class:`memlab.InferencePlan`), in field order.

    Example:
        >>> specs = lever_specs(InferencePlan)
        >>> specs["kv_cache"].type, specs["quantize"].choices, specs["batch_size"].type
        ('bool', ('none', 'int8', 'nf4'), 'int')
        >>> lever_specs(Plan)["checkpointing"].type
        'blocks'
    """
    if plan_class is Plan:
        return dict(LEVERS)
    specs = {}
    for name, spec in INFERENCE_LEVERS.items():
        choices = tuple(spec["choices"])
        kind = "choice" if choices else "bool" if isinstance(spec["default"], bool) else "int"
        specs[name] = LeverSpec(name, spec["default"], kind, spec["help"], "", choices)
    return specs


def panel_lever_specs(plan_class: type[Plan] | type[InferencePlan]) -> dict[str, LeverSpec]:
    """The levers the panel shows: :func:`lever_specs` but those a built trainer's setting
    (:attr:`~memlab.plan.LeverSpec.needs_trainer`): the colocated vLLM engine's (``vllm_memory``, ``vllm_sleep``),
    which no live step runs (a GRPOTrainer with ``use_vllm=True`` is estimated, not measured: :func:`memlab.estimate`
    and ``fit(..., dry_run=True)`` take them), and a DPOTrainer's ``precompute_ref``; a built trainer cannot change
    any of them (each lever's :attr:`~memlab.techniques.core.lever.Lever.refuses_change`: memlab.apply refuses it), so
    a panel would only show dead controls.

    Example:
        >>> "vllm_memory" in lever_specs(Plan), "vllm_memory" in panel_lever_specs(Plan)
        (True, False)
    """
    return model_lever_specs(plan_class)


def model_lever_specs(plan_class: type[Plan] | type[InferencePlan] = Plan) -> dict[str, LeverSpec]:
    """The levers a front end that builds the model itself (``memlab estimate``, from a config) can use: every one
    but those a built trainer's setting (:attr:`~memlab.plan.LeverSpec.needs_trainer`), which only
    ``memlab.estimate(trainer, plan)`` in Python takes.

    Example:
        >>> sorted(set(lever_specs(Plan)) - set(model_lever_specs()))
        ['precompute_ref', 'vllm_memory', 'vllm_sleep']
    """
    return {name: spec for name, spec in lever_specs(plan_class).items() if not spec.needs_trainer}


def trainer_levers_note(asked: Mapping[str, str] | None = None) -> str:
    """What a front end that builds the model itself says of the levers it leaves out (:func:`model_lever_specs`):
    whose settings they are and where they apply; ``asked``: how the front end asks a trainer with each (the command
    line's trainer question), where not in Python.

    Example:
        >>> trainer_levers_note()[:68]
        'Not here: vllm_memory and vllm_sleep, settings of a TRL GRPOTrainer '
        >>> trainer_levers_note({"vllm_memory": "--trainer grpo --vllm-gpu-memory-utilization 0.3"})[-61:]
        'vllm_memory: --trainer grpo --vllm-gpu-memory-utilization 0.3'
    """
    owners: dict[str, list[str]] = {}
    for name, spec in lever_specs(Plan).items():
        if spec.needs_trainer:
            owners.setdefault(spec.needs_trainer, []).append(name)
    said = "; ".join(f"{' and '.join(names)}, setting{'s' if len(names) > 1 else ''} of {owner}"
                     for owner, names in owners.items())
    if asked:
        return f"Not here: {said}; ask that trainer's question instead: " + "; ".join(
            f"{name}: {words}" for name, words in asked.items())
    return f"Not here: {said}: estimate that trainer with them in Python, memlab.estimate(trainer, plan)"


def refuse_trainer_levers(axes: Mapping[str, Iterable[Any]], command: str,
                          asked: Mapping[str, str] | None = None) -> None:
    """Refuse, before anything runs, the levers in ``axes`` (``{lever: values}``, :func:`memlab.plan.parse_axes`)
    that a built trainer's setting (:attr:`~memlab.plan.LeverSpec.needs_trainer`), where ``command`` builds the model
    itself: one MemlabError that says whose setting each is and where it applies (``asked``: the command's own
    trainer question for each, where it has one; else Python's).

    Example:
        >>> refuse_trainer_levers({"precision": ["bf16"]}, "memlab estimate")
        >>> refuse_trainer_levers({"precompute_ref": [True]}, "memlab estimate")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: precompute_ref is a setting of a TRL DPOTrainer, and memlab estimate builds a ...
    """
    instead = "estimate the trainer with it in Python, memlab.estimate(trainer, memlab.Plan({name}=...))"
    for name in axes:  # the command's own trainer question, where it has one for this lever
        if asked and name in asked:
            instead = f"ask the trainer's question: {command} {asked[name]}"
            break
    refusal = trainer_levers_refusal(axes, f"{command} builds a model from its config", instead)
    if refusal:
        raise MemlabError(refusal)


def lever_help(specs: Mapping[str, LeverSpec], *, said: bool = True) -> str:
    """One line that names every lever with its values and says what it does (the magic's ``--try`` help); with
    ``said`` False, the levers and their values alone (``memlab estimate --try``'s help).

    Example:
        >>> lever_help(lever_specs(InferencePlan)).split("; ")[-1].split(" (")[0]
        'kv_cache=on|off'
        >>> lever_help(lever_specs(InferencePlan), said=False).split("; ")[-1]
        'kv_cache=on | off'
    """
    # The command line's help: the values spaced, so that a terminal's width wraps a long list between them.
    return "; ".join(f"{name}={_values(spec) if said else _values(spec).replace('|', ' | ')}"
                     + (f" ({spec.help})" if said else "") for name, spec in specs.items())


def _values(spec: LeverSpec) -> str:
    if spec.choices:
        return "|".join(("model", *spec.choices) if spec.default is None else spec.choices)
    if spec.type == "float":
        return "X.XX"
    if spec.type == "int" and spec.default is None:
        return "N|auto"
    if spec.type == "blocks":
        return "off|all|N"
    return "on|off" if spec.type == "bool" else "N"
