# %% [markdown]
# # 14 · GRPO without running out of memory
#
# GRPO (TRL's `GRPOTrainer`) trains a policy on its own completions: every step first **generates**
# `num_generations` completions for each prompt, scores them with a reward function, and then trains on them.
# One step is several phases, and each holds different memory:
#
# | phase | what it holds |
# |---|---|
# | generation | prompts x `num_generations` rows decoded to `max_completion_length` tokens; the KV cache grows |
# | old-policy | the policy's log-probs, no gradients, when a generation is trained on more than once |
# | reference | the reference's log-probs, no gradients, when `beta != 0` (a copy of the weights, or LoRA's base) |
# | forward, backward, optimizer | the usual training step over the completions |
#
# This notebook trains a tiny policy for real under `memlab.watch`, shows one step's phases on a timeline,
# estimates the same step on fake tensors, lets `memlab.fit` pick a plan within a smaller budget, and then asks
# the question people ask before renting a GPU: does GRPO with LoRA on an 8B model fit a 24 GB card? An 80 GB one?

# %%
import logging
import tempfile
import warnings

# Quiet before the imports: some libraries warn while they load.
warnings.filterwarnings("ignore", category=FutureWarning)
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # optional CPU kernels it may not find

from datasets import Dataset
from memlab.estimation.cuda.gpus import GPUS
from memlab.kinds.grpo.vllm import vllm_share
from memlab.techniques.vllm import VLLMSettings
import peft
from tokenizers import Tokenizer, models, pre_tokenizers
import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers import PreTrainedTokenizerFast, Qwen3Config
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
# Sizes of the model and the run, small enough for a CPU; on a GPU, make them bigger. The tests run every
# notebook with smaller values injected after this cell.
hidden = 64          # width of the policy
layers = 2           # transformer blocks
rows = 4             # completions per device per micro-batch (per_device_train_batch_size)
generations = 4      # completions per prompt (num_generations)
completion = 12      # tokens per completion (max_completion_length)
train_steps = 3      # optimizer steps trainer.train() runs
steps = 1            # timed steps per measurement
noise = 0            # exactly `steps` steps: this notebook is about memory
big_layers = 36      # Qwen3-8B's 36 layers; fewer make its dry runs quicker and the model smaller

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
# ## Prompts, a reward, a policy
#
# The prompts are sums ("12 + 30 =") and the reward is higher the closer the completion's first number is to the
# sum: the dataset's `answer` column reaches the reward function as a keyword, as TRL passes every column. A word-level
# tokenizer is built in memory, so nothing is downloaded. The policy is a tiny Llama, saved to a folder and
# loaded back: with `beta != 0` TRL loads the reference model from the same place.

# %%
numbers = [str(n) for n in range(200)]
vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, "+": 3, "=": 4, **{n: i + 5 for i, n in enumerate(numbers)}}
words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]")

pairs = [(a, b) for a in range(0, 100, 7) for b in range(0, 100, 11)][:32]
prompts = Dataset.from_list([{"prompt": f"{a} + {b} =", "answer": str(a + b)} for a, b in pairs])


def close_to_the_sum(completions, answer, **_):
    """1.0 where the completion's first word is the sum, less the further it is from it, 0.0 for no number."""
    rewards = []
    for text, expected in zip(completions, answer):
        first = text.split()[:1]
        guess = int(first[0]) if first and first[0].isdigit() else None
        rewards.append(0.0 if guess is None else 1 - min(abs(guess - int(expected)), 100) / 100)
    return rewards


config = LlamaConfig(
    hidden_size=hidden,
    intermediate_size=2 * hidden,
    num_hidden_layers=layers,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=len(vocab),
    max_position_embeddings=64,
    pad_token_id=0,
    eos_token_id=2,
)
# The policy and the trainers' output folders go in a temporary folder, removed when the kernel stops.
workdir = tempfile.TemporaryDirectory(prefix="nb14-")
policy_path = f"{workdir.name}/policy"
AutoModelForCausalLM.from_config(config).save_pretrained(policy_path)
# With internet, a real policy's name goes where policy_path is below: from_pretrained("Qwen/Qwen3-0.6B")
print(f"{sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters()):,} parameters; "
      f"{len(prompts)} prompts such as "
      f"{prompts[0]['prompt']!r}")

