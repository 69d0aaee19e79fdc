"""memlab's estimate of eager against SDPA attention, next to the same pair of runs that others published.

Each row is one published training run measured twice on a named GPU, once with ``attn_implementation="eager"`` and
once with ``"sdpa"``, with the settings the source gave. memlab estimates both from the model's config alone (on
fake tensors, on a machine without a GPU), the attention implementation set on the config, and the result records:

- ``published``: the eager and the SDPA peaks in the source's unit (``published_eager``, ``published_sdpa``), and
  what they measure (``measures``);
- ``memlab``: memlab's figure of the same kind for each (``memlab_eager``, ``memlab_sdpa``, same unit), and the
  ratios ``ratio_eager`` and ``ratio_sdpa`` (memlab over published);
- ``difference``: eager minus SDPA, published (``published_difference``) and estimated (``memlab_difference``),
  and their ratio (``difference_ratio``). This is the check that matters here: eager attention keeps, per layer,
  rows x heads x tokens x tokens attention probabilities (and its dropout mask) for backward, which SDPA's fused
  kernels do not;
- ``memlab_eager_as_run``, ``difference_ratio_as_run`` (OPT rows): the eager estimate with the attention code the
  published run's transformers had (:func:`opt_eager_4_46`) in place of today's, and its difference's ratio;
- ``differs``: what the source's run does that memlab's estimate does not model, and why a ratio is off by more than
  15% where it is.

Sources (every published number below is quoted from them, nothing else is):

- huggingface/transformers pull request #31031 ("[GPT-NeoX] Add SDPA support", vasqu, 2024-05-25, merged), its
  description's "Training results": "rtx3080ti-16GB, PyTorch 2.2.1, OS Ubuntu 22.04 using ``float16`` with
  pythia-410m-deduped", measured with fxmarty's training script (gist 7e75cc3942d6974e4849093ebea0a331, 2023-12-11:
  ``AutoModelForCausalLM`` with ``--use-half``, ``model.train()``, each step ``model.zero_grad()``, ``loss =
  outputs.logits.sum()``, ``loss.backward()``, no optimizer). The part of the gist that builds the inputs and reads the
  peak could not be read here: "Eager peak mem (MB)" / "sdpa peak mem (MB)" are taken as the allocator's allocated
  peak (``max_memory_allocated``, which the fxmarty-derived scripts of the other SDPA pull requests print), in MB of
  1e6 bytes, and the batch as token ids alone (no padding).
- huggingface/transformers pull request #31172 ("[GPT2] Add SDPA support", vasqu, 2024-06-01, merged): its
  description says its benchmarks are "like in #31031 for gpt2-large (same setup)": the same GPU, PyTorch, float16 and
  script; its "Training benchmark" table has the same columns.

- huggingface/transformers docs/source/en/model_doc/opt.md, its SDPA section (added with pull request #33298, "add
  sdpa to OPT", whose comment of 2024-09-25 ran the benchmark "used code from here #31031"): "L40S-45GB, PyTorch
  2.4.0, OS Debian GNU/Linux 11 using ``float16`` with facebook/opt-350m", the same columns; the rows of 2,048 tokens
  (1 x 2048) and 8 x 1024 are estimated. The eager code that ran is transformers' OPT of late 2024 (4.46), not
  today's: see ``_OPT_EAGER``.

Rejected candidates (why) are listed in ``REJECTED`` and written into the result.

memlab has no step without an optimizer, so the estimate runs its default AdamW and its figure is the allocated
peak less the optimizer state (``breakdown["optimizer"]``, there all step long in a steady-state step), the published
script having no optimizer. The RTX 3080 Ti (sm86) is not a GPU kind memlab knows: the rows are estimated for the
RTX 4090 (sm89), whose SDPA backend choice for fp16 (flash) is the same; only allocated bytes are compared.

Run from the repository root (no GPU needed; about a minute on 2 cores)::

    python -m benchmarks.attention_vs_published
    python -m benchmarks.attention_vs_published --rows 1,3     # some rows only (1-based), no JSON written
    python -m benchmarks.attention_vs_published --markdown benchmarks/results/attention_vs_published-cpu.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from memlab.plan import Plan

NAME = "attention_vs_published"
UNITS = {"GB": 1e9, "MB": 1e6, "MiB": 2**20}
"""The units sources write their peaks in, in bytes."""
IMPLEMENTATIONS = ("eager", "sdpa")
NEOX = ("huggingface/transformers pull request #31031 ([GPT-NeoX] Add SDPA support, 2024-05-25), 'Training "
        "results': rtx3080ti-16GB, PyTorch 2.2.1, float16, EleutherAI/pythia-410m-deduped, fxmarty's training "
        "script (logits.sum() backward, no optimizer)")
GPT2 = ("huggingface/transformers pull request #31172 ([GPT2] Add SDPA support, 2024-06-01), 'Training benchmark': "
        "gpt2-large, 'same setup' as #31031 (rtx3080ti-16GB, PyTorch 2.2.1, float16, fxmarty's training script)")
FP16 = {"torch_dtype": torch.float16}
REJECTED = (
    {"source": "huggingface/transformers pull request #28802 (SDPA for BERT, hackyon's gist)",
     "why": "the gist's table gives batch, length and peaks but neither the checkpoint nor the dtype nor the GPU"},
    {"source": "huggingface/transformers pull request #32092 (sdpa for Albert, albert-base-v2 fp16)",
     "why": "no GPU named, and the masked-LM step's inputs (mask, padding) differ from run to run of its script"},
    {"source": "huggingface/transformers pull request #37106 (sdpa for Electra, open)",
     "why": "not merged; the figures are means of five runs of a script adapted for masked LM, the GPU not stated"},
    {"source": "huggingface/transformers docs perf_infer_gpu_one.md (FlashAttention-2 / SDPA sections)",
     "why": "its Llama and Falcon figures are speed-up plots (images), with no memory figure"},
)


def gpt2_large() -> Any:
    """gpt2-large's config: vocab 50,257, 1,024 positions, embedding 1,280, 36 layers, 20 heads, dropout 0.1
    (embedding, residual and attention), tied embeddings (774,030,080 parameters)."""
    from transformers import GPT2Config

    return GPT2Config(vocab_size=50_257, n_positions=1024, n_embd=1280, n_layer=36, n_head=20)


def pythia_410m() -> Any:
    """EleutherAI/pythia-410m-deduped's config: vocab 50,304, hidden 1,024, 24 layers, 16 heads, intermediate 4,096,
    rotary on 25% of each head, parallel residual, untied embeddings, no dropout (405,334,016 parameters)."""
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(vocab_size=50_304, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                         intermediate_size=4096, rotary_pct=0.25, max_position_embeddings=2048,
                         use_parallel_residual=True, tie_word_embeddings=False)


def opt_350m() -> Any:
    """facebook/opt-350m's config: vocab 50,272, hidden 1,024 projected from and to 512-wide embeddings, 24 layers,
    16 heads, ffn 4,096 (ReLU), 2,048 positions, post-layer-norm (no final norm), dropout 0.1 and attention dropout
    0.0, tied embeddings."""
    from transformers import OPTConfig

    return OPTConfig(vocab_size=50_272, hidden_size=1024, word_embed_proj_dim=512, num_hidden_layers=24,
                     num_attention_heads=16, ffn_dim=4096, max_position_embeddings=2048, do_layer_norm_before=False,
                     dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, activation_function="relu")


def tiny_gpt2() -> Any:
    """A two-layer GPT-2 for the smoke run."""
    from transformers import GPT2Config

    return GPT2Config(vocab_size=1000, n_positions=128, n_embd=64, n_layer=2, n_head=4)


@dataclass(frozen=True)
class Run:
    """One published pair of runs, eager and SDPA: the model, where it ran, the two peaks (in ``unit``, of kind
    ``measures``), and where the source said so."""

    name: str
    model: str
    config: Callable[[], Any]
    gpu: str
    estimated_for: str
    rows: int
    tokens: int
    published_eager: float
    published_sdpa: float
    source: str
    unit: str = "MB"
    measures: str = "allocated"
    differs: str = ""

    @property
    def published_difference(self) -> float:
        return self.published_eager - self.published_sdpa


_FXMARTY: dict[str, Any] = dict(gpu="RTX 3080 Ti (16GB)", estimated_for="RTX4090-24GB", rows=1)
_GPT2_DROPOUT = ("eager also keeps its attention dropout's mask (rows x heads x tokens x tokens) for backward; "
                 "model.train() leaves gpt2-large's dropout 0.1 on")
_SHORT = ("memlab is under both published peaks by 120 to 360 MB, about the same with either implementation and at "
          "sequence 128 too (pythia: 168 MB over its fp16 weights and gradients, where activations are small), so "
          "not attention: the cause is not established; candidates are the cuBLAS workspaces, which PyTorch 2.2 "
          "takes from the caching allocator (max_memory_allocated counts them, memlab only in its reserve), one per "
          "handle and stream, the forward's thread and autograd's each with one, and the script's own tensors "
          "(its attention mask, any padding) that the source does not show")
_GPT2_SDPA = ("memlab's SDPA peak for gpt2-large is the same 3,353.44 MB at 1x128, 2x256 and 1x512: it lies late in "
              "backward, at the tied embedding's gradient (every other gradient, 1,419 MB, and 386 MB, three "
              "vocabulary x 1,280 fp16 buffers), a point whose size does not depend on the tokens, where the "
              "published SDPA peaks grow with them (3,494.6, 3,552.6, 3,657.7, 3,665.6 MB): the real run's peak is "
              "elsewhere, at a point where memlab holds less than the real run did")
_GPT2_512 = (f"{_GPT2_DROPOUT}. The published difference here is 2.99 bytes per attention element (36 layers x 20 "
             "heads x 512 x 512 = 188.7M), at 1024 it is 5.03 (fp16 probabilities 2, dropout mask 1, dropout output "
             "2 bytes), memlab's 4.0 and 4.87: memlab's difference is 34% over because its SDPA peak is 8.5% (312 MB) "
             f"under the published one while its eager peak is 2.9% under. {_GPT2_SDPA}. {_SHORT}")
OPT = ("huggingface/transformers docs/source/en/model_doc/opt.md, SDPA section (pull request #33298's benchmark): "
       "L40S-45GB, PyTorch 2.4.0, float16, facebook/opt-350m, #31031's training script (logits.sum() backward, no "
       "optimizer)")
_L40S: dict[str, Any] = dict(gpu="L40S (45GB)", estimated_for="L40S-48GB")
_OPT_EAGER = ("eager attention as transformers ran it then (4.46, OPTAttention): after the mask is added it takes "
              "torch.max(attn_weights, finfo(fp16).min), whose backward keeps its fp16 input, the masked scores, "
              "then the float32 softmax (kept) and its fp16 copy (kept by the bmm with the values): 2 + 4 + 2 = 8 "
              "bytes per attention element (the published difference is {per:.2f} bytes per element of 24 layers x "
              "16 heads x {elements}). Today's OPT eager (transformers 5.x, eager_attention_forward) has no "
              "torch.max: 4 + 2 = 6 bytes, what memlab counts (a dry run of it keeps what the CPU's run keeps, "
              "tests/estimation/cuda/test_attention_cuda.py), so memlab's difference is 6/8 = 0.75 of the "
              "published one by the code, not by the kernels. Estimated with 4.46's eager attention in place of "
              "today's (memlab_eager_as_run), the difference is the published one (difference_ratio_as_run). Both "
              "published peaks are over memlab's, SDPA's by 16-19%: 426 MB at 2,048 tokens, 1,650 MB at 8,192, "
              "about 0.2 MB a token (some four fp16 hidden-size tensors a layer) that 4.46's OPT kept and today's "
              "does not, or that memlab misses: not established here")
RUNS = (
    Run("pythia-410m train, fp16, 1x128", "pythia-410m-deduped", pythia_410m, tokens=128, published_eager=1789.95,
        published_sdpa=1789.95, source=f"{NEOX}, batch_size 1, seq_len 128", differs=_SHORT, **_FXMARTY),
    Run("pythia-410m train, fp16, 1x256", "pythia-410m-deduped", pythia_410m, tokens=256, published_eager=1845.83,
        published_sdpa=1844.84, source=f"{NEOX}, batch_size 1, seq_len 256", differs=_SHORT, **_FXMARTY),
    Run("gpt2-large train, fp16, 1x128", "gpt2-large", gpt2_large, tokens=128, published_eager=3482.32,
        published_sdpa=3494.62, source=f"{GPT2}, batch size 1, seq len 128",
        differs=f"{_GPT2_SDPA}. {_SHORT}", **_FXMARTY),
    Run("gpt2-large train, fp16, 2x256", "gpt2-large", gpt2_large, tokens=256, published_eager=3901.5,
        published_sdpa=3657.68, source=f"{GPT2}, batch size 2, seq len 256",
        differs=f"{_GPT2_DROPOUT}. {_GPT2_SDPA}. {_SHORT}",
        **{**_FXMARTY, "rows": 2}),
    Run("gpt2-large train, fp16, 1x512", "gpt2-large", gpt2_large, tokens=512, published_eager=4230.1,
        published_sdpa=3665.59, source=f"{GPT2}, batch size 1, seq len 512", differs=_GPT2_512, **_FXMARTY),
    Run("gpt2-large train, fp16, 1x1024", "gpt2-large", gpt2_large, tokens=1024, published_eager=8682.26,
        published_sdpa=4881.09, source=f"{GPT2}, batch size 1, seq len 1024",
        differs=f"{_GPT2_DROPOUT}. {_SHORT}", **_FXMARTY),
    Run("opt-350m train, fp16, 1x2048", "opt-350m", opt_350m, tokens=2048, published_eager=15662.224,
        published_sdpa=2715.75, source=f"{OPT}, batch_size 1, seq_len 2048",
        differs=_OPT_EAGER.format(per=(15662.224 - 2715.75) * 1e6 / (24 * 16 * 2048**2), elements="2048 x 2048"),
        rows=1, **_L40S),
    Run("opt-350m train, fp16, 8x1024", "opt-350m", opt_350m, tokens=1024, published_eager=34175.763,
        published_sdpa=8821.18, source=f"{OPT}, batch_size 8, seq_len 1024",
        differs=_OPT_EAGER.format(per=(34175.763 - 8821.18) * 1e6 / (24 * 16 * 8 * 1024**2),
                                  elements="8 x 1024 x 1024"),
        rows=8, **_L40S),
)
"""The published pairs of runs, each with its source."""
SMOKE = (Run("tiny gpt2, fp16, 2x64", "tiny-gpt2", tiny_gpt2, tokens=64, published_eager=1.0, published_sdpa=1.0,
             source="smoke: no published figure", **{**_FXMARTY, "rows": 2}),)


def logits_sum(model: Any, batch: Any) -> Any:
    """fxmarty's training script's loss: the sum of the logits."""
    return model(**batch).logits.sum()


def opt_eager_4_46(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float,
                   dropout: float = 0.0, **kwargs: Any) -> tuple[Any, Any]:
    """OPT's eager attention as transformers 4.46 computed it (``OPTAttention.forward``, Apache-2.0, the HuggingFace
    team), in today's ``eager_attention_forward`` signature: the masked scores clamped by ``torch.max`` against the
    dtype's minimum (its backward keeps them), the softmax in float32 cast back to fp16."""
    from torch import nn

    weights = torch.matmul(query * scaling, key.transpose(-1, -2))  # 4.46 scaled the query projection
    if attention_mask is not None:
        weights = weights + attention_mask
        weights = torch.max(weights, torch.tensor(torch.finfo(weights.dtype).min, device=weights.device))
    if weights.dtype == torch.float16:
        weights = nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(torch.float16)
    else:
        weights = nn.functional.softmax(weights, dim=-1)
    probabilities = nn.functional.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(probabilities, value).transpose(1, 2).contiguous(), weights


