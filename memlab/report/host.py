"""Host memory in a report's words: the host budget line under a table, and why nothing fits where the host is what
every plan misses (:attr:`memlab.report.Trial.host_bytes`, DESIGN.md 2.4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memlab.plan import format_bytes

if TYPE_CHECKING:  # reads a Report's trials; imports nothing of the report at run time
    from memlab.report.data import Report

__all__ = ["host_lines", "host_reason"]


def host_lines(report: Report) -> list[str]:
    """The line under a table that names the host budget, where some plan keeps bytes on the host and a host budget
    judged it (the smallest, where trials had several); none otherwise.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report.data import Report, Trial
        >>> t = Trial(Plan(offload="all"), "ok", 9, {}, None, None, None, "cuda", host_bytes=2**30, host_budget=2**34)
        >>> host_lines(Report([t]))
        ['Host budget: 16.00 GiB (the host column: what each plan keeps in host memory at the most)']
    """
    budgets = [t.host_budget for t in report.trials if t.host_budget is not None and t.status == "ok"]
    if not budgets or not any(t.host_bytes for t in report.trials):
        return []
    return [f"Host budget: {format_bytes(min(budgets))} (the host column: what each plan keeps in host memory at the "
            "most)"]


def host_reason(report: Report) -> str | None:
    """Why nothing fits, where some plan fits the device and misses only the host budget: the one that needs the
    least host memory, and by how much it misses; None otherwise.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report.data import Report, Trial
        >>> t = Trial(Plan(offload="all"), "ok", 9, {}, None, None, None, "cuda", host_bytes=3 * 2**30,
        ...           host_budget=2**31)
        >>> host_reason(Report([t], budget=10))
        'offload-all fits the device but needs 3.00 GiB of host memory, 1.00 GiB over the host budget of 2.00 GiB'
    """
    missed = [t for t in report.trials if t.status == "ok" and t.verdict_figure == "host" and t.host_budget]
    if not missed:
        return None
    closest = min(missed, key=lambda t: t.host_bytes - (t.host_budget or 0))
    budget = closest.host_budget or 0
    return (f"{closest.label} fits the device but needs {format_bytes(closest.host_bytes)} of host memory, "
            f"{format_bytes(closest.host_bytes - budget)} over the host budget of {format_bytes(budget)}")
