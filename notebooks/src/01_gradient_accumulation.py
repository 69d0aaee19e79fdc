# %% [markdown]
# # 01 · Gradient accumulation
#
# When a batch of B rows does not fit, split it. Run forward and backward on B/k rows at a time, k times;
# backward adds each micro-batch's gradients to `.grad`; step the optimizer once at the end. If every
# micro-batch's loss is divided by k, the sum is the mean over all B rows: the same gradient, so the same
# training, as the big batch.
#
# Activations now follow the micro-batch, not the batch. What it costs: k small passes instead of one big
# one, and small passes keep the hardware less busy. This notebook checks both claims with numbers.

# %%
import copy
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
# ## The same gradient, numerically
#
# `memlab.apply(model, plan)` puts a plan on a model for real training and returns an object with an
# `optimizer` and `step(batch)`. A hook that runs just before the optimizer's step sees the gradients it
# is about to use. We take them for the whole batch at once, then for the same batch in micro-batches.
# Each run uses a fresh copy of the model, so both start from the same weights.

# %%
def gradients_at_step(plan, data=batch):
    """The gradients the optimizer receives at its first step, on a copy of the model."""
    twin = copy.deepcopy(model)
    applied = memlab.apply(twin, plan)
    seen = []

    def grab(optimizer, args, kwargs):
        seen.extend(p.grad.detach().clone() for group in optimizer.param_groups for p in group["params"])

    applied.optimizer.register_step_pre_hook(grab)
    applied.step(data)
    applied.undo()
    return seen


def relative_difference(got, want):
    top = sum(((g - w).double() ** 2).sum() for g, w in zip(got, want)) ** 0.5
    bottom = sum((w.double() ** 2).sum() for w in want) ** 0.5
    return float(top / bottom)


full = gradients_at_step(memlab.Plan())
factors = [k for k in (2, 4, 8) if rows % k == 0]
for k in factors:
    accumulated = gradients_at_step(memlab.Plan(micro_batch=rows // k, accumulation=k))
    difference = relative_difference(accumulated, full)
    print(f"{k} micro-batches of {rows // k} rows: relative difference {difference:.1e}")

# %% [markdown]
# Differences near 1e-7 are float32 rounding: the sums happen in another order. Without the division by
# k the gradient would be k times too big. Here is that mistake, made by hand:

# %%
k = factors[-1]
twin = copy.deepcopy(model)
for start in range(0, rows, rows // k):
    part = {key: value[start : start + rows // k] for key, value in batch.items()}
    twin(**part).loss.backward()  # no division by k
undivided = [p.grad for p in twin.parameters()]
norm = lambda grads: float(sum((g.double() ** 2).sum() for g in grads) ** 0.5)  # noqa: E731
print(f"{k} micro-batches, loss not divided: gradient {norm(undivided) / norm(full):.2f} times the right size")
del twin, undivided

# %% [markdown]
# ## What it costs
#
# Every plan below trains on the same rows per optimizer step; only the split differs.

# %%
plans = [memlab.Plan()] + [memlab.Plan(micro_batch=rows // k, accumulation=k) for k in factors]
report = memlab.compare(model, batch, plans, steps=steps, noise=noise)
report

# %%
report.plot()

# %% [markdown]
# The plain step and the most accumulated one as steps over time, on one scale: each micro-batch climbs and
# falls again, so the step's highest point is one micro-batch's activations (plus the gradients the earlier
# micro-batches left), however many micro-batches the effective batch has.

# %%
memlab.Report([report[0], report[-1]]).plot(kind="timeline")

# %%
plain = report[0]
for t in report:
    print(
        f"{t.label:8} peak {t.peak_bytes / plain.peak_bytes:5.0%} of plain,",
        f"activations {human(t.breakdown['activations']):>10},",
        f"speed {t.samples_per_s / plain.samples_per_s:5.0%} of plain",
    )

# %% [markdown]
# The activations shrink with the micro-batch; params, optimizer state and now the gradients (they are
# kept between micro-batches) do not, so the peak flattens out at the model's own memory. Speed usually
# drops as the micro-batch gets small, a lot on a GPU, whose kernels need many rows to be busy, and less
# on a CPU. The right split is the largest micro-batch that fits.

# %% [markdown]
# ## Exercise
#
# The Hugging Face loss is a mean over the tokens whose label is not `-100`. Here every row has the same
# number of such tokens. Mask the second half of the labels in the first half of the rows (padding does
# this in real data) and compare the accumulated gradient with the full one again. Why does it no longer
# match?
#
# The next cell holds one solution, folded: click it to open.

# %% jupyter={"source_hidden": true}
# Solution
padded = {"input_ids": batch["input_ids"], "labels": batch["labels"].clone()}
padded["labels"][: rows // 2, seq_len // 2 :] = -100
full_padded = gradients_at_step(memlab.Plan(), padded)
halves = gradients_at_step(memlab.Plan(micro_batch=rows // 2, accumulation=2), padded)
print(f"relative difference with uneven token counts: {relative_difference(halves, full_padded):.1e}")
# Each micro-batch's loss is a mean over its own tokens; dividing by k then gives a token in the short
# micro-batch more weight than a token in the long one. The fix is to weight each micro-batch by its
# share of the tokens (sum of losses over the total token count) instead of dividing by k.
