"""Trial and Report: the results of measuring plans, as tables (text, HTML, pandas), JSON and figures.

Nothing here imports pandas or plotly at import time: they are imported inside the functions that need them,
so ``import memlab`` stays light.
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

from memlab.errors import MemlabError
from memlab.measure.tracker import CATEGORIES
from memlab.plan import PLAN_FIELDS, Plan, format_bytes

if TYPE_CHECKING:
    import pandas

__all__ = [
    "CATEGORIES",
    "FIGURE_TITLES",
    "STATUSES",
    "Report",
    "Trial",
    "budget_line",
    "budget_note",
    "comparison_figure",
    "comparison_traces",
    "figure_columns",
    "figure_data",
    "one_line",
]

STATUSES = ("ok", "oom", "error")

_MIB = 1024**2
_CATEGORY_COLORS = {
    "params": "#4C78A8",
    "grads": "#F58518",
    "optimizer": "#54A24B",
    "activations": "#E45756",
    "other": "#B0B0B0",
}
_DOES_NOT_FIT_COLOR = "#7F7F7F"
_BEST_COLOR = "#2CA02C"
_RATE_COLOR = "#72B7B2"
_BUDGET_COLOR = "#D62728"


@dataclass
class Trial:
    """The result of running one plan: peak memory, where it went, and speed.

    Args:
        plan: the plan that was run.
        status: ``"ok"``, ``"oom"`` (out of memory, or over the budget memlab enforces) or ``"error"``.
        peak_bytes: the peak memory of a steady-state training step (for ``"oom"``: the peak reached).
        breakdown: bytes per category at the moment of the peak; keys are :data:`CATEGORIES` and the
            values add up to ``peak_bytes``. Missing categories count as 0, and what the breakdown does not
            account for is added to ``"other"`` (so an empty breakdown puts all of ``peak_bytes`` there); more
            than ``peak_bytes`` is a ValueError.
        step_time_s: median seconds per optimizer step, or None (not timed, failed, or an estimate).
        samples_per_s: rows per second, or None.
        tokens_per_s: tokens per second, or None where the batch has no tokens.
        device: the device the trial ran on, such as ``"cuda:0"`` or ``"cpu"``.
        error: the error message for ``"oom"`` and ``"error"`` trials.
        rows_per_step: rows per optimizer step (the effective batch).
        budget: the budget in bytes the trial was held to, if any.
        reserved_bytes: the CUDA caching allocator's ``max_memory_reserved``.
        rss_bytes: process resident memory after the trial (CPU context).
        preexisting_bytes: memory held before the trial began; it is part of ``"other"``.
        notes: remarks for the reader, such as ``"fp16 on CPU is slow"``.
        estimated: True for dry-run estimates (no real step ran).

    Example:
        >>> t = Trial(Plan(precision="bf16"), status="ok", peak_bytes=300,
        ...           breakdown={"params": 100, "grads": 100, "activations": 100},
        ...           step_time_s=0.5, samples_per_s=8.0, tokens_per_s=None, device="cpu", budget=400)
        >>> t.fits, t.label, t.breakdown["optimizer"]
        (True, 'bf16', 0)
    """

    plan: Plan
    status: str
    peak_bytes: int
    breakdown: dict[str, int]
    step_time_s: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    device: str
    error: str | None = None
    rows_per_step: int | None = None
    budget: int | None = None
    reserved_bytes: int | None = None
    rss_bytes: int | None = None
    preexisting_bytes: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    estimated: bool = False

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} is not one of {', '.join(STATUSES)}")
        self.peak_bytes = int(self.peak_bytes)
        unknown = set(self.breakdown) - set(CATEGORIES)
        if unknown:
            raise ValueError(f"breakdown has unknown categories {sorted(unknown)}; use only {', '.join(CATEGORIES)}")
        breakdown = {name: int(self.breakdown.get(name, 0)) for name in CATEGORIES}
        if any(value < 0 for value in breakdown.values()):
            raise ValueError(f"breakdown has negative bytes: {breakdown}")
        total = sum(breakdown.values())
        if total > self.peak_bytes:
            raise ValueError(f"breakdown adds up to {total} bytes, more than peak_bytes={self.peak_bytes}")
        breakdown["other"] += self.peak_bytes - total
        self.breakdown = breakdown
        self.notes = tuple(self.notes)

    @property
    def label(self) -> str:
        """The plan's short label, as in tables and plots."""
        return self.plan.label()

    @property
    def fits(self) -> bool:
        """True when the trial ran (``status == "ok"``) and its peak is within its budget (if it had one)."""
        return self.status == "ok" and (self.budget is None or self.peak_bytes <= self.budget)

    def to_dict(self) -> dict[str, Any]:
        """A flat, JSON-friendly dict: plan fields under their own names, bytes under ``<category>_bytes``.

        Example:
            >>> t = Trial(Plan(accumulation=2), "ok", 10, {"params": 10}, 0.1, 20.0, None, "cpu")
            >>> d = t.to_dict()
            >>> d["label"], d["accumulation"], d["params_bytes"], d["optimizer_bytes"], d["optimizer"]
            ('accum2', 2, 10, 0, 'adamw')
        """
        data: dict[str, Any] = {"label": self.label, "status": self.status, "fits": self.fits}
        data["peak_bytes"] = self.peak_bytes
        for name in CATEGORIES:
            data[f"{name}_bytes"] = self.breakdown[name]
        data.update(
            step_time_s=self.step_time_s,
            samples_per_s=self.samples_per_s,
            tokens_per_s=self.tokens_per_s,
            error=self.error,
        )
        for name in PLAN_FIELDS:
            data[name] = getattr(self.plan, name)
        data.update(
            device=self.device,
            rows_per_step=self.rows_per_step,
            budget=self.budget,
            reserved_bytes=self.reserved_bytes,
            rss_bytes=self.rss_bytes,
            preexisting_bytes=self.preexisting_bytes,
            notes=list(self.notes),
            estimated=self.estimated,
        )
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trial:
        """The Trial that :meth:`to_dict` described (``label`` and ``fits`` are recomputed, not read).

        Example:
            >>> t = Trial(Plan(precision="bf16"), "oom", 5, {"activations": 5}, None, None, None, "cuda:0",
            ...           error="CUDA out of memory")
            >>> Trial.from_dict(t.to_dict()) == t
            True
        """
        plan = Plan(**{name: data[name] for name in PLAN_FIELDS if name in data})
        return cls(
            plan=plan,
            status=data["status"],
            peak_bytes=data["peak_bytes"],
            breakdown={name: data.get(f"{name}_bytes", 0) for name in CATEGORIES},
            step_time_s=data.get("step_time_s"),
            samples_per_s=data.get("samples_per_s"),
            tokens_per_s=data.get("tokens_per_s"),
            device=data.get("device", "unknown"),
            error=data.get("error"),
            rows_per_step=data.get("rows_per_step"),
            budget=data.get("budget"),
            reserved_bytes=data.get("reserved_bytes"),
            rss_bytes=data.get("rss_bytes"),
            preexisting_bytes=data.get("preexisting_bytes", 0),
            notes=tuple(data.get("notes") or ()),
            estimated=bool(data.get("estimated", False)),
        )

    def to_text(self) -> str:
        """A plain-text table of this one trial (see :meth:`Report.to_text`).

        Example:
            >>> t = Trial(Plan(), "oom", 2048, {}, None, None, None, "cpu", error="out of memory", budget=1024)
            >>> lines = t.to_text().splitlines()
            >>> lines[1].split()[:5], lines[-2]
            (['plain', 'does', 'not', 'fit', '(OOM)'], 'Budget: 1.0 KiB')
        """
        return Report([self], budget=self.budget).to_text()

    def _repr_html_(self) -> str:
        return Report([self], budget=self.budget)._repr_html_()