def estimate_one(run: Run, implementation: str, as_run: bool = False) -> Any:
    """memlab's estimate of ``run`` with one attention implementation (set on the config; ``Plan(attention=...)``
    can take its place once that lever exists); ``as_run``: OPT's eager attention as the published run's
    transformers (4.46) computed it, in place of today's."""
    from transformers.models.opt import modeling_opt

    import memlab

    config = run.config()
    config._attn_implementation = implementation
    batch = {"input_ids": (run.rows, run.tokens)}
    today = modeling_opt.eager_attention_forward
    if as_run:
        modeling_opt.eager_attention_forward = opt_eager_4_46
    try:
        return memlab.estimate(config, batch, Plan(), loss_fn=logits_sum, gpu=run.estimated_for, load=FP16)
    finally:
        modeling_opt.eager_attention_forward = today


def figure(trial: Any, measures: str) -> float:
    """memlab's figure of the kind the published peak ``measures``, with the optimizer state out (the published
    script has no optimizer).

    Example:
        >>> from types import SimpleNamespace
        >>> figure(SimpleNamespace(peak_bytes=10, breakdown={"optimizer": 4}), "allocated")
        6
    """
    if measures != "allocated":
        raise ValueError(f"no memlab figure for {measures!r}")
    return trial.peak_bytes - trial.breakdown.get("optimizer", 0)


