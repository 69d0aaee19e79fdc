"""Writes docs/figures/timeline.svg: memlab's own static figure of two plans' step timelines (the SVG a notebook keeps
of ``report.plot(kind="timeline")``), the plain step beside gradient checkpointing on a small Llama built from its
config: the plain step's one climb through the forward, checkpointing's lower saw-tooth.

Run from the repository root: ``python docs/figures/make_timeline.py`` (under a minute on a CPU).
"""

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import memlab
from memlab.report.timeline_figure import named_timelines, timelines_svg

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
    OUT.write_text(timelines_svg(named_timelines(report)), encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
