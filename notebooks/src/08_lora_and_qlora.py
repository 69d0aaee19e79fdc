# %% [markdown]
# # 08 · LoRA, QLoRA and pure bf16
#
# A full fine-tune trains every weight, so every weight needs a gradient and AdamW's two moments: 16 bytes per
# parameter in fp32, about 112 GB for a 7B model before a single activation. Three levers change what is
# trained and how it is stored:
#
# | lever | what changes | bytes per base parameter |
# |---|---|---|
# | `weights="bf16"` | weights, gradients and optimizer state in bf16, no fp32 copy | 8 |
# | `adapter="lora"` | the base is frozen; small adapters (peft) train beside each linear layer | 4 (frozen) |
# | `adapter="qlora"` | as LoRA, with the frozen linear weights in 4-bit NF4 (bitsandbytes) | about 0.5 |
#
# LoRA adds, next to a linear layer `W` (d_out x d_in), two thin matrices `B` (d_out x r) and `A` (r x d_in)
# and trains only those: r x (d_in + d_out) numbers instead of d_in x d_out. memlab puts the adapters on
# the live model for a trial and takes them off again: your model comes back exactly as it was.

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
rank = 8           # LoRA rank
curve_steps = 20   # optimizer steps in the loss-curve run
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
# ## Four ways to train the same model, measured

# %%
plans = [
    memlab.Plan(),
    memlab.Plan(weights="bf16"),
    memlab.Plan(adapter="lora", lora_rank=rank),
    memlab.Plan(adapter="qlora", lora_rank=rank),
]
report = memlab.compare(model, batch, plans, steps=steps, noise=noise)
report

# %%
report.plot()

# %%
full, bf16, lora, qlora = report
for trial in report:
    trained = trial.breakdown["grads"] + trial.breakdown["optimizer"]
    print(f"{trial.label:14} weights {human(trial.breakdown['params']):>12}   "
          f"optimizer state {human(trial.breakdown['optimizer']):>12}")
trainable = sum(
    rank * (m.in_features + m.out_features)
    for name, m in model.named_modules()
    if isinstance(m, torch.nn.Linear) and m is not model.get_output_embeddings()
)
print(f"LoRA trains {trainable:,} numbers, {trainable / n_params:.1%} of the model's {n_params:,}")


# %% [markdown]
# On a model this small the embedding and the output head (which get no adapter and are not quantized)
# are a large share of the weights; on a 7B model the linear layers hold almost all of them, and QLoRA's
# weights come close to an eighth of fp32.
#
# ## Does a LoRA model learn?
#
# `memlab.apply` puts the plan on a copy of the model for real training. Only the adapters are in the
# optimizer; the loss on a repeated batch still falls. `undo` asks what to do with trained adapters:
# `adapter="merge"` adds them into the base weights, `"keep"` leaves them on the model, `"discard"` drops
# them (a plain `undo()` merges them, and says so: nothing trained is lost silently).

# %%
def train(plan):
    twin = copy.deepcopy(model)
    with memlab.apply(twin, plan, lr=lr) as applied:
        names = {id(p): n for n, p in twin.named_parameters()}
        trained = [names[id(p)] for g in applied.optimizer.param_groups for p in g["params"]]
        losses = [applied.step(batch) for _ in range(curve_steps)]
        applied.undo(adapter="discard")  # the twin is thrown away, its trained adapters with it
    return trained, losses


curves = {}
for plan in (memlab.Plan(), memlab.Plan(adapter="lora", lora_rank=rank)):
    trained, curves[plan.label()] = train(plan)
    print(f"{plan.label():8} trains {len(trained)} tensors, e.g. {trained[0]}")
fig = go.Figure([go.Scatter(y=losses, name=name, mode="lines+markers") for name, losses in curves.items()])
fig.update_layout(title="Full fine-tune against LoRA", xaxis_title="optimizer step", yaxis_title="loss")
fig

# %% [markdown]
# To train this way outside memlab, `plan.to_code()` writes the lines (peft's `get_peft_model`, and for
# QLoRA the `BitsAndBytesConfig` to load the model with), and `plan.to_peft_config()` gives the
# `LoraConfig` itself.

# %%
print(memlab.Plan(adapter="qlora", lora_rank=rank, precision="bf16").to_code()[:900])

# %% [markdown]
# ## Exercise
#
# How does the optimizer state grow with the rank? Measure LoRA at ranks 2, 8 and 32 and compare the
# optimizer bytes with the count `2 x 4 bytes x rank x (d_in + d_out)` summed over the linear layers.
#
# The next cell holds one solution, folded: click it to open.

# %% jupyter={"source_hidden": true}
# Solution
ranks = [2, 8, 32]
plans = [memlab.Plan(adapter="lora", lora_rank=r) for r in ranks]
sweep = memlab.compare(model, batch, plans, steps=1, noise=noise)
linears = [
    m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not model.get_output_embeddings()
]
for r, trial in zip(ranks, sweep):
    counted = sum(8 * r * (m.in_features + m.out_features) for m in linears)
    print(f"rank {r:3}: optimizer {human(trial.breakdown['optimizer']):>12}, counted {human(counted):>12}")
# The optimizer bytes grow in proportion to the rank (plus AdamW's step counters, a few bytes per tensor).
