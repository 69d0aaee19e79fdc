# %% [markdown]
# # 12 · From an OOM in `trainer.train()` to a plan that fits
#
# You already fine-tune with `transformers.Trainer` or TRL's `SFTTrainer`. The first steps run, and an hour
# later `trainer.train()` dies with `CUDA out of memory`. The usual cause is the data: most examples are
# short, a few are long, and the batch that holds the long ones needs far more activation memory than the
# batches before it.
#
# memlab takes the trainer itself as the live object:
#
# | call | what it does with a trainer |
# |---|---|
# | `memlab.measure(trainer, plan)` | its model, its `compute_loss`; no batch: the dataset's **worst batch** |
# | `memlab.fit(trainer, budget=...)` | the fastest plan within the budget, judged on that worst batch |
# | `memlab.apply(trainer, plan)` | the plan on the trainer's arguments and model until `undo()` |
# | `memlab.watch(trainer, budget=...)` | every step's memory in `train()`, a warning, a live figure |
#
# This notebook picks a plan twice, once from a typical batch and once from the worst batch, trains each
# for an epoch under `memlab.watch`, and shows which one would have run out of memory.

# %%
import logging
import tempfile
import warnings

# Quiet before the imports: some libraries warn while they load.
warnings.filterwarnings("ignore", category=FutureWarning)
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # optional CPU kernels it may not find

from datasets import Dataset
from memlab.errors import MemlabWarning
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers import PreTrainedTokenizerFast
import trl

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
# Sizes of the model and the data. The defaults run in a minute or two on a small CPU; on a GPU, make
# them bigger. The tests run every notebook with smaller values injected after this cell.
hidden = 64          # width of the model
layers = 2           # transformer blocks
rows = 4             # examples per batch (per_device_train_batch_size)
short_words = 10     # words in most examples
long_words = 190     # words in the long tail's examples
examples = 32        # examples in the dataset
long_examples = 4    # of which this many are long
steps = 1            # timed steps per measurement
noise = 0.05         # time on past `steps` until the median step is known within +-5% (0: exactly `steps`)

# %%
device = "cuda" if torch.cuda.is_available() else "cpu"
if device == "cpu":
    # The models here are small: one thread runs them about as fast as several, and on a shared machine (a
    # Binder, a laptop building something) torch's threads wait on each other for the busy core, up to
    # 15 times slower (docs/workshop.md has the numbers). On a machine of your own, delete this line.
    torch.set_num_threads(1)
where = torch.cuda.get_device_name() if device == "cuda" else f"the CPU, {torch.get_num_threads()} thread(s)"
print("Running on", where)

# %% [markdown]
# ## A dataset with a long tail
#
# Most examples are short; a few are nearly twenty times longer. A word-level tokenizer is built in memory
# from the texts themselves, so nothing is downloaded.

# %%
texts = [" ".join(f"short{(i + j) % 7}" for j in range(short_words)) for i in range(examples - long_examples)]
texts += [" ".join(f"long{j % 40}" for j in range(long_words))] * long_examples
words = Tokenizer(models.WordLevel(unk_token="[UNK]"))
words.pre_tokenizer = pre_tokenizers.Whitespace()
words.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[EOS]"]))
tokenizer = PreTrainedTokenizerFast(
    tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]"
)
lengths = sorted(len(tokenizer(text)["input_ids"]) for text in texts)
print(f"{len(texts)} examples; tokens per example: median {lengths[len(lengths) // 2]}, longest {lengths[-1]}")

# %% [markdown]
# ## The trainer
#
# With internet, the model and tokenizer of a real checkpoint go in the same places:
#
# ```python
# model = AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M")
# tokenizer = AutoTokenizer.from_pretrained("HuggingFaceTB/SmolLM2-135M")
# ```

