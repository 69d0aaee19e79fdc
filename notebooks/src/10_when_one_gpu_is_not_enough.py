# %% [markdown]
# # 10 · When one GPU is not enough
#
# Fully fine-tuning an 8-billion-parameter model with AdamW holds about 16 bytes per parameter before a
# single activation: some 120 GiB, more than the 80 GiB of the largest common GPU. No lever of notebooks
# 01-09 brings that under 80 GiB without changing what is trained. The way out is to spread the model state
# over several GPUs:
#
# | strategy | what each of N GPUs keeps | engine |
# |---|---|---|
# | **FSDP2** | 1/N of weights, grads, optimizer state; one block whole while it runs | PyTorch, accelerate |
# | **ZeRO-2** | all the 16-bit weights; 1/N of the gradients and optimizer state | DeepSpeed |
# | **ZeRO-3** | 1/N of everything; one layer's full weights while it runs | DeepSpeed |
#
# Each GPU still holds the activations of its own micro-batch: sharding divides the model state, not the
# activations. memlab answers, on fake tensors and without any GPU, how much each GPU will hold, how many
# GPUs each strategy needs, and writes the accelerate config that runs the plan.

# %%
import logging
import warnings

# Quiet before the imports: some libraries warn while they load.
warnings.filterwarnings("ignore", category=FutureWarning)
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # optional CPU kernels it may not find

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig
import yaml

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
# The shape of Llama 3.1 8B. The tests shrink it; leave it as it is to ask the real question.
hidden = 4096
layers = 32
heads = 32
kv_heads = 8
intermediate = 14336
vocab = 128256
seq_len = 2048     # tokens per row; each GPU trains one row per micro-step
budget = "80GiB"   # memory of one GPU (an H100 or A100 80GB)
gpus = 8           # GPUs in the machine

# %% [markdown]
# ## The model, on the meta device
#
# A model built on the `meta` device has every parameter's shape and dtype but no memory, so an 8B model
# costs nothing here. memlab's dry runs copy it onto fake tensors.

# %%
# With internet, read the real config instead (no weights are downloaded):
#   config = transformers.AutoConfig.from_pretrained("meta-llama/Llama-3.1-8B")
# To train for real later, on the GPUs, load the weights as usual:
#   model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", torch_dtype=torch.float32)
config = LlamaConfig(
    hidden_size=hidden,
    intermediate_size=intermediate,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    num_key_value_heads=kv_heads,
    vocab_size=vocab,
    use_cache=False,
)
with torch.device("meta"):  # shapes only: no memory
    model = AutoModelForCausalLM.from_config(config)
n_params = sum(p.numel() for p in model.parameters())

# One row per GPU. Token values do not change memory, and a few thousand zeros cost nothing.
ids = torch.zeros(1, seq_len, dtype=torch.long)
batch = {"input_ids": ids, "labels": ids}
print(f"{n_params:,} parameters ({n_params / 1e9:.2f} billion); per GPU a batch of 1 x {seq_len} tokens")

# %% [markdown]
# ## One GPU: the arithmetic

# %%
limit = memlab.parse_budget(budget)
state = 16 * n_params  # fp32 weights 4 + grads 4 + AdamW's two moments 8 bytes per parameter
print(f"model state on one GPU: {human(state)}, {state / limit:.1f}x the {budget} budget")
print(f"the same state over {gpus} GPUs: {human(state / gpus)} each")

# %% [markdown]
# ## Sharded: the peak per GPU
#
# `%%memfit --dry-run --gpus N` runs the step on fake tensors as each GPU would: FSDP2 for real
# (`fully_shard` over a fake process group, counted by PyTorch's own `FSDPMemTracker`), ZeRO-2 and ZeRO-3
# from DeepSpeed's formulas plus the activations of that same dry run. `BATCH` is what *each* GPU trains
# per micro-step. Without `--strategy`, all three are estimated. bf16 autocast and checkpointing are on,
# as in most LLM recipes; try without them.

# %%
# %load_ext memlab

# %%
# %%memfit model batch --dry-run --gpus $gpus --budget $budget --try precision=bf16 checkpointing=on --quiet

# %%
sharded = _  # the Report: one trial per strategy, each with the peak per GPU
for trial in sharded:
    held = human(trial.model_state_bytes)
    print(f"{trial.label:28} {human(trial.peak_bytes):>10} per GPU, model state {held:>10}, "
          f"{'fits' if trial.fits else 'does not fit'}")
sharded.plot()

# %% [markdown]
# ZeRO-2 keeps a whole copy of the 16-bit weights on every GPU, so its peak falls slowest as GPUs are
# added; FSDP2 and ZeRO-3 shard the weights too. The `communication` part is the buffers the engines
# gather and reduce through (DeepSpeed's bucket sizes, FSDP2's all-gather of one block).
#
# ## How many GPUs, at the least?
#
# `--gpus auto` (with `--budget`) finds the smallest number of GPUs (1, 2, 4, 8, ...) that fits, for each
# strategy. For ZeRO it costs one dry run; for FSDP2 one per number tried, so here only ZeRO-3 is asked.

# %%
# %%memfit model batch --dry-run --gpus auto --strategy zero3 --budget $budget --try precision=bf16 checkpointing=on

# %%
smallest = _.best
print(f"ZeRO-3 fits {budget} on {smallest.gpus} GPUs: {human(smallest.peak_bytes)} per GPU")

# %% [markdown]
# ## Carry the plan to accelerate
#
# `Plan.to_accelerate_config(gpus=N, strategy=...)` gives the dict that `accelerate launch --config_file`
# reads, written here as YAML. The training script that goes with it carries the plan's other levers
# (accumulation, the optimizer, checkpointing); launch it with
# `accelerate launch --config_file memlab_accelerate.yaml train.py`.

# %%
from memlab.export.accelerate import accelerate_script

plan = smallest.plan
accelerate_config = plan.to_accelerate_config(gpus=smallest.gpus, strategy=smallest.strategy)
text = yaml.safe_dump(accelerate_config, sort_keys=False)
with open("memlab_accelerate.yaml", "w") as out:
    out.write(text)
print(text)

# %%
print(accelerate_script(plan, strategy=smallest.strategy, model_name="meta-llama/Llama-3.1-8B"))

# %% [markdown]
# ## Exercise
#
# Your GPUs have 40 GiB (A100 40GB). How many does ZeRO-2 need, and how many ZeRO-3? Why the difference?
# Export the FSDP2 config for 8 of them as YAML too. (`memlab.estimation.sharded.per_gpu.smallest_gpus` is the Python
# form of
# `--gpus auto`: ZeRO-2 and ZeRO-3 share one dry run there.)
#
# The next cell holds one solution, folded: click it to open.

# %% jupyter={"source_hidden": true}
# Solution
from memlab.estimation.sharded.per_gpu import smallest_gpus

tuned = memlab.Plan(precision="bf16", checkpointing=True)
found = smallest_gpus(model, batch, tuned, budget="40GiB", strategies=["zero2", "zero3"])
for name, trial in found.items():
    print(name, "no number of GPUs fits" if trial is None else f"{trial.gpus} GPUs, {human(trial.peak_bytes)}")
# ZeRO-2 keeps all the 16-bit weights on every GPU (2 bytes per parameter, some 15 GiB for 8B), whatever N.
print(yaml.safe_dump(tuned.to_accelerate_config(gpus=8, strategy="fsdp2"), sort_keys=False))
