# %% [markdown]
# # 07 · Will a 7B model fit?
#
# Before renting a GPU, it helps to know whether training will fit on it. memlab can run one training
# step on *fake* tensors: they carry shapes and dtypes but no data, so the step allocates nothing and
# computes nothing, while memlab counts every byte a real step would hold. A laptop without a GPU can
# dry-run a 7-billion-parameter model this way in under a minute.
#
# The question here: can one 24 GiB GPU fully fine-tune a Llama-shaped 7B model on 512-token rows?

# %%
import logging
import warnings

# Quiet before the imports: some libraries warn while they load.
warnings.filterwarnings("ignore", category=FutureWarning)
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # optional CPU kernels it may not find

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig

import memlab

transformers.logging.set_verbosity_error()
torch.manual_seed(0)


def human(num_bytes):
    """Bytes in KiB, MiB or GiB, for printing."""
    for unit in ("B", "KiB", "MiB"):
        if abs(num_bytes) < 1024:
            return f"{num_bytes:,.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:,.1f} GiB"


# %% tags=["parameters"]
# The shape of Llama 2 7B. The tests shrink it; leave it as it is to ask the real question.
hidden = 4096
layers = 32
heads = 32
intermediate = 11008
vocab = 32000
seq_len = 512
budget = "24GiB"

# %%
# With internet, read a real model's config instead (no weights are downloaded):
#   config = transformers.AutoConfig.from_pretrained("meta-llama/Llama-2-7b-hf")
config = LlamaConfig(
    hidden_size=hidden,
    intermediate_size=intermediate,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    num_key_value_heads=heads,
    vocab_size=vocab,
)
with torch.device("meta"):  # shapes only: no memory
    shell = AutoModelForCausalLM.from_config(config)
n_params = sum(p.numel() for p in shell.parameters())
del shell
print(f"{n_params:,} parameters ({n_params / 1e9:.2f} billion)")

# %% [markdown]
# ## The arithmetic first
#
# Before any activation, full training holds weights, gradients and optimizer state. Per parameter:

# %%
per_parameter = {
    "fp32 weights, fp32 grads, AdamW": 4 + 4 + 8,
    "bf16 autocast (fp32 master weights), AdamW": 4 + 4 + 8,
    "fp32 weights, fp32 grads, AdamW8bit": 4 + 4 + 2,
}
limit = memlab.parse_budget(budget)
for setup_name, nbytes in per_parameter.items():
    print(f"{setup_name:45} {nbytes:2} bytes/param = {nbytes * n_params / 2**30:6.1f} GiB "
          f"({nbytes * n_params / limit:.1f}x the budget)")

# %% [markdown]
# Mixed precision does not change this line: it saves activations, not model state. The dry run adds
# what the arithmetic leaves out: activations, temporary buffers, and the moment when they all peak
# together.
#
# ## The dry run
#
# `memlab.estimate` takes a config (or a model) and a batch given as shapes. `device="cuda"` asks about a
# GPU even on a machine without one: the fake step runs the CPU's kernels but keeps what CUDA's would
# (its attention backends, autocast dtypes, dropout masks and AdamW update), for the GPU kind `gpu=`
# names (an 80 GB H100 by default). Made on a CPU this way, the estimates of every step measured on an
# H100 so far are within 5% of its peak (the README's benchmarks list them). The notes say what was
# assumed.

# %%
shapes = {"input_ids": (1, seq_len), "labels": (1, seq_len)}
plan = memlab.Plan(precision="bf16", checkpointing=True)
estimate = memlab.estimate(config, shapes, plan, budget=budget, device="cuda")
estimate

# %%
for note in estimate.notes:
    print("-", note)
print(f"allocated peak {estimate.peak_bytes / 2**30:.1f} GiB; the budget judges the "
      f"{estimate.verdict_figure}, {estimate.verdict_bytes / 2**30:.1f} GiB")

# %% [markdown]
# Read the breakdown with the moment of the peak in mind. With checkpointing, activations are small,
# and the peak often falls in the optimizer step instead: gradients and AdamW's state are all there.
# memlab's AdamW is fused, as the Trainer builds it. A plain loop's `torch.optim.AdamW(params)` runs the
# foreach update on a GPU, which holds a temporary as large as the weights (counted under `other`): ask
# for `optimizer="adamw_foreach"` to estimate that loop as it is.
#
# The peak is what tensors hold (`max_memory_allocated`). The card shows more: the caching allocator's
# reserve and the CUDA context. `card_bytes` models both, and a budget is judged on it.

# %% [markdown]
# ## Which plans fit in the budget?

# %%
plans = [
    memlab.Plan(),
    memlab.Plan(precision="bf16", checkpointing=True),
    memlab.Plan(precision="bf16", checkpointing=True, optimizer="adamw8bit"),
]
report = memlab.Report([memlab.estimate(config, shapes, p, budget=budget, device="cuda") for p in plans],
                       budget=limit)
report

# %%
report.plot()

# %%
fitting = [t.label for t in report if report.fits(t)]
smallest = min(report, key=lambda t: t.peak_bytes)
print(f"fits in {budget}:", ", ".join(fitting) or "none of these plans")
print(f"smallest peak: {smallest.label}, {smallest.peak_bytes / 2**30:.1f} GiB")

# %% [markdown]
# If none fits, full fine-tuning at this size needs more than these techniques. The usual next step is to
# freeze the weights and train small adapters (LoRA; notebook 08): frozen weights need no gradients or
# optimizer state, and QLoRA stores them in 4 bits. The estimate covers both: peft's adapters and the
# 4-bit weights' bytes, still on fake tensors. (Other ways out: shard the model state across several GPUs,
# ZeRO or FSDP, or offload the optimizer state to CPU memory, notebook 05.)
#
# ## What LoRA and QLoRA change

# %%
tuned = [
    memlab.Plan(precision="bf16", checkpointing=True),
    memlab.Plan(precision="bf16", checkpointing=True, adapter="lora"),
    memlab.Plan(precision="bf16", checkpointing=True, adapter="qlora"),
]
adapters = memlab.Report(
    [memlab.estimate(config, shapes, p, budget=budget, device="cuda") for p in tuned], budget=limit
)
for trial in adapters:
    parts = ", ".join(f"{k} {trial.breakdown[k] / 2**30:.1f}" for k in ("params", "grads", "optimizer"))
    print(f"{trial.label:22} peak {trial.peak_bytes / 2**30:6.1f} GiB ({parts} GiB)")

# %% [markdown]
# ## Exercise
#
# Which of these GPUs would the smallest plan above fit on, judged by what each card will show
# (`card_bytes`: the allocator's reserve and that GPU's CUDA context; where the reserve is not known,
# the allocated peak, and `verdict_figure` says which)? Then change `seq_len` in the parameters cell to
# 2048 and run again: which categories grow?
#
# The next cell holds one solution, folded: click it to open.

# %% jupyter={"source_hidden": true}
# Solution
for gpu, gib in (("L4-24GB", 24), ("A100-40GB", 40), ("L40S-48GB", 48), ("H100-80GB", 80)):
    trial = memlab.estimate(config, shapes, smallest.plan, budget=f"{gib}GiB", device="cuda", gpu=gpu)
    verdict = "fits" if trial.fits else "does not fit"
    figure = f"{trial.verdict_figure} {trial.verdict_bytes / 2**30:5.1f} GiB"
    print(f"{gpu:10} {smallest.label}: {figure}, {verdict}")