def estimate_run(run: Run) -> dict[str, Any]:
    """memlab's estimates of one published pair, eager and SDPA, and how they compare."""
    unit = UNITS[run.unit]
    started = time.perf_counter()
    trials = {impl: estimate_one(run, impl) for impl in IMPLEMENTATIONS}
    as_run = estimate_one(run, "eager", as_run=True) if run.model == "opt-350m" else None
    seconds = time.perf_counter() - started
    mine = {impl: figure(trial, run.measures) / unit for impl, trial in trials.items()}
    published = {"eager": run.published_eager, "sdpa": run.published_sdpa}
    difference = mine["eager"] - mine["sdpa"]
    return {
        "run": run.name,
        "model": run.model,
        "gpu": run.gpu,
        "estimated_for": run.estimated_for,
        "batch": f"{run.rows}x{run.tokens}",
        "source": run.source,
        "measures": run.measures,
        "unit": run.unit,
        "published_eager": run.published_eager,
        "published_sdpa": run.published_sdpa,
        "memlab_eager": common.rounded(mine["eager"], 2),
        "memlab_sdpa": common.rounded(mine["sdpa"], 2),
        "ratio_eager": common.rounded(mine["eager"] / published["eager"], 3),
        "ratio_sdpa": common.rounded(mine["sdpa"] / published["sdpa"], 3),
        "published_difference": common.rounded(run.published_difference, 2),
        "memlab_difference": common.rounded(difference, 2),
        "difference_ratio": (common.rounded(difference / run.published_difference, 3)
                             if abs(run.published_difference) >= 10 else None),
        "memlab_eager_as_run": None if as_run is None else common.rounded(figure(as_run, run.measures) / unit, 2),
        "difference_ratio_as_run": None if as_run is None else common.rounded(
            (figure(as_run, run.measures) / unit - mine["sdpa"]) / run.published_difference, 3),
        "optimizer_out": {impl: common.rounded(trial.breakdown.get("optimizer", 0) / unit, 2)
                          for impl, trial in trials.items()},
        "differs": run.differs or None,
        "status": {impl: trial.status for impl, trial in trials.items()},
        "seconds": common.rounded(seconds, 1),
        "notes": {impl: list(trial.notes) for impl, trial in trials.items()},
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    """The docs' table of the rows: published and estimated peaks of either implementation, their ratios, and the
    eager-minus-SDPA difference published and estimated."""
    return common.markdown_table(
        ["run", "GPU", "source", "eager: published / memlab", "sdpa: published / memlab", "ratio eager", "ratio sdpa",
         "eager - sdpa: published / memlab"],
        [[r["run"], r["gpu"], r["source"].split(" (")[0], f"{r['published_eager']} / {r['memlab_eager']} {r['unit']}",
          f"{r['published_sdpa']} / {r['memlab_sdpa']} {r['unit']}", r["ratio_eager"], r["ratio_sdpa"],
          f"{r['published_difference']} / {r['memlab_difference']} {r['unit']}"] for r in rows],
    )


def chosen(spec: str | None, smoke: bool) -> list[Run]:
    """The runs to estimate: all, the smoke run, or the 1-based ``--rows`` (``"1,3"``)."""
    if smoke:
        return list(SMOKE)
    if not spec:
        return list(RUNS)
    return [RUNS[int(part) - 1] for part in spec.split(",")]


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=None, help="estimate these rows only (1-based, comma-separated)")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help="the folder to write the JSON in (default: benchmarks/results/)")
    parser.add_argument("--markdown", default=None, metavar="JSON",
                        help="print the docs' table of a results file, estimating nothing")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())["rows"]))
        return None
    common.quiet()
    rows = [estimate_run(run) for run in chosen(args.rows, args.smoke)]
    for row in rows:
        print(f"{row['run']}: eager {row['memlab_eager']} ({row['ratio_eager']} of {row['published_eager']}), sdpa "
              f"{row['memlab_sdpa']} ({row['ratio_sdpa']} of {row['published_sdpa']}), eager - sdpa "
              f"{row['memlab_difference']} vs {row['published_difference']} {row['unit']} ({row['seconds']} s)")
    size = "smoke" if args.smoke else "published"
    payload = {
        **common.metadata_for(NAME, torch.device("cpu"), size),
        "what": ("memlab.estimate of published eager-vs-SDPA training runs, attention set on the config, made on "
                 "this CPU for the GPU each ran on"),
        "rows": rows,
        "rejected": list(REJECTED),
        "outside_15_percent": [r["run"] for r in rows
                               if max(abs(r["ratio_eager"] - 1), abs(r["ratio_sdpa"] - 1)) > 0.15],
        "markdown": markdown(rows),
    }
    print(markdown(rows))
    if args.rows is None:
        folder = Path(args.out) if args.out else common.RESULTS_DIR
        path = folder / f"{NAME}-cpu{'-smoke' if args.smoke else ''}.json"
        common.write_json(payload, path)
        print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
