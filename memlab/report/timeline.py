"""A step's timeline: memory over one tracked step by category, its phases, and its peak named.

:meth:`Timeline.from_recording` turns what :class:`~memlab.measure.timeline.StepRecorder` kept of a tracked step
(one event per change of a tracked storage) into a timeline bounded in size whatever the model: the series by
category thinned to at most :data:`MAX_POINTS` points (in each stretch of events its highest and lowest total kept,
and the peak kept exactly), the phases, the peak (its bytes the trial's ``peak_bytes``, its phase, the module running,
its categories equal to the trial's ``breakdown``, what is alive by the module that made it), and the events
compressed for :meth:`Timeline.save`, which writes PyTorch's memory-snapshot pickle for ``torch.cuda._memory_viz``
and https://pytorch.org/memory_viz. The x axis counts the step's allocation events (allocations, frees, resizes),
the axis PyTorch's memory_viz draws too: a measured step and an estimated one are drawn alike.

Drawing is :mod:`memlab.report.views.timeline_figure`'s (plotly and static SVG).
"""

from __future__ import annotations

import dataclasses
import pickle
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memlab.errors import MemlabError
from memlab.measure.timeline import BEFORE_STEP, Recording
from memlab.report.views import view

__all__ = ["MAX_POINTS", "MODEL_ITSELF", "OUTSIDE", "Timeline", "TimelinePeak"]

MAX_POINTS = 1200
"""The most points a timeline keeps to draw (the peak always among them)."""
OUTSIDE = "(outside modules)"
"""The module name of what was made outside every module of the model (the loss, the optimizer step)."""
MODEL_ITSELF = "(the model itself)"
"""The module name, in ``by_module``, of what the model's own forward made outside its submodules."""
UNTRACKED = "(beyond memlab's tracking)"
"""What a saved snapshot names the bytes a trial's peak holds beyond the tracked ones (held all through the step)."""
_TOP_MODULES = 16
_BLOCK = re.compile(r"^(.*?\.\d+)(?:\.|$)")


@dataclass(frozen=True)
class TimelinePeak:
    """The moment of a step's peak.

    Attributes:
        bytes: the peak (the trial's ``peak_bytes``).
        phase: the phase it falls in (``"forward"``, ``"backward"``, ``"optimizer"``, ``"prefill"``, ``"decode"``; ""
            outside them), and ``micro_batch`` its micro-batch (0 first; None outside them).
        module: the module running then, as ``model.named_modules()`` names it ("" for the model itself, and outside
            every module).
        model: the model's class name where the model itself was running then (``module`` is ""), "" otherwise: it
            tells the two apart, and the description names the model.
        by_category: bytes by category then; equals the trial's ``breakdown`` and adds up to ``bytes``.
        by_module: bytes alive then by the module that made them (the largest few, the rest under
            ``"(other modules)"``; what was alive before the step under ``"(before the step)"``, what the model's own
            forward made under :data:`MODEL_ITSELF`, what was made outside the model under :data:`OUTSIDE`).
        layers_held: how many of the model's numbered blocks (``layers.17``) hold activations then.
        at: where it is on the timeline's x axis (events since the step began).
    """

    bytes: int
    phase: str
    module: str
    by_category: dict[str, int]
    by_module: dict[str, int]
    layers_held: int = 0
    at: int = 0
    micro_batch: int | None = None
    model: str = ""

    @property
    def description(self) -> str:
        """The peak in words: ``"backward of model.layers.17.mlp: activations of 17 layers held"``.

        Example:
            >>> TimelinePeak(10, "backward", "model.layers.1.mlp", {}, {}, layers_held=2).description
            'backward of model.layers.1.mlp: activations of 2 layers held'
            >>> TimelinePeak(10, "backward", "", {}, {}, model="GPT2LMHeadModel").description
            'backward of GPT2LMHeadModel'
        """
        where = self.module or self.model or OUTSIDE
        text = f"{self.phase} of {where}" if self.phase else f"peak in {where}"
        if self.layers_held:
            text += f": activations of {self.layers_held} layer{'s' if self.layers_held != 1 else ''} held"
        return text


