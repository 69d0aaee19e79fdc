# %% [markdown]
# # NN · Title
#
# What this notebook finds out, in a few sentences.
#
# (This template is not a notebook. Copy it to `src/NN_name.py` to start one. Its setup, parameters and device
# cells are shared by every notebook: `python notebooks/sync.py --check` names the notebooks whose copies differ.
# The model cell and the exercise are a starting point.)

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
# ## The experiment
#
# The measurement through memlab's API, then a plot.

# %%
summary = memlab.measure(model, batch, steps=steps, noise=noise)
summary.plot()

# %% [markdown]
# ## Exercise
#
# A question to try.
#
# The next cell holds one solution, folded: click it to open.

# %% jupyter={"source_hidden": true}
# Solution
print('one answer')
