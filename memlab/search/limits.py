"""``memlab.limits``: the longest sequences (or the most rows) a plan trains on within a budget.

Memory in tokens has a known shape: a constant (weights, gradients, optimizer state), a part linear in the tokens
(the activations of every layer) and, where attention keeps its probabilities (eager), a part quadratic in them; in
rows it is linear. So a few sizes are enough: the batch's size and its double (and quadruple, for tokens) are
tried, the curve through them says where it crosses the budget, and the sizes on both sides of that crossing are
tried until the largest that fits and the next that does not are a ``multiple`` apart (:mod:`memlab.search.narrow`:
at most ``MAX_RUNS`` tries and ``MAX_SECONDS``, the answer's notes say where it stopped short). On a config, a name
or another device these are dry runs on fake tensors (:func:`memlab.estimate`); on a live model on its own device
they are measured trials, each out-of-memory recovered (:func:`memlab.measure`). A CUDA dry run's
sizes are replayed on the card held to the budget; the answer is then checked on the whole card, up to
``UNCAPPED_CHECKS`` sizes down, so that it never counts on the capped allocator giving its cache back in time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memlab.errors import MemlabError, refuse_class
from memlab.estimation.cuda.gpus import gpu_kind
from memlab.live.trainer_kinds import generates
from memlab.plan import Plan, format_bytes, parse_budget
from memlab.report import Trial
from memlab.report.format import FIGURE_WORDS, over_words
from memlab.search.narrow import MAX_RUNS, MAX_SECONDS, bracket, narrow
from memlab.search.narrow import fits as _fits
from memlab.techniques.precision import half_precision
from memlab.trainer.source import is_trainer

__all__ = ["MAX_RUNS", "MAX_SECONDS", "Limits", "limits", "resized"]
UNCAPPED_CHECKS = 3
"""The sizes at and below a dry run's answer checked on the whole card one ``multiple`` apart, tried or not
(:func:`_checked_without_release`); below them only the sizes already tried are checked."""
UNCAPPED_NOTE = ("the answer is the largest size whose card figure is within the budget without the cap's release of "
                 "cached segments: {sizes} fit only if the capped allocator gives its cache back in time, which "
                 "fragmentation can stop")


@dataclass
class Limits:
    """What :func:`limits` found: ``value``, the largest size that fits (0 when none does), its ``trial``, and
    ``next``, the next size tried, which does not (None when every size tried fits, up to the model's context);
    ``tried`` holds every ``(size, trial)`` in order of size."""

    vary: str
    value: int
    trial: Trial | None
    next: int | None
    next_trial: Trial | None
    budget: int
    tried: list[tuple[int, Trial]] = field(default_factory=list)
    measured: bool = False
    notes: tuple[str, ...] = ()
    reason: str | None = None
    """Where nothing fits: why (what the smallest size tried needs, and the part no size changes)."""
    suggestions: list[Trial] = field(default_factory=list)
    """Where nothing fits: plans with other levers estimated to fit at the smallest size tried (as ``fit``'s
    suggestions: the fastest expected first)."""
    unit: str | None = None
    """What a size is where it is not tokens per row or rows: a GRPOTrainer's ``"completion tokens"``
    (``max_completion_length``) or ``"generations per device"`` (``per_device_train_batch_size``)."""

    def to_text(self, code: Callable[[Plan], str] | None = None, *, budget_said: bool = False) -> str:
        """A table of the sizes tried, memory against the budget, the answer marked; where nothing fits, why, and the
        plans estimated to fit instead, each with ``code(plan)`` (default: the plan as Python). ``budget_said``: a
        header says the budgets (``memlab estimate --max-tokens``): here they are "the budget".

        Example:
            >>> t = Trial(Plan(), "ok", 90, {}, None, None, None, "cpu", budget=100)
            >>> print(Limits("rows", 4, t, 5, None, 100, [(4, t)]).to_text().splitlines()[0])
            rows  peak  fits  (budget 100 B, dry runs)
        """
        # The column is the figure each size was judged by (verdict_bytes), named as it is: the card figure where
        # the reserve and the CUDA context are known, else the allocated peak; each cell named where they differ.
        names = {_figure_word(trial) for _, trial in self.tried if trial.status == "ok"}
        column = names.pop() if len(names) == 1 else "judged on"
        rows = []
        for size, trial in self.tried:
            mark = "  <- largest that fits" if size == self.value else "  <- next, does not fit" * (size == self.next)
            shown = format_bytes(trial.verdict_bytes) if trial.status == "ok" else trial.status
            if trial.status == "ok" and column == "judged on":
                shown += f" {_figure_word(trial)}"
            fits = "yes" if _fits(trial, self.budget) else "no" if trial.host_budget is None else (
                f"no ({over_words(dataclasses.replace(trial, budget=self.budget))})")  # which budget, of two
            rows.append((str(size), shown, fits, mark))
        widths = [max([len(heading), *(len(row[index]) for row in rows)])  # each column as wide as its widest cell
                  for index, heading in enumerate((self.vary, column, "fits"))]
        said = ("" if budget_said else f"budget {format_bytes(self.budget)}, ") + ("measured" if self.measured else
                                                                                   "dry runs")
        lines = [("  ".join(f"{cell:<{width}}" for cell, width in zip(row[:3], widths, strict=True)) + row[3]).rstrip()
                 for row in [(self.vary, column, "fits", f"  ({said})"), *rows]]
        if "card" in names or column == "card":
            lines.append("card: the allocator's reserve + the CUDA context (what nvidia-smi shows)"
                         + ("" if self.measured else ", modelled on a card held to the budget"))
        lines += [f"{size} {self._unit()}: {trial.error}" for size, trial in self.tried if trial.status == "error"]
        lines.append(self.answer(budget_said=budget_said))
        if self.reason:
            lines.append(self.reason.replace(f"against {format_bytes(self.budget)}", "against the budget")
                         if budget_said else self.reason)
        if self.suggestions:
            lines.append(f"would fit at {self.tried[0][0] if self.tried else 0} {self._unit()} instead (estimated):")
            lines += [f"  {trial.plan.label()}  ({_figure_word(trial)} {format_bytes(trial.verdict_bytes)}): "
                      f"{(code or _plan_code)(trial.plan)}" for trial in self.suggestions]
        elif not self.value and self.reason:
            lines.append("no combination of levers tried fits either: a larger budget (or more GPUs) is needed")
        return "\n".join([*lines, *self.notes])

    def _unit(self) -> str:
        return self.unit or ("tokens per row" if self.vary == "tokens" else "rows")

    def answer(self, *, budget_said: bool = False) -> str:
        """One sentence: the largest size that fits and the next that does not, in the budget and the host budget
        where the sizes were judged on it too (``budget_said``: a header says them).

        Example:
            >>> t = Trial(Plan(), "ok", 90, {}, None, None, None, "cpu", budget=100, host_budget=2**30)
            >>> Limits("rows", 4, t, 5, None, 100, [(4, t)]).answer()
            'at most 4 rows fit in 100 B and the host budget of 1.00 GiB; 5 do not'
        """
        what = self._unit()
        hosts = [trial.host_budget for _, trial in self.tried if trial.host_budget is not None]
        budget = "the budget" if budget_said else format_bytes(self.budget)
        if hosts:
            budget += " and the host budget" + ("" if budget_said else f" of {format_bytes(min(hosts))}")
        if not self.value:
            return f"nothing fits: even {self.next} {what} need more than {budget}"
        beyond = f"; {self.next} do not" if self.next is not None else ""
        return f"at most {self.value} {what} fit in {budget}{beyond}"

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return self.to_text()

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(self.to_text())}</pre>"

    def plot(self) -> Any:
        """A plotly figure: memory against the size tried, the budget as a line, the answer marked."""
        import plotly.graph_objects as go

        sizes = [size for size, trial in self.tried if trial.status == "ok"]
        peaks = [trial.verdict_bytes / 2**30 for size, trial in self.tried if trial.status == "ok"]
        names = {_figure_word(trial) for size, trial in self.tried if trial.status == "ok"}
        figure = go.Figure(go.Scatter(x=sizes, y=peaks, mode="lines+markers", name=" or ".join(sorted(names))))
        figure.add_hline(y=self.budget / 2**30, line_dash="dash", annotation_text=f"budget {format_bytes(self.budget)}")
        if self.value:
            figure.add_vline(x=self.value, line_dash="dot", annotation_text=f"{self.value} fit")
        figure.update_layout(xaxis_title=self.vary, yaxis_title="GiB", title=self.answer(), height=360)
        return figure


def _figure_word(trial: Trial) -> str:
    """What :attr:`~memlab.report.Trial.verdict_bytes` of ``trial`` is: ``card`` (the reserve + the CUDA context)
    where known, else ``peak`` (allocated)."""
    return "peak" if trial.card_bytes is None else "card"


def _plan_code(plan: Plan) -> str:
    """The plan as Python (its fields that differ from the plain plan's).

    Example:
        >>> _plan_code(Plan(weights="bf16", checkpointing=True))
        "Plan(checkpointing=True, weights='bf16')"
    """
    from memlab.plan import PLAN_FIELDS

    plain = Plan()
    fields = [f"{name}={getattr(plan, name)!r}" for name in PLAN_FIELDS if getattr(plan, name) != getattr(plain, name)]
    return f"Plan({', '.join(fields)})"


def _size_of(batch: Any, vary: str) -> int:
    """The batch's rows (dimension 0) or tokens (dimension 1 of its first tensor with two dimensions)."""
    shapes = [tuple(getattr(value, "shape", value)) for value in _values(batch)]
    if vary == "rows":
        return int(shapes[0][0])
    wide = [shape for shape in shapes if len(shape) >= 2]
    if not wide:
        raise MemlabError("vary='tokens' needs a batch with a sequence dimension (rows x tokens); write vary='rows'")
    return int(wide[0][1])


def _values(batch: Any) -> list[Any]:
    from memlab.live.batch import StepBatches

    if batch is None or isinstance(batch, StepBatches):  # a trainer's: made from its dataset, not resized
        raise MemlabError(
            "limits varies a batch of tensors (or shapes), and a trainer's batches are collated from its dataset; "
            "write memlab.limits(trainer.model, plan, budget=..., batch={'input_ids': (rows, tokens), 'labels': "
            "(rows, tokens)}, loss_fn=...), with plan=memlab.Plan.from_trainer(trainer)"
        )
    if isinstance(batch, Mapping):
        return list(batch.values())
    return list(batch) if isinstance(batch, (tuple, list)) else [batch]


def resized(batch: Any, vary: str, size: int) -> Any:
    """``batch`` with ``size`` rows or tokens: shapes replaced, tensors repeated along the dimension and cut.

    Example:
        >>> resized({"input_ids": (1, 512), "labels": (1, 512)}, "tokens", 1024)
        {'input_ids': (1, 1024), 'labels': (1, 1024)}
        >>> import torch
        >>> resized(torch.arange(6).view(2, 3), "tokens", 5)
        tensor([[0, 1, 2, 0, 1],
                [3, 4, 5, 3, 4]])
    """
    dim = 0 if vary == "rows" else 1
    current = _size_of(batch, vary)

    def one(value: Any) -> Any:
        shape = tuple(getattr(value, "shape", value))
        if len(shape) <= dim or shape[dim] != current:
            return value
        if not hasattr(value, "shape"):
            return (*shape[:dim], size, *shape[dim + 1:])
        times = [1] * len(shape)
        times[dim] = -(-size // current)
        return value.repeat(*times).narrow(dim, 0, size)

    if isinstance(batch, Mapping):
        return {key: one(value) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(one(value) for value in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(one(value) for value in batch)
    return one(batch)


def limits(
    model_or_config: Any,
    plan: Plan | None = None,
    *,
    budget: int | str,
    batch: Any = None,
    vary: str = "tokens",
    multiple: int | None = None,
    dry_run: bool = False,
    **keywords: Any,
) -> Limits:
    """The largest sequence length (``vary="tokens"``) or number of rows (``vary="rows"``) at which ``plan`` fits
    ``budget``, the batch's other dimension kept.

    Sizes are multiples of ``multiple`` (default: 64 tokens, or 1 row). On a config, a name, or with ``device=``
    other than the live model's (or ``dry_run=True``), each size is a dry run on fake tensors (:func:`memlab.estimate`
    with ``keywords``: ``device``, ``gpu``, ``load``, ``loss_fn``...); on a live model on its own device, each is a
    measured step (:func:`memlab.measure` capped at the budget, out-of-memory recovered; with ``loss_fn``, ``lr``).
    The search narrows until ``value`` and ``next`` are one ``multiple`` apart (:mod:`memlab.search.narrow`), trying
    at most :data:`MAX_RUNS` sizes and starting none after :data:`MAX_SECONDS`; where it stops short, the notes say
    how far apart they are and which limit stopped it. ``value`` is the largest size that fits below the smallest size
    tried that does not (the figure need not grow with the size). For tokens the answer stops at the model's
    ``max_position_embeddings`` where its config has one (said in the notes).

    On a trainer without ``batch`` (its batches are collated from its dataset), ``vary="rows"`` answers the most
    examples per device (``per_device_train_batch_size``, its accumulation kept); on TRL's ``GRPOTrainer`` (which
    generates its own batch), ``vary="tokens"`` answers the longest
    ``max_completion_length`` and ``vary="rows"`` the most generations per device (``per_device_train_batch_size``,
    its accumulation and ``steps_per_generation`` kept; sizes in whole prompts of ``num_generations``), each size a
    dry run of the trainer's whole step (generation, reference log-probs, training) with the setting changed only
    while it runs (:mod:`memlab.search.limits_trainer`); ``plan=None`` is the trainer as set up. Sizes on a trainer are
    dry runs, on CUDA each answer checked on the whole card as a model's is. Example:
    ``memlab.limits(trainer, budget="24GiB", vary="tokens", multiple=128).value``.

    Args:
        model_or_config: what :func:`memlab.estimate` takes (a live model, a config, a name).
        plan: the plan (default: the plain ``Plan()``).
        budget: bytes or a size such as ``"24GiB"`` (on CUDA, what the card shows).
        batch: the batch to start from: tensors, or shapes such as ``{"input_ids": (1, 512), "labels": (1, 512)}``.
        vary: ``"tokens"`` (dimension 1 of every tensor that has the batch's sequence length) or ``"rows"``.
        multiple: the step between sizes.
        dry_run: estimate even on a live model on its own device.

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        ...                      vocab_size=256, max_position_embeddings=100_000)
        >>> found = limits(config, budget="64MiB", batch={"input_ids": (1, 512), "labels": (1, 512)}, device="cpu")
        >>> found.trial.peak_bytes <= 64 * 2**20 < found.next_trial.peak_bytes, found.next - found.value
        (True, 64)
    """
    refuse_class(model_or_config, "limits")
    if vary not in ("tokens", "rows"):
        raise MemlabError(f"vary={vary!r} is not known; write vary='tokens' or vary='rows'")
    capacity = parse_budget(budget)
    if capacity is None:
        raise MemlabError("limits needs a budget; write for example budget='24GiB'")
    step = multiple if multiple is not None else 64 if vary == "tokens" else 1
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise MemlabError(f"multiple={multiple!r} is not allowed; write a whole number >= 1, e.g. multiple=64")
    if keywords.get("gpu") is not None:  # the GPU's name resolved here, once: every dry run below takes the kind
        keywords["gpu"] = gpu_kind(keywords["gpu"])
    unit = None
    if generates(model_or_config) or (batch is None and is_trainer(model_or_config)):
        from memlab.search.limits_trainer import trainer_sizes

        sizes = trainer_sizes(model_or_config, plan, vary, capacity, multiple, batch, keywords)
        step, run, measured, ceiling, unit = sizes.multiple, sizes.run, False, sizes.ceiling, sizes.unit
        whole_card = sizes.whole_card
        start = max(step, min(sizes.current, ceiling or sizes.current) // step * step)
    else:
        if batch is None:
            raise MemlabError("limits varies a batch: write batch={'input_ids': (rows, tokens), 'labels': (rows, "
                              "tokens)} (shapes, for a dry run) or a batch of tensors")
        plan = plan or Plan()
        start = max(step, _size_of(batch, vary) // step * step)
        run, measured = _runner(model_or_config, plan, batch, vary, capacity, dry_run, keywords)
        ceiling = _context(model_or_config) if vary == "tokens" else None
        whole_card = _whole_card(model_or_config, plan, batch, vary, capacity, keywords)
    searched = narrow(run, start=start, step=step, ceiling=ceiling, budget=capacity,
                      grow=(2, 4) if vary == "tokens" else (2,))
    tried = searched.tried
    over = [] if measured else _checked_without_release(tried, capacity, step, whole_card)
    found = _answer(tried, capacity, vary, step, measured, ceiling, unit, searched.stopped)
    if over:
        found.notes = (*found.notes,
                       UNCAPPED_NOTE.format(sizes=" and ".join(f"{size} {unit or vary}" for size in over)))
    if unit is not None:
        ends = (f"{ceiling} completion tokens reach the model's context (max_position_embeddings) after the longest "
                "prompt: longer is not tried" if vary == "tokens" else
                f"{ceiling} examples is the train dataset's length: more are not tried")
        found.notes = tuple(ends if note.endswith("longer is not tried") else note for note in found.notes)
    if not found.value and found.tried:
        found.reason = _why_nothing_fits(found)
        if unit is None:  # a trainer's: fit names the plans (and GRPOConfig changes) that fit
            found.suggestions = _what_would_fit(model_or_config, found, batch, measured, keywords)
    return found


def _why_nothing_fits(found: Limits) -> str:
    """Why even the smallest size tried does not fit: what it needs, and the part of it no size changes (the
    weights, their gradients and the optimizer state).

    Example:
        >>> parts = {"params": 60, "grads": 20, "optimizer": 40, "activations": 10}
        >>> t = Trial(Plan(), "ok", 130, parts, None, None, None, "cpu", budget=100)
        >>> said = _why_nothing_fits(Limits("tokens", 0, None, 64, t, 100, [(64, t)]))
        >>> for part in said.split(": "):
        ...     print(part)
        why
        64 tokens per row need 130 B (allocated peak) against 100 B; the weights, gradients and optimizer state alone \
hold 120 B, more than the budget
        no shorter sequence fits with this plan
    """
    size, trial = found.tried[0]
    unit = found._unit()
    if trial.status != "ok":
        what = "ran out of memory" if trial.status == "oom" else f"failed ({trial.error or trial.status})"
        return f"why: even {size} {unit} {what} under {format_bytes(found.budget)}"
    figure = FIGURE_WORDS[trial.verdict_figure]
    fixed = sum(trial.breakdown.get(part, 0) for part in ("params", "grads", "optimizer"))
    said = (f"why: {size} {unit} need {format_bytes(trial.verdict_bytes)} ({figure}) against "
            f"{format_bytes(found.budget)}")
    if not fixed:
        return said
    shorter = "no shorter sequence" if found.vary == "tokens" else "no fewer rows"
    if fixed + ((trial.context_bytes or 0) if trial.card_bytes is not None else 0) >= found.budget:
        return (f"{said}; the weights, gradients and optimizer state alone hold {format_bytes(fixed)}, more than "
                f"the budget: {shorter} fits with this plan")
    return f"{said}; the weights, gradients and optimizer state hold {format_bytes(fixed)} of it"


def _what_would_fit(model_or_config: Any, found: Limits, batch: Any, measured: bool,
                    keywords: dict[str, Any]) -> list[Trial]:
    """Plans with other levers estimated (dry runs at the smallest size tried) to fit the budget with fit's margin,
    as :func:`memlab.search.suggest.combined_suggestions` finds them: the fastest expected first; at most three."""
    from memlab.estimation.cuda.gpus import kind_or_default
    from memlab.estimation.estimate import estimate
    from memlab.search.speed import speed_prior
    from memlab.search.suggest import combined_suggestions

    size, base = found.tried[0]
    small = resized(batch, found.vary, size)
    asked = ({key: value for key, value in keywords.items() if key in ("loss_fn", "lr", "host_budget")} if measured
             else keywords)

    def estimated(plans: list[Plan]) -> list[Trial]:
        return [estimate(model_or_config, small, plan, budget=found.budget, **asked) for plan in plans]

    if base.status != "ok" or not base.breakdown:  # a measured step out of memory: its dry run stands for it
        base = estimated([base.plan])[0]
        if base.status != "ok" or not base.breakdown:
            return []

    rows = _size_of(small, "rows")
    try:
        return combined_suggestions(base, estimated, budget=found.budget, rows=rows,
                                    prior=speed_prior(str(base.device).split(":")[0]), want=3, tries=4,
                                    half=half_precision(not str(base.device).startswith("cuda")
                                                       or kind_or_default(keywords.get("gpu")).bf16))
    except MemlabError:
        return []


def _checked_without_release(tried: dict[int, Trial], budget: int, step: int,
                             whole_card: Callable[[int], Trial]) -> list[int]:
    """The dry runs' answer, checked on the whole card: from the answer down, each size whose card figure is over the
    budget where nothing caps the allocator has its trial in ``tried`` replaced by that one, until one fits. The first
    :data:`UNCAPPED_CHECKS` sizes are one ``step`` apart, tried or not; past them, the largest size tried that still
    fits only by the capped replay, and so on: whatever the walk, the answer left in ``tried`` is a size checked on the
    whole card (or none fits). Returns the sizes found over.

    The sizes are tried on the card held to the budget (:func:`memlab.estimation.cuda.gpus.capped`), whose
    allocator gives its cached segments back and tries again before it runs out, as PyTorch's does. Where a size
    fits only thanks to that, fragmentation decides: on an H100 (benchmarks/results/boundary_*.json), 1,792 tokens
    of the Qwen2-like boundary model reserved 38 MB under the cap on the whole card and still ran out of memory under
    it, its free memory held in split segments the release cannot give back. No card figure (a CPU): nothing to
    check.

    Example:
        >>> from memlab.report.data import Trial
        >>> def card(size): return Trial(Plan(), "ok", size, {}, None, None, None, "cuda:0", reserved_bytes=size,
        ...                              context_bytes=0)
        >>> tried = {64: card(64), 128: card(90)}  # the capped replay: 128 tokens fit a budget of 100
        >>> _checked_without_release(tried, 100, 64, lambda size: card(size + 30)), tried[128].verdict_bytes
        ([128], 158)
    """
    over: list[int] = []
    value = bracket(tried, budget)[0]
    if not value or tried[value].card_bytes is None:
        return over
    while value >= step:
        tried[value] = whole_card(value)
        if _fits(tried[value], budget):
            break
        over.append(value)
        # Sizes are multiples of the step: the next one down, tried or not, for the first checks; then the answer the
        # sizes tried give now (a capped replay's, until it too is checked), or the next one down where none is left.
        value = value - step if len(over) < UNCAPPED_CHECKS else bracket(tried, budget)[0] or value - step
    return over


def _answer(tried: Mapping[int, Trial], budget: int, vary: str, step: int, measured: bool, ceiling: int | None,
            unit: str | None, stopped: str | None) -> Limits:
    """The sizes tried as an answer: ``value`` the bracket's low end (the largest size that fits below the smallest
    that does not), ``next`` its high end, and notes where they are not one ``step`` apart (``stopped``: the limit
    the search reached) or where a size above ``next`` fits by its figure (a figure that does not grow with the size).

    Example:
        >>> def t(peak): return Trial(Plan(), "ok", peak, {}, None, None, None, "cpu", budget=100)
        >>> found = _answer({4: t(50), 8: t(120), 12: t(90)}, 100, "rows", 1, False, None, None, "16 tries")
        >>> found.value, found.next, found.notes[0]
        (4, 8, 'not narrowed below 4 rows: the search stopped at its limit of 16 tries')
        >>> found.notes[1].split(":")[0]
        '12 rows fit by their own figure, but 8 do not'
    """
    ordered = sorted(tried.items())
    value, following = bracket(tried, budget)
    found = Limits(vary, value, tried.get(value), following, None if following is None else tried[following], budget,
                   ordered, measured, unit=unit)
    notes, what = [], unit or vary
    if following is not None and following - value > step:
        notes.append(f"not narrowed below {following - value} {what}: the search stopped at its limit of {stopped}"
                     if stopped else f"not narrowed below {following - value} {what}")
    if following is None and stopped:
        notes.append(f"every size tried fits: the search stopped at its limit of {stopped} before one that does not")
    above = [size for size, trial in ordered if following is not None and size > following and _fits(trial, budget)]
    if above:
        notes.append(f"{above[-1]} {what} fit by their own figure, but {following} do not: the answer is the "
                     "largest size below the first that does not fit, since a run meets smaller sizes too (shorter "
                     "completions, a last batch that is not full)")
    if following is None and value == ceiling:
        notes.append(f"{ceiling} tokens is the model's context (max_position_embeddings): longer is not tried")
    found.notes = tuple(notes)
    return found


def _context(model_or_config: Any) -> int | None:
    config = getattr(model_or_config, "config", model_or_config)
    found = getattr(config, "max_position_embeddings", None)
    return found if isinstance(found, int) and found > 0 else None


def _whole_card(model_or_config: Any, plan: Plan, batch: Any, vary: str, budget: int,
                keywords: dict[str, Any]) -> Callable[[int], Trial]:
    """A dry run of one size on the whole card (no cap at the budget): the check of a dry run's answer."""
    from memlab.estimation.estimate import estimate

    return lambda size: estimate(model_or_config, resized(batch, vary, size), plan, budget=budget, **keywords)


def _runner(
    model_or_config: Any, plan: Plan, batch: Any, vary: str, budget: int, dry_run: bool, keywords: dict[str, Any]
) -> tuple[Callable[[int], Trial], bool]:
    """How one size is tried: a measured step on a live model on its own device, else a dry run."""
    from torch import nn

    from memlab.live.device import model_device

    live = isinstance(model_or_config, nn.Module) and not dry_run and any(
        True for _ in model_or_config.parameters())
    if live:
        import torch

        own = model_device(model_or_config)
        asked = keywords.get("device")
        live = own.type != "meta" and (asked is None or torch.device(asked).type == own.type)
    if live:
        from memlab.runner.trial import measure

        run_keywords = {key: value for key, value in keywords.items() if key in ("loss_fn", "lr", "host_budget")}

        def measured(size: int) -> Trial:
            trial = measure(model_or_config, resized(batch, vary, size), plan, budget=budget, steps=1, warmup=0,
                            noise=0, progress=False, **run_keywords)
            return dataclasses.replace(trial, budget=budget)

        return measured, True
    from memlab.estimation.cuda.gpus import capped
    from memlab.estimation.estimate import estimate

    # The card held to the budget, as a real cap holds it: the allocator's model gives its cache back and tries
    # again before it runs out, so the card figure at the boundary is the capped allocator's.
    on_card = {**keywords, "gpu": capped(keywords.get("gpu"), budget)}

    def estimated(size: int) -> Trial:
        return estimate(model_or_config, resized(batch, vary, size), plan, budget=budget, **on_card)

    return estimated, False


def shorter_sequences(model: Any, batch: Any, plan: Plan, budget: int, **keywords: Any) -> str | None:
    """When nothing fits: the longest sequences that ``plan`` (the lightest plan searched) is estimated to fit
    ``budget`` at, as one sentence, from :func:`limits` in dry runs on ``model`` (``keywords``: ``device``,
    ``loss_fn``, ``lr``). None where the batch has no sequence dimension, is taken whole (an image batch), or where
    even the shortest sequences (or the batch's own length) do not change the answer.

    Example:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        ...                      vocab_size=256, max_position_embeddings=4096)
        >>> ids = torch.randint(0, 256, (4, 2048))
        >>> said = shorter_sequences(LlamaForCausalLM(config), {"input_ids": ids, "labels": ids}, Plan(), 40 * 2**20,
        ...                          device="cpu")
        >>> said.startswith("with plain, sequences of at most "), "(this batch has 2048)" in said
        (True, True)
    """
    from memlab.live.batch import StepBatches, is_atomic

    if isinstance(batch, StepBatches):  # a trainer's: its worst micro-batch, where its rows are padded, not packed
        batch = batch.micro_batches(None, 1)[0]
        if not isinstance(batch, Mapping) or "position_ids" in batch or "cu_seq_lens_q" in batch:
            return None
    try:
        length = _size_of(batch, "tokens")
    except MemlabError:
        return None
    if is_atomic(batch) or length < 2:
        return None
    step = min(64, max(1, length // 8))  # sizes fine enough to be worth saying for short batches too
    found = limits(model, plan, budget=budget, batch=batch, vary="tokens", multiple=step, dry_run=True, **keywords)
    if not found.value or found.value >= length:
        return None
    return (f"with {plan.label()}, sequences of at most {found.value} tokens per row (this batch has {length}) are "
            f"estimated to fit {format_bytes(budget)}: shorter sequences are a lever too (memlab.limits)")
