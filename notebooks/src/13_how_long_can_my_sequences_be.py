# %% [markdown]
# # 13 · How long can my sequences be?
#
# Long documents, long conversations, whole source files: often the question is not how many rows a batch can
# hold but how many tokens one row can. Memory grows with the sequence length in two ways. Every layer keeps
# tensors for backward that are tokens x width: that part grows **linearly**. Attention compares every token with
# every other; a kernel that keeps the tokens x tokens matrix of probabilities for backward adds a part that grows
# **quadratically**.
#
# This notebook measures both on a tiny Llama, with the two attention kernels transformers offers everywhere
# (`eager` and `sdpa`), then cuts the linear part with selective checkpointing (`checkpointing=k`), and finally
# asks `memlab.limits` for the longest sequence that fits a budget: measured on the tiny model, and estimated on
# fake tensors for Llama 3.1 8B on a 24 GiB card.

# %%
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
budget = "512MiB"  # the tiny model's budget for memlab.limits
# The 8B estimate at the end: Llama 3.1 8B's shape on a 24 GiB card (an RTX 4090). One dry run of this shape takes
# 10 to 60 s on a small CPU and memlab.limits makes up to 8 for each kernel, so the tests keep 2 of its 32 layers.
big_hidden = 4096
big_layers = 32
big_heads = 32
big_kv_heads = 8
big_intermediate = 14336
big_vocab = 128256
big_context = 131072   # max_position_embeddings: Llama 3.1's 128K tokens
big_seq_len = 1024     # where memlab.limits starts
card_budget = "24GiB"
card = "RTX4090-24GB"

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
# With internet, a real checkpoint works the same way; replace the two from_config lines with:
#   model = AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M", attn_implementation="sdpa").to(device)
#   eager = AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M", attn_implementation="eager").to(device)
#   vocab = model.config.vocab_size
heads = 4


def tiny_config():
    return LlamaConfig(
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        vocab_size=vocab,
        max_position_embeddings=64 * seq_len,
        use_cache=False,
    )


# Attention kernel: chosen when the model is built or loaded (attn_implementation=). Each model gets a config of
# its own: from_config keeps the config object, and a second model built from it with another
# attn_implementation would switch the first model's attention too.
model = AutoModelForCausalLM.from_config(tiny_config(), attn_implementation="sdpa").to(device)
eager = AutoModelForCausalLM.from_config(tiny_config(), attn_implementation="eager").to(device)
eager.load_state_dict(model.state_dict())  # the same weights: only the kernel differs


def batch_of(length):
    """Random tokens, `rows` x `length`: memory and speed do not depend on what the text says."""
    ids = torch.randint(0, vocab, (rows, length), device=device)
    return {"input_ids": ids, "labels": ids}


batch = batch_of(seq_len)
n_params = sum(p.numel() for p in model.parameters())
print(f"{n_params:,} parameters; batches of {rows} rows; attention: {model.config._attn_implementation} "
      f"and {eager.config._attn_implementation}")

# %% [markdown]
# ## Why memory grows with the length
#
# For backward, each block of a training step keeps what its forward computed: its input, the normed input, the
# queries, keys and values, the attention's output, the MLP's inputs and its wider middle. Each is rows x tokens x
# a width, so twice the tokens hold twice the bytes. The logits at the end, rows x tokens x vocabulary, grow the
# same way.
#
# Attention is where the two kernels differ. `eager` is attention written in plain PyTorch operators: it computes
# the scores of every query against every key, rows x heads x tokens x tokens, softmaxes them and keeps the
# probabilities for backward, in every layer. `sdpa` calls PyTorch's `scaled_dot_product_attention`, which runs a
# fused kernel where one applies (a flash-attention kernel on the CPU; flash or memory-efficient attention on
# most GPUs): it works through the matrix in blocks and keeps one number per query and head for backward, so
# nothing of size tokens x tokens stays. The extra memory of eager is then about
#
#     rows x heads x tokens² x 4 bytes (in fp32) x layers
#
# Below, the same weights run with both kernels at five lengths, from `seq_len` to 16 times `seq_len`.