@dataclass
class Report:
    """The trials of a ``compare`` or ``fit`` (or a panel's runs so far), with tables, JSON and a figure.

    Args:
        trials: the trials, in the order they ran.
        budget: the memory budget in bytes the trials were compared against, if any.
        skipped: plans a search chose not to measure, each with the reason (e.g. predicted not to fit).

    Example:
        >>> fast = Trial(Plan(), "ok", 900, {"params": 900}, 0.5, 8.0, None, "cpu")
        >>> small = Trial(Plan(checkpointing=True), "ok", 500, {"params": 500}, 1.0, 4.0, None, "cpu")
        >>> report = Report([fast, small], budget=600)
        >>> report.best.label, len(report), report[0].label
        ('ckpt', 2, 'plain')
    """

    trials: list[Trial] = field(default_factory=list)
    budget: int | None = None
    skipped: list[tuple[Plan, str]] = field(default_factory=list)

    def fits(self, trial: Trial) -> bool:
        """Whether ``trial`` fits: its own budget (:attr:`Trial.fits`) and this report's budget, if set.

        Example:
            >>> t = Trial(Plan(), "ok", 900, {"params": 900}, 0.5, 8.0, None, "cpu")
            >>> Report([t]).fits(t), Report([t], budget=800).fits(t)
            (True, False)
        """
        return trial.fits and (self.budget is None or trial.peak_bytes <= self.budget)

    @property
    def best(self) -> Trial | None:
        """The fastest trial that fits (most samples/s; a tie goes to the lower peak), or None.

        Trials without a speed (estimates) rank below any measured speed, and among themselves by lower peak.

        Example:
            >>> fast = Trial(Plan(), "ok", 900, {"params": 900}, 0.5, 8.0, None, "cpu")
            >>> Report([fast], budget=1000).best is fast, Report([fast], budget=800).best
            (True, None)
        """
        candidates = [trial for trial in self.trials if self.fits(trial)]
        if not candidates:
            return None

        def rank(trial: Trial) -> tuple[float, int]:
            speed = trial.samples_per_s if trial.samples_per_s is not None else float("-inf")
            return (speed, -trial.peak_bytes)

        return max(candidates, key=rank)

    def __len__(self) -> int:
        return len(self.trials)

    def __iter__(self) -> Iterator[Trial]:
        return iter(self.trials)

    @overload
    def __getitem__(self, index: int) -> Trial: ...

    @overload
    def __getitem__(self, index: slice) -> Report: ...

    def __getitem__(self, index: int | slice) -> Trial | Report:
        if isinstance(index, slice):
            return Report(self.trials[index], budget=self.budget)
        return self.trials[index]

    # --- data -----------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """``{"budget": ..., "trials": [Trial.to_dict(), ...], "skipped": [...]}``, JSON-friendly.

        The ``fits`` of each trial here is the report's view (see :meth:`fits`).

        Example:
            >>> r = Report([Trial(Plan(), "ok", 900, {"params": 900}, 0.5, 8.0, None, "cpu")], budget=800)
            >>> d = r.to_dict()
            >>> d["budget"], d["trials"][0]["label"], d["trials"][0]["fits"], d["skipped"]
            (800, 'plain', False, [])
        """
        trials = []
        for trial in self.trials:
            data = trial.to_dict()
            data["fits"] = self.fits(trial)
            trials.append(data)
        skipped = [{"plan": dataclasses.asdict(plan), "reason": reason} for plan, reason in self.skipped]
        return {"budget": self.budget, "trials": trials, "skipped": skipped}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """The Report that :meth:`to_dict` described; keys other than ``budget`` and ``trials`` are ignored.

        Example:
            >>> r = Report([Trial(Plan(), "ok", 1, {"other": 1}, 0.1, 10.0, None, "cpu")], budget=2)
            >>> Report.from_dict(r.to_dict()) == r
            True
        """
        skipped = [(Plan(**item["plan"]), str(item["reason"])) for item in data.get("skipped", [])]
        trials = [Trial.from_dict(item) for item in data.get("trials", [])]
        return cls(trials, budget=data.get("budget"), skipped=skipped)

    def to_json(self, indent: int | None = 2) -> str:
        """The report as a JSON string (see :meth:`to_dict`); :meth:`from_json` reads it back.

        Example:
            >>> r = Report([Trial(Plan(), "error", 0, {}, None, None, None, "cpu", error="boom")])
            >>> Report.from_json(r.to_json()) == r
            True
        """
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Report:
        """The Report in a JSON string written by :meth:`to_json`."""
        return cls.from_dict(json.loads(text))

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per trial; the columns are the keys of :meth:`Trial.to_dict` (notes joined by ``"; "``).

        Columns: ``label, status, fits, peak_bytes, params_bytes, grads_bytes, optimizer_bytes,
        activations_bytes, other_bytes, step_time_s, samples_per_s, tokens_per_s, error``, the plan fields
        (``micro_batch, accumulation, checkpointing, precision, optimizer, offload``), then ``device,
        rows_per_step, budget, reserved_bytes, rss_bytes, preexisting_bytes, notes, estimated``.

        Example:
            >>> r = Report([Trial(Plan(), "ok", 1, {"other": 1}, 0.1, 10.0, None, "cpu")])
            >>> list(r.to_dataframe().columns[:4])
            ['label', 'status', 'fits', 'peak_bytes']
        """
        import pandas

        rows = []
        for data in self.to_dict()["trials"]:
            data["notes"] = "; ".join(data["notes"])
            rows.append(data)
        frame = pandas.DataFrame(rows, columns=_empty_trial_columns())
        for name in ("step_time_s", "samples_per_s", "tokens_per_s"):
            frame[name] = frame[name].astype("float64")
        for name in ("micro_batch", "rows_per_step", "budget", "reserved_bytes", "rss_bytes"):
            frame[name] = frame[name].astype("Int64")
        return frame

    # --- text and HTML --------------------------------------------------------------------------------------

    def _rows(self) -> list[dict[str, str]]:
        best = self.best
        rows = []
        for trial in self.trials:
            status = _status_text(trial, self.fits(trial))
            notes = list(trial.notes)
            if trial.error:
                notes.insert(0, one_line(trial.error))
            peak = format_bytes(trial.peak_bytes) if trial.status != "error" else "-"
            if trial.status == "oom" and trial.peak_bytes:
                peak = ">= " + peak
            row = {
                "best": "*" if trial is best else "",
                "plan": trial.label,
                "status": status,
                "peak": peak,
            }
            for name in CATEGORIES:
                row[name] = format_bytes(trial.breakdown[name]) if trial.status == "ok" else "-"
            row.update(
                step=_format_seconds(trial.step_time_s),
                samples=_format_rate(trial.samples_per_s),
                tokens=_format_rate(trial.tokens_per_s),
                notes="; ".join(notes),
            )
            rows.append(row)
        return rows

    def _footer(self) -> list[str]:
        lines = []
        best = self.best
        if best is not None:
            speed = "" if best.samples_per_s is None else f", {_format_rate(best.samples_per_s)} samples/s"
            lines.append(f"Best: {best.label} (peak {format_bytes(best.peak_bytes)}{speed})")
        elif self.trials:
            lines.append("Best: none of these fits")
        if self.budget is not None:
            lines.append(f"Budget: {format_bytes(self.budget)}")
        held = max((trial.preexisting_bytes for trial in self.trials), default=0)
        if held > 0:
            lines.append(
                f"Held before the trials: {format_bytes(held)} (counted under 'other'; "
                "free what you no longer need, such as an old optimizer, to make room)"
            )
        devices = sorted({trial.device for trial in self.trials})
        if devices:
            lines.append("Device: " + ", ".join(devices))
        if any(trial.estimated for trial in self.trials):
            lines.append("Estimated: dry run on fake tensors, no step was timed")
        if self.skipped:
            kinds = Counter(reason.split(":", 1)[0].strip() for _, reason in self.skipped)
            counted = ", ".join(f"{count} {kind}" for kind, count in kinds.most_common())
            lines.append(f"Not measured: {len(self.skipped)} plans ({counted})")
        return lines

    def to_text(self) -> str:
        """A plain-text table for the terminal: a line per trial, ``*`` marks the best, then a summary.

        Example:
            >>> r = Report([Trial(Plan(), "ok", 2048, {"params": 2048}, 0.25, 16.0, None, "cpu")])
            >>> lines = r.to_text().splitlines()
            >>> lines[0].split()[:4], lines[1].split()[:4]
            (['plan', 'status', 'peak', 'params'], ['*', 'plain', 'ok', '2.0'])
            >>> for line in lines[3:]:
            ...     print(line)
            Best: plain (peak 2.0 KiB, 16.0 samples/s)
            Device: cpu
        """
        if not self.trials:
            return "No trials yet."
        headers = {
            "best": "",
            "plan": "plan",
            "status": "status",
            "peak": "peak",
            **{name: name for name in CATEGORIES},
            "step": "time/step",
            "samples": "samples/s",
            "tokens": "tokens/s",
            "notes": "notes",
        }
        rows = self._rows()
        keys = [key for key in headers if key != "notes" or any(row["notes"] for row in rows)]
        widths = {key: max(len(headers[key]), *(len(row[key]) for row in rows)) for key in keys}
        lines = ["  ".join(headers[key].ljust(widths[key]) for key in keys).rstrip()]
        for row in rows:
            lines.append("  ".join(row[key].ljust(widths[key]) for key in keys).rstrip())
        return "\n".join(lines + [""] + self._footer())

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's plain-text view (a terminal, or text/plain): the table rather than the dataclass fields."""
        printer.text("Report(...)" if cycle else self.to_text())

    def __str__(self) -> str:
        return self.to_text()

    def _repr_html_(self) -> str:
        """An HTML table: sizes in KiB/MiB/GiB, the best row highlighted, OOM rows marked "does not fit"."""
        if not self.trials:
            return "<div class='memlab-report'><p>No trials yet.</p></div>"
        headers = [
            ("plan", "plan"),
            ("status", "status"),
            ("peak", "peak"),
            *[(name, name) for name in CATEGORIES],
            ("step", "time/step"),
            ("samples", "samples/s"),
            ("tokens", "tokens/s"),
            ("notes", "notes"),
        ]
        numeric = {"peak", *CATEGORIES, "step", "samples", "tokens"}
        best = self.best
        parts = [
            "<div class='memlab-report'>",
            "<table style='border-collapse:collapse'>",
            "<thead><tr>"
            + "".join(
                f"<th style='text-align:{'right' if key in numeric else 'left'};padding:2px 8px'>"
                f"{html.escape(title)}</th>"
                for key, title in headers
            )
            + "</tr></thead>",
            "<tbody>",
        ]
        for trial, row in zip(self.trials, self._rows(), strict=True):
            if trial is best:
                style = "background:#e3f4e1;font-weight:bold"
                row["plan"] = row["plan"] + " \u2605 best"
            elif trial.status == "oom" or (trial.status == "ok" and not self.fits(trial)):
                style = "background:#f4f4f4;color:#777"
            elif trial.status == "error":
                style = "background:#fdecea"
            else:
                style = ""
            cells = "".join(
                f"<td style='text-align:{'right' if key in numeric else 'left'};padding:2px 8px'>"
                f"{html.escape(row[key])}</td>"
                for key, _ in headers
            )
            parts.append(f"<tr style='{style}'>{cells}</tr>")
        parts.append("</tbody></table>")
        parts.extend(f"<p style='margin:2px 0'>{html.escape(line)}</p>" for line in self._footer())
        parts.append("</div>")
        return "\n".join(parts)

    # --- figure ---------------------------------------------------------------------------------------------

    def plot(self) -> Any:  # a plotly.graph_objects.Figure; plotly is imported only when drawing
        """A plotly figure: samples/s per plan (left) and peak memory by category per plan (right).

        The right panel stacks params, grads, optimizer, activations and other (MiB) for each plan; an
        out-of-memory plan is a grey hatched "does not fit" bar (as high as the peak it reached, at least its
        budget), a failed plan an ``x`` on the axis, and a dashed line marks the budget. The best plan's samples/s
        bar is green. This is the top row of the live figure (:mod:`memlab.jupyter.live`), built by the same
        :func:`comparison_figure`: the traces are always the same eight (five categories, "does not fit", "error",
        "samples/s"), in that order.

        Example:
            >>> r = Report([Trial(Plan(), "ok", 2**20, {"params": 2**20}, 0.5, 8.0, None, "cpu")])
            >>> [trace.name for trace in r.plot().data][-1]
            'samples/s'
        """
        data = figure_data(self)
        fig = comparison_figure(figure_columns(self, data))
        if data["budget_mib"] is not None:
            fig.add_shape(budget_line(data["budget_mib"]))
            fig.add_annotation(budget_note(self.budget or 0))
        title = "memlab: memory and speed per plan"
        if data["best"] is not None:
            title += f" (best: {data['best']})"
        fig.update_layout(title=title, margin={"t": 80})
        return fig


