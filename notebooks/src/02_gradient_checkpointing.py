# %% [markdown]
# # 02 · Gradient checkpointing
#
# Backward needs the intermediate results of forward. Normally each transformer block keeps all of its
# intermediate tensors until backward reaches it. With checkpointing, a block keeps only its input; its
# insides are thrown away after forward and computed again, block by block, when backward needs them.
#
# So activations shrink to one saved input per block plus the insides of the one block being redone.
# The price is a second forward pass through every block, roughly a third more arithmetic per step.
# Hugging Face models switch it on with `model.gradient_checkpointing_enable()`; memlab does that for
# you and switches it back off afterwards.

# %%
import copy
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
# ## Memory against time, at three batch sizes

# %%
sizes = sorted({max(1, rows // 2), rows, 2 * rows})
plans = [memlab.Plan(micro_batch=k, checkpointing=on) for k in sizes for on in (False, True)]
report = memlab.compare(model, batch, plans, steps=steps, noise=noise)
report

# %%
report.plot()

# %% [markdown]
# The largest batch, with and without checkpointing, as steps over time on one scale. Without it, forward
# climbs until every block's activations are held; with it, forward keeps only each block's input, and
# backward is a saw-tooth: each block's activations are recomputed, used and dropped before the next block's.

# %%
largest = max(t.plan.micro_batch for t in report)
memlab.Report([t for t in report if t.plan.micro_batch == largest]).plot(kind="timeline")

# %%
fig = make_subplots(rows=1, cols=2, subplot_titles=("activations at the peak", "time per step"))
for on, color in ((False, "#4C78A8"), (True, "#E45756")):
    trials = [t for t in report if t.plan.checkpointing == on]
    name = "checkpointing" if on else "plain"
    fig.add_trace(go.Scatter(x=sizes, y=[t.breakdown["activations"] / 2**20 for t in trials], name=name,
                             mode="lines+markers", line_color=color), row=1, col=1)
    fig.add_trace(go.Scatter(x=sizes, y=[t.step_time_s * 1000 for t in trials], name=name, showlegend=False,
                             mode="lines+markers", line_color=color), row=1, col=2)
fig.update_xaxes(title_text="rows per step")
fig.update_yaxes(title_text="MiB", rangemode="tozero", row=1, col=1)
fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=2)
fig

# %%
for k in sizes:
    off, on = (t for t in report if t.plan.micro_batch == k)
    print(f"{k:3} rows: checkpointing keeps {on.breakdown['activations'] / off.breakdown['activations']:4.0%} "
          f"of the activations and takes {on.step_time_s / off.step_time_s:4.0%} of the time")

# %% [markdown]
# On tiny models a step is dominated by overheads, so the time ratio is noisy; the memory ratio is the
# dependable part. The bigger the model and batch, the closer the extra time gets to one more forward.
#
# ## Seeing the recomputation
#
# A hook on the first block's MLP counts how often it starts during one training step. (A hook at the
# *end* of the MLP would miss the second run: PyTorch stops recomputing as soon as it has every tensor
# backward asked for.)

# %%
twin = copy.deepcopy(model)  # apply trains for real; keep the notebook's model as it is
calls = []
hook = twin.model.layers[0].mlp.register_forward_pre_hook(lambda module, args: calls.append(1))
for on in (False, True):
    calls.clear()
    with memlab.apply(twin, memlab.Plan(checkpointing=on)) as applied:
        applied.step(batch)
    print(f"checkpointing={on}: the first block's MLP ran {len(calls)} time(s) in one step")
hook.remove()
del twin

# %% [markdown]
# ## Exercise
#
# Checkpointing and accumulation both cut activations. For your batch, which gives the lower peak at the
# same rows per step, `Plan(micro_batch=rows // 2, accumulation=2)` or `Plan(checkpointing=True)`? Which
# is faster? What do you get with both?
#
# The next cell holds one solution, folded: click it to open.

# %% jupyter={"source_hidden": true}
# Solution
half = max(1, rows // 2)
options = [
    memlab.Plan(micro_batch=half, accumulation=rows // half),
    memlab.Plan(checkpointing=True),
    memlab.Plan(micro_batch=half, accumulation=rows // half, checkpointing=True),
]
both = memlab.compare(model, batch, options, steps=1, noise=noise)
for t in both:
    print(f"{t.label:12} peak {human(t.peak_bytes):>10}  {t.samples_per_s:8.1f} samples/s")
