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
