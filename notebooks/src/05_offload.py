# %% [markdown]
# # 05 · Offload to CPU memory, host memory and compile
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

import json
from pathlib import Path
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
link_gb_per_s = 16   # CPU-GPU link in GB/s (PCIe 4.0 x16 is rated ~32 each way; real copies get less)
measure_compile = False  # True: measure torch.compile live below (on a 2-core CPU its first step takes 30-100 s)

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
# ## How much host memory does offload need?
#
# Offload does not make bytes disappear: it moves them to the host, whose RAM is also finite (and pinned
# memory more so: the kernel cannot page it out). Every trial and estimate says what its plan keeps in host
# memory at the most, `trial.host_bytes`, and `host_budget=` judges it beside `budget=`: a plan that fits
# the GPU but not the host "does not fit (host)", in the table, the CLI (`--host-budget`) and the JSON
# alike. A live run is judged against the memory the machine has available unless told otherwise.
#
# On this CPU the measured offload plans above keep 0 host bytes (nothing moved, and their note says so). A
# dry run with `device="cuda"` counts what each plan would keep in pinned host memory on a GPU, beside its
# GPU figures (without CUDA the GPU's bytes are shown as without offload; the note says that too):

# %%
offload_plans = [memlab.Plan(offload=where) for where in ("none", "optimizer", "activations")]
on_gpu = memlab.Report([memlab.estimate(model, batch, p, device="cuda") for p in offload_plans])
for t in on_gpu:
    print(f"{t.label:20} GPU peak {human(t.peak_bytes):>10}  host {human(t.host_bytes):>10}")

# %% [markdown]
# The GPU and the host side by side, one pair of bars per plan:

# %%
labels = [t.label for t in on_gpu]
figure = go.Figure([
    go.Bar(x=labels, y=[t.peak_bytes / 2**20 for t in on_gpu], name="GPU: allocated peak"),
    go.Bar(x=labels, y=[t.host_bytes / 2**20 for t in on_gpu], name="host: offloaded bytes"),
])
figure.update_layout(barmode="group", yaxis_title="MiB", title="Where each plan keeps its bytes (estimated for a GPU)")
figure

# %% [markdown]
# Now a host budget between the two offload plans' needs: the GPU budget holds for all three, and the plan
# that needs more host memory than the budget "does not fit (host)". The line under the table names the
# host budget, and `verdict_figure` says which figure decided.

# %%
needs = sorted(t.host_bytes for t in on_gpu if t.host_bytes)
host_budget = (needs[0] + needs[-1]) // 2
judged = memlab.Report(
    [memlab.estimate(model, batch, p, device="cuda", budget="80GiB", host_budget=host_budget) for p in offload_plans],
    budget=memlab.parse_budget("80GiB"),
)
judged

# %%
for t in judged:
    print(f"{t.label:20} fits={t.fits!s:5}  decided by the {t.verdict_figure} figure")

# %% [markdown]
# The same question for a 7B model on a real GPU: full training in bf16 with checkpointing, AdamW
# offloaded, on an 80 GB card with a 64 GiB host budget (what a rented machine's share of RAM may be).
# Offloaded AdamW keeps about 16 bytes per parameter on the host (an fp32 copy of the weights, a buffer for
# their gradients, two moments), so the arithmetic is printed beside the estimate to check it: the dry run
# runs three of the model's layers and carries what they hold, on the GPU and on the host, to all 32 (the
# estimate is above the arithmetic: pinned host blocks are rounded up to a power of two, as PyTorch's pinned
# allocator rounds them). One thing
# to read with it: made without CUDA, the card figure is the plan's without offload (the note says so; with
# CUDA the GPU side is modelled too).

# %%
config_7b = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=32, vocab_size=32000)
with torch.device("meta"):
    params_7b = sum(p.numel() for p in AutoModelForCausalLM.from_config(config_7b).parameters())
plan_7b = memlab.Plan(precision="bf16", checkpointing=True, offload="optimizer")
big = memlab.estimate(config_7b, {"input_ids": (1, 512), "labels": (1, 512)}, plan_7b, budget="80GiB",
                      host_budget="64GiB", device="cuda")