FIGURE_TITLES = ("Throughput", "Peak memory by category")
"""The titles of the two panels of every memlab figure: samples/s per plan in column 1 (axes ``x``, ``y``), peak
memory by category per plan in column 2 (axes ``x2``, ``y2``)."""

THROUGHPUT_COLUMN, MEMORY_COLUMN = 1, 2
_COLUMN_WIDTHS = (0.4, 0.6)
_TRACE_COLUMNS = (*(MEMORY_COLUMN for _ in CATEGORIES), MEMORY_COLUMN, MEMORY_COLUMN, THROUGHPUT_COLUMN)


def comparison_figure(
    columns: list[dict[str, Any]] | None = None, *, more_titles: tuple[str, ...] = ()
) -> Any:  # a plotly Figure
    """The figure of :meth:`Report.plot` and of the live figure: the subplot layout, axes and per-plan traces.

    Row 1 is throughput (column 1) and peak memory by category (column 2), holding :func:`comparison_traces`
    filled with ``columns`` (see :func:`figure_columns`; None: empty, for a live figure to fill). ``more_titles``
    adds rows below (two titles per row) for the caller's own traces; the live figure adds one. plotly is
    imported here, never when memlab is imported.

    Example:
        >>> fig = comparison_figure(more_titles=("Memory of the running trial", "Memory vs throughput"))
        >>> [a.text for a in fig.layout.annotations][:2], fig.data[0].xaxis, fig.data[-1].xaxis
        (['Throughput', 'Peak memory by category'], 'x2', 'x')
    """
    from plotly.subplots import make_subplots

    rows = 1 + len(more_titles) // 2
    fig = make_subplots(
        rows=rows,
        cols=2,
        column_widths=list(_COLUMN_WIDTHS),
        horizontal_spacing=0.12,
        vertical_spacing=0.16,
        subplot_titles=(*FIGURE_TITLES, *more_titles),
    )
    for trace, column in zip(comparison_traces(columns), _TRACE_COLUMNS, strict=True):
        fig.add_trace(trace, row=1, col=column)
    fig.update_layout(barmode="stack", legend_title_text="memory", bargap=0.25)
    fig.update_xaxes(title_text="plan", type="category", row=1)
    fig.update_yaxes(title_text="samples/s", rangemode="tozero", row=1, col=THROUGHPUT_COLUMN)
    fig.update_yaxes(title_text="peak memory (MiB)", rangemode="tozero", row=1, col=MEMORY_COLUMN)
    return fig


