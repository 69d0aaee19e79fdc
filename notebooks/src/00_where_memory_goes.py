# %% [markdown]
# # 00 · Where the memory goes
#
# A training step keeps several kinds of tensors on the device at once. memlab sorts them into five
# categories:
#
# | category | what it holds | how big |
# |---|---|---|
# | `params` | the weights | 4 bytes per parameter in fp32 |
# | `grads` | one gradient per weight, written by backward | 4 bytes per parameter |
# | `optimizer` | AdamW's two running averages per weight | 8 bytes per parameter |
# | `activations` | what forward saves for backward, and scratch space | grows with rows × tokens |
# | `other` | the batch, and whatever the process already held | |
#
# The first three are fixed by the model. Activations depend on what you push through it, which makes
# them the part you can most often shrink. This notebook measures all of them on a small model, then
# moves the batch size and the sequence length to see which bars follow.

# %%
import logging
import warnings

# Quiet before the imports: some libraries warn while they load.
warnings.filterwarnings("ignore", category=FutureWarning)
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # optional CPU kernels it may not find

import plotly.graph_objects as go
from plotly.subplots import make_subplots
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
# ## One training step, measured
#
# `memlab.measure` runs a few training steps of a plan on the live model and reports the peak memory of a
# steady step (the optimizer state already exists), split by category, and the speed. `memlab.Plan()` is
# plain fp32 training with AdamW. Afterwards the model is exactly as it was.

# %%
trial = memlab.measure(model, batch, memlab.Plan(), steps=steps, noise=noise)
trial

# %% [markdown]
# Set the measurement beside the bytes-per-parameter rule from the table:

# %%
rule = {"params": 4 * n_params, "grads": 4 * n_params, "optimizer": 8 * n_params}
for name, measured in trial.breakdown.items():
    guess = human(rule[name]) if name in rule else "depends on the batch"
    print(f"{name:12} measured {human(measured):>11}    rule of thumb: {guess}")
print(f"{'peak':12} measured {human(trial.peak_bytes):>11}")

# %% [markdown]
# ## What a lever is for: fitting a budget
#
# Say the device had room for 90% of that peak. The plain step no longer fits, and that is what memlab's levers
# are for: each trades some speed for memory. Here are three plans side by side: plain; checkpointing (each
# block's activations recomputed in backward instead of kept); and checkpointing with a micro-batch of a quarter
# of the rows, accumulated four times. All three train in fp32: on a GPU `precision="bf16"` is the next lever,
# but a CPU without bf16 units (most laptops and Binder's) emulates bf16 slowly, so here it would only show a slower
# step.