@dataclass
class Timeline:
    """Memory over one step, by category, with its phases and its peak (``trial.timeline``).

    Attributes:
        categories: the series' categories (``breakdown``'s keys), bottom of the stack first.
        x: the events since the step began at each point kept (0: before its first operator).
        series: category -> bytes at each point of ``x``.
        phases: ``(name, start, end)`` on the x axis, in order: each micro-batch's ``"forward"`` and ``"backward"``
            and the ``"optimizer"`` step; ``"prefill"`` and each ``"decode"`` step for inference.
        peak: the :class:`TimelinePeak`.
        events: how many events the step had.
        device: where the step ran (or the device the estimate is for).
        label: the plan's label, once a report names it.

    Example:
        >>> import memlab, torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        >>> trial = memlab.measure(model, torch.randn(4, 8), memlab.Plan(), loss_fn=lambda m, b: m(b).mean(),
        ...                        steps=1, noise=0)
        >>> timeline = trial.timeline
        >>> timeline.peak.bytes == trial.peak_bytes, timeline.peak.by_category == trial.breakdown
        (True, True)
        >>> [name for name, _, _ in timeline.phases]
        ['forward', 'backward', 'optimizer']
    """

    categories: tuple[str, ...]
    x: list[int]
    series: dict[str, list[int]]
    phases: list[tuple[str, int, int]]
    peak: TimelinePeak
    events: int = 0
    device: str = ""
    label: str = ""
    _trace: bytes = field(default=b"", repr=False)
    _allocator: bytes = field(default=b"", repr=False)
    _held: tuple[tuple[str, int, str], ...] = field(default=(), repr=False)
    """``(category, bytes, what)`` counted all through the step beside the recorded trace (an estimate's cuBLAS
    workspaces, 8-bit state computed from its size): :meth:`snapshot` holds them too, so its replay peaks at
    ``peak.bytes``."""

    @classmethod
    def from_recording(
        cls, recording: Recording, *, peak_bytes: int, breakdown: Mapping[str, int], device: str = "",
        allocator_snapshot: Mapping[str, Any] | None = None,
    ) -> Timeline:
        """The timeline of a recorded step whose trial read ``peak_bytes`` and ``breakdown``: where these differ from
        the tracked bytes (the CUDA allocator's peak, with its rounding and workspaces), the difference is drawn under
        ``"other"`` over the whole step. ``allocator_snapshot``: the CUDA allocator's own snapshot of the step, which
        :meth:`save` then writes.

        Example:
            >>> from memlab.measure.timeline import Recording
            >>> from array import array
            >>> rec = Recording(("params", "other"), array("q", [0, 1, 1]), array("q", [8, 4, 0]),
            ...                 array("b", [0, 1, 1]), array("i", [0, 1, 1]), start=1, peak_event=2,
            ...                 module_names=["(before the step)", "fc"], sections=[("forward", 1, 3)])
            >>> t = Timeline.from_recording(rec, peak_bytes=12, breakdown={"params": 8, "other": 4})
            >>> t.x, t.series["other"], t.peak.bytes, t.peak.phase, t.peak.by_module
            ([0, 1, 2], [0, 4, 0], 12, 'forward', {'(before the step)': 8, 'fc': 4})
        """
        categories = tuple(recording.categories)
        keys = np.frombuffer(recording.keys, dtype=np.int64) if len(recording) else np.zeros(0, np.int64)
        sizes = np.frombuffer(recording.sizes, dtype=np.int64) if len(recording) else np.zeros(0, np.int64)
        cats = np.frombuffer(recording.cats, dtype=np.int8).astype(np.int64) if len(recording) else keys
        modules = np.frombuffer(recording.modules, dtype=np.int32).astype(np.int64) if len(recording) else keys
        totals = _running_totals(keys, sizes, cats, len(categories))
        start, events = recording.start, len(sizes)
        peak_index = recording.peak_event - 1  # the state after this event is the peak
        tracked_peak = int(totals[:, peak_index].sum()) if peak_index >= 0 else 0
        offset = int(peak_bytes) - tracked_peak
        by_category = {name: int(breakdown.get(name, 0)) for name in categories}
        other = categories.index("other")
        by_category["other"] += int(peak_bytes) - sum(by_category.values())  # as Trial fills its breakdown
        # Point i is the state after event i, at x = i - start + 1: x = 0 is the step before its first operator.
        first = max(start - 1, 0)
        chosen = _thinned(totals.sum(axis=0), first, events, max(peak_index, first)) if events else np.zeros(0, int)
        x = [int(i) - start + 1 for i in chosen]
        series = {name: [int(v) + (offset if row == other else 0) for v in totals[row, chosen]]
                  for row, name in enumerate(categories)}
        if not x or x[0] > 0:  # nothing was alive before the step: its empty start
            x = [0, *x]
            series = {name: [offset if name == "other" else 0, *values] for name, values in series.items()}
        phases = [(name, max(a - start, 0), max(b - start, 0)) for name, a, b in recording.sections]
        at = max(recording.peak_event - start, 0)
        phase, micro = _phase_at(recording.sections, recording.peak_event)
        by_module, layers = _alive_by_module(keys, sizes, cats, modules, recording, categories, peak_index)
        peak = TimelinePeak(
            bytes=int(peak_bytes), phase=phase, module=_public_name(recording.peak_module, recording),
            by_category=by_category, by_module=by_module, layers_held=layers, at=at, micro_batch=micro,
            model=recording.root if recording.root and recording.peak_module == recording.root else "",
        )
        trace = zlib.compress(pickle.dumps(
            (categories, bytes(recording.keys), bytes(recording.sizes), bytes(recording.cats),
             bytes(recording.modules), recording.module_names, start, recording.sections, recording.dropped)
        ), 6)
        # Level 1: a step's allocator history with its Python frames pickles to tens of MB, which level 6 took
        # 0.9 s a trial to compress on this project's CPU (level 1: 0.07 s, a tenth larger).
        allocator = zlib.compress(pickle.dumps(dict(allocator_snapshot)), 1) if allocator_snapshot else b""
        held = (("other", offset, UNTRACKED),) if offset else ()  # the allocator's own snapshot holds it already
        return cls(categories, x, series, phases, peak, events=events - start, device=device,
                   _trace=trace, _allocator=allocator, _held=held)

    # ------------------------------------------------------------------------------------------------ views
    def shifted(self, category: str, change: int, what: str = "") -> Timeline:
        """This timeline with ``change`` bytes more under ``category`` all through the step (a state computed from
        its size rather than allocated, as 8-bit AdamW's in an estimate; an estimate's cuBLAS workspaces), which
        its :meth:`snapshot` holds too, named ``what``.

        Example:
            >>> peak = TimelinePeak(3, "", "", {"optimizer": 1, "other": 2}, {})
            >>> t = Timeline(("optimizer", "other"), [0], {"optimizer": [1], "other": [2]}, [], peak)
            >>> t.shifted("optimizer", 4).peak.bytes, t.shifted("optimizer", 4).series["optimizer"]
            (7, [5])
        """
        series = {name: [v + change for v in values] if name == category else list(values)
                  for name, values in self.series.items()}
        by_category = dict(self.peak.by_category)
        by_category[category] = by_category.get(category, 0) + change
        peak = dataclasses.replace(self.peak, bytes=self.peak.bytes + change, by_category=by_category)
        held = (*self._held, (category, change, what or f"{category} counted from its size"))
        return dataclasses.replace(self, series=series, peak=peak, _allocator=b"", _held=held)

    def thinned(self, limit: int) -> Timeline:
        """This timeline drawn with at most about ``limit`` points (each stretch's highest and lowest, the peak kept
        exactly): what several timelines drawn together use, so that a notebook keeps them small.

        Example:
            >>> peak = TimelinePeak(9, "", "", {"other": 9}, {}, at=5)
            >>> t = Timeline(("other",), list(range(10)), {"other": [1, 2, 3, 4, 5, 9, 4, 3, 2, 1]}, [], peak)
            >>> t.thinned(8).x
            [0, 4, 5, 9]
        """
        if len(self.x) <= limit:
            return self
        totals = np.array(self.totals, dtype=np.int64)
        at = self.x.index(self.peak.at) if self.peak.at in self.x else int(totals.argmax())
        chosen = _thinned(totals, 0, len(self.x), at, limit).tolist()
        return dataclasses.replace(self, x=[self.x[i] for i in chosen],
                                   series={name: [values[i] for i in chosen] for name, values in self.series.items()})

    def first_step(self) -> Timeline | None:
        """Training's first step, drawn from this steady one (what an estimate and a tracked step are): the same step
        without the optimizer state before its ``"optimizer"`` phase, which torch's and bitsandbytes' optimizers make
        in the first ``optimizer.step()``; from that phase on the state is drawn whole (at most what step 1 holds
        while making it). Labelled ``"step 1"``; its peak is step 1's. None without an optimizer phase or state
        (inference, a frozen model, a sharded estimate's phases).

        Example:
            >>> peak = TimelinePeak(9, "backward", "", {"optimizer": 4, "activations": 5}, {}, at=1)
            >>> phases = [("forward", 0, 0), ("backward", 1, 1), ("optimizer", 2, 2)]
            >>> t = Timeline(("optimizer", "activations"), [0, 1, 2], {"optimizer": [4, 4, 4],
            ...              "activations": [0, 5, 1]}, phases, peak)
            >>> first = t.first_step()
            >>> first.series["optimizer"], first.peak.bytes, first.peak.phase, first.label
            ([0, 0, 4], 5, 'backward', 'step 1')
        """
        start = next((first for name, first, _ in reversed(self.phases) if name == "optimizer"), None)
        if start is None or not any(self.series.get("optimizer", ())):
            return None
        series = {name: [0 if name == "optimizer" and x < start else value for x, value in zip(self.x, values,
                                                                                                  strict=True)]
                  for name, values in self.series.items()}
        totals = [sum(values) for values in zip(*series.values(), strict=True)]
        point = max(range(len(totals)), key=totals.__getitem__)
        at = self.x[point]
        phase = next((name for name, first, end in self.phases if first <= at <= end), "")
        by_category = {name: series[name][point] for name in self.categories}
        peak = TimelinePeak(totals[point], phase, self.peak.module if at == self.peak.at else "", by_category, {},
                            at=at, model=self.peak.model if at == self.peak.at else "")
        return dataclasses.replace(self, series=series, peak=peak, label="step 1", _trace=b"", _allocator=b"",
                                   _held=())

    @property
    def from_allocator(self) -> bool:
        """Whether :meth:`save` writes the CUDA allocator's own snapshot of the step (else one made from memlab's
        tracking)."""
        return bool(self._allocator)

    @property
    def totals(self) -> list[int]:
        """Bytes alive at each point of ``x`` (all categories)."""
        return [sum(values) for values in zip(*self.series.values(), strict=True)]

    def phase_peaks(self) -> dict[str, int]:
        """The highest total of each named phase (a phase that repeats, one per micro-batch, once), in order.

        Example:
            >>> line = Timeline(x=[0, 1, 2], categories=["params"], series={"params": [1, 3, 2]},
            ...                 phases=[("forward", 0, 1), ("backward", 2, 2)],
            ...                 peak=TimelinePeak(3, "forward", "", {}, {}))
            >>> line.phase_peaks()
            {'forward': 3, 'backward': 2}
        """
        peaks: dict[str, int] = {}
        for name, start, end in self.phases:
            inside = [total for x, total in zip(self.x, self.totals, strict=True) if start <= x <= end]
            peaks[name] = max([peaks.get(name, 0), *inside])
        return peaks

    @property
    def modules(self) -> list[str]:
        """The module running at each point of ``x``, as ``model.named_modules()`` names it ("" outside every module,
        and everywhere on a timeline that keeps no trace of its events).

        Example:
            >>> from memlab.measure.timeline import Recording
            >>> from array import array
            >>> recording = Recording(categories=["other"], keys=array("q", [0, 0]), sizes=array("q", [4, 0]),
            ...                       cats=array("b", [0, 0]), modules=array("i", [1, 0]), peak_event=1,
            ...                       module_names=["(before the step)", "fc"])
            >>> Timeline.from_recording(recording, peak_bytes=4, breakdown={"other": 4}).modules
            ['', 'fc', '(before the step)']
        """
        if not self._trace:
            return [""] * len(self.x)
        _, _, _, _, modules, names, start, _, _ = pickle.loads(zlib.decompress(self._trace))
        running = np.frombuffer(modules, np.int32)
        # point x is the state after event x + start - 1 (x = 0: before the step's first event)
        return [names[int(running[i])] if 0 <= (i := x + start - 1) < len(running) else "" for x in self.x]

    @property
    def nbytes(self) -> int:
        """What the timeline weighs, pickled (it stays small whatever the model)."""
        return len(pickle.dumps(self))

    def plot(self, first_step: bool = False) -> Any:
        """A plotly figure: memory over the step stacked by category, the phases shaded, the peak marked and named;
        with ``first_step=True``, training's first step (:meth:`first_step`) in a row above it, on the same scale:
        why step 2 can run out of memory where step 1 did not.

        Example:
            >>> peak = TimelinePeak(2, "forward", "fc", {"other": 2}, {})
            >>> Timeline(("other",), [0, 1], {"other": [0, 2]}, [("forward", 0, 1)], peak).plot().layout.title.text
            'peak 2 B: forward of fc'
        """
        first = self.first_step() if first_step else None
        if first is None:
            return view("timeline_figure")([self])
        later = dataclasses.replace(self, label=f"{self.label}: step 2 and after" if self.label else "step 2 and after")
        return view("timeline_figure")([first, later])

    def to_svg(self) -> str:
        """The static figure (SVG) that a notebook keeps: the same drawing as :meth:`plot`, no plotly needed.

        Example:
            >>> peak = TimelinePeak(2, "forward", "fc", {"other": 2}, {})
            >>> Timeline(("other",), [0, 1], {"other": [0, 2]}, [("forward", 0, 1)], peak).to_svg()[:4]
            '<svg'
        """
        return view("timelines_svg")([self])  # type: ignore[no-any-return]

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/plain": f"Timeline: peak {self.peak.bytes} bytes, {self.peak.description}",
                "image/svg+xml": self.to_svg()}

    # ------------------------------------------------------------------------------------------------ saving
    def snapshot(self) -> dict[str, Any]:
        """The step as PyTorch's memory snapshot (the dict ``torch.cuda.memory._snapshot()`` returns): on CUDA the
        allocator's own, recorded around the tracked step; elsewhere made from memlab's tracking, each storage a
        block with the module that made it as its frame (its category and phase as the frame's function), and
        what the peak holds beside them all through the step (an estimate's cuBLAS workspaces) a block each; a
        timeline composed of others (a GRPO step's) as it is drawn. Replayed, it peaks at ``peak.bytes``.

        Example:
            >>> from memlab.measure.timeline import Recording
            >>> from array import array
            >>> rec = Recording(("other",), array("q", [0, 0]), array("q", [4, 0]), array("b", [0, 0]),
            ...                 array("i", [1, 1]), peak_event=1, module_names=["(before the step)", "fc"])
            >>> snap = Timeline.from_recording(rec, peak_bytes=4, breakdown={"other": 4}).snapshot()
            >>> [e["action"] for e in snap["device_traces"][0]], snap["segments"]
            (['alloc', 'free_requested', 'free_completed'], [])
        """
        if self._allocator:
            return dict(pickle.loads(zlib.decompress(self._allocator)))
        if not self._trace:  # composed from other timelines (a GRPO step's generation and training): as drawn
            return _snapshot_from_series(self)
        return _snapshot_from_trace(pickle.loads(zlib.decompress(self._trace)), self.phases, self._held)

    def save(self, path: str | Path) -> Path:
        """Write :meth:`snapshot` as a pickle at ``path``: open it at https://pytorch.org/memory_viz (drag the file
        in), or with ``torch.cuda._memory_viz.trace_plot(pickle.load(f))``; returns the path.

        Example:
            >>> import tempfile, os
            >>> peak = TimelinePeak(0, "", "", {"other": 0}, {})
            >>> t = Timeline.from_recording(Recording(("other",)), peak_bytes=0, breakdown={})
            >>> os.path.getsize(t.save(tempfile.mktemp(suffix=".pickle"))) > 0
            True
            >>> t.save(tempfile.gettempdir())  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            memlab.errors.MemlabError: ... is a folder; write a file's path, for example .../step.pickle
        """
        target = Path(path)
        if target.is_dir():
            raise MemlabError(f"{path} is a folder; write a file's path, for example {target / 'step.pickle'}")
        if not target.parent.is_dir():
            raise MemlabError(f"the folder of {path} does not exist; create it first, or write a path in an existing "
                              "folder")
        with target.open("wb") as file:
            pickle.dump(self.snapshot(), file)
        return target


