# %% [markdown]
# # 09 · Optimizers and the loss: Adafactor, 8-bit, paged, fused, chunked cross-entropy
#
# Two parts of a training step's memory do not depend on the activations' tricks: the optimizer's state,
# which lives as long as training does, and the loss's logits, one number per token and per word of the
# vocabulary. Five levers act on them:
#
# | lever | what it keeps | bytes per trained parameter |
# |---|---|---|
# | `optimizer="adamw"` | two fp32 moments; built as the Trainer builds it, with torch's fused update | 8 |
# | `optimizer="adamw8bit"` | the two moments in 8 bits, in blocks with their own scale (bitsandbytes) | about 2 |
# | `optimizer="paged_adamw8bit"` | the same, in CUDA memory the driver pages out to the CPU | about 2 |
# | `optimizer="adafactor"` | per matrix, a row and a column of second moments, no first moment | near 0 |
# | `loss="chunked"` | head and cross-entropy by chunks of tokens: one chunk's logits at once | (activations) |
#
# Adafactor's updates are not Adam's, so it changes how the model trains (memlab's search tries it only
# when asked); the 8-bit moments cost a little accuracy; the chunked loss computes the very same loss and
# gradients, and pays by running the LM head twice.

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
big_vocab = 32768   # vocabulary of the chunked-loss experiment (Llama 3 has 128256 words)

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
# ## Four optimizers, measured

# %%
optimizers = ["adamw", "adamw8bit", "paged_adamw8bit", "adafactor"]
plans = [memlab.Plan(optimizer=name) for name in optimizers]
report = memlab.compare(model, batch, plans, steps=steps, noise=noise)
report

# %%
report.plot()

# %%
for trial in report:
    state = trial.breakdown["optimizer"]
    print(f"{trial.label:16} optimizer state {human(state):>12} = {state / n_params:5.2f} bytes per parameter")
    for note in trial.notes:
        print("   note:", note)

# %% [markdown]
# On a CPU the paged optimizer is the unpaged one (paging is a CUDA feature), and its trial's notes say so.
# On a GPU, bitsandbytes keeps the large states of a paged optimizer in unified memory, outside PyTorch's
# allocator: the driver moves them to CPU memory when the GPU runs short, instead of failing.
#
# ## Fused AdamW
#
# `optimizer="adamw"` is `torch.optim.AdamW(..., fused=True)`, what the Trainer builds by default
# (`optim="adamw_torch_fused"`). Fused means one kernel updates every weight: no temporary tensors the size
# of the weights, as the older "foreach" update makes while it runs.

# %%
with memlab.apply(copy.deepcopy(model), memlab.Plan()) as applied:
    print(type(applied.optimizer).__name__, "fused:", applied.optimizer.defaults["fused"])
print(memlab.Plan(optimizer="adafactor").to_training_arguments()["optim"])

# %% [markdown]
# ## Chunked cross-entropy
#
# The loss needs logits: `tokens x vocabulary` numbers, upcast to fp32, kept for backward together with their
# log-softmax. With a large vocabulary they are most of the activations. `loss="chunked"` runs the model up to
# its last hidden states, then the head and the cross-entropy on a few tokens at a time, each chunk under
# `torch.utils.checkpoint`, so that backward recomputes one chunk's logits instead of keeping them all.
# The model below has the same body and a `big_vocab`-word vocabulary.

# %%
big_config = copy.deepcopy(config)
big_config.vocab_size = big_vocab
big = AutoModelForCausalLM.from_config(big_config).to(device)
big_ids = torch.randint(0, big_vocab, (rows, seq_len), device=device)
big_batch = {"input_ids": big_ids, "labels": big_ids}

losses = memlab.compare(big, big_batch, [memlab.Plan(), memlab.Plan(loss="chunked")], steps=steps, noise=noise)
full, chunked = losses
print(f"activations: full loss {human(full.breakdown['activations'])}, "
      f"chunked {human(chunked.breakdown['activations'])} "
      f"({chunked.breakdown['activations'] / full.breakdown['activations']:.0%})")
losses.plot()

# %%
# The same loss: one step of each, from the same weights.
for plan in (memlab.Plan(), memlab.Plan(loss="chunked")):
    with memlab.apply(copy.deepcopy(big), plan) as applied:
        print(f"{plan.label():13} loss {applied.step(big_batch):.6f}")

# %% [markdown]
# The chunked loss needs a causal LM with an LM head and the default loss (`model(**batch).loss`, with
# labels in the batch); elsewhere memlab refuses it with a message that says what to write. With the Trainer,
# `plan.to_training_arguments()` turns it into Liger Kernel's fused linear cross-entropy (`pip install
# liger-kernel`, on a GPU); `plan.to_code()` writes the chunked loss out in plain PyTorch.

# %% [markdown]
# ## Exercise
#
# Adafactor keeps, for a weight matrix of `d_out x d_in`, `d_out + d_in` fp32 numbers (and for a vector, the
# vector's size), plus one 4-byte RMS per tensor. Count that for `model` and compare it with the optimizer
# bytes measured above. How much smaller than AdamW's is it, and why does the ratio shrink as `hidden` grows?
#
# The next cell holds one solution, folded: click it to open.

# %% jupyter={"source_hidden": true}
# Solution
counted = 0
for p in model.parameters():
    counted += 4 * (p.shape[0] + p.shape[1]) if p.dim() == 2 else 4 * p.numel()
    counted += 4
adamw, adafactor = report[0], report[3]
print(f"counted {human(counted)}, measured {human(adafactor.breakdown['optimizer'])}")
print(f"Adafactor keeps {adafactor.breakdown['optimizer'] / adamw.breakdown['optimizer']:.1%} of AdamW's state")
# A d x d matrix keeps 2d numbers instead of AdamW's 2 d^2: the ratio falls as 1 / d.
