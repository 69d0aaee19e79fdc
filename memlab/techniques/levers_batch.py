"""The declarations of the levers that cut the batch: ``micro_batch`` and ``accumulation`` (see
:mod:`memlab.techniques.accumulation` for the technique, :mod:`memlab.techniques.lever` for the facets).

Example:
    >>> [lever.name for lever in DECLARATIONS]
    ['micro_batch', 'accumulation']
"""

from __future__ import annotations

from memlab.techniques.accumulation import ACCUMULATION
from memlab.techniques.lever import TARGETS, Lever, carried

DECLARATIONS = (
    Lever(
        "micro_batch",
        None,
        help="rows per forward/backward: fewer rows, fewer activations; None means the whole batch",
        split=True,
        technique=ACCUMULATION,
        exports=dict.fromkeys(TARGETS, carried),
    ),
    Lever(
        "accumulation",
        1,
        help="micro-batches per optimizer step: keeps the effective batch while micro-batches shrink; more steps",
        split=True,
        technique=ACCUMULATION,
        exports=dict.fromkeys(TARGETS, carried),
    ),
)