# %%
# With internet: model = AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M").to(device)
config = LlamaConfig(
    hidden_size=hidden,
    intermediate_size=2 * hidden,
    num_hidden_layers=layers,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=len(tokenizer),
    max_position_embeddings=2 * lengths[-1],
)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config).to(device)
workdir = tempfile.TemporaryDirectory(prefix="nb12-")  # the trainers' output folders, removed with the kernel
args = trl.SFTConfig(
    output_dir=f"{workdir.name}/output",
    report_to=[],
    use_cpu=device == "cpu",
    save_strategy="no",
    num_train_epochs=1,
    per_device_train_batch_size=rows,
    logging_steps=2,  # memlab.watch's figure redraws every logging step
    disable_tqdm=True,
    seed=0,
    max_length=2 * lengths[-1],
)
trainer = trl.SFTTrainer(
    model=model, args=args, train_dataset=Dataset.from_dict({"text": texts}), processing_class=tokenizer
)
trainer.args.log_level = "error"
print(f"{sum(p.numel() for p in model.parameters()):,} parameters; {len(trainer.train_dataset)} examples")

# %% [markdown]
# ## A typical batch and the worst batch
#
# The first `rows` examples are a typical batch. `memlab.measure(trainer, plan)` without a batch reads the
# lengths of the whole train dataset, collates its longest examples with the trainer's own collator and
# measures that batch; the trial's notes say which examples it held.

# %%
typical = trainer.data_collator([{"input_ids": trainer.train_dataset[i]["input_ids"]} for i in range(rows)])
typical = {key: value.to(device) for key, value in typical.items() if torch.is_tensor(value)}
plain = memlab.Plan()
on_typical = memlab.measure(trainer, typical, plain, steps=steps, noise=noise)
on_worst = memlab.measure(trainer, plain, steps=steps, noise=noise)
print(f"typical batch ({typical['input_ids'].shape[1]} tokens): peak {human(on_typical.peak_bytes)}")
print(f"worst batch: peak {human(on_worst.peak_bytes)}; {on_worst.notes[-1]}")

# A budget between the two: a typical batch fits it, the worst batch does not. On a GPU this is your card.
budget = (on_typical.peak_bytes + on_worst.peak_bytes) // 2
print("budget:", human(budget))

# %% [markdown]
# ## Two plans: one picked on a typical batch, one on the worst
#
# `memlab.fit` keeps the trainer's effective batch (rows per optimizer step) and searches for the fastest plan
# within the budget: the micro-batch (the accumulation follows from it) and checkpointing, as `space` names
# them, and the levers of fit's default space that `space` does not name (bf16 autocast and 8-bit Adam among
# them: `space` sets the values of the levers it names); the next cell prints every plan it tried. Given
# `typical`, it judges every plan on that batch; given no batch, on the dataset's worst batch.

# %%
space = {"micro_batch": [4, 2, 1], "checkpointing": [False, True]}
from_typical = memlab.fit(trainer, typical, budget=budget, space=space, steps=steps, noise=noise)
from_worst = memlab.fit(trainer, budget=budget, space=space, steps=steps, noise=noise)
print("tried:", ", ".join(trial.label for trial in from_worst.trials))
print("picked on a typical batch:", from_typical.best.plan.label())
print("picked on the worst batch:", from_worst.best.plan.label())
from_worst.plot()


# %% [markdown]
# ## Train each for an epoch under `memlab.watch`
#
# `memlab.apply(trainer, plan)` puts the plan on the trainer until `undo()`; `memlab.watch(trainer,
# budget=...)` records each step's peak and which examples the step trained on, warns once when a step
# comes within 10% of the budget, and in a notebook draws the steps live, then leaves a static figure. On a
# GPU whose memory is the budget, a step over it is where `trainer.train()` dies.

# %%
def train_watched(plan):
    applied = memlab.apply(trainer, plan)
    watched = memlab.watch(trainer, budget=budget)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.train()
    finally:
        watched.remove()
        applied.undo()  # the trainer and its model come back as they were
    for warning in caught:
        if isinstance(warning.message, MemlabWarning):
            print("memlab warned:", warning.message)
    verdict = "OVER the budget" if watched.peak_bytes > budget else "within the budget"
    print(f"{plan.label()}: peak {human(watched.peak_bytes)} at step {watched.peak_step} "
          f"(examples of {watched.peak_lengths} tokens), {verdict}")
    return watched


over = train_watched(from_typical.best.plan)

# %%
under = train_watched(from_worst.best.plan)

