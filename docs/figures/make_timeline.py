"""Writes docs/figures/timeline.svg: memlab's static timeline figure (the SVG a notebook keeps) of one training
step without and with activation checkpointing, on the small Llama of the README's comparison.

Run from the repository root: ``python docs/figures/make_timeline.py`` (under a minute on a CPU).
"""

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import memlab
from memlab.report.views.timeline_figure import timelines_svg

OUT = Path(__file__).resolve().parent / "timeline.svg"


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = LlamaConfig(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=4096, max_position_embeddings=256, use_cache=False)
    model = AutoModelForCausalLM.from_config(config)
    ids = torch.randint(0, 4096, (8, 64))
    batch = {"input_ids": ids, "labels": ids}
    report = memlab.compare(model, batch, [memlab.Plan(), memlab.Plan(checkpointing=True)], steps=1, noise=0)
    timelines = [trial.timeline for trial in report if trial.timeline is not None]
    assert len(timelines) == 2, [trial.error for trial in report]
    for trial, timeline in zip(report, timelines, strict=True):
        timeline.label = trial.label  # named in its title
    OUT.write_text(timelines_svg(timelines), encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
