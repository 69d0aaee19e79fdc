"""Trial and Report as data: what a measurement found, which trial is best, and JSON / pandas forms.

An inference plan's trial is :class:`~memlab.report.inference_trial.InferenceTrial`, a Trial of its own module.

Tables (:mod:`memlab.report.views.tables`) and figures (:mod:`memlab.report.views.figure`) are drawn by their own
modules, imported when first used, so ``import memlab`` imports neither pandas nor plotly.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, overload

from memlab.errors import MemlabError
from memlab.measure.tracker import CATEGORIES, INFERENCE_CATEGORIES
from memlab.plan import PLAN_FIELDS, Plan
from memlab.report.noise import runs_speed_interval
from memlab.report.views import view

if TYPE_CHECKING:
    import pandas

    from memlab.report.timeline import Timeline

__all__ = ["ALL_CATEGORIES", "CATEGORIES", "INFERENCE_CATEGORIES", "STATUSES", "Report", "Trial", "speed_range"]

STATUSES = ("ok", "oom", "error")
ALL_CATEGORIES = ("params", "grads", "optimizer", "activations", "kv_cache", "other")
"""Every category of training and inference breakdowns, in the order a table of both shows them."""


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
        reserved_bytes: the CUDA caching allocator's reserved peak (``max_memory_reserved``; modelled in an estimate).
        context_bytes: what the driver holds for the process on the GPU outside the caching allocator: the CUDA
            context and library handles (read from the driver on CUDA; modelled for a named GPU in an estimate).
        rss_bytes: process resident memory after the trial (CPU context).
        preexisting_bytes: memory held before the trial began; it is part of ``"other"``.
        notes: remarks for the reader, such as ``"fp16 on CPU is slow"``.
        estimated: True for dry-run estimates (no real step ran).
        step_times: every timed step's seconds, in order (their median is ``step_time_s``).
        step_runs: how many of ``step_times`` each timed run gave, in order, where a plan was timed again in turn
            (``fit`` and ``compare`` time close contenders A B A B): their interval is of the runs' medians; empty
            where the steps came from one run.
        timeline: the tracked step over time (:class:`~memlab.report.timeline.Timeline`: memory by category, phases,
            the peak named); None where no step was tracked (a failed warm-up, a trial loaded from a dict), and for
            sharded estimates (ZeRO is computed from formulas; FSDP2's FSDPMemTracker gives per-module peaks, not a
            step over time).
        compile_seconds: where the plan compiles (``compile=True``), the seconds of its first warm-up step, which
            compiled the step and ran it once: never part of ``step_time_s`` (None otherwise).
        model_weights: ``"bf16"`` or ``"fp16"`` where the model itself holds its trained weights in that dtype (loaded
            so) while the plan keeps the model's dtypes; the label then says so. None otherwise.
        host_bytes: the most host memory (pinned and pageable) the plan needs at once beyond what the process held
            before: what its levers keep on the host (offloaded optimizer state and activations, a paged optimizer's
            spill), by their own accounting; 0 where the plan keeps nothing there (a CPU device moves nothing off it).
        host_budget: the host memory in bytes the trial was judged against (``host_budget=``; a live run's default
            is what the machine had available), if any.

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
    context_bytes: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    estimated: bool = False
    step_times: tuple[float, ...] = field(default_factory=tuple)
    model_weights: str | None = None
    step_runs: tuple[int, ...] = field(default_factory=tuple)
    host_bytes: int = 0
    host_budget: int | None = None
    compile_seconds: float | None = None
    timeline: Timeline | None = field(default=None, repr=False, compare=False)

    categories: ClassVar[tuple[str, ...]] = CATEGORIES
    """The keys of ``breakdown``: a training step's (:class:`InferenceTrial`: :data:`INFERENCE_CATEGORIES`)."""
    mode: ClassVar[str | None] = None
    """What its dict's ``mode`` says, for a kind of trial that :meth:`from_dict` tells apart by it (a subclass of
    Trial: ``"inference"`` for :class:`~memlab.report.inference_trial.InferenceTrial`); None for a training trial."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} is not one of {', '.join(STATUSES)}")
        self.peak_bytes = int(self.peak_bytes)
        self.host_bytes = int(self.host_bytes)
        if self.host_bytes < 0:
            raise ValueError(f"host_bytes={self.host_bytes} is negative")
        categories = self.categories
        unknown = set(self.breakdown) - set(categories)
        if unknown:
            raise ValueError(f"breakdown has unknown categories {sorted(unknown)}; use only {', '.join(categories)}")
        breakdown = {name: int(self.breakdown.get(name, 0)) for name in categories}
        if any(value < 0 for value in breakdown.values()):
            raise ValueError(f"breakdown has negative bytes: {breakdown}")
        total = sum(breakdown.values())
        if total > self.peak_bytes:
            raise ValueError(f"breakdown adds up to {total} bytes, more than peak_bytes={self.peak_bytes}")
        breakdown["other"] += self.peak_bytes - total
        self.breakdown = breakdown
        self.notes = tuple(self.notes)
        self.step_times = tuple(float(seconds) for seconds in self.step_times)
        self.step_runs = tuple(int(count) for count in self.step_runs)
        if self.step_runs and sum(self.step_runs) != len(self.step_times):
            raise ValueError(f"step_runs={self.step_runs} does not add up to the {len(self.step_times)} step times")

    @property
    def label(self) -> str:
        """The plan's short label, as in tables and plots; a model loaded in bf16 trains bf16 weights, and says so.

        Example:
            >>> Trial(Plan(checkpointing=True), "ok", 1, {}, None, None, None, "cpu", model_weights="bf16").label
            'ckpt bf16-weights'
        """
        label = self.plan.label()
        if self.model_weights is None or self.plan.weights != "fp32":
            return label
        suffix = f"{self.model_weights}-weights"
        return suffix if label == "plain" else f"{label} {suffix}"

    @property
    def card_bytes(self) -> int | None:
        """What the card will show for the process (nvidia-smi, and what an out-of-memory error is about): the
        reserved peak plus the CUDA context; None unless both are known.

        Example:
            >>> Trial(Plan(), "ok", 90, {}, None, None, None, "cuda:0", reserved_bytes=100, context_bytes=20).card_bytes
            120
        """
        known = self.reserved_bytes is not None and self.context_bytes is not None
        return (self.reserved_bytes or 0) + (self.context_bytes or 0) if known else None

    @property
    def verdict_bytes(self) -> int:
        """The figure a budget verdict judges: :attr:`card_bytes` where it is known, else the allocated peak."""
        card = self.card_bytes
        return self.peak_bytes if card is None else card

    @property
    def host_fits(self) -> bool:
        """Whether :attr:`host_bytes` are within :attr:`host_budget` (True where no host budget was given)."""
        return self.host_budget is None or self.host_bytes <= self.host_budget

    @property
    def verdict_figure(self) -> str:
        """The figure that decided the verdict (DESIGN 2.4): ``"host"`` where the device figure is within
        :attr:`budget` and :attr:`host_bytes` are over :attr:`host_budget`; else ``"card"`` (:attr:`card_bytes`) or
        ``"allocated"`` (the allocated peak), whichever :attr:`verdict_bytes` is.

        Example:
            >>> t = Trial(Plan(), "ok", 90, {}, None, None, None, "cuda:0", budget=100, reserved_bytes=96)
            >>> t.verdict_figure, t.fits, dataclasses.replace(t, context_bytes=8).fits
            ('allocated', True, False)
            >>> dataclasses.replace(t, host_bytes=2**30, host_budget=2**29).verdict_figure
            'host'
        """
        if self.device_fits and not self.host_fits:
            return "host"
        return "allocated" if self.card_bytes is None else "card"

    @property
    def device_fits(self) -> bool:
        """Whether :attr:`verdict_bytes` are within :attr:`budget` (True where no budget was given)."""
        return self.budget is None or self.verdict_bytes <= self.budget

    @property
    def fits(self) -> bool:
        """True when the trial ran (``status == "ok"``), its :attr:`verdict_bytes` are within its budget, if any,
        and its :attr:`host_bytes` within its host budget, if any."""
        return self.status == "ok" and self.device_fits and self.host_fits

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
        for name in self.categories:
            data[f"{name}_bytes"] = self.breakdown[name]
        data.update(
            step_time_s=self.step_time_s,
            samples_per_s=self.samples_per_s,
            tokens_per_s=self.tokens_per_s,
            error=self.error,
        )
        data.update(self._plan_values())
        data.update(
            device=self.device,
            rows_per_step=self.rows_per_step,
            budget=self.budget,
            reserved_bytes=self.reserved_bytes,
            rss_bytes=self.rss_bytes,
            preexisting_bytes=self.preexisting_bytes,
            context_bytes=self.context_bytes, card_bytes=self.card_bytes, verdict_figure=self.verdict_figure,
            notes=list(self.notes),
            estimated=self.estimated,
            step_times=list(self.step_times),
            model_weights=self.model_weights,
            step_runs=list(self.step_runs),
            host_bytes=self.host_bytes,
            host_budget=self.host_budget,
            compile_seconds=self.compile_seconds,
        )
        return data

    def _plan_values(self) -> dict[str, Any]:
        return {name: getattr(self.plan, name) for name in PLAN_FIELDS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trial:
        """The Trial that :meth:`to_dict` described (``label``, ``fits``, ``card_bytes`` and ``verdict_figure`` are
        recomputed, not read).

        Example:
            >>> t = Trial(Plan(precision="bf16"), "oom", 5, {"activations": 5}, None, None, None, "cuda:0",
            ...           error="CUDA out of memory")
            >>> Trial.from_dict(t.to_dict()) == t
            True
        """
        mode = data.get("mode")
        if mode is not None and mode != cls.mode:
            for kind in Trial.__subclasses__():
                if kind.mode == mode:
                    return kind.from_dict(data)
        return cls(**cls._keywords(data))

    @classmethod
    def _keywords(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        plan = Plan(**{name: data[name] for name in PLAN_FIELDS if name in data})
        return dict(
            plan=plan,
            status=data["status"],
            peak_bytes=data["peak_bytes"],
            breakdown={name: data.get(f"{name}_bytes", 0) for name in cls.categories},
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
            context_bytes=data.get("context_bytes"),
            notes=tuple(data.get("notes") or ()),
            estimated=bool(data.get("estimated", False)),
            step_times=tuple(data.get("step_times") or ()),
            model_weights=data.get("model_weights"),
            step_runs=tuple(data.get("step_runs") or ()),
            host_bytes=data.get("host_bytes") or 0,
            host_budget=data.get("host_budget"),
            compile_seconds=data.get("compile_seconds"),
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
        suggestions: when nothing in a fit's space fits, plans outside it (adapters, pure bf16) estimated to fit,
            as estimated Trials, the one expected fastest first.
        shorter_sequences: when nothing in a fit's space fits, the longest sequences its lightest plan is estimated
            to fit at, as a sentence (:func:`memlab.search.limits.shorter_sequences`); None otherwise.

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
    suggestions: list[Trial] = field(default_factory=list)
    shorter_sequences: str | None = None

    def fits(self, trial: Trial) -> bool:
        """Whether ``trial`` fits: its own budget (:attr:`Trial.fits`) and this report's budget, if set, each
        judged on :attr:`Trial.verdict_bytes` (the card figure where known, else the allocated peak).

        Example:
            >>> t = Trial(Plan(), "ok", 900, {"params": 900}, 0.5, 8.0, None, "cpu")
            >>> Report([t]).fits(t), Report([t], budget=800).fits(t)
            (True, False)
        """
        return trial.fits and (self.budget is None or trial.verdict_bytes <= self.budget)

    @property
    def best(self) -> Trial | None:
        """The fastest trial that fits, where speed is judged with its noise; None when nothing fits.

        The trials that fit and whose speed is within measurement noise of the fastest one (see :meth:`ties`)
        are equals; among them ``best`` is the one with the lowest peak. Trials without a speed (estimates) rank
        below any measured speed, and among themselves by lower peak.

        Example:
            >>> fast = Trial(Plan(), "ok", 900, {"params": 900}, 0.5, 8.0, None, "cpu")
            >>> Report([fast], budget=1000).best is fast, Report([fast], budget=800).best
            (True, None)
            >>> noisy = Trial(Plan(), "ok", 900, {}, 0.5, 16.0, None, "cpu", rows_per_step=8, step_times=(0.4, 0.6))
            >>> small = Trial(Plan(checkpointing=True), "ok", 500, {}, 0.55, 14.5, None, "cpu", rows_per_step=8,
            ...               step_times=(0.5, 0.6))
            >>> report = Report([noisy, small])
            >>> report.best.label, [t.label for t in report.ties]
            ('ckpt', ['plain'])
        """
        equals = self._equals_of_the_fastest()
        return min(equals, key=lambda trial: trial.peak_bytes) if equals else None

    @property
    def ties(self) -> list[Trial]:
        """The trials that fit and are as fast as :attr:`best` within measurement noise, ``best`` left out.

        Two speeds are within noise when their intervals (:func:`speed_range`: where the median speed lies, 95%)
        overlap; a trial timed once, or not timed, has no interval, only its speed.

        Example:
            >>> a = Trial(Plan(), "ok", 900, {}, 0.5, 16.0, None, "cpu", rows_per_step=8, step_times=(0.4, 0.6))
            >>> b = Trial(Plan(precision="bf16"), "ok", 800, {}, 1.0, 8.0, None, "cpu", rows_per_step=8,
            ...           step_times=(0.9, 1.1))
            >>> Report([a, b]).ties
            []
        """
        best = self.best
        return [trial for trial in self._equals_of_the_fastest() if trial is not best]

    def _equals_of_the_fastest(self) -> list[Trial]:
        candidates = [trial for trial in self.trials if self.fits(trial)]
        timed = [trial for trial in candidates if trial.samples_per_s is not None]
        if not timed:
            lowest = min(candidates, key=lambda trial: trial.peak_bytes, default=None)
            return [] if lowest is None else [lowest]
        fastest = max(timed, key=lambda trial: (trial.samples_per_s or 0.0, -trial.peak_bytes))
        slowest_of_fastest = speed_range(fastest)[0]
        return [trial for trial in timed if speed_range(trial)[1] >= slowest_of_fastest]

    @property
    def categories(self) -> tuple[str, ...]:
        """The memory categories of the trials' breakdowns, in table order: a training report's
        :data:`CATEGORIES`, an inference report's :data:`INFERENCE_CATEGORIES`, both where both kinds are mixed.

        Example:
            >>> Report([]).categories
            ('params', 'grads', 'optimizer', 'activations', 'other')
        """
        kinds = {type(trial).categories for trial in [*self.trials, *self.suggestions]}
        if not kinds:
            return CATEGORIES
        if len(kinds) == 1:
            return next(iter(kinds))
        present = {name for kind in kinds for name in kind}
        return tuple(name for name in ALL_CATEGORIES if name in present)

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
        suggestions = [trial.to_dict() for trial in self.suggestions]
        return {"budget": self.budget, "trials": trials, "skipped": skipped, "suggestions": suggestions,
                "shorter_sequences": self.shorter_sequences}

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
        suggestions = [Trial.from_dict(item) for item in data.get("suggestions", [])]
        return cls(trials, budget=data.get("budget"), skipped=skipped, suggestions=suggestions,
                   shorter_sequences=data.get("shorter_sequences"))

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

        Columns: ``label, status, fits, peak_bytes, params_bytes, grads_bytes, optimizer_bytes, activations_bytes,
        other_bytes, step_time_s, samples_per_s, tokens_per_s, error``, the plan fields (``micro_batch, accumulation,
        checkpointing, precision, optimizer, offload``...), then ``device, rows_per_step, budget, reserved_bytes,
        rss_bytes, preexisting_bytes, context_bytes, card_bytes, verdict_figure, notes, estimated, step_times,
        model_weights, step_runs, host_bytes, host_budget``.

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
        columns = list(_EMPTY_TRIAL.to_dict()) if any(type(t) is Trial for t in self.trials) or not rows else []
        for trial in {trial.mode: trial for trial in self.trials if trial.mode is not None}.values():
            empty = type(trial)(type(trial.plan)(), "error", 0, {}, None, None, None, "")  # each other kind's columns
            columns += [name for name in empty.to_dict() if name not in columns]
        frame = pandas.DataFrame(rows, columns=columns)
        for name in ("step_time_s", "samples_per_s", "tokens_per_s", "prefill_tokens_per_s", "decode_tokens_per_s"):
            if name in frame:
                frame[name] = frame[name].astype("float64")
        for name in ("micro_batch", "batch_size", "rows_per_step", "budget", "reserved_bytes", "rss_bytes",
                     "context_bytes", "host_budget"):
            if name in frame:
                frame[name] = frame[name].astype("Int64")
        return frame

    # --- tables and figure (drawn by memlab.report.views.tables and memlab.report.views.figure) ---

    def to_text(self) -> str:
        """A plain-text table for the terminal: a line per trial, ★ marks the best, then a summary.

        Example:
            >>> r = Report([Trial(Plan(), "ok", 2048, {"params": 2048}, 0.25, 16.0, None, "cpu")])
            >>> lines = r.to_text().splitlines()
            >>> lines[0].split()[:4], lines[1].split()[:4]
            (['plan', 'status', 'peak', 'KiB'], ['★', 'plain', 'ok', '2.0'])
            >>> for line in lines[3:]:
            ...     print(line)
            Best: plain (peak 2.0 KiB, 16.0 samples/s)
            Device: cpu
        """
        return view("text_table")(self)  # type: ignore[no-any-return]

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's plain-text view (a terminal, or text/plain): the table rather than the dataclass fields."""
        printer.text("Report(...)" if cycle else self.to_text())

    def __str__(self) -> str:
        return self.to_text()

    def _repr_html_(self) -> str:
        """An HTML table: sizes in KiB/MiB/GiB, the best row highlighted, OOM rows marked "does not fit"."""
        return view("html_table")(self)  # type: ignore[no-any-return]

    def plot(self, kind: str = "comparison") -> Any:  # a plotly.graph_objects.Figure; plotly imported only here
        """A plotly figure: samples/s per plan (left) and peak memory by category per plan (right); with
        ``kind="timeline"``, every plan's step over time on one time axis and one memory scale, stacked by category,
        phases shaded and each peak named (:mod:`memlab.report.views.timeline_figure`).

        The right panel stacks params, grads, optimizer, activations and other (MiB) for each plan; an
        out-of-memory plan is a grey hatched "does not fit" bar (as high as the peak it reached, at least a tenth
        past its budget line), a plan over the budget is hatched over its own colours (and its samples/s bar grey and
        hatched), a failed plan an ``x`` on the axis, and a dashed line marks the budget. The best plan's samples/s
        bar is green, with "best" written above its error bar (its ties "tie", a plan over the budget "over budget");
        the legend names only the marks drawn. This is the top row of the live figure
        (:mod:`memlab.frontends.jupyter.live`), built by the same :func:`comparison_figure`: the traces are always
        the same ten (five categories, "out of memory", "over budget", "error", "samples/s", and the text trace
        "marks" of the words above the throughput bars), in that order.

        Example:
            >>> r = Report([Trial(Plan(), "ok", 2**20, {"params": 2**20}, 0.5, 8.0, None, "cpu")])
            >>> [trace.name for trace in r.plot().data][-2:]
            ['samples/s', 'marks']
        """
        if kind == "timeline":
            return view("report_timelines")(self)
        if kind != "comparison":
            raise MemlabError(f"plot(kind={kind!r}) is not a figure memlab draws; write kind='comparison' or "
                              "kind='timeline'")
        return view("report_figure")(self)


def speed_range(trial: Trial) -> tuple[float, float]:
    """The interval of samples/s that bounds the trial's median speed (95%, from its timed steps:
    :func:`memlab.report.noise.speed_interval`; for a trial pooled from runs timed in turn, the span of its runs'
    medians widened by their typical noise, :func:`~memlab.report.noise.runs_speed_interval`); its speed twice
    where it has none (timed once, or not timed).

    Example:
        >>> speed_range(Trial(Plan(), "ok", 1, {}, 0.5, 16.0, None, "cpu", rows_per_step=8, step_times=(0.4, 0.8)))
        (10.0, 20.0)
    """
    interval = runs_speed_interval(trial.step_times, trial.step_runs, trial.rows_per_step)
    if interval is None:
        speed = trial.samples_per_s or 0.0
        return speed, speed
    return interval


_EMPTY_TRIAL = Trial(Plan(), "error", 0, {}, None, None, None, "")