# %%
steps_over, steps_under = over.to_dataframe(), under.to_dataframe()
print(f"budget {human(budget)}")
for name, table in (("a typical", steps_over), ("the worst", steps_under)):
    print(f"picked on {name} batch: {(table.peak_bytes > budget).sum()} of {len(table)} steps over it")
steps_over.assign(peak_MiB=(steps_over.peak_bytes / 2**20).round(2))[
    ["step", "peak_MiB", "samples_per_s", "padded_length"]]

# %% [markdown]
# The plan picked on a typical batch was the faster one on that batch, and it fits every short batch: the
# steps over the budget are exactly those that hold the long examples. The plan picked on the worst batch
# pays for them from the first step, and no step goes over.
#
# On your own fine-tune: `memlab.fit(trainer, budget="24GiB")`, then `memlab.apply(trainer,
# result.best.plan)` and `trainer.train()`; `memlab.export.engines.training_arguments(plan)` writes the same
# plan as `TrainingArguments` keywords for a script. `memlab.panel(trainer)` does the same with buttons.

# %% [markdown]
# ## The usual SFT recipe: packing and LoRA
#
# Most fine-tunes today pack short examples into full rows (`packing=True`: one row holds several examples
# back to back, with `position_ids` that restart at each one) and train LoRA adapters
# (`peft_config=LoraConfig(...)`). memlab takes that trainer as it is: a micro-batch is what the trainer's own
# collator packs from `per_device_train_batch_size` examples, the model keeps the adapters TRL put on it, and
# the plan memlab reports is the trainer's own (its rank, alpha and dropout read from the `LoraConfig`).

# %%
from peft import LoraConfig

packed_args = trl.SFTConfig(
    output_dir=f"{workdir.name}/packed", report_to=[], use_cpu=device == "cpu", save_strategy="no", num_train_epochs=1,
    per_device_train_batch_size=2, logging_steps=2, disable_tqdm=True, seed=0,
    packing=True, max_length=lengths[-1] // 2,
)
torch.manual_seed(0)
packed = trl.SFTTrainer(
    model=AutoModelForCausalLM.from_config(config).to(device), args=packed_args,
    train_dataset=Dataset.from_dict({"text": texts}), processing_class=tokenizer,
    peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear"),
)
packed.args.log_level = "error"
own = memlab.measure(packed, steps=steps, noise=noise)
print(f"the trainer's own plan: {own.plan.label()}; peak {human(own.peak_bytes)}")
print(own.notes[-1])

# %% [markdown]
# Now a budget a little under that peak, as if this were the card's limit: `fit` keeps the trainer's
# effective batch and its adapters and searches the micro-batch (2 or 1) with the levers of its default space;
# the plan it picks trains an epoch under `watch`.

# %%
packed_budget = int(own.peak_bytes * 0.9)
packed_fit = memlab.fit(packed, budget=packed_budget, space={"micro_batch": [2, 1]}, steps=steps, noise=noise)
print("picked:", packed_fit.best.plan.label())
applied = memlab.apply(packed, packed_fit.best.plan)
watched = memlab.watch(packed, budget=packed_budget)
try:
    packed.train()
finally:
    watched.remove()
    applied.undo()
verdict = "OVER the budget" if watched.peak_bytes > packed_budget else "within the budget"
print(f"packed LoRA epoch: peak {human(watched.peak_bytes)} of {human(packed_budget)}, {verdict}")

# %% [markdown]
# ## Exercise
#
# Make the tail longer (`long_words = 250`, in the parameters cell, then run the notebook again) or give
# the search the chunked loss: `space = {"micro_batch": [4, 2, 1], "checkpointing": [False, True], "loss":
# ["full", "chunked"]}` (the accumulation always follows from the micro-batch). Which plan does each fit pick
# now, and does the worst-batch pick still stay under the budget?
#
# The next cell holds one solution, folded: click it to open.

# %% jupyter={"source_hidden": true}
# Solution
space = {"micro_batch": [4, 2, 1], "checkpointing": [False, True], "loss": ["full", "chunked"]}
result = memlab.fit(trainer, budget=budget, space=space, steps=steps, noise=noise)
print("picked on the worst batch:", result.best.plan.label())
train_watched(result.best.plan)