def comparison_traces(columns: list[dict[str, Any]] | None = None) -> list[Any]:
    """The eight per-plan traces, styled: the five categories, "does not fit" and "error" (peak memory panel), and
    "samples/s" (throughput panel), in that order; filled with ``columns`` (:func:`figure_columns`), else empty.

    Example:
        >>> [trace.name for trace in comparison_traces()][5:]
        ['does not fit', 'error', 'samples/s']
    """
    import plotly.graph_objects as go

    traces: list[Any] = [
        go.Bar(
            name=name,
            x=[],
            y=[],
            marker_color=_CATEGORY_COLORS[name],
            legendgroup="memory",
            hovertemplate="%{x}<br>" + name + ": %{y:.2f} MiB<extra></extra>",
        )
        for name in CATEGORIES
    ]
    traces.append(
        go.Bar(
            name="does not fit",
            x=[],
            y=[],
            marker={"color": _DOES_NOT_FIT_COLOR, "pattern": {"shape": "/"}},
            legendgroup="does not fit",
            textposition="inside",
            insidetextanchor="middle",
            hovertemplate="%{x}<br>does not fit: out of memory (reached %{customdata:.2f} MiB)<extra></extra>",
        )
    )
    traces.append(
        go.Scatter(
            name="error",
            x=[],
            y=[],
            mode="markers",
            marker={"symbol": "x", "size": 12, "color": _BUDGET_COLOR},
            hovertemplate="%{x}<br>error: %{text}<extra></extra>",
        )
    )
    traces.append(
        go.Bar(
            name="samples/s",
            x=[],
            y=[],
            marker_color=_RATE_COLOR,
            showlegend=False,
            hovertemplate="%{x}<br>%{y:.3g} samples/s<extra></extra>",
        )
    )
    for trace, values in zip(traces, columns or [], strict=False):
        for key, value in values.items():
            trace[key] = value
    return traces