# %%
lengths = [k * seq_len for k in (1, 2, 4, 8, 16)]
measured = {"sdpa": [], "eager": []}
for length in lengths:
    for name, which in (("sdpa", model), ("eager", eager)):
        # one step each: the memory is what matters here, and a step of 16 x seq_len tokens takes seconds
        measured[name].append(memlab.measure(which, batch_of(length), memlab.Plan(), steps=1, noise=0))

print(f"{'tokens':>6} {'sdpa':>12} {'eager':>12} {'difference':>12} {'the formula':>12}   (activations at the peak)")
for length, fused, plain in zip(lengths, measured["sdpa"], measured["eager"]):
    formula = rows * heads * length**2 * 4 * layers
    sdpa_bytes, eager_bytes = fused.breakdown["activations"], plain.breakdown["activations"]
    difference = eager_bytes - sdpa_bytes
    print(f"{length:6} {human(sdpa_bytes):>12} {human(eager_bytes):>12} {human(difference):>12} "
          f"{human(formula):>12}   {difference / formula:4.2f} x the formula")

# %%
figure = go.Figure()
for name, color in (("sdpa", "#4C78A8"), ("eager", "#E45756")):
    figure.add_scatter(x=lengths, y=[t.breakdown["activations"] / 2**20 for t in measured[name]], name=name,
                       mode="lines+markers", line_color=color)
figure.update_layout(title="activations at the peak against the sequence length", xaxis_title="tokens per row",
                     yaxis_title="MiB", yaxis_rangemode="tozero", height=380)
figure

# %% [markdown]
# Twice the tokens, twice sdpa's activations: a straight line. Eager's bends upwards: twice the tokens, about four
# times the difference, close to the formula (one fp32 matrix of probabilities per layer). Where
# the step's peak falls inside an attention layer's backward, which makes the gradient of that matrix too, the
# difference is larger. What is alive at eager's peak, by the module that made it, shows where the peak falls and
# what the attention layers hold there:

# %%
longest = measured["eager"][-1]
print(f"eager, {lengths[-1]} tokens: {longest.timeline.peak.description}")
for module, nbytes in list(longest.timeline.peak.by_module.items())[:6]:
    print(f"  {module:32} {human(nbytes):>12}")
for name in ("sdpa", "eager"):
    trial = measured[name][-1]
    print(f"{name:5} at {lengths[-1]} tokens: peak {human(trial.peak_bytes)}, one step took "
          f"{trial.step_time_s * 1000:,.0f} ms")

# %% [markdown]
# Nothing else changes: the same weights, the same loss. So on a model that allows it, `sdpa` (transformers'
# default where PyTorch has it) or a flash-attention kernel is the first lever for long sequences. `eager` is still
# what some models need (to return the attention probabilities, or where a model's attention has no fused kernel),
# and it is the one to check for when a long sequence runs out of memory.
#
# ## Selective checkpointing: fewer blocks kept
#
# Checkpointing a block (notebook 02) keeps only its input and computes its insides again in backward: the linear
# part shrinks, at the price of a second forward through that block. `Plan(checkpointing=True)` does it for every
# block; `Plan(checkpointing=k)` for `k` of them, spread evenly, so the memory falls step by step as `k` grows and
# each block left out runs forward once instead of twice. (`memlab.fit` picks the fewest blocks that fit a budget.)
# With sdpa, at 4 times `seq_len` (every plan's steps are timed, and the longest length is slow on a CPU):

# %%
long_batch = batch_of(4 * seq_len)
plans = [memlab.Plan()] + [memlab.Plan(checkpointing=k) for k in range(1, layers)] + [memlab.Plan(checkpointing=True)]
checkpointed = memlab.compare(model, long_batch, plans, steps=steps, noise=noise)
checkpointed

# %%
checkpointed.plot()

# %%
plain = checkpointed[0]
for t in checkpointed:
    print(f"{t.label:6} activations {human(t.breakdown['activations']):>12} "
          f"({t.breakdown['activations'] / plain.breakdown['activations']:4.0%} of plain), "
          f"{t.step_time_s / plain.step_time_s:4.0%} of plain's time")

