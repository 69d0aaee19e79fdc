# %% [markdown]
# # 04 · 8-bit Adam
#
# AdamW keeps two fp32 numbers per weight, a running mean of the gradient and of its square: 8 bytes per
# parameter, twice the weights themselves. bitsandbytes' `AdamW8bit` stores both in 8 bits. To keep them
# accurate, it quantizes in blocks of 256 values, each block with its own scale, so one large value only
# coarsens its own block. The update itself is still computed in fp32.
#
# That is 2 bytes per parameter instead of 8, a quarter. bitsandbytes keeps tensors with fewer than
# 4096 elements (biases, norms) in fp32, where the saving would be tiny anyway. The question is whether
# training still behaves the same: a short run answers it.

# %%
import copy
import logging
import warnings

# Quiet before the imports: some libraries warn while they load.
warnings.filterwarnings("ignore", category=FutureWarning)
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # optional CPU kernels it may not find

import plotly.graph_objects as go
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
# Sizes of the model and the batch, small enough for a CPU (a free Binder; how long they take depends on how
# busy it is: docs/workshop.md says what was measured); on a GPU, make them bigger. The tests run every notebook with
# smaller values injected after this cell.
hidden = 128   # width of the model
layers = 4     # transformer blocks
vocab = 4096   # vocabulary size
rows = 8       # sequences per batch
seq_len = 64   # tokens per sequence
steps = 3      # timed steps per measurement
noise = 0.05   # time on past `steps` until the median step is known within +-5% (0: exactly `steps` steps)
curve_steps = 30   # optimizer steps in the loss-curve run
lr = 1e-3          # learning rate of that run

# %%
device = "cuda" if torch.cuda.is_available() else "cpu"
if device == "cpu":
    # The models here are small: one thread runs them about as fast as several, and on a shared machine (a
    # Binder, a laptop building something) torch's threads wait on each other for the busy core, up to
    # 15 times slower (docs/workshop.md has the numbers). On a machine of your own, delete this line.
    torch.set_num_threads(1)
where = torch.cuda.get_device_name() if device == "cuda" else f"the CPU, {torch.get_num_threads()} thread(s)"
print("Running on", where)

# %%
# With internet, a real checkpoint works the same way; replace the config and from_config lines with:
#   model = AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M").to(device)
#   vocab = model.config.vocab_size
config = LlamaConfig(
    hidden_size=hidden,
    intermediate_size=4 * hidden,
    num_hidden_layers=layers,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=vocab,
    max_position_embeddings=4 * seq_len,
    use_cache=False,
)
model = AutoModelForCausalLM.from_config(config).to(device)

# Random tokens: memory and speed do not depend on what the text says.
ids = torch.randint(0, vocab, (rows, seq_len), device=device)
batch = {"input_ids": ids, "labels": ids}
n_params = sum(p.numel() for p in model.parameters())
print(f"{n_params:,} parameters; a batch of {rows} rows x {seq_len} tokens")

# %% [markdown]
# ## The optimizer state, measured

# %%
plans = [memlab.Plan(), memlab.Plan(optimizer="adamw8bit")]
report = memlab.compare(model, batch, plans, steps=steps, noise=noise)
report

# %%
report.plot()

# %%
adamw, eight_bit = report
big = sum(p.numel() for p in model.parameters() if p.numel() >= 4096)
expected = (2 * big + 8 * (n_params - big)) / (8 * n_params)
print(f"AdamW state:      {human(adamw.breakdown['optimizer'])}")
print(f"AdamW8bit state:  {human(eight_bit.breakdown['optimizer'])}")
print(f"ratio {eight_bit.breakdown['optimizer'] / adamw.breakdown['optimizer']:.2f}; "
      f"{big / n_params:.0%} of the parameters are in tensors big enough for 8 bits, "
      f"which predicts {expected:.2f} (plus a little for the block scales)")


# %% [markdown]
# ## Does it train the same?
#
# Two copies of the model, the same batch, the same learning rate: one with AdamW, one with AdamW8bit.
# `applied.step(batch)` does one optimizer step and returns the loss. On a single repeated batch the
# model memorizes it, so the loss falls quickly; what matters is whether the two curves agree.

# %%
def train(optimizer):
    twin = copy.deepcopy(model)
    with memlab.apply(twin, memlab.Plan(optimizer=optimizer), lr=lr) as applied:
        return [applied.step(batch) for _ in range(curve_steps)]


curves = {name: train(name) for name in ("adamw", "adamw8bit")}
fig = go.Figure([go.Scatter(y=losses, name=name, mode="lines+markers") for name, losses in curves.items()])
fig.update_layout(title="AdamW against AdamW8bit", xaxis_title="optimizer step", yaxis_title="loss")
fig

# %%
for name, losses in curves.items():
    print(f"{name:10} loss {losses[0]:.3f} -> {losses[-1]:.3f}")

# %% [markdown]
# ## Exercise
#
# Which tensors of this model keep fp32 state, and what share of the parameters do they hold? Then
# predict the saving for other shapes, such as the tiny one the tests use (hidden 32, vocab 128) and a
# 7B-like one. (Models built on the `meta` device have shapes but no memory, so this costs nothing.)
#
# The next cell holds one solution, folded: click it to open.

# %% jupyter={"source_hidden": true}
# Solution
small = {name: p.numel() for name, p in model.named_parameters() if p.numel() < 4096}
print(f"{len(small)} tensors keep fp32 state, {sum(small.values()) / n_params:.2%} of the parameters:")
print(sorted(small)[:4], "...")
for width, words in ((32, 128), (128, 4096), (1024, 32000), (4096, 32000)):
    shape = LlamaConfig(
        **{**config.to_dict(), "hidden_size": width, "intermediate_size": 4 * width, "vocab_size": words}
    )
    with torch.device("meta"):
        shell = AutoModelForCausalLM.from_config(shape)
    sizes = [p.numel() for p in shell.parameters()]
    share = sum(s for s in sizes if s >= 4096) / sum(sizes)
    ratio = (2 * share + 8 * (1 - share)) / 8
    print(f"hidden={width:5} vocab={words:6}: {share:7.2%} of parameters get 8-bit state; ratio {ratio:.2f}")
# Only the norm weights (one vector of `hidden` numbers each) stay fp32 in a model of any real size.