# %% [markdown]
# ## The trainer
#
# `beta=0.04` keeps a reference model (its log-probs are the KL term's), and `num_iterations=2` trains on each
# generation twice, so TRL computes the old policy's log-probs too. TRL turns gradient checkpointing on by default;
# it is off here, and the plan is `fit`'s to choose. Each optimizer step trains on
# `rows x 2` completions (two micro-batches of `rows`), all generated at once at the start of the step.

# %%
def grpo_trainer():
    """A GRPOTrainer on the saved policy: made again later for a plan to train from its first step."""
    args = trl.GRPOConfig(
        output_dir=f"{workdir.name}/output",
        report_to=[],
        use_cpu=device == "cpu",
        save_strategy="no",
        max_steps=train_steps,
        per_device_train_batch_size=rows,
        gradient_accumulation_steps=2,
        num_generations=generations,
        max_completion_length=completion,
        beta=0.04,
        num_iterations=2,
        gradient_checkpointing=False,  # TRL's default is True; fit below decides
        logging_steps=train_steps,  # memlab.watch's figure redraws every logging step
        disable_tqdm=True,
        bf16=False,
        seed=0,
        log_level="error",
    )
    policy = AutoModelForCausalLM.from_pretrained(policy_path).to(device)
    return trl.GRPOTrainer(model=policy, reward_funcs=close_to_the_sum, args=args, train_dataset=prompts,
                           processing_class=tokenizer)


trainer = grpo_trainer()
args = trainer.args
print(f"{args.per_device_train_batch_size * args.gradient_accumulation_steps} completions per optimizer step, "
      f"{args.num_generations} per prompt, up to {args.max_completion_length} tokens each")

# %% [markdown]
# ## Train it for real under `memlab.watch`
#
# `memlab.watch(trainer)` records every step's peak while `trainer.train()` runs, draws the steps live and
# keeps the costliest step's timeline. A step's peak counts everything the process holds then, as a GPU's allocator
# would: the policy's weights, gradients and optimizer state, the reference model, and what earlier steps left. In a
# GRPO step, TRL generates inside the step before the first forward: a step that generates holds more, and takes
# longer, than one that trains on generations made before it (with `num_iterations=2` and two micro-batches a
# step, every other step generates).

# %%
watched = memlab.watch(trainer)
try:
    output = trainer.train()
finally:
    watched.remove()
print(f"peak {human(watched.peak_bytes)} at step {watched.peak_step}")
print(f"{watched.samples_per_s:.1f} completions/s over train()'s {watched.train_time_s:.2f} s "
      f"(TRL's train_samples_per_second: {output.metrics['train_samples_per_second']:.1f})")
watched.to_dataframe()[["step", "peak_bytes", "step_time_s", "samples_per_s"]]

# %% [markdown]
# Two rates, each defined once. `watched.samples_per_s` counts the completions of every step over the whole
# `train()`, the time between steps included (logging, the figure's redraws): what TRL's `train_samples_per_second`
# counts, each timed by its own clock. The table's `samples_per_s` is each step's own: its completions over its own
# `step_time_s`, generation included where the step generates, nothing between steps.

# %% [markdown]
# ## One step, every phase named
#
# `memlab.measure(trainer)` runs one GRPO step the way `train()` does, on its worst case: the longest prompts,
# every completion generated to the full `max_completion_length` (a policy that stops early holds less), and
# names each phase on its timeline. Its peak is the same quantity as the watch's, everything the process holds at
# the step's peak, on the worst case rather than on what the policy generated. `memlab.estimate(trainer)` makes the
# same step on fake tensors, nothing run for real, with the generation as one phase and the training as the others;
# on a GPU it would also say what the card shows.

# %%
measured = memlab.measure(trainer, steps=steps, noise=noise)
print("phases:", " -> ".join(name for name, _, _ in measured.timeline.phases))
print(f"measured peak {human(measured.peak_bytes)}, in {measured.timeline.peak.phase}")
measured.timeline.plot()

# %%
estimated = memlab.estimate(trainer, device=device)


