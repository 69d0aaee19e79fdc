"""What a step's timeline costs an estimate: the same dry run with the recorder on and off, and the size of what
a saved notebook keeps of it.

A Llama config of the model size named by the size (``--small``: Llama 2 13B on this CPU, ``--full``: Llama 2 70B;
a dry run on fake tensors never allocates the model) is estimated for CUDA with ``memlab.estimate`` in alternating
rounds, once as memlab runs it (the timeline recorded) and once with the recorder switched off
(:meth:`memlab.measure.timeline.StepRecorder.recording` replaced by a context that records nothing, here only).
The result holds each round's seconds, the ratio of the medians (on / off), that both give the same peak, and the
bytes of the timeline's static SVG (:func:`memlab.report.views.timeline_figure.timelines_svg`, what a saved notebook
keeps) and of its plotly figure as JSON.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
from benchmarks import common

NAME = "timeline_cost"
SETTINGS = {  # model, hidden, layers, heads, kv heads, intermediate, vocab, tokens, rounds
    "smoke": ("tiny", 64, 2, 4, 4, 128, 256, 32, 1),
    "small": ("llama-2-13b", 5120, 40, 40, 40, 13824, 32000, 512, 3),
    "full": ("llama-2-70b", 8192, 80, 64, 8, 28672, 32000, 512, 3),
}


@contextlib.contextmanager
def recorder_off() -> Iterator[None]:
    """The runner's timeline recorder records nothing while this is open (the "off" side of the comparison)."""
    from memlab.measure.timeline import StepRecorder

    original = StepRecorder.recording

    @contextlib.contextmanager
    def nothing(self: Any, tracker: Any) -> Iterator[None]:
        yield None

    StepRecorder.recording = nothing  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        StepRecorder.recording = original  # type: ignore[method-assign]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Estimate the model with the recorder on and off in turn; record times, the ratio and the saved sizes."""
    import torch
    from transformers import LlamaConfig

    import memlab
    from memlab.report.views.timeline_figure import timeline_figure, timelines_svg

    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    args = parser.parse_args(argv)
    common.quiet()
    device = common.resolve_device(args, parser)
    model, hidden, layers, heads, kv_heads, intermediate, vocab, tokens, rounds = SETTINGS[args.size]
    config = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, intermediate_size=intermediate, vocab_size=vocab,
                         max_position_embeddings=4096)
    shapes = {"input_ids": (1, tokens), "labels": (1, tokens)}
    plan = memlab.Plan(precision="bf16", checkpointing=True)
    seconds: dict[str, list[float]] = {"on": [], "off": []}
    peaks: dict[str, int] = {}
    recorded = None
    memlab.estimate(config, shapes, plan, device="cuda")  # warm-up: imports and first-call costs, not timed
    load = __import__("os").getloadavg()
    for number in range(rounds):
        for side in (("on", "off") if number % 2 == 0 else ("off", "on")):
            started = time.perf_counter()
            with recorder_off() if side == "off" else contextlib.nullcontext():
                trial = memlab.estimate(config, shapes, plan, device="cuda")
            seconds[side].append(time.perf_counter() - started)
            peaks[side] = trial.peak_bytes
            if side == "on":
                recorded = trial.timeline
    assert recorded is not None, "the estimate with the recorder on has no timeline"
    svg_bytes = len(timelines_svg([recorded]).encode())
    plotly_bytes = len(timeline_figure([recorded]).to_json().encode())
    ratio = statistics.median(seconds["on"]) / statistics.median(seconds["off"])
    result = {
        **common.metadata_for(NAME, device, args.size),
        "model": model,
        "plan": plan.label(),
        "batch": f"1x{tokens}",
        "estimated_for": "cuda (H100-80GB), on this machine's CPU",
        "load_average_before": [round(value, 2) for value in load],
        "load_average_after": [round(value, 2) for value in __import__("os").getloadavg()],
        "seconds": {side: [round(value, 2) for value in values] for side, values in seconds.items()},
        "ratio_on_over_off": round(ratio, 3),
        "ratio_per_round": [round(on / off, 3) for on, off in zip(seconds["on"], seconds["off"], strict=True)],
        "same_peak": peaks["on"] == peaks["off"],
        "peak_bytes": peaks["on"],
        "events": recorded.events,
        "points_kept": len(recorded.x),
        "saved_svg_bytes": svg_bytes,
        "plotly_json_bytes": plotly_bytes,
        "torch_threads": torch.get_num_threads(),
    }
    stem = common.result_stem(NAME, device, args.size)
    path = common.write_json(result, args.out / f"{stem}.json")
    common.write_figure(timeline_figure([recorded]), args.out / f"{stem}.html")
    print(f"{model}: recorder on/off {result['ratio_on_over_off']} (rounds {result['ratio_per_round']}), "
          f"saved SVG {svg_bytes} bytes, plotly JSON {plotly_bytes} bytes -> {path}")
    return result


if __name__ == "__main__":
    main()