# %% [markdown]
# Each block checkpointed takes its insides off the peak, so the plans between none and all fill the gap in
# steps. On a tiny model the times are noisy; the memory is the dependable part. Between no checkpointing and
# every block, `checkpointing=k` is how to spend exactly the memory there is on speed.
#
# ## `memlab.limits`: the longest sequence that fits
#
# `memlab.limits(model, plan, budget=..., batch=..., vary="tokens")` answers the question directly. Memory in
# tokens is a constant plus a linear part plus, with eager, a quadratic part, so a few sizes are enough: it tries
# the batch's length, its double and quadruple, puts a parabola through them, tries where it crosses the budget and
# then both sides, until the longest length that fits and the next that does not are `multiple` tokens apart (64
# by default), in at most 8 tries. On a live model each size is a measured step, held to the budget (an
# out-of-memory is recovered, not raised).

# %%
def both_kernels(found, unit="MiB", judged="peak"):
    """Both kernels' tries on one figure: memory against the length, the budget dashed, each answer dotted."""
    scale = 2**20 if unit == "MiB" else 2**30
    figure = go.Figure()
    for (name, answer), color in zip(found.items(), ("#4C78A8", "#E45756")):
        tried = [(size, t.verdict_bytes / scale) for size, t in answer.tried if t.status == "ok"]
        figure.add_scatter(x=[size for size, _ in tried], y=[y for _, y in tried], name=name,
                           mode="lines+markers", line_color=color)
        figure.add_vline(x=answer.value, line_dash="dot", line_color=color)
    budget_bytes = next(iter(found.values())).budget
    figure.add_hline(y=budget_bytes / scale, line_dash="dash", annotation_text=f"budget {human(budget_bytes)}",
                     annotation_position="bottom left")
    answers = ", ".join(f"{name} {answer.value}" for name, answer in found.items())
    figure.update_layout(title=f"the longest sequence that fits: {answers} tokens per row",
                         xaxis_title="tokens per row", yaxis_title=f"{judged} ({unit})", yaxis_rangemode="tozero",
                         height=400)
    return figure


found = {}
for name, which in (("sdpa", model), ("eager", eager)):
    found[name] = memlab.limits(which, memlab.Plan(), budget=budget, batch=batch, vary="tokens")
    print(f"{name}:", found[name], end="\n\n")

# %%
both_kernels(found)

# %% [markdown]
# `found.value` is the longest length that fits, `found.trial` its measurement, `found.next` the next length
# tried, which does not fit, and `found.plot()` draws one search. A try that went over the budget is not drawn: the
# step was stopped there.
#
# ## Llama 3.1 8B on a 24 GiB card, estimated
#
# The same question for a model that does not fit on this machine: on a config (no weights), each size is a dry
# run on fake tensors (notebook 07), here for a 24 GiB card (`device="cuda"`, and `gpu=` names the card). A full
# fine-tune of 8 billion parameters does not fit 24 GiB at any length (16 bytes a parameter with AdamW), so the
# plan is the usual one for this card: LoRA adapters on a base held in bf16 (`weights="bf16"`; notebook 08), bf16
# autocast, and every block checkpointed. The lengths go in steps of 256 tokens (`multiple=256`), which keeps the
# searches short: at the full size each dry run takes seconds to a minute on a small CPU.

# %%
# With internet, read the real config instead (no weights are downloaded; the model is gated: log in first):
#   config = transformers.AutoConfig.from_pretrained("meta-llama/Llama-3.1-8B", attn_implementation="sdpa")
# and the model itself, to train it:
#   AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", attn_implementation="sdpa", dtype=torch.bfloat16)
def big_config(attention):
    return LlamaConfig(
        hidden_size=big_hidden,
        intermediate_size=big_intermediate,
        num_hidden_layers=big_layers,
        num_attention_heads=big_heads,
        num_key_value_heads=big_kv_heads,
        vocab_size=big_vocab,
        max_position_embeddings=big_context,
        rope_theta=500000.0,
        attn_implementation=attention,  # Attention kernel: the estimate follows the config's implementation
    )


