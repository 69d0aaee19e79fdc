"""``memlab estimate --host-budget SIZE``: the host memory each plan may keep (offloaded optimizer state and
activations, a paged optimizer's spill, ZeRO / FSDP offload), judged beside the GPU budget (DESIGN.md 2.4).

A sharded estimate's ``host_bytes`` are per rank; a node of several GPUs runs that many ranks on one host, so the
budget, which is the node's, is shared among them: each rank is judged against its share, and the lines under the
table say the host memory per node. A trainer's per-GPU answer says its load too, per GPU and per node
(:func:`load_lines`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = ["GPUS_PER_NODE", "add_host_argument", "host_budget", "host_judged", "host_judged_rows", "load_lines",
           "node_lines"]

GPUS_PER_NODE = 8
"""The GPUs of one node a sharded estimate assumes where more GPUs than this train (the host budget is a node's)."""


def add_host_argument(parser: argparse.ArgumentParser) -> None:
    """``--host-budget SIZE``.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_host_argument(parser)
        >>> parser.parse_args(["--host-budget", "16GiB"]).host_budget
        '16GiB'
    """
    parser.add_argument(
        "--host-budget", metavar="SIZE", default=None,
        help="host (CPU) memory the plans may keep, such as 64GiB: offloaded optimizer state and activations, a paged "
        "optimizer's spill, ZeRO offload (a node's, shared by its GPUs' ranks); a plan over it 'does not fit (host)' "
        "(default: not judged)",
    )


def host_budget(args: argparse.Namespace) -> int | None:
    """``--host-budget`` in bytes (None where it is not given); a MemlabError in the flag's words where it is wrong.

    Example:
        >>> host_budget(argparse.Namespace(host_budget="1GiB")), host_budget(argparse.Namespace())
        (1073741824, None)
    """
    from memlab.options import parse_host_budget

    try:
        return parse_host_budget(getattr(args, "host_budget", None))
    except Exception as error:  # the size's own words, as the flag is spelled
        from memlab.errors import MemlabError

        raise MemlabError(str(error).replace("host_budget", "--host-budget").replace("=", " ")) from None


def host_judged(trials: Sequence[Any], args: argparse.Namespace) -> list[Any]:
    """``trials`` judged against ``--host-budget`` too (unchanged without it).

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report import Trial
        >>> trial = Trial(Plan(offload="all"), "ok", 9, {}, None, None, None, "cuda", host_bytes=2**31)
        >>> [t.status for t in host_judged([trial], argparse.Namespace(host_budget="1GiB"))], trial.fits
        (['ok'], True)
        >>> host_judged([trial], argparse.Namespace(host_budget="1GiB"))[0].verdict_figure
        'host'
    """
    budget = host_budget(args)
    return list(trials) if budget is None else [dataclasses.replace(trial, host_budget=budget) for trial in trials]


def host_judged_rows(rows: Sequence[tuple[Any, str, Any]], args: argparse.Namespace) -> list[tuple[Any, str, Any]]:
    """Sharded rows ``(plan, strategy, trial or None)`` judged against ``--host-budget``: each rank against its share
    of the node's budget (the budget over the GPUs of a node, :data:`GPUS_PER_NODE` at the most).

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.estimation.sharded.fsdp2 import ShardedTrial
        >>> rank = ShardedTrial(Plan(offload="optimizer"), "ok", 9, {}, None, None, None, "cuda", gpus=4,
        ...                     strategy="zero2", host_bytes=2**30)
        >>> [(t.host_budget, t.fits) for _, _, t in host_judged_rows([(rank.plan, "zero2", rank)],
        ...                                                           argparse.Namespace(host_budget="3GiB"))]
        [(805306368, False)]
    """
    budget = host_budget(args)
    if budget is None:
        return list(rows)
    return [(plan, name, trial if trial is None else
             dataclasses.replace(trial, host_budget=budget // min(max(trial.gpus, 1), GPUS_PER_NODE)))
            for plan, name, trial in rows]


def node_lines(rows: Sequence[tuple[Any, str, Any]]) -> list[str]:
    """What the sharded plans that keep bytes on the host need there, per rank and per node.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.estimation.sharded.fsdp2 import ShardedTrial
        >>> rank = ShardedTrial(Plan(offload="optimizer"), "ok", 9, {}, None, None, None, "cuda", gpus=16,
        ...                     strategy="zero2", host_bytes=2**30)
        >>> node_lines([(rank.plan, "zero2", rank)])
        ['Host memory: offload-optimizer with zero2: 1.00 GiB per GPU, 8.00 GiB per node of 8 GPUs']
    """
    from memlab.plan import format_bytes

    lines = []
    for plan, name, trial in rows:
        if trial is not None and trial.status == "ok" and trial.host_bytes:
            node = min(max(trial.gpus, 1), GPUS_PER_NODE)
            lines.append(f"Host memory: {plan.label()} with {name}: {format_bytes(trial.host_bytes)} per GPU, "
                         f"{format_bytes(trial.host_bytes * node)} per node of {node} GPU{'s' if node != 1 else ''}")
    return lines


def load_lines(trials: Sequence[Any], budget: int | None) -> list[str]:
    """The load of a trainer's per-GPU answer (``load_bytes`` and ``load_host_bytes``,
    :func:`memlab.estimation.sharded.loading.with_load`), a line a plan wrapped to the answer's width: its GPU bytes
    beside the step's peak, which of the two is the run's peak, over ``budget`` where it is, and the host memory a
    node holds while loading.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.estimation.sharded.fsdp2 import ShardedTrial
        >>> rank = ShardedTrial(Plan(), "ok", 2**30, {}, None, None, None, "cuda", gpus=8, strategy="fsdp2",
        ...                     load_bytes=3 * 2**30, load_host_bytes=2**34)
        >>> said = " ".join(" ".join(load_lines([rank], 2 * 2**30)).split())
        >>> said.startswith("Load: 3.00 GiB per GPU while the model loads and is wrapped, above the step's peak")
        True
        >>> "the load is the run's peak per GPU, over the 2.00 GiB budget" in said, said[-45:]
        (True, 'host memory per node while loading: 16.00 GiB')
    """
    import textwrap

    from memlab.frontends.cli.estimate.text import WIDTH
    from memlab.plan import format_bytes

    lines = []
    for trial in trials:
        load = getattr(trial, "load_bytes", None)
        if trial.status != "ok" or load is None:
            continue
        label = f" ({trial.label})" if len(trials) > 1 else ""
        above = load > trial.peak_bytes
        line = (f"Load{label}: {format_bytes(load)} per GPU while the model loads and is wrapped, "
                f"{'above' if above else 'below'} the step's peak ({format_bytes(trial.peak_bytes)}): the "
                f"{'load' if above else 'step'} is the run's peak per GPU")
        if budget is not None and load + (trial.context_bytes or 0) > budget:  # the card's figure: with the context
            line += f", over the {format_bytes(budget)} budget"
        host = trial.load_host_bytes or 0  # none: bitsandbytes quantizes on the GPU as it loads
        line += f"; host memory per node while loading: {format_bytes(host) if host else 'only the mapped checkpoint'}"
        lines += textwrap.wrap(line, WIDTH, subsequent_indent="  ")
    return lines
