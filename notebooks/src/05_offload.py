# %% [markdown]
# # 05 · Offload to CPU memory
#
# Offload trades GPU memory for traffic over the link between CPU and GPU (PCIe, or NVLink-C2C on some
# machines):
#
# - `offload="optimizer"`: AdamW's state and an fp32 copy of the weights live in (pinned) CPU memory and
#   the update runs on the CPU. Each step the gradients travel to the CPU and the new weights travel back.
# - `offload="activations"`: tensors that forward saves for backward are copied to pinned CPU memory as
#   they are made and copied back when backward needs them (`torch.autograd.graph.save_on_cpu`).
# - `offload="all"`: both.
#
# Without a GPU everything already lives in CPU memory, so there is nothing to move. memlab then runs
# the plan unchanged and attaches a note that says so, rather than reporting a saving that does not exist.

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
link_gb_per_s = 16   # CPU-GPU link in GB/s (PCIe 4.0 x16 is rated ~32 each way; real copies get less)

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
# ## The four settings on this device

# %%
plans = [memlab.Plan(offload=where) for where in ("none", "optimizer", "activations", "all")]
report = memlab.compare(model, batch, plans, steps=steps, noise=noise)
report

# %%
report.plot()

# %%
for t in report:
    print(f"{t.label:22} peak {human(t.peak_bytes):>10}  {t.samples_per_s:8.1f} samples/s  ", *t.notes)

# %% [markdown]
# On a GPU the `optimizer` bar shrinks with optimizer offload, and the `activations` bar with activation
# offload, while the steps get slower by the time the copies take (unless they hide behind compute).
#
# ## When it pays
#
# Per step, optimizer offload moves the fp32 gradients down and the fp32 weights back up; activation
# offload moves the saved activations down and back. From the plain plan's numbers and the link speed in
# the parameters cell:

# %%
plain = report[0]
trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
moves = {
    "optimizer": (plain.breakdown["optimizer"], 2 * 4 * trainable),
    "activations": (plain.breakdown["activations"], 2 * plain.breakdown["activations"]),
}
for what, (frees, traffic) in moves.items():
    seconds = traffic / (link_gb_per_s * 1e9)
    print(f"offload={what!r:14} frees up to {human(frees):>10}, moves {human(traffic):>10} per step "
          f"= {seconds * 1000:6.2f} ms at {link_gb_per_s} GB/s")
print(f"one plain step here takes {plain.step_time_s * 1000:.1f} ms")

# %% [markdown]
# The traffic for optimizer offload grows with the parameters, not with the batch; a larger batch makes
# each step longer, so the same copy time weighs less. Offload pays when:
#
# 1. without it the plan does not fit, and the other remedies (accumulation, checkpointing, bf16, 8-bit
#    Adam) are already on or cost more time than the copies;
# 2. the copy time is small next to a step, or overlaps with it;
# 3. the CPU is fast enough for the update (for optimizer offload it does AdamW over every parameter).
#
# It rarely pays for a model that fits once the cheaper techniques are on.

# %% [markdown]
# ## Exercise
#
# Offload and 8-bit Adam both go after the optimizer state. With the numbers above, how much does each
# free, and which costs less time? Measure `Plan(offload="optimizer")` against `Plan(optimizer="adamw8bit")`
# (on a CPU, offload will report no change; on a GPU you get the real trade).
#
# The next cell holds one solution, folded: click it to open.

# %% jupyter={"source_hidden": true}
# Solution
pair = [memlab.Plan(offload="optimizer"), memlab.Plan(optimizer="adamw8bit")]
pair = memlab.compare(model, batch, pair, steps=1, noise=noise)
for t in pair:
    print(f"{t.label:20} optimizer {human(t.breakdown['optimizer']):>10}  peak {human(t.peak_bytes):>10}  "
          f"{t.samples_per_s:8.1f} samples/s", *t.notes)