def _running_totals(keys: np.ndarray, sizes: np.ndarray, cats: np.ndarray, count: int) -> np.ndarray:
    """Bytes by category after each event: ``(categories, events)``."""
    events = len(sizes)
    delta = np.zeros((count, events), dtype=np.int64)
    if not events:
        return np.zeros((count, 1), dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    previous = np.full(events, -1, dtype=np.int64)
    same = keys[order[1:]] == keys[order[:-1]]
    previous[order[1:][same]] = order[:-1][same]
    had = previous >= 0
    before = np.where(had, sizes[np.where(had, previous, 0)], 0)
    before_cat = np.where(had, cats[np.where(had, previous, 0)], cats)
    index = np.arange(events)
    np.add.at(delta, (before_cat, index), -before)
    np.add.at(delta, (cats, index), sizes)
    return np.cumsum(delta, axis=1)


def _thinned(total: np.ndarray, first: int, end: int, peak: int, limit: int = MAX_POINTS) -> np.ndarray:
    """Indexes of the points kept between ``first`` and ``end``: each stretch's highest and lowest, the peak."""
    if end <= first:
        return np.array([first], dtype=np.int64)
    span = end - first
    if span <= limit:
        return np.arange(first, end, dtype=np.int64)
    buckets = limit // 2 - 2
    edges = np.linspace(first, end, buckets + 1).astype(np.int64)
    kept = [first, end - 1, peak]
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        if high > low:
            part = total[low:high]
            kept.extend((low + int(part.argmax()), low + int(part.argmin())))
    return np.unique(np.array(kept, dtype=np.int64))


def _phase_at(sections: Sequence[tuple[str, int, int]], event: int) -> tuple[str, int | None]:
    """The section an event count falls in, and its micro-batch (the how-many-th forward before it)."""
    forwards = 0
    for name, first, end in sections:
        if name in ("forward", "prefill"):
            forwards += 1
        if first < event <= end or (first == end == event):
            return name, (forwards - 1 if name in ("forward", "backward") else None)
    return "", None


def _public_name(name: str, recording: Recording) -> str:
    """A recorded module name as ``model.named_modules()`` gives it: the model itself is "" (recorded under its
    class's name, which no ``named_modules()`` entry has)."""
    return "" if recording.root and name == recording.root else name


def _alive_by_module(
    keys: np.ndarray, sizes: np.ndarray, cats: np.ndarray, modules: np.ndarray, recording: Recording,
    categories: tuple[str, ...], peak_index: int,
) -> tuple[dict[str, int], int]:
    """Bytes alive at the peak by the module that made them, and how many numbered blocks hold activations."""
    if peak_index < 0:
        return {}, 0
    upto = peak_index + 1
    k, s, c, m = keys[:upto], sizes[:upto], cats[:upto], modules[:upto]
    reversed_keys = k[::-1]
    _, last_reversed = np.unique(reversed_keys, return_index=True)
    last = upto - 1 - last_reversed
    _, first = np.unique(k, return_index=True)  # same key order as ``last`` (both sorted by key)
    alive = s[last] > 0
    made_by = m[first][alive]
    held = s[last][alive]
    category = c[last][alive]
    names = recording.module_names
    totals: dict[str, int] = {}
    for module, nbytes in zip(made_by.tolist(), held.tolist(), strict=True):
        name = names[module]
        name = MODEL_ITSELF if recording.root and name == recording.root else name or OUTSIDE
        totals[name] = totals.get(name, 0) + nbytes
    activations = categories.index("activations") if "activations" in categories else -1
    blocks = {match.group(1) for module in set(made_by[category == activations].tolist())
              if (match := _BLOCK.match(names[module]))}
    ranked = sorted(totals.items(), key=lambda item: -item[1])
    kept = dict(ranked[:_TOP_MODULES])
    rest = sum(value for _, value in ranked[_TOP_MODULES:])
    if rest:
        kept["(other modules)"] = rest
    return kept, len(blocks)


def _snapshot_from_trace(
    trace: tuple[Any, ...], phases: Sequence[tuple[str, int, int]], held: Sequence[tuple[str, int, str]] = ()
) -> dict[str, Any]:
    """The recorded step as PyTorch's snapshot: each storage a block, what was alive before the step and still is
    in ``segments``, the step's changes in the trace; ``held`` amounts (category, bytes, what) all through the step
    beside them: a positive one a block of its own, a negative one taken off that category's blocks alive all
    through (8-bit state in place of the fp32 state recorded)."""
    categories, keys, sizes, cats, modules, names, start, sections, _ = trace
    keys, sizes = np.frombuffer(keys, np.int64).tolist(), np.frombuffer(sizes, np.int64).tolist()
    cats, modules = np.frombuffer(cats, np.int8).tolist(), np.frombuffer(modules, np.int32).tolist()
    section_of = _section_names(sections, len(sizes))
    live: dict[int, tuple[int, int, list[dict[str, Any]]]] = {}  # key -> address, size, frames
    through: dict[int, int] = {}  # key -> category, for what was alive before the step
    address = 1 << 32
    events: list[dict[str, Any]] = []

    def frames(index: int) -> list[dict[str, Any]]:
        module = names[modules[index]] or OUTSIDE
        return [{"filename": module, "line": 0, "name": categories[cats[index]]},
                {"filename": "memlab step", "line": 0, "name": section_of[index] or BEFORE_STEP}]

    for index, (key, size) in enumerate(zip(keys, sizes, strict=True)):
        old = live.get(key)
        if old is not None and old[1] == size:
            if key in through:
                through[key] = cats[index]
            continue  # a storage moved to another category: the allocator sees nothing
        if old is not None:
            del live[key]
            if index >= start:
                for action in ("free_requested", "free_completed"):
                    events.append(_entry(action, old[0], old[1], index - start, old[2]))
        through.pop(key, None)
        if size:
            where = frames(index)
            live[key] = (address, size, where)
            if index >= start:
                events.append(_entry("alloc", address, size, index - start, where))
            else:
                through[key] = cats[index]
            address += -(-size // 512) * 512 or 512
    blocks = list(live.values())
    for category, nbytes, what in held:
        if nbytes > 0:
            blocks.append((address, nbytes, [{"filename": what, "line": 0, "name": category},
                                             {"filename": "memlab step", "line": 0, "name": BEFORE_STEP}]))
            address += -(-nbytes // 512) * 512
            continue
        owed = -nbytes
        for key in [key for key, cat in through.items() if categories[cat] == category and key in live]:
            index = blocks.index(live[key])
            block_address, size, where = blocks[index]
            taken = min(owed, size)
            blocks[index] = (block_address, size - taken, where)
            owed -= taken
            if not owed:
                break
    return {"segments": _segments(blocks), "device_traces": [events], "allocator_settings": {}}


def _segments(blocks: Sequence[tuple[int, int, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Each block alive at the end of the step, ``(address, size, frames)``, as a segment of its own."""
    return [
        {"device": 0, "address": addr, "total_size": size, "allocated_size": size, "active_size": size,
         "requested_size": size, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
         "is_expandable": False, "frames": [],
         "blocks": [{"address": addr, "size": size, "requested_size": size, "state": "active_allocated",
                     "frames": where}]}
        for addr, size, where in blocks if size
    ]


def _snapshot_from_series(timeline: Timeline) -> dict[str, Any]:
    """A timeline without a recorded trace as PyTorch's snapshot: each category's rise from one drawn point to the
    next a block, its fall freeing the newest blocks first (a block freed in part: freed, and its rest allocated
    again), so that a replay goes through the drawn totals and peaks at the timeline's peak."""
    blocks: dict[str, list[tuple[int, int, list[dict[str, Any]]]]] = {name: [] for name in timeline.categories}
    address = 1 << 32
    events: list[dict[str, Any]] = []
    for point, moment in enumerate(timeline.x):
        section = next((name for name, first, end in timeline.phases if first <= moment <= end), "") or BEFORE_STEP
        for name in timeline.categories:
            change = timeline.series[name][point] - (timeline.series[name][point - 1] if point else 0)
            where = [{"filename": "memlab step", "line": 0, "name": name},
                     {"filename": "memlab step", "line": 0, "name": section}]
            while change < 0:  # the first point is what was alive before the step: no event
                block_address, size, made = blocks[name].pop()
                if point:
                    for action in ("free_requested", "free_completed"):
                        events.append(_entry(action, block_address, size, moment, made))
                change += size
            if change > 0:
                blocks[name].append((address, change, where))
                if point:
                    events.append(_entry("alloc", address, change, moment, where))
                address += -(-change // 512) * 512
    return {"segments": _segments([block for kept in blocks.values() for block in kept]), "device_traces": [events],
            "allocator_settings": {}}


def _entry(action: str, address: int, size: int, time: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {"action": action, "addr": address, "size": size, "stream": 0, "time_us": time, "frames": frames,
            "device_free": 0}


def _section_names(sections: Sequence[tuple[str, int, int]], events: int) -> list[str]:
    names = [""] * events
    for name, first, end in sections:
        for index in range(first, min(end, events)):
            names[index] = name
    return names
