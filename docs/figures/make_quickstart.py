"""Writes docs/figures/quickstart.svg: memlab's own static figure (the SVG a notebook keeps after a run) of the
README's comparison, on a small Llama built from its config.

Run from the repository root: ``python docs/figures/make_quickstart.py`` (about a minute on a CPU).
"""

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import memlab
from memlab.report.static import report_svg

OUT = Path(__file__).resolve().parent / "quickstart.svg"


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = LlamaConfig(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=4096, max_position_embeddings=256, use_cache=False)
    model = AutoModelForCausalLM.from_config(config)
    ids = torch.randint(0, 4096, (8, 64))
    batch = {"input_ids": ids, "labels": ids}
    plans = [memlab.Plan(), memlab.Plan(micro_batch=2, accumulation=4, checkpointing=True, precision="bf16")]
    report = memlab.compare(model, batch, plans, steps=3, noise=0)
    OUT.write_text(report_svg(report), encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
