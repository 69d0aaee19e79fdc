"""The levers a front end offers, for either mode: one :class:`~memlab.plan.LeverSpec` per field of the plan class.

A training :class:`memlab.Plan` declares its levers as :data:`memlab.plan.LEVERS`; an :class:`memlab.InferencePlan`
as :data:`memlab.inference.plan.INFERENCE_LEVERS`. Front ends (the magic's help, the panel's controls) read both
through :func:`lever_specs`, so that they build one thing per lever whatever the mode.
"""

from __future__ import annotations

from collections.abc import Mapping

from memlab.inference.plan import INFERENCE_LEVERS, InferencePlan
from memlab.plan import LEVERS, LeverSpec, Plan

__all__ = ["lever_help", "lever_specs", "panel_lever_specs"]


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
    """The levers the panel shows: :func:`lever_specs` but the colocated vLLM engine's (``vllm_memory``,
    ``vllm_sleep``), which no live step runs (a GRPOTrainer with ``use_vllm=True`` is estimated, not measured:
    :func:`memlab.estimate` and ``fit(..., dry_run=True)`` take them), and a DPOTrainer's ``precompute_ref``, which
    a built trainer cannot switch (a new trainer's setting): a panel would only show dead controls.

    Example:
        >>> "vllm_memory" in lever_specs(Plan), "vllm_memory" in panel_lever_specs(Plan)
        (True, False)
    """
    from memlab.techniques.vllm import FIELDS

    # nor a DPOTrainer's precompute_ref, which a built trainer cannot switch (memlab.apply refuses it)
    hidden = (*FIELDS, "precompute_ref")
    return {name: spec for name, spec in lever_specs(plan_class).items() if name not in hidden}


def lever_help(specs: Mapping[str, LeverSpec]) -> str:
    """One line that names every lever with its values and says what it does (the magic's ``--try`` help).

    Example:
        >>> lever_help(lever_specs(InferencePlan)).split("; ")[-1].split(" (")[0]
        'kv_cache=on|off'
    """
    return "; ".join(f"{name}={_values(spec)} ({spec.help})" for name, spec in specs.items())


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
