"""The colour of each memory category, one table for every memlab figure (bars, timelines, watch), so that a
category looks the same wherever it is drawn.

Example:
    >>> CATEGORY_COLORS["activations"]
    '#E45756'
"""

from __future__ import annotations

CATEGORY_COLORS = {
    "params": "#4C78A8",
    "grads": "#F58518",
    "optimizer": "#54A24B",
    "activations": "#E45756",
    "kv_cache": "#B279A2",
    "other": "#B0B0B0",
}
"""The colour of each memory category's bars and areas."""

HOST_COLOR = "#9D755D"
"""The colour of host memory (:attr:`memlab.report.Trial.host_bytes`): beside the device's categories, never one."""
BUDGET_COLOR = "#D62728"
"""The colour of a budget line (the device's dashed, the host's dotted) and of an error's cross."""
HATCH = "/"
"""The pattern of every bar of a plan that does not fit: out of memory (grey) or over a budget (its own colours)."""