with torch.device("meta"):  # shapes only: no memory
    shell = AutoModelForCausalLM.from_config(big_config("sdpa"))
print(f"{sum(p.numel() for p in shell.parameters()) / 1e9:.2f} billion parameters in {big_layers} layers")
del shell

lora = memlab.Plan(adapter="lora", weights="bf16", precision="bf16", checkpointing=True)
shapes = {"input_ids": (1, big_seq_len), "labels": (1, big_seq_len)}
found_big = {
    name: memlab.limits(big_config(name), lora, budget=card_budget, batch=shapes, vary="tokens", multiple=256,
                        device="cuda", gpu=card)
    for name in ("sdpa", "eager")
}
for name, answer in found_big.items():
    print(f"{name}:", answer, end="\n\n")

# %%
both_kernels(found_big, unit="GiB", judged=found_big["sdpa"].trial.verdict_figure)

# %% [markdown]
# The budget is judged on what the card would show (`verdict_bytes`: the allocated peak, plus the caching
# allocator's reserve and the CUDA context), as in notebook 07. It need not rise smoothly with the length: the
# reserve is made of segments, and a few more tokens can need a new segment or fit the old ones better, which is
# why `limits` tries the lengths on both sides of its guess. Where is the peak at each kernel's longest length?

# %%
for name, answer in found_big.items():
    trial = answer.trial
    print(f"{name} at {answer.value} tokens: allocated {trial.peak_bytes / 2**30:.2f} GiB, reserved "
          f"{trial.reserved_bytes / 2**30:.2f} GiB, {trial.verdict_figure} {trial.verdict_bytes / 2**30:.2f} GiB")
    print(f"  the peak: {trial.timeline.peak.description}; alive then, by module:")
    for module, nbytes in list(trial.timeline.peak.by_module.items())[:3]:
        print(f"    {module:40} {nbytes / 2**30:6.2f} GiB")

# %% [markdown]
# With every block checkpointed, what stays through the step is one input per block. Two things come on top, at
# different moments of backward. First the loss's backward holds the logits and their gradient (made in the root
# module, `LlamaForCausalLM`): rows x tokens x a vocabulary of 128,256, in bf16 and again in fp32 for the loss.
# Then each block is recomputed in turn, and with eager the recomputed block holds its tokens x tokens
# probabilities (and their gradient), one block at a time. Whichever is higher makes the peak, and the lines above
# say which it is for each kernel. Eager's matrices are large single blocks of memory, and the allocator's reserve,
# which the card shows, grows with them.
#
# ## Exercise
#
# With sdpa, the logits make the 8B's peak. `Plan(loss="chunked")` computes the head and the loss in chunks
# of tokens, so the full logits are never held (notebook 09). How long can the sequences be with it, with sdpa?
# Does eager attention fit that length?
#
# The next cell holds one solution, folded: click it to open. (At the full size, its dry runs take a few
# minutes on a small CPU.)

# %% jupyter={"source_hidden": true}
# Solution
chunked = memlab.Plan(adapter="lora", weights="bf16", precision="bf16", checkpointing=True, loss="chunked")
answer = memlab.limits(big_config("sdpa"), chunked, budget=card_budget, batch=shapes, vary="tokens", multiple=256,
                       device="cuda", gpu=card)
print(answer, end="\n\n")
longest_shapes = {"input_ids": (1, answer.value), "labels": (1, answer.value)}
with_eager = memlab.estimate(big_config("eager"), longest_shapes, chunked, budget=card_budget, device="cuda", gpu=card)
print(f"eager at {answer.value} tokens: {with_eager.verdict_figure} {with_eager.verdict_bytes / 2**30:.1f} GiB, "
      f"{'fits' if with_eager.fits else 'does not fit'} in {card_budget}")
# The chunked loss takes the logits off the peak; then what grows with the length is one input per block and the
# recomputed block's insides (linear) and, with eager, that block's probabilities (quadratic): the kernel decides
# how far it goes.
