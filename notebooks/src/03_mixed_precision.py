# %% [markdown]
# # 03 · Mixed precision: fp16 and bf16
#
# Under `torch.autocast`, matrix multiplications and most layers run in a 16-bit type, while the weights
# themselves stay fp32 ("master weights"), so that small updates are not rounded away. There are two
# 16-bit types:
#
# - **fp16** has 5 exponent bits: numbers below about 6e-8 become zero. Gradients are often that small,
#   so the loss is multiplied by a large factor before backward and the gradients divided by it before
#   the optimizer step. A `GradScaler` picks the factor as it goes: it halves it (and skips the step)
#   when a gradient overflows, and raises it again after a run of clean steps.
# - **bf16** keeps fp32's 8 exponent bits and drops mantissa bits instead: the same range as fp32, less
#   precision, no scaling needed.
#
# Memory: tensors saved for backward are 16-bit, so activations shrink. Weights, gradients and optimizer
# state stay fp32, so those bars do not. Speed is a matter of hardware, as the measurement shows.

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
# ## Small numbers in each type

# %%
small = torch.tensor([1e-3, 1e-5, 1e-7, 1e-9])
print("fp32:              ", small.tolist())
print("fp16:              ", small.half().float().tolist())
print("bf16:              ", small.bfloat16().float().tolist())
scale = 2.0**16
print("fp16, scaled first:", ((small * scale).half().float() / scale).tolist())

# %% [markdown]
# fp16 loses the smallest values entirely (and rounds the next ones coarsely); scaled by 2^16 first, they
# survive. bf16 keeps them all, with two to three significant digits.
#
# ## fp32, bf16 and fp16 on this device

# %%
plans = [memlab.Plan(precision=p) for p in ("fp32", "bf16", "fp16")]
report = memlab.compare(model, batch, plans, steps=steps, noise=noise)
report

# %%
report.plot()

# %%
fp32 = report[0]
for t in report:
    if t.status != "ok":
        print(f"{t.plan.precision:5} {t.status}: {t.error}")
        continue
    print(f"{t.plan.precision:5} activations {human(t.breakdown['activations']):>10}, "
          f"speed {t.samples_per_s / fp32.samples_per_s:6.0%} of fp32", *t.notes)
if device == "cpu":
    print("CPU instruction set PyTorch uses:", torch.backends.cpu.get_cpu_capability())

# %% [markdown]
# **Why fp16 is slow on a CPU.** GPUs have matrix units built for fp16 and bf16. Most CPUs have no fast
# fp16 arithmetic: the work goes through conversions to and from fp32 or through slow fallback kernels,
# which only adds time, and the note memlab attaches to the trial says so. bf16 is different on recent
# x86 server CPUs (AVX512-BF16, AMX), which have bf16 dot-product instructions; on older ones it is slow
# too. The speeds above are this machine's answer. On a GPU with tensor cores, both 16-bit types are
# usually much faster than fp32.
#
# The master weights really do stay fp32:

# %%
half = "bf16" if report[1].status == "ok" else "fp16"  # older GPUs have no bf16
with memlab.apply(model, memlab.Plan(precision=half)) as applied:
    applied.step(batch)  # one real training step
    print(f"weight dtypes during {half} training:", {str(p.dtype) for p in model.parameters()})

# %% [markdown]
# ## Exercise
#
# Which categories did bf16 shrink compared with fp32, and which stayed the same? Explain each with the
# list at the top. Then: what would change if the weights themselves were stored in bf16 (pure bf16
# training, no fp32 master copy)?
#
# The next cell holds one solution, folded: click it to open.

# %% jupyter={"source_hidden": true}
# Solution
bf16 = report[1]
if bf16.status == "ok":
    for name in ("params", "grads", "optimizer", "activations"):
        if fp32.breakdown[name]:
            print(f"{name:12} bf16 / fp32 = {bf16.breakdown[name] / fp32.breakdown[name]:.2f}")
        else:
            print(f"{name:12} none at the fp32 peak")
# Only activations shrink: they are what autocast computes in 16 bits. Weights, gradients and AdamW's
# state stay fp32. Pure bf16 weights would halve params and grads (and the optimizer state if it is bf16
# too), at the risk of updates smaller than bf16's precision being lost.