def phase_peaks(trial):
    """The largest total of each named phase of a trial's timeline."""
    timeline = trial.timeline
    totals = [sum(timeline.series[name][i] for name in timeline.categories) for i in range(len(timeline.x))]
    peaks = {}
    for name, start, end in timeline.phases:
        inside = [total for x, total in zip(timeline.x, totals) if start <= x <= end]
        peaks[name] = max([peaks.get(name, 0), *inside])
    return peaks


measured_phases, estimated_phases = phase_peaks(measured), phase_peaks(estimated)
for phase, nbytes in measured_phases.items():
    beside = estimated_phases.get(phase)
    print(f"{phase:12} measured {human(nbytes):>12}   estimated {human(beside) if beside else '(in forward)':>12}")
print(f"{'step':12} measured {human(measured.peak_bytes):>12}   estimated {human(estimated.peak_bytes):>12}")

# %% [markdown]
# The reference and old-policy passes run without gradients over the same tokens as the training forward,
# which holds more, so the estimate counts them within the forward.
#
# ## A plan within a smaller budget
#
# Give the step 80% of its measured peak. `memlab.fit(trainer, budget=...)` keeps the completions of one
# optimizer step (the GRPO objective stays the same) and searches how they are split into micro-batches, the
# precision and the optimizer; `memlab.apply` puts the best plan on the trainer until `undo()`. The first plan it
# measures is the trainer as built (`mb4x2`: two micro-batches of 4), the step `memlab.measure(trainer)` measured
# above, so the figure's first bar is that peak; `plain` would be all 8 completions in one micro-batch. Checkpointing is
# left out of the space here: with transformers 5.24, TRL's generation switches it off and on again through
# names transformers has deprecated, and memlab passes that warning on.