print(f"{params_7b / 1e9:.2f} billion parameters; estimate: card {human(big.card_bytes)}, "
      f"host {human(big.host_bytes)}, fits={big.fits} (decided by the {big.verdict_figure} figure)")
arithmetic = 16 * params_7b
print(f"arithmetic: 16 bytes x {params_7b / 1e9:.2f} billion = {human(arithmetic)} of host memory, "
      f"{'over' if arithmetic > memlab.parse_budget('64GiB') else 'within'} the 64 GiB host budget")

# %% [markdown]
# ## Compile: the same step, a different peak
#
# `Plan(compile=True)` runs the step under `torch.compile`. It moves nothing, but the compiled kernels save
# different tensors for backward and fuse temporaries away, so the peak changes (sometimes up: PyTorch's
# issues #122512 and #167199). The first warm-up step compiles; its time is the trial's `compile_seconds`,
# kept out of the speed. A dry run estimates the compiled step with AOTAutograd's partition on fake
# tensors, and its note says what that cannot see:

# %%
compile_plans = [memlab.Plan(), memlab.Plan(compile=True)]
estimated = memlab.Report([memlab.estimate(model, batch, p) for p in compile_plans])
for t in estimated:
    print(f"{t.label:10} estimated peak {human(t.peak_bytes):>10}", *[n for n in t.notes if n.startswith("compile")])

# %% [markdown]
# Compiling takes 30 to 100 s on a small CPU, too long for this notebook's time limit, so the measured
# figures come from the recorded run of `benchmarks/compile_memory.py` on a 2-core CPU (three families,
# eager against compiled, each the median of timed steps). Set `measure_compile = True` in the parameters
# cell to measure this notebook's model live instead.

# %%
if measure_compile:
    live = memlab.compare(model, batch, compile_plans, steps=steps, noise=noise)
    for t in live:
        print(f"{t.label:10} peak {human(t.peak_bytes):>10}  {t.samples_per_s:8.1f} samples/s  "
              f"compile {t.compile_seconds or 0:.1f} s")


def recorded(name):
    """A committed benchmark result, found from this folder or from memlab's checkout."""
    for root in (Path.cwd(), *Path.cwd().parents, Path(memlab.__file__).resolve().parents[1]):
        path = root / "benchmarks" / "results" / name
        if path.exists():
            return json.loads(path.read_text())
    return None


compiled = recorded("compile_memory-cpu.json")
if compiled is None:
    print("benchmarks/results/compile_memory-cpu.json is not here: open the notebook from memlab's checkout")
else:
    rows = compiled["families"]
    for row in rows:
        eager, comp = row["eager"], row["compiled"]
        print(f"{row['family']:8} peak {human(eager['peak_bytes']):>10} -> {human(comp['peak_bytes']):>10} "
              f"({row['compiled_over_eager_peak']:.2f}x), speed x{row['compiled_over_eager_speed']:.2f}, "
              f"compile {comp['compile_seconds']:.0f} s, estimate's error {comp['estimate_error']:+.1%}")
    figure = go.Figure([
        go.Bar(x=[r["family"] for r in rows], y=[r["eager"]["peak_bytes"] / 2**20 for r in rows], name="eager"),
        go.Bar(x=[r["family"] for r in rows], y=[r["compiled"]["peak_bytes"] / 2**20 for r in rows], name="compiled"),
        go.Bar(x=[r["family"] for r in rows], y=[r["compiled"]["estimate_bytes"] / 2**20 for r in rows],
               name="compiled, estimated"),
    ])
    figure.update_layout(barmode="group", yaxis_title="peak MiB",
                         title=f"torch.compile on {compiled['device']['cpu']} ({compiled['date'][:10]})")
    figure.show()

# %% [markdown]
# Compile is a lever to measure, not to assume: `fit` searches it only when you put it in `space=`
# (`--try compile=on,off`), and the exports write the Trainer's `torch_compile=True`.

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
