"""The CUDA caching allocator's expandable segments as a lever (``Plan(expandable_segments=True)``): its technique
and its declaration.

Expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) change what the card shows, not the step:
each pool is one segment mapped in pages, so freed blocks merge across what would have been separate segments and
the reserve over the allocated peak shrinks. A live CUDA trial switches them on with PyTorch's runtime setting
(:func:`memlab.live.device.switch_expandable_segments_on`) and the process's setting is put back when the trial is
over, failed or not; a process already running with them is measured as it is. A dry run's card figure assumes them
(:mod:`memlab.estimation.cuda.allocator`); a CPU trial runs the same step and says so. The exports write the line
that sets them before CUDA starts (:data:`memlab.live.device.ENVIRONMENT_LINE`,
:data:`~memlab.live.device.PYTHON_LINE`).

Example:
    >>> [lever.name for lever in DECLARATIONS]
    ['expandable_segments']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memlab.live.device import ENVIRONMENT_LINE, PYTHON_LINE, switch_expandable_segments_on
from memlab.techniques.core.fragments import Accelerate, Code, Elsewhere, nothing_for, per_target_but_peft
from memlab.techniques.core.lever import Lever, PlanLike
from memlab.techniques.core.technique import StepParts, Technique, Undo

if TYPE_CHECKING:  # annotations only
    from memlab.techniques.core.fragments import Export, Fragment

__all__ = ["CPU_NOTE", "DECLARATIONS", "EXPANDABLE_SEGMENTS", "SWITCHED_NOTE", "ExpandableSegments"]

CPU_NOTE = "expandable_segments changes nothing off CUDA (it is the CUDA caching allocator's): the same step ran"
"""The note of a trial with the lever on, on a device other than CUDA."""

SWITCHED_NOTE = (
    "reserved_bytes measured with the allocator's expandable segments, switched on for this trial (PyTorch's runtime "
    "allocator setting) and off again after: segments reserved before (the weights') stayed as they were, where a "
    f"process started with {ENVIRONMENT_LINE.split()[-1]} makes every segment expandable"
)
"""The note of a live CUDA trial whose process did not run with expandable segments: memlab switched them on."""

ALREADY_NOTE = "expandable segments: this process already runs with them (measured as it is)"
"""The note of a live CUDA trial whose process already makes its segments expandable."""

SET_BEFORE = (
    "The CUDA allocator's expandable segments: set them before CUDA starts, in the shell",
    f"  {ENVIRONMENT_LINE}",
    "or first thing in Python, before torch touches CUDA:",
    f"  {PYTHON_LINE}",
)
"""How to set them, as lines (each export writes them as its comments)."""


class ExpandableSegments(Technique):
    """``expandable_segments``: on a live CUDA trial, the allocator's expandable segments switched on where the
    process does not run with them, and off again when the trial is taken off (failed or not); nothing elsewhere.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from memlab.plan import Plan
        >>> parts = StepParts(nn.Linear(2, 2), Plan(expandable_segments=True), torch.device("cpu"))
        >>> EXPANDABLE_SEGMENTS.put_on(parts) is None, EXPANDABLE_SEGMENTS.notes(parts) == [CPU_NOTE]
        (True, True)
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        self._switched = False
        if not parts.plan.expandable_segments or parts.device.type != "cuda" or parts.fake:
            return None  # a dry run's card figure assumes them (the estimate's allocator model); no CUDA call there
        undo = switch_expandable_segments_on()
        self._switched = undo is not None
        return undo

    def notes(self, parts: StepParts) -> list[str]:
        if not parts.plan.expandable_segments or parts.fake:
            return []
        if parts.device.type != "cuda":
            return [CPU_NOTE]
        return [SWITCHED_NOTE if getattr(self, "_switched", False) else ALREADY_NOTE]


EXPANDABLE_SEGMENTS = ExpandableSegments()
"""The ``expandable_segments`` lever's technique."""


def _comments(lines: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"# {line}" for line in lines)


def _export(target: str) -> Export:
    def fragment(plan: PlanLike) -> Fragment:
        if not plan.expandable_segments:
            return nothing_for(target)
        if target == "code":  # the snippet's model is on its GPU already: too late to set, so it says when
            return Code(environment=_comments(SET_BEFORE))
        if target == "accelerate":  # the script loads the model itself: the line goes before torch is imported
            return Accelerate(script=Code(environment=(
                f"# launch with the CUDA allocator's expandable segments: {ENVIRONMENT_LINE}",
                *PYTHON_LINE.split("; "))))
        where = "TrainingArguments" if target == "trainer" else "a DeepSpeed config"
        return Elsewhere(f"expandable segments are not a setting of {where}: set them in the environment before "
                         f"CUDA starts ({ENVIRONMENT_LINE}, or first thing in Python: {PYTHON_LINE})")

    return fragment


DECLARATIONS = (
    Lever(
        "expandable_segments",
        False,
        short="xseg",
        help="the CUDA caching allocator's expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): "
        "freed blocks merge across pages, so the card holds less reserve over the allocated peak; the same step at "
        "no cost (CUDA only; set before CUDA starts, switched on for a live trial)",
        technique=EXPANDABLE_SEGMENTS,
        # The card figure without them is at least the one with them; the allocated peak is the same.
        needs_at_least=lambda mine, theirs: not mine,
        on_cpu=lambda value: False,
        on_cpu_note="expandable segments are the CUDA allocator's: on a CPU the plan runs the same step",
        exports=per_target_but_peft(_export),
    ),
)
"""The lever's declaration (:data:`memlab.techniques.core.registry.REGISTRY` gathers it)."""
