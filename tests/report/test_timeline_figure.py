"""What a notebook keeps of a timeline stays under 1 MB whatever the step: a recording as long as the recorder keeps
(``MAX_EVENTS`` events, a 70B step's scale), with a thousand micro-batches or twenty thousand decode steps, drawn
alone (the magic's pick, ``memlab.watch``'s costliest step, ``Timeline``'s own repr) or eight plans together
(``report.plot(kind="timeline")``'s static form)."""

from __future__ import annotations

import json
from array import array

import numpy as np
import pytest

from memlab.measure.timeline import MAX_EVENTS, Recording
from memlab.measure.tracker import CATEGORIES
from memlab.report.timeline import Timeline
from memlab.report.views.static import timeline_bundle
from memlab.report.views.timeline_figure import timelines_svg

MB = 1_000_000


def long_recording(events: int, sections: list[tuple[str, int, int]] | None = None) -> Recording:
    """``events`` changes: a few hundred storages alive at the start, then saw-teeth of allocations and frees in
    every category, the module running changing every event (a new name every 97)."""
    rng = np.random.default_rng(0)
    start = 300
    keys = np.empty(events, dtype=np.int64)
    sizes = np.empty(events, dtype=np.int64)
    keys[:start] = np.arange(start)
    sizes[:start] = rng.integers(1 << 20, 1 << 26, start)
    body = np.arange(events - start)
    # Each storage lives for 64 events: allocated at its first event, freed at its second.
    keys[start:] = start + (body // 2) - (body % 2) * 32
    sizes[start:] = np.where(body % 2 == 0, rng.integers(1 << 10, 1 << 28, events - start), 0)
    cats = rng.integers(0, len(CATEGORIES), events).astype(np.int8)
    names = ["(before the step)", *(f"model.layers.{i}.mlp" for i in range(events // 97 + 1))]
    modules = np.minimum(np.arange(events) // 97 + 1, len(names) - 1).astype(np.int32)
    modules[:start] = 0
    peak = int(np.argmax(np.cumsum(np.where(sizes > 0, sizes, 0)))) + 1  # any event will do as the peak here
    return Recording(
        CATEGORIES, array("q", keys.tobytes()), array("q", sizes.tobytes()), array("b", cats.tobytes()),
        array("i", modules.tobytes()), start=start, peak_event=peak, peak_module=names[-1], module_names=names,
        sections=sections or [("forward", start, events // 2), ("backward", events // 2, events - 10),
                              ("optimizer", events - 10, events)],
    )


def timeline_of(recording: Recording, label: str = "plain") -> Timeline:
    timeline = Timeline.from_recording(recording, peak_bytes=70 * 2**30, breakdown={"params": 2**30})
    timeline.label = label
    return timeline


def saved_size(bundle: dict[str, object]) -> int:
    """What the bundle weighs in a saved notebook (its JSON)."""
    return len(json.dumps(bundle))


@pytest.fixture(scope="module")
def longest() -> Timeline:
    return timeline_of(long_recording(MAX_EVENTS))


def test_the_longest_recording_keeps_a_small_record(longest: Timeline) -> None:
    assert longest.events == MAX_EVENTS - 300
    small = saved_size(timeline_bundle([timeline_of(long_recording(2_000))]))
    large = saved_size(timeline_bundle([longest]))
    assert large < MB and large < 2 * small  # bounded by the drawing, not by the events
    assert saved_size(longest._repr_mimebundle_()) < MB


def test_eight_plans_drawn_together_stay_under_a_megabyte(longest: Timeline) -> None:
    timelines = [timeline_of(long_recording(50_000 * (i + 1)), f"plan {i}") for i in range(7)]
    assert saved_size({"image/svg+xml": timelines_svg([longest, *timelines])}) < MB


@pytest.mark.parametrize("phase", ["micro-batches", "decode"])
def test_thousands_of_phases_stay_under_a_megabyte(phase: str) -> None:
    events = 400_000
    if phase == "micro-batches":  # 1,000 micro-batches: a forward and a backward each
        width = (events - 300) // 2000
        sections = [(("forward", "backward")[i % 2], 300 + i * width, 300 + (i + 1) * width) for i in range(2000)]
    else:  # a prefill and 20,000 decode steps
        width = (events - 300) // 20_001
        sections = [("prefill" if i == 0 else "decode", 300 + i * width, 300 + (i + 1) * width) for i in range(20_001)]
    bundle = timeline_bundle([timeline_of(long_recording(events, sections))])
    assert saved_size(bundle) < MB / 4
    assert bundle["image/svg+xml"].count("<rect") < 1_000  # a shade per pixel at most, not one per phase
