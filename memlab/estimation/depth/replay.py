"""Events of a dry run (:class:`~memlab.estimation.depth.log.Event`, as kept or as carried to another depth by
:func:`~memlab.estimation.depth.extend.extend`) told again to fresh consumers of the same kinds: the caching
allocator's model gives the reserved peak, the tracker's :class:`~memlab.measure.tracker.Ledger` with a
:class:`~memlab.measure.timeline.StepRecorder` gives the step's peak, its breakdown and its timeline. They are
memlab's own classes, told the same calls in the same order, so their results are what the dry run's would be.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from memlab.estimation.cuda.allocator import CachingAllocator
from memlab.estimation.depth.log import ALLOCATOR, STEP, Event
from memlab.measure.ledger import Ledger
from memlab.measure.timeline import Recording, StepRecorder

__all__ = ["StepReplay", "replay_allocator", "replay_step"]


def replay_allocator(events: Iterable[Event], capacity: int | None) -> tuple[int, int] | None:
    """The allocator's reserved and allocated peaks where the trial read them (its tracked step's end), from the
    allocator's events of ``events``; None when no read is among them.

    Example:
        >>> log = [Event("A", "alloc", 1, 3 << 20), Event("A", "reset_peak"), Event("A", "free", 1),
        ...        Event("A", "alloc", 2, 2 << 20), Event("A", "read")]
        >>> [size >> 20 for size in replay_allocator(log, None)]
        [20, 3]
    """
    allocator = CachingAllocator(capacity)
    read: tuple[int, int] | None = None
    for event in events:
        if event.consumer != ALLOCATOR:
            continue
        op = event.op
        if op == "alloc":
            allocator.malloc(event.key, event.nbytes)
        elif op == "free":
            allocator.free(event.key)
        elif op == "resize":
            allocator.record(event.key, event.nbytes)
        elif op == "reset_peak":
            allocator.reset_peak()
        elif op == "empty_cache":
            allocator.empty_cache()
        elif op == "read":
            read = (allocator.peak_reserved_bytes, allocator.peak_allocated_bytes)
    return read


@dataclass
class StepReplay:
    """What the tracked step's ledger and recorder made of the events: the peak, its breakdown, the recording."""

    peak_bytes: int
    breakdown: dict[str, int]
    recording: Recording


class _Named:
    """A module watch that names what the event being told says was running."""

    def __init__(self) -> None:
        self.current = ""

    def reset(self) -> None:
        pass


def replay_step(events: Iterable[Event], categories: Sequence[str], *, root: str = "") -> StepReplay:
    """The tracked step's peak, breakdown and recording, from the step's events of ``events``: the storages alive
    at its start, then each allocation, free, resize, new category, check of the peak and section in order.
    ``root`` is the name the model itself ran under (its class's), named "" in the recording's timeline.

    Example:
        >>> log = [Event("L", "start", 1, 100, "params"), Event("L", "alloc", 2, 50, "activations", "net"),
        ...        Event("L", "check", module="net"), Event("L", "free", 2, 0, "activations")]
        >>> replay = replay_step(log, ("params", "activations", "other"))
        >>> replay.peak_bytes, replay.breakdown["activations"], replay.recording.peak_module
        (150, 50, 'net')
    """
    ledger = Ledger(tuple(categories))
    recorder = StepRecorder(None, categories)
    watch = _Named()
    recorder.watch = watch  # type: ignore[assignment]
    recorder.result.root = root  # the model's own name, as the dry run's recorder has it
    sections: list[contextlib.AbstractContextManager[Any]] = []
    listening = False
    for event in events:
        if event.consumer != STEP:
            continue
        op = event.op
        if op == "start":
            ledger.add_key(event.key, event.nbytes, event.category)
            continue
        watch.current = event.module
        if not listening:  # the tracker's first check, then the recorder told what is alive
            ledger.note_peak()
            recorder.start([(key, entry[2], entry[1]) for key, entry in ledger.entries.items()])
            ledger.recorder = recorder
            listening = True
        if op == "alloc":
            ledger.add_key(event.key, event.nbytes, event.category)
        elif op == "free":
            ledger.remove_key(event.key)
        elif op == "resize":
            ledger.resize_key(event.key, event.nbytes)
        elif op == "move":
            ledger.move_key(event.key, event.category)
        elif op == "check":
            ledger.note_peak()
        elif op == "enter":
            section = recorder.section(event.label)
            section.__enter__()
            sections.append(section)
        elif op == "exit":
            sections.pop().__exit__(None, None, None)
    return StepReplay(ledger.peak, dict(ledger.peak_totals), recorder.result)