# %%
budget = int(0.8 * measured.peak_bytes)
space = {"micro_batch": [2 * rows, rows, rows // 2], "checkpointing": [False]}
result = memlab.fit(trainer, budget=budget, space=space, steps=steps, noise=noise, max_trials=4, progress=False)
print("budget:", human(budget))
print("tried:", ", ".join(f"{trial.label} ({human(trial.peak_bytes)})" for trial in result.trials))
print("best:", result.best.plan.label() if result.best else "none fits")
result.plot()

# %% [markdown]
# The best plan is applied to a fresh trainer, which trains from its first step as a new run would (the trainer
# above has already trained, and TRL keeps its generations between calls of `train()`). The two peaks printed are
# one quantity, a step's peak with everything the process holds: fit's from its worst-case step (every completion
# at full length), the watch's from the costliest step `train()` ran, on the completions the policy wrote.

# %%
if result.best is not None:
    trainer = grpo_trainer()
    applied = memlab.apply(trainer, result.best.plan)
    watched = memlab.watch(trainer, budget=budget)
    try:
        trainer.train()
    finally:
        watched.remove()
        applied.undo()
    verdict = "within" if watched.peak_bytes <= budget else "OVER"
    print(f"{result.best.plan.label()}: fit measured a peak of {human(result.best.peak_bytes)} on the worst case; "
          f"trained at a peak of {human(watched.peak_bytes)}, {verdict} the budget")

# %% [markdown]
# ## Will GRPO on an 8B model fit?
#
# Qwen3-8B with LoRA adapters on every projection, bf16 and checkpointing, 8 completions per prompt of up to
# 1,024 tokens after a 64-token prompt, 32 completions per optimizer step: a usual GRPO fine-tune. Its weights
# cannot be built here, and need not be: the policy is built on PyTorch's **meta** device (shapes and dtypes, no
# memory, in a second), and `memlab.trainer_on_meta` builds the `GRPOTrainer` around it as you would build it to
# train (a Trainer moves its model to the GPU as it starts, which a meta model cannot do; this is the one thing it
# changes, through the Trainer's own `place_model_on_device` switch). `memlab.estimate(trainer, gpu=...)` then does
# what it did for the tiny trainer above: the generation and the training step on fake tensors, TRL's own loss, the
# peak the larger of the two phases. `memlab.measure` refuses a meta trainer (there is nothing to run) and says to
# estimate it.

# %%
# With internet, read the real config instead (no weights are downloaded):
#   big = transformers.AutoConfig.from_pretrained("Qwen/Qwen3-8B")
# and, to train it, load the model itself: AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-8B", dtype=torch.bfloat16)
big = Qwen3Config(vocab_size=151_936, hidden_size=4096, intermediate_size=12_288, num_hidden_layers=big_layers,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40_960,
                  tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
big_args = dict(per_device_train_batch_size=8, gradient_accumulation_steps=4, num_generations=8,
                max_completion_length=1024, beta=0.0, gradient_checkpointing=True)
big_prompt = 64  # tokens in the longest prompt: the estimate reads it from the train dataset
long_prompts = Dataset.from_list([{"prompt": " ".join(numbers[i:i + big_prompt]), "answer": "0"} for i in range(8)])
adapters = peft.LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                 "gate_proj", "up_proj", "down_proj"])


def grpo_8b(settings):
    """A GRPOTrainer of ``big`` with ``settings`` (GRPOConfig's keywords), its policy on the meta device."""
    with torch.device("meta"):  # shapes only: no memory
        policy_8b = AutoModelForCausalLM.from_config(big, dtype=torch.bfloat16)
    return memlab.trainer_on_meta(
        trl.GRPOTrainer, model=policy_8b, reward_funcs=close_to_the_sum, train_dataset=long_prompts,
        processing_class=tokenizer, peft_config=adapters,
        args=trl.GRPOConfig(output_dir=f"{workdir.name}/8b", report_to=[], save_strategy="no", bf16=True,
                            use_cpu=device == "cpu", disable_tqdm=True, **settings))


trainer_8b = grpo_8b(big_args)
print(f"{sum(p.numel() for p in trainer_8b.model.parameters()) / 1e9:.2f} billion parameters in {big_layers} "
      f"layers, {sum(p.numel() for p in trainer_8b.model.parameters() if p.requires_grad) / 1e6:.1f} million of "
      "them trained (the adapters)")

cards = {gpu: GPUS[gpu].memory_bytes for gpu in ("RTX4090-24GB", "H100-80GB")}  # what each card holds
found_8b = {}
for gpu, size in cards.items():
    found = found_8b[gpu] = memlab.estimate(trainer_8b, gpu=gpu)
    peaks = phase_peaks(found)
    training = max(nbytes for phase, nbytes in peaks.items() if phase != "generation")
    generated = big_args["per_device_train_batch_size"] * big_args["gradient_accumulation_steps"]  # decoded at once
    # the last token is sampled, never cached
    cache = memlab.kv_cache_bytes(big, tokens=big_prompt + big_args["max_completion_length"] - 1, batch=generated)
    fits = "fits" if found.verdict_bytes <= size else "does NOT fit"
    print(f"{gpu}: allocated peak {human(found.peak_bytes)} in {found.timeline.peak.phase} (generation "
          f"{human(peaks['generation'])} with a KV cache of {human(cache)}, training {human(training)}); the card "
          f"would show {human(found.verdict_bytes)}: {fits} its {human(size)}")

# %% [markdown]
# The generation holds the weights, the adapters' training state and the KV cache of 32 completions of 1,088
# tokens, each keeping its keys and values in every layer. The training step holds the weights, the step's 32
# generations, and, with every block checkpointed, each block's input and one block's activations at a time over a
# micro-batch of 8 completions of 1,088 tokens: here it is the larger of the two. The 24 GB card is at its edge:
# what it would show is within a few tens of MiB of all it has, which a real run (another driver's CUDA context,
# fragmentation over thousands of steps) can take. The exercise below tries the two settings people reach for first.

# %% [markdown]
# ## Exercise
#
# On the 24 GB card, how much room does `per_device_train_batch_size=4` with `gradient_accumulation_steps=8` (the
# same 32 completions per optimizer step) leave? And completions of 768 tokens instead of 1,024?
#
# The solution below is folded in text (each 8B dry run takes up to a minute on a small CPU, and Run All skips
# it): open it and copy it into a cell.

# %% [markdown]
# <details><summary>Solution (click to open)</summary>
#
# ```python
# size = cards["RTX4090-24GB"]
# for settings in ({**big_args, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 8},
#                  {**big_args, "max_completion_length": 768}):
#     found = memlab.estimate(grpo_8b(settings), gpu="RTX4090-24GB")
#     peaks = phase_peaks(found)
#     print(f"{settings['per_device_train_batch_size']} x {settings['gradient_accumulation_steps']}, "
#           f"{settings['max_completion_length']} tokens: peak in {found.timeline.peak.phase}, generation "
#           f"{human(peaks['generation'])}, card {human(found.verdict_bytes)}: "
#           f"{human(size - found.verdict_bytes)} left")
# # about 22.4 GiB on the card with 4 x 8 (1.5 GiB left), about 23.6 GiB with 768 tokens (0.4 GiB left); the
# # peak is in the training step both times. The smaller micro-batch shrinks the training step only: the
# # generation batch is still 32 completions (steps_per_generation follows the accumulation). Shorter completions
# # shrink both phases, the generation's KV cache most, but the training step less than halving its micro-batch.
# ```
#
# </details>

# %% [markdown]
# ## With a colocated vLLM engine
#
# TRL can generate with vLLM instead of transformers' `generate`, many times faster. With `vllm_mode="colocate"`
# the engine runs in the training process, on the same card: at start it takes `vllm_gpu_memory_utilization` of
# the card's **total** memory for its own copy of the weights and its KV cache, and keeps it. With
# `vllm_enable_sleep_mode=True` TRL puts the engine to sleep while the policy trains (level 2: its weights and KV
# cache are freed) and wakes it for the next generation. `memlab.estimate(trainer, gpu=...)` adds that share to the
# step: held through training, or only while generating when the engine sleeps. vLLM runs on a CUDA GPU
# (`pip install vllm`); where it is not installed, the cell below works the engine out with memlab's own arithmetic.

# %%
import importlib.util

vllm_settings = dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3,
                     vllm_enable_sleep_mode=True)
