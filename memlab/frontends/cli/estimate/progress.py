"""``memlab estimate``'s progress: what it says on stderr as each step starts, with the time so far
(:func:`progress_lines`, :class:`EstimateProgress`), and each plan's dry run announced as it runs
(:func:`estimate_each`). Every part of the command (its plans, a trainer's step, the allocator's lever, the limits)
says its steps here, so that none of them imports the command itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from memlab.estimation.cuda.gpus import GpuKind

__all__ = ["EstimateProgress", "estimate_each", "progress_lines"]


def progress_lines(err: TextIO, clock: Callable[[], float] = time.perf_counter) -> Callable[[str], None]:
    """A ``say(text)`` that prints ``memlab estimate: text ... (N s so far)`` on ``err`` as each step starts.

    Example:
        >>> import sys
        >>> seconds = iter([0.0, 0.4, 12.6])
        >>> say = progress_lines(sys.stdout, clock=lambda: next(seconds))
        >>> say("reading the config of llama-70b"); say("estimating zero3 on 8 GPUs")
        memlab estimate: reading the config of llama-70b ... (0 s so far)
        memlab estimate: estimating zero3 on 8 GPUs ... (13 s so far)
    """
    started = clock()

    def say(text: str) -> None:
        print(f"memlab estimate: {text} ... ({clock() - started:.0f} s so far)", file=err, flush=True)

    return say


class EstimateProgress:
    """Progress of ``memlab estimate`` on ``err``, as a context whose value is ``say(text)``, told as each step
    starts. On a terminal: a tqdm bar of the dry runs (``dry_runs`` of them at most; :meth:`expect` adds more), with
    the time so far and tqdm's estimate of the time left from the dry runs finished. Elsewhere (a pipe, a log):
    one line per step with the time so far (:func:`progress_lines`), which a log keeps readable.

    Example:
        >>> import io
        >>> with EstimateProgress(io.StringIO(), dry_runs=2) as say:
        ...     say("reading the config of gpt2"); say("estimating plan 1 of 2: plain")
        >>> say.bar is None  # not a terminal: lines, no bar
        True
    """

    def __init__(self, err: TextIO, dry_runs: int, *, terminal: bool | None = None) -> None:
        self.err = err
        self.dry_runs = dry_runs
        self.terminal = bool(getattr(err, "isatty", lambda: False)()) if terminal is None else terminal
        self.lines = progress_lines(err)
        self.bar: Any = None
        self._running = False

    def __enter__(self) -> EstimateProgress:
        if self.terminal:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.dry_runs, file=self.err, unit="dry run", dynamic_ncols=True, leave=False,
                            bar_format="memlab estimate: {desc} {bar} {n_fmt}/{total_fmt} dry runs "
                                       "[{elapsed} so far, about {remaining} left]")
            # One dry run of a 70B model takes most of a minute: the bar's clock ticks on through it.
            self._stop = threading.Event()
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self._stop.set()
            self._ticker.join(timeout=5)
            self.bar.close()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self.bar.refresh()

    def expect(self, more: int) -> None:
        """``more`` dry runs than said at the start (the suggestions estimated when nothing fits)."""
        self.dry_runs += more
        if self.bar is not None:
            self.bar.total = self.dry_runs
            self.bar.refresh()

    def __call__(self, text: str) -> None:
        if self.bar is None:
            self.lines(text)
            return
        if self._running:
            self.bar.update(1)
        self._running = text.startswith("estimating ")
        self.bar.set_description_str(text)


def estimate_each(
    model: Any, batch: Any, plans: Any, *, budget: int | None, device: str | None, say: Callable[[str], None],
    gpu: GpuKind | None = None, load: dict[str, Any] | None = None,
) -> Any:
    """The single-GPU estimates of ``plans``, one dry run at a time so that each is said as it starts (building the
    fake model again per plan costs a fraction of a second; a dry run of a large model, seconds to minutes). ``gpu``:
    the GPU kind whose kernels a CUDA dry run made without CUDA emulates (``--gpu``); ``load``: how the model is
    loaded (:func:`memlab.frontends.cli.load.load_from_args`).

    Example:
        >>> from transformers import LlamaConfig
        >>> from memlab.plan import Plan
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        ...                      vocab_size=256)
        >>> shapes = {"input_ids": (1, 16), "labels": (1, 16)}
        >>> report = estimate_each(config, shapes, [Plan(), Plan(checkpointing=True)], budget=None, device="cpu",
        ...                        say=print)
        estimating plan 1 of 2: plain
        estimating plan 2 of 2: ckpt
        >>> [trial.status for trial in report]
        ['ok', 'ok']
    """
    from memlab.estimation.answers import kept_estimate
    from memlab.report import Report

    trials = []
    for number, plan in enumerate(plans, start=1):
        say(f"estimating plan {number} of {len(plans)}: {plan.label()}")
        trials += kept_estimate(model, batch, plan, budget=budget, device=device, gpu=gpu, load=load)
    return Report(trials, budget=budget)
