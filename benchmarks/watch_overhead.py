"""memlab.watch's overhead: seconds per optimizer step of ``trainer.train()`` with and without ``memlab.watch`` (and
its live figure, redrawn every logging step), on a tiny Llama Trainer, in one process.

Three sides train the same Trainer in alternating rounds (the order rotates each round, so that the load of the
machine, which drifts, hits all sides alike); each round is one ``trainer.train()`` of ``steps`` steps:

- ``plain``: no memlab;
- ``watch``: ``memlab.watch(trainer, budget)`` with its figure (:class:`memlab.frontends.jupyter.watch_figure.
  WatchFigure`, a real plotly FigureWidget, redrawn every ``logging_steps``; nothing displays it). On the CPU the
  watch reads each step's peak with memlab's tracker (a ``TorchDispatchMode``: Python on every operator);
- ``watch_allocator_style``: the same, with the per-step probe swapped for one that reads nothing (what the CUDA path
  costs in Python: the callbacks, the ``training_step`` wrapper, the records and the figure; on a GPU the allocator
  reads its own peak, with a synchronize at each end of the step). Only meaningful on the CPU; on CUDA ``watch``
  is that path for real.

A step's time is the wall time between two ``on_step_end`` callbacks of a timer added last (so it includes every
other callback, the data loader and the figure's redraws); the first ``warmup`` steps of each round are dropped.
Ratios are medians within this one run: ``watch / plain`` step time; the goal is an overhead under 3% (ratio < 1.03).

Run from the repository root::

    python -m benchmarks.watch_overhead --threads 1      # --small: CPU, a couple of minutes
    python -m benchmarks.watch_overhead --full           # CUDA GPU, a bigger Llama
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from benchmarks import common

NAME = "watch_overhead"
GOAL = 1.03
SIDES = ("plain", "watch", "watch_allocator_style")


@dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    heads: int
    vocab: int
    rows: int
    length: int
    rounds: int
    steps: int
    warmup: int
    logging_steps: int


SIZES = {
    "smoke": Size(hidden=32, layers=1, heads=2, vocab=128, rows=2, length=16, rounds=1, steps=3, warmup=1,
                  logging_steps=1),
    "small": Size(hidden=256, layers=4, heads=4, vocab=4096, rows=8, length=128, rounds=4, steps=12, warmup=2,
                  logging_steps=5),
    "full": Size(hidden=1024, layers=12, heads=16, vocab=32000, rows=8, length=512, rounds=5, steps=30, warmup=3,
                 logging_steps=10),
}


def make_trainer(size: Size, device: torch.device, out: str) -> Any:
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    model = common.llama_model(hidden=size.hidden, layers=size.layers, heads=size.heads, vocab=size.vocab,
                               positions=size.length)
    batch = common.lm_batch(vocab=size.vocab, rows=size.rows * size.steps, length=size.length)
    data = Dataset.from_dict({"input_ids": batch["input_ids"].tolist()})
    args = TrainingArguments(output_dir=out, report_to=[], use_cpu=device.type == "cpu", save_strategy="no",
                             max_steps=size.steps, per_device_train_batch_size=size.rows, disable_tqdm=True,
                             logging_steps=size.logging_steps, learning_rate=1e-5, dataloader_num_workers=0)

    def collate(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids = torch.tensor([e["input_ids"] for e in examples])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

    return Trainer(model=model, args=args, train_dataset=data, data_collator=collate)


def _timer_class() -> type:
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.ends.append(time.perf_counter())

    return StepTimer


class _NoPeak:
    """A per-step probe that reads nothing (the allocator-style path's Python, without an allocator)."""

    peak_allocated = 0

    def __enter__(self) -> _NoPeak:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@contextlib.contextmanager
def _allocator_style() -> Iterator[None]:
    import importlib

    memory = importlib.import_module("memlab.trainer.watch")._StepMemory
    saved = memory.start

    def start(self: Any) -> None:
        self.probe = _NoPeak()

    memory.start = start  # type: ignore[method-assign]
    try:
        yield
    finally:
        memory.start = saved  # type: ignore[method-assign]


def timed_train(trainer: Any, warmup: int, *, watch: bool, budget: int | str | None = "64GiB", figure: bool = False,
                allocator_style: bool = False) -> tuple[list[float], int]:
    """Step times of one ``train()`` (the first ``warmup`` dropped), under ``memlab.watch`` (with ``budget``, and a
    live figure drawn nowhere when ``figure``) or not, and how often the figure redrew. Shared by this benchmark and
    the GPU run's trainer part."""
    import memlab

    timer = _timer_class()()
    trainer.add_callback(timer)
    watched = drawn = None
    context = _allocator_style() if allocator_style else contextlib.nullcontext()
    try:
        with context:
            if watch:
                watched = memlab.watch(trainer, budget=budget, show=False)
                if figure:
                    # Imported only where a figure is drawn: plotly, which it needs, is not in the GPU image.
                    from memlab.frontends.jupyter.watch_figure import WatchFigure

                    drawn = WatchFigure(watched, display=lambda obj, **keywords: None)
            trainer.train()
    finally:
        trainer.remove_callback(timer)
        if watched is not None:
            watched.remove()
    times = [b - a for a, b in zip(timer.ends, timer.ends[1:], strict=False)]
    return times[warmup:], 0 if drawn is None else drawn.redraws


def one_round(trainer: Any, side: str, size: Size) -> tuple[list[float], int]:
    """Step times of one ``train()`` on ``side`` (warm-up steps dropped), and how often the figure redrew."""
    return timed_train(trainer, size.warmup, watch=side != "plain", figure=True,
                       allocator_style=side == "watch_allocator_style")


def run(size: Size, device: torch.device) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out:
        trainer = make_trainer(size, device, out)
        times: dict[str, list[list[float]]] = {side: [] for side in SIDES}
        redraws: dict[str, list[int]] = {side: [] for side in SIDES}
        for number in range(size.rounds):
            order = SIDES[number % 3:] + SIDES[: number % 3]
            for side in order:
                step_times, drawn = one_round(trainer, side, size)
                times[side].append(step_times)
                redraws[side].append(drawn)

    def median_step(side: str) -> float:
        value = common.median([t for block in times[side] for t in block])
        assert value is not None
        return value

    plain = median_step("plain")
    per_round = {side: [(common.median(block) or 0.0) / (common.median(base) or 1.0)
                        for block, base in zip(times[side], times["plain"], strict=True)] for side in SIDES[1:]}
    sides = {
        side: {
            "step_time_s_median": median_step(side),
            "samples_per_s": size.rows / median_step(side),
            "figure_redraws_per_round": redraws[side],
            "step_times_s": [[round(t, 6) for t in block] for block in times[side]],
        }
        for side in SIDES
    }
    ratios = {side: median_step(side) / plain for side in SIDES[1:]}
    return {
        "model": {"class": "LlamaForCausalLM", **{k: v for k, v in asdict(size).items()
                                                  if k in ("hidden", "layers", "heads", "vocab")}},
        "batch": {"rows": size.rows, "length": size.length},
        "rounds": size.rounds,
        "steps_per_round": size.steps,
        "warmup_steps_dropped": size.warmup,
        "logging_steps": size.logging_steps,
        "sides": sides,
        "ratio": ratios,
        "ratio_per_round": per_round,
        "spread": {side: [min(values), max(values)] for side, values in per_round.items()},
        "goal": GOAL,
        "meets_goal": {side: ratio < GOAL for side, ratio in ratios.items()},
        "method": (
            "one Trainer, sides in rotating order per round, one train() of steps per side per round; step time = "
            "wall time between consecutive on_step_end callbacks of a timer added last; ratio = median step time of "
            "the side / plain's, over all rounds; watch = memlab.watch + its WatchFigure (a plotly FigureWidget "
            "redrawn every logging_steps, not displayed); watch_allocator_style = the same with a per-step probe "
            "that reads nothing (on CPU: the CUDA path's Python cost without the tracker)"
        ),
    }


def figure(result: dict[str, Any]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for side in SIDES:
        blocks = result["sides"][side]["step_times_s"]
        fig.add_trace(go.Box(y=[t for block in blocks for t in block], name=side))
    fig.update_layout(title=f"memlab.watch overhead: {', '.join(f'{k} x{v:.3f}' for k, v in result['ratio'].items())}",
                      yaxis_title="seconds per optimizer step", yaxis_rangemode="tozero")
    return fig


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the ratios, write ``watch_overhead-<device>.json`` and ``.html``."""
    result, path = common.run_in_rounds(NAME, __doc__, SIZES, run, figure, argv)
    for side, ratio in result["ratio"].items():
        low, high = result["spread"][side]
        print(f"{side}: step time x{ratio:.3f} of plain (per round {low:.3f}..{high:.3f}; goal < {GOAL})")
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