if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available():
    colocated = trl.GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(policy_path), reward_funcs=close_to_the_sum,
        args=trl.GRPOConfig(output_dir=f"{workdir.name}/vllm", report_to=[], save_strategy="no", max_steps=train_steps,
                            per_device_train_batch_size=rows, gradient_accumulation_steps=2,
                            num_generations=generations, max_completion_length=completion, **vllm_settings),
        train_dataset=prompts, processing_class=tokenizer)
    for gpu in cards:
        trial = memlab.estimate(colocated, gpu=gpu)
        print(f"{gpu}: {trial.status}, allocated peak {human(trial.peak_bytes)}, the card would show "
              f"{human(trial.verdict_bytes)}")
        print("   ", "\n    ".join(note for note in trial.notes if "vLLM" in note))
else:
    # memlab's own arithmetic for the engine (what the estimate above adds to a colocated trainer's step), on the 8B
    # policy on the meta device: its share of each card, its copy of the weights, the generation batch's KV cache.
    policy_8b = trainer_8b.model
    engine_settings = VLLMSettings("colocate", vllm_settings["vllm_gpu_memory_utilization"],
                                   sleep=vllm_settings["vllm_enable_sleep_mode"])
    generated = big_args["per_device_train_batch_size"] * big_args["gradient_accumulation_steps"]
    for gpu, size in cards.items():
        engine = vllm_share(engine_settings, policy_8b, card=size, prompt=big_prompt,
                            completion=big_args["max_completion_length"], sequences=generated)
        if engine.refusal() is not None:
            print(f"{gpu}: vLLM's {engine_settings.utilization:.0%} is {human(engine.share)}, less than its "
                  f"{human(engine.weights)} of weights: the engine would not start (vllm_gpu_memory_utilization of "
                  f"at least {engine.least:.2f})")
            continue
        # Generating, the engine's share sits beside the policy's weights and adapters; training, it sleeps. The
        # training phases' peak from the estimate above, with what the card adds over the allocated peak (the
        # allocator's reserve and the CUDA context).
        found = found_8b[gpu]
        peaks = phase_peaks(found)
        generating = engine.share + found.breakdown["params"]
        training = (max(nbytes for phase, nbytes in peaks.items() if phase != "generation")
                    + found.verdict_bytes - found.peak_bytes + engine.during_training)
        fits = "fits" if max(generating, training) <= size else "does NOT fit"
        print(f"{gpu}: generation {human(generating)} (vLLM's {human(engine.share)}, of which "
              f"{human(engine.share - engine.weights)} for its KV cache, + the policy's weights), training "
              f"{human(training)} with the engine asleep: {fits} its {human(size)}")