def figure_columns(report: Report, data: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """What each of the :func:`comparison_traces` shows, in trace order: ``{"x": ..., "y": ...}`` and, where the
    trace has them, ``"text"``, ``"customdata"`` (the MiB an out-of-memory plan reached) and ``"marker.color"``.

    An out-of-memory plan's "does not fit" bar is at least as high as its budget: a trial stopped by the budget
    may have reached little before the allocation that broke it (failing both, the highest peak drawn, so the bar
    is never invisible).

    Example:
        >>> oom = Trial(Plan(), "oom", 0, {}, None, None, None, "cpu", error="out of memory", budget=2**21)
        >>> figure_columns(Report([oom]))[5]
        {'x': ['plain'], 'y': [2.0], 'customdata': [0.0], 'text': ['does not fit']}
    """
    data = figure_data(report) if data is None else data
    labels = data["labels"]
    heights = _does_not_fit_heights(report, data)
    columns: list[dict[str, Any]] = [{"x": labels, "y": data["categories"][name]} for name in CATEGORIES]
    columns.append(
        {
            "x": labels,
            "y": heights,
            "customdata": data["does_not_fit"],
            "text": ["does not fit" if height is not None else "" for height in heights],
        }
    )
    columns.append({"x": labels, "y": data["error"], "text": data["error_text"]})
    columns.append(
        {
            "x": labels,
            "y": data["samples_per_s"],
            "marker.color": [_BEST_COLOR if label == data["best"] else _RATE_COLOR for label in labels],
        }
    )
    return columns


def budget_line(budget_mib: float) -> dict[str, Any]:
    """The dashed budget line across the peak memory panel, as a plotly shape.

    Example:
        >>> budget_line(8.0)["yref"], budget_line(8.0)["line"]["dash"]
        ('y2', 'dash')
    """
    return {
        "type": "line",
        "xref": "x2 domain",
        "x0": 0,
        "x1": 1,
        "yref": "y2",
        "y0": budget_mib,
        "y1": budget_mib,
        "line": {"color": _BUDGET_COLOR, "dash": "dash", "width": 2},
        "name": "budget",
    }


def budget_note(budget: int) -> dict[str, Any]:
    """The label of :func:`budget_line` (``"budget 8.0 GiB"``), as a plotly annotation.

    Example:
        >>> budget_note(2**20)["text"]
        'budget 1.0 MiB'
    """
    return {
        "text": f"budget {format_bytes(budget)}",
        "xref": "x2 domain",
        "yref": "y2",
        "x": 0,
        "y": budget / _MIB,
        "xanchor": "left",
        "yanchor": "bottom",
        "showarrow": False,
        "font": {"color": _BUDGET_COLOR},
    }


def _does_not_fit_heights(report: Report, data: Mapping[str, Any]) -> list[float | None]:
    floor = max((peak for peak in data["peak_mib"] if peak), default=1.0)
    heights: list[float | None] = []
    for trial, reached in zip(report.trials, data["does_not_fit"], strict=True):
        if reached is None:
            heights.append(None)
            continue
        budget = trial.budget if trial.budget is not None else report.budget
        height = max(reached, (budget or 0) / _MIB)
        heights.append(height if height > 0 else floor)
    return heights


def figure_data(report: Report) -> dict[str, Any]:
    """The figure as plain data: lists aligned with ``labels``, sizes in MiB, None where a bar is absent.

    Keys:
        ``labels``: one per trial (a repeated label gets `` (2)``, `` (3)``... so bars never merge).
        ``status``: each trial's status. ``fits``: the report's view of whether each trial fits.
        ``categories``: ``{category: [MiB or None]}``, values for trials that ran (``"ok"``).
        ``does_not_fit``: MiB reached by out-of-memory trials, None elsewhere.
        ``error``: 0 for failed trials (a marker on the axis), None elsewhere.
        ``error_text``: the one-line message of failed trials, "" elsewhere.
        ``peak_mib``: every trial's peak (None for errors).
        ``samples_per_s``: speeds of ``"ok"`` trials, None elsewhere.
        ``best``: the best trial's label, or None. ``budget_mib``: the budget, or None. ``unit``: ``"MiB"``.

    Example:
        >>> ok = Trial(Plan(), "ok", 2**20, {"params": 2**20}, 0.5, 8.0, None, "cpu")
        >>> oom = Trial(Plan(micro_batch=8), "oom", 3 * 2**20, {"activations": 3 * 2**20},
        ...             None, None, None, "cpu")
        >>> d = figure_data(Report([ok, oom]))
        >>> d["labels"], d["categories"]["params"], d["does_not_fit"], d["best"]
        (['plain', 'mb8x1'], [1.0, None], [None, 3.0], 'plain')
    """
    labels: list[str] = []
    seen: dict[str, int] = {}
    for trial in report.trials:
        count = seen.get(trial.label, 0) + 1
        seen[trial.label] = count
        labels.append(trial.label if count == 1 else f"{trial.label} ({count})")
    categories: dict[str, list[float | None]] = {name: [] for name in CATEGORIES}
    does_not_fit: list[float | None] = []
    error: list[float | None] = []
    error_text: list[str] = []
    peak: list[float | None] = []
    speed: list[float | None] = []
    best = report.best
    best_label = None
    for label, trial in zip(labels, report.trials, strict=True):
        ran = trial.status == "ok"
        for name in CATEGORIES:
            categories[name].append(trial.breakdown[name] / _MIB if ran else None)
        does_not_fit.append(trial.peak_bytes / _MIB if trial.status == "oom" else None)
        error.append(0.0 if trial.status == "error" else None)
        error_text.append(one_line(trial.error) if trial.status == "error" and trial.error else "")
        peak.append(trial.peak_bytes / _MIB if trial.status != "error" else None)
        speed.append(trial.samples_per_s if ran else None)
        if trial is best:
            best_label = label
    return {
        "labels": labels,
        "status": [trial.status for trial in report.trials],
        "fits": [report.fits(trial) for trial in report.trials],
        "categories": categories,
        "does_not_fit": does_not_fit,
        "error": error,
        "error_text": error_text,
        "peak_mib": peak,
        "samples_per_s": speed,
        "best": best_label,
        "budget_mib": None if report.budget is None else report.budget / _MIB,
        "unit": "MiB",
    }


def _empty_trial_columns() -> list[str]:
    return list(Trial(Plan(), "error", 0, {}, None, None, None, "").to_dict())


def _status_text(trial: Trial, fits: bool) -> str:
    if trial.status == "oom":
        return "does not fit (OOM)"
    if trial.status == "error":
        return "error"
    if not fits:
        return "does not fit (over budget)"
    return "ok (estimate)" if trial.estimated else "ok"


def one_line(message: BaseException | str, limit: int | None = 120) -> str:
    """The first non-empty line of a message, for a table cell or a status line; at most ``limit`` characters.

    An exception other than a :class:`~memlab.errors.MemlabError` (whose messages are written for the user) is
    prefixed with its type name, and one without a message is its type name alone.

    Example:
        >>> one_line("CUDA out of memory.\\n  Tried to allocate 2.00 GiB")
        'CUDA out of memory.'
        >>> one_line(ValueError("\\nbad value\\nmore")), one_line(MemlabError("write budget='8GiB'"))
        ('ValueError: bad value', "write budget='8GiB'")
        >>> one_line("x" * 200, limit=10), one_line(KeyboardInterrupt())
        ('xxxxxxx...', 'KeyboardInterrupt')
    """
    text = next((line.strip() for line in str(message).splitlines() if line.strip()), "")
    if isinstance(message, BaseException) and not isinstance(message, MemlabError):
        text = f"{type(message).__name__}: {text}" if text else type(message).__name__
    elif isinstance(message, BaseException) and not text:
        text = type(message).__name__
    if limit is None or len(text) <= limit:
        return text
    return text[: limit - 3] + "..."


def _format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.2f} s"


def _format_rate(rate: float | None) -> str:
    if rate is None:
        return "-"
    if rate >= 100:
        return f"{rate:,.0f}"
    if rate >= 10:
        return f"{rate:.1f}"
    return f"{rate:.2f}"
