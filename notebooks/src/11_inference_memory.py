# %% [markdown]
# # 11 · Inference memory
#
# The model is trained; now it has to answer. Inference keeps no gradients and no optimizer state, so
# what is left is the weights, the activations of one forward, and, when generating, the **KV cache**: the
# keys and values of every past token, kept so that each new token runs through the model alone.
#
# | lever (`memlab.InferencePlan`) | what changes | cost |
# |---|---|---|
# | `weights="bf16"` / `"fp16"` | weights held in 16 bits | half of fp32's bytes |
# | `quantize="int8"` / `"nf4"` | linear weights in 8 or 4 bits (bitsandbytes) | a quarter / an eighth of fp32 |
# | `batch_size=N` | sequences per forward | activations and cache grow with N |
# | `new_tokens=N` | generate N tokens (0: one forward) | the cache grows by one token per step |
# | `kv_cache=False` | recompute the past at every step | less memory, much slower decoding |
#
# The KV cache of `tokens` tokens for `rows` sequences is exactly
# `2 x layers x kv-heads x head-dim x tokens x rows x bytes per element`. memlab measures all of it on
# the live model under `torch.inference_mode()`, with the same probes, report and bit-exact restore as
# for training.

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
new_tokens = 16  # tokens to generate

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
    num_key_value_heads=2,  # grouped-query attention: the cache keeps 2 heads of keys and values, not 4
    vocab_size=vocab,
    max_position_embeddings=4 * seq_len,
)
model = AutoModelForCausalLM.from_config(config).to(device).eval()

# Random prompts: memory and speed do not depend on what the text says.
prompts = {"input_ids": torch.randint(0, vocab, (rows, seq_len), device=device)}
n_params = sum(p.numel() for p in model.parameters())
print(f"{n_params:,} parameters; {rows} prompts of {seq_len} tokens")

# %% [markdown]
# ## Weights: fp32, 16 bits, 8 bits, 4 bits

# %%
plans = [
    memlab.InferencePlan(),
    memlab.InferencePlan(weights="bf16"),
    memlab.InferencePlan(quantize="int8"),
    memlab.InferencePlan(weights="bf16", quantize="nf4"),
]
report = memlab.compare(model, prompts, plans, steps=steps, noise=noise)
report

# %%
report.plot()

# %%
fp32, bf16, int8, nf4 = (trial.breakdown["params"] for trial in report)
print(f"bf16 weights: {human(bf16)}, {bf16 / fp32:.0%} of fp32's {human(fp32)}")
print(f"int8 weights: {human(int8)}, {int8 / fp32:.0%} of fp32's")
print(f"NF4 weights:  {human(nf4)}, {nf4 / bf16:.0%} of bf16's")

# %% [markdown]
# The embedding and the output head are not quantized; on a model this small they are a large share of
# the weights, and on a 7B model the linear layers hold almost all of them.
#
# ## Generation and the KV cache
#
# With `new_tokens=N` memlab generates greedily, as `model.generate` does: one prefill forward over the
# prompt, then N - 1 decode steps of one token each. The table shows the prefill's and the decode steps'
# tokens/s apart.

# %%
generation = memlab.compare(
    model,
    prompts,
    [
        memlab.InferencePlan(weights="bf16", new_tokens=new_tokens),
        memlab.InferencePlan(weights="bf16", new_tokens=new_tokens, kv_cache=False),
    ],
    steps=steps,
    noise=noise,
)
generation

# %%
cached = generation[0]
head_dim = config.hidden_size // config.num_attention_heads
layers_, kv_heads = config.num_hidden_layers, config.num_key_value_heads
formula = 2 * layers_ * kv_heads * head_dim * cached.context_tokens * rows * 2  # 2 bytes per bf16 number
print(f"KV cache after {new_tokens} new tokens: {human(cached.kv_cache_end_bytes)} measured, "
      f"{human(formula)} by the formula ({cached.context_tokens} tokens per row, bf16)")
print("the same from memlab:", human(memlab.kv_cache_bytes(config, tokens=cached.context_tokens, batch=rows)))

# %% [markdown]
# ## How many prompts at once?
#
# `memlab.fit_inference` finds the largest batch whose measured peak fits a budget: it measures 1 and 2
# rows, predicts the largest from the line through them, measures that, and one row more.

# %%
budget = 2 * generation[0].peak_bytes  # twice what this batch takes: how many more rows fit?
# The search is about memory: one timed step per size, without the noise rule (noise=0).
largest = memlab.fit_inference(
    model, prompts, memlab.InferencePlan(weights="bf16", new_tokens=new_tokens), budget=budget, steps=1, noise=0
)
print(f"largest batch within {human(budget)}: {largest.best.rows_per_step} rows")
largest

# %% [markdown]
# ## Before you load it: estimate
#
# `memlab.estimate` runs the same steps on fake tensors: a 7B model's KV cache for a 4096-token context
# is predicted in seconds, without the weights. The magic does all of the above from one line, too.

# %%
from memlab.estimation.estimate import load_config

seven_b = load_config("llama-7b")
for context in (512, 4096):
    print(f"Llama 2 7B, bf16 KV cache for {context} tokens: "
          f"{human(memlab.kv_cache_bytes(seven_b, tokens=context, batch=1, dtype='bf16'))}")
guess = memlab.estimate(model, {"input_ids": (rows, 4 * seq_len)}, memlab.InferencePlan(weights="bf16"))
print(f"this model, {4 * seq_len} tokens per prompt: peak {human(guess.peak_bytes)}, "
      f"of which KV cache {human(guess.breakdown['kv_cache'])}")

# %%
# %load_ext memlab
# %memfit model prompts --inference --try weights=bf16 quantize=none,nf4 new_tokens=8 --steps 1 --noise $noise

# %% [markdown]
# ## Exercise
#
# How does the KV cache grow with the number of generated tokens, and what does it cost per token? Measure
# `new_tokens` of 4, 8 and 16 (bf16 weights) and compare `kv_cache_end_bytes` with the formula.
#
# The next cell holds one solution, folded: click it to open.

# %% jupyter={"source_hidden": true}
# Solution
lengths = [4, 8, 16]
sweep = memlab.compare(
    model, prompts, [memlab.InferencePlan(weights="bf16", new_tokens=n) for n in lengths], steps=1, noise=noise
)
per_token = memlab.kv_cache_bytes(config, tokens=1, batch=rows, dtype="bf16")
for n, trial in zip(lengths, sweep):
    print(f"{n:3} new tokens: cache {human(trial.kv_cache_end_bytes):>10}, "
          f"formula {human(per_token * trial.context_tokens):>10}")
# Each generated token adds 2 x layers x kv-heads x head-dim x rows x 2 bytes: a line in the tokens.