# %%
budget = int(0.9 * trial.peak_bytes)
levers = memlab.compare(
    model,
    batch,
    [memlab.Plan(), memlab.Plan(checkpointing=True),
     memlab.Plan(micro_batch=max(rows // 4, 1), accumulation=4, checkpointing=True)],
    budget=budget,
    steps=steps,
    noise=noise,
)
print(f"budget {human(budget)}; the fastest plan that fits: {levers.best.label if levers.best else 'none'}")
levers.plot()

# %% [markdown]
# The plain bar crosses the budget line: it does not fit. Checkpointing brings the peak under it for the price
# of a second forward through each block in backward; accumulation cuts the activations again, for the price of
# smaller, slower steps. `levers.best` is the fastest plan that fits. Each lever has its own notebook (01 to
# 05); the rest of this one goes back to the plain step and looks at where its memory goes.

# %% [markdown]
# ## Inside the step: the timeline
#
# The breakdown is a snapshot at the moment of the peak. `trial.timeline` shows the whole step it was taken
# from: memory over the step, stacked by category, with forward, backward and the optimizer step shaded, and
# the peak marked and named: the phase, the module running then (as `model.named_modules()` names it), and
# how many blocks still hold their activations.

# %%
timeline = trial.timeline
print(timeline.peak.description)
timeline.plot()

# %% [markdown]
# Read it from left to right. Forward climbs: each block saves what backward will need. Backward begins at
# the top and walks down: each block's saved activations are freed once its gradients are computed, while
# the weights' gradients (orange) appear one by one. The previous step's gradients were freed by
# `zero_grad(set_to_none=True)`, so gradients and activations mostly take turns, and the peak is where they
# overlap most. (With gradient accumulation, notebook 01, the first micro-batch's gradients live through the
# next one.) What is alive at the peak, by the module that made it:

# %%
for module, held in timeline.peak.by_module.items():
    print(f"{module:45} {human(held):>11}")

# %% [markdown]
# `timeline.save("step.pickle")` writes the step in PyTorch's own memory-snapshot format: drag the file onto
# https://pytorch.org/memory_viz to see every allocation, with the module that made it. On a GPU memlab saves
# the CUDA allocator's own record of the step.

# %%
path = timeline.save("step.pickle")
print("saved", path, f"({human(path.stat().st_size)})")

# %% [markdown]
# The bar figure sums each plan up at its peak, with the speed beside it:

# %%
memlab.Report([trial]).plot()

# %% [markdown]
# ## More rows, longer sequences
#
# `Plan(micro_batch=k)` feeds k rows per forward and backward (memlab repeats rows when k is more than the
# batch holds), so one `compare` call walks through batch sizes. For sequence length we cut the batch to
# shorter rows and measure each.

# %%
sizes = sorted({max(1, rows // 4), max(1, rows // 2), rows, 2 * rows})
by_rows = memlab.compare(model, batch, [memlab.Plan(micro_batch=k) for k in sizes], steps=steps, noise=noise)

lengths = sorted({max(2, seq_len // 4), max(2, seq_len // 2), seq_len})
by_length = [
    memlab.measure(
        model, {key: value[:, :n] for key, value in batch.items()}, memlab.Plan(), steps=steps, noise=noise
    )
    for n in lengths
]
by_rows

# %%
colors = {"params": "#4C78A8", "grads": "#F58518", "optimizer": "#54A24B", "activations": "#E45756"}
fig = make_subplots(rows=1, cols=2, shared_yaxes=True, subplot_titles=("more rows", "longer rows"))
for col, (xs, trials) in enumerate([(sizes, by_rows.trials), (lengths, by_length)], start=1):
    for name, color in colors.items():
        ys = [t.breakdown[name] / 2**20 for t in trials]
        fig.add_trace(
            go.Scatter(x=xs, y=ys, name=name, mode="lines+markers", line_color=color, showlegend=col == 1),
            row=1, col=col,
        )
fig.update_xaxes(title_text="rows per step", row=1, col=1)
fig.update_xaxes(title_text=f"tokens per row ({rows} rows)", row=1, col=2)
fig.update_yaxes(title_text="MiB at the peak", rangemode="tozero", row=1, col=1)
fig.update_layout(title="What grows with the batch")
fig


# %% [markdown]
# Params and optimizer state stay flat: the model's own memory does not care about the batch.
# Activations climb. (On a very small batch the peak can move to the optimizer step, where gradients
# exist and activations are gone; the lines then swap.) Activations per token tell whether the climb is
# a straight line: the same bytes per token means linear; bytes per token that grow with the length mean
# some tensor is length × length, as attention scores are when the attention implementation
# materializes them.

# %%
def per_token(t, tokens):
    return f"{t.breakdown['activations'] / tokens / 1024:7.1f} KiB of activations per token"


for k, t in zip(sizes, by_rows.trials):
    print(f"{k:4} rows x {seq_len:4} tokens:", per_token(t, k * seq_len))
for n, t in zip(lengths, by_length):
    print(f"{rows:4} rows x {n:4} tokens:", per_token(t, rows * n))
print("attention implementation:", model.config._attn_implementation)

# %% [markdown]
# ## Exercise
#
# Double `hidden` (the width) and measure again. Which categories grow about 4×, which about 2×, and why?
# Make a guess from the table at the top before you run it.
#
# One solution is folded below: click it to open, and copy it into a cell to run it. Run All leaves it
# alone, so its answers stay hidden until you look.

# %% [markdown]
# <details><summary>Solution (click to open)</summary>
#
# ```python
# wide_config = LlamaConfig(**{**config.to_dict(), "hidden_size": 2 * hidden, "intermediate_size": 8 * hidden})
# wide = AutoModelForCausalLM.from_config(wide_config).to(device)
# wide_trial = memlab.measure(wide, batch, memlab.Plan(), steps=1, noise=noise)
# for name in ("params", "optimizer", "activations"):
#     print(f"{name:12} x{wide_trial.breakdown[name] / max(trial.breakdown[name], 1):.1f}")
# # Weight matrices in the blocks are hidden x hidden, so they grow 4x; the embedding and output tables are
# # vocab x hidden and only double, which pulls the ratio down in a small model. Activations inside the
# # blocks are rows x tokens x hidden (about 2x), but the logits are rows x tokens x vocab and do not grow
# # with the width at all.
# del wide
# ```
#
# </details>
