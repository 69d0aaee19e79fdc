"""Writes docs/figures/quickstart.svg: memlab's own static figure (the SVG a notebook keeps after a run) of the
README's comparison, on a small Llama built from its config, with a budget the plain step does not fit.

Run from the repository root: ``python docs/figures/make_quickstart.py`` (about a minute on a CPU).
"""

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import memlab
from memlab.report.views.static import report_svg

OUT = Path(__file__).resolve().parent / "quickstart.svg"


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = LlamaConfig(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=4096, max_position_embeddings=256, use_cache=False)
    model = AutoModelForCausalLM.from_config(config)
    ids = torch.randint(0, 4096, (8, 64))
    batch = {"input_ids": ids, "labels": ids}
    # The README's plans in fp32: on a CPU bf16 is emulated and slow, so the figure would argue against the tool;
    # what these levers are for, fitting a budget, a CPU shows as a GPU does. The budget is scaled to this small
    # model: between the plain step's peak and checkpointing's, so that plain does not fit and memlab must choose.
    plans = [memlab.Plan(), memlab.Plan(checkpointing=True), memlab.Plan(micro_batch=2, accumulation=4,
                                                                            checkpointing=True)]
    free = memlab.compare(model, batch, plans[:2], steps=1, noise=0)
    plain, checkpointed = free.trials
    budget = (plain.peak_bytes + checkpointed.peak_bytes) // 2 // 2**20 * 2**20
    report = memlab.compare(model, batch, plans, steps=5, noise=0, budget=budget)
    OUT.write_text(report_svg(report), encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
