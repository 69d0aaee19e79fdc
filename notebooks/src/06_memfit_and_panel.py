# %% [markdown]
# # 06 · `%%memfit` and the panel: the fastest plan that fits
#
# The earlier notebooks turned one technique on at a time. In practice you have a memory budget and the
# number of rows you want per optimizer step, and want the fastest combination that fits. memlab
# searches for it on the live model, three ways: the `%%memfit` cell magic, `memlab.fit` in Python,
# and a widget panel to try settings by hand. Then the winner goes onto the model, or into the
# Hugging Face `Trainer`.

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
budget_fraction = 0.8   # the budget, as a share of what plain training peaks at

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
# ## Compare chosen plans with `%%memfit`
#
# `%load_ext memlab` registers the magic. `%%memfit MODEL BATCH --try KEY=V1,V2 ...` measures every
# combination of the values; the cell body is the loss (leave it empty for `model(**batch).loss`). The
# figure fills in while the plans run. `%%memfit?` shows every option.

# %%
# %load_ext memlab

# %%
# %%memfit model batch --try precision=fp32,bf16 checkpointing=off,on --steps $steps --noise $noise
loss = model(**batch).loss

# %% [markdown]
# On a CPU, bf16's speed depends on the CPU. One whose flags list bf16 matrix units (`amx_bf16` or
# `avx512_bf16`: recent Xeons, AMD's Zen 4) runs bf16's matrix products natively, and the speeds above are its own;
# others emulate them, often several times slower than fp32, and there the figure's key and the table's note say so
# beside those speeds. The next cell says which this CPU is. On a GPU bf16 runs natively and is usually the faster
# choice, so compare speeds there.

# %%
from memlab.techniques.precision import bf16_on_cpu

print(bf16_on_cpu() if device == "cpu" else "a GPU of compute capability 8.0 or more runs bf16 natively")

# %% [markdown]
# `--quiet` leaves out the live figure. The magic returns a `memlab.Report` either way, so `_` picks it up
# in the next cell.

# %%
# %%memfit model batch --try optimizer=adamw,adamw8bit --steps $steps --noise $noise --quiet

# %%
tried = _
print("fastest of these:", tried.best.label)

# %% [markdown]
# ## Search within a budget: `memlab.fit`
#
# We set the budget below what plain training needs, so plain training will not do. `fit` keeps the
# rows per optimizer step fixed (`batch_size`) and searches micro-batch sizes with accumulation,
# checkpointing, precision, the optimizer and (on a GPU) offload. It measures the plans most likely to
# win first, and skips those that its measurements show cannot fit or cannot be faster. On a CPU the
# budget is enforced by memlab's own accounting, and going over it counts as out of memory.

# %%
plain = memlab.measure(model, batch, memlab.Plan(), steps=steps, noise=noise)
budget = int(budget_fraction * plain.peak_bytes)
print(f"plain training peaks at {human(plain.peak_bytes)}; the budget is {human(budget)}")

# %%
report = memlab.fit(model, batch, budget=budget, batch_size=rows, steps=steps, noise=noise)
report

# %%
report.plot()

# %% [markdown]
# ## Apply it
#
# `memlab.apply` puts the best plan on the model; `step` trains one effective batch; `undo` takes the
# techniques off again (the weights keep what they learned).

# %%
best = report.best
print("best plan:", best.plan)
applied = memlab.apply(model, best.plan)
losses = [applied.step(batch) for _ in range(3)]
applied.undo()
print("losses:", [round(loss, 3) for loss in losses])

# %% [markdown]
# The magic does the search and the apply in one cell: with `--budget` and `--batch-size` it searches
# like `fit`, and `--apply` leaves the result on the model as `memfit_applied`:
#
# ```
# %%memfit model batch --budget 8GiB --batch-size 32 --apply
# ```
#
# ## The panel
#
# `memlab.panel(model, batch)` gives one control per technique, a Run button that measures the current
# setting and adds it to the figure and the table, and Apply/Undo buttons. `panel.report` holds every
# run so far. (The panel needs a running kernel; a static copy of the notebook shows no panel.)

# %%
board = memlab.panel(model, batch)
board

# %%
board.report  # press Run a few times above, then run this cell again

# %% [markdown]
# ## Take the plan to the Trainer
#
# A plan translates into `TrainingArguments` keywords: the micro-batch becomes
# `per_device_train_batch_size`, accumulation `gradient_accumulation_steps`, and so on. The Trainer's checkpointing
# flag is every block or none: where fit picked a number of blocks (`checkpointing=k`, fewer recomputations), the
# Trainer gets every block here, or you checkpoint those blocks on the model yourself, as `plan.to_code()` writes.

# %%
plan = best.plan
if type(plan.checkpointing) is int:  # some blocks checkpointed: the Trainer can only checkpoint all of them
    plan = plan.replace(checkpointing=True)
kwargs = plan.to_training_arguments()
kwargs.setdefault("per_device_train_batch_size", rows)  # micro_batch=None: all rows of the batch
kwargs

# %%
from transformers import TrainingArguments

args = TrainingArguments(output_dir="memlab-out", report_to="none", use_cpu=device == "cpu", **kwargs)
print(f"micro-batch {args.per_device_train_batch_size}, accumulation {args.gradient_accumulation_steps},")
print(f"bf16={args.bf16}, fp16={args.fp16}, optim={args.optim}")
# then: Trainer(model=model, args=args, train_dataset=...).train()

# %% [markdown]
# Without the Trainer, `best.plan.to_code()` writes the same plan as a plain PyTorch loop:

# %%
print(best.plan.to_code())

# %% [markdown]
# ## Exercise
#
# Halve the budget and search again in one cell with the magic, applying the result. Does anything still
# fit? If so, what did the search give up to get there? Undo it afterwards.
#
# One solution is folded below: click it to open, and copy it into a cell to run it. Run All leaves it
# alone, so its answers stay hidden until you look.

# %% [markdown]
# <details><summary>Solution (click to open)</summary>
#
# ```ipython3
# half = budget // 2
# %memfit model batch --budget {half}B --batch-size $rows --steps 1 --noise $noise --quiet --apply
# if "memfit_applied" in globals():
#     print("applied:", memfit_applied.plan.label())
#     memfit_applied.undo()
# ```
#
# </details>
