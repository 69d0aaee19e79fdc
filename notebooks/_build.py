"""Writes the workshop notebooks (``NN_name.ipynb``) from the cells below, with no outputs.

The notebooks are generated so that they stay consistent with each other and can be reviewed as plain Python:
edit this file, then run ``python notebooks/_build.py`` (``--check`` only reports notebooks that are out of date,
which the tests also do).

Every notebook follows the same shape: a short explanation, the setup cell, a cell tagged ``parameters`` with the
sizes (CI injects smaller ones after it, papermill-style), the device, a model built from a config (the
``from_pretrained`` line is there for readers with internet), an experiment through memlab's API, a plot, and an
exercise with a collapsed solution.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from textwrap import dedent

import nbformat
from nbformat import NotebookNode

HERE = Path(__file__).resolve().parent

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


# --- cells ----------------------------------------------------------------------------------------------------


def md(text: str) -> NotebookNode:
    return nbformat.v4.new_markdown_cell(dedent(text).strip())


def code(text: str, *, tags: tuple[str, ...] = (), hidden: bool = False) -> NotebookNode:
    cell = nbformat.v4.new_code_cell(dedent(text).strip())
    if tags:
        cell.metadata["tags"] = list(tags)
    if hidden:
        cell.metadata["jupyter"] = {"source_hidden": True, "outputs_hidden": True}
    return cell


STDLIB = ("copy", "logging", "warnings")


def setup(*extra_imports: str) -> NotebookNode:
    """The first code cell: imports (standard library, then third party, then memlab), quiet warnings and logs,
    a seed, and a MiB formatter. ``extra_imports`` are import lines, sorted in with the others."""

    def module(line: str) -> str:
        return line.split()[1]

    base = [
        "import logging",
        "import warnings",
        "import torch",
        "import transformers",
        "from transformers import AutoModelForCausalLM, LlamaConfig",
    ]
    imports = sorted({*base, *extra_imports}, key=lambda line: (module(line), line.startswith("from"), line))
    lines = [
        *[line for line in imports if module(line) in STDLIB],
        "",
        "# Quiet before the imports: some libraries warn while they load.",
        'warnings.filterwarnings("ignore", category=FutureWarning)',
        'logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # optional CPU kernels it may not find',
        "",
        *[line for line in imports if module(line) not in STDLIB],
        "",
        "import memlab",
        "",
        "transformers.logging.set_verbosity_error()",
        "torch.manual_seed(0)",
        "",
        "",
        "def human(num_bytes):",
        '    """Bytes in KiB, MiB or GiB, for printing."""',
        '    for unit in ("B", "KiB", "MiB"):',
        "        if abs(num_bytes) < 1024:",
        '            return f"{num_bytes:,.1f} {unit}"',
        "        num_bytes /= 1024",
        '    return f"{num_bytes:,.1f} GiB"',
    ]
    return code("\n".join(lines))


SIZES = """
# Sizes of the model and the batch, small enough for a CPU (a free Binder; how long they take depends on how
# busy it is: the README says what was measured); on a GPU, make them bigger. The tests run every notebook with
# smaller values injected after this cell.
hidden = 128   # width of the model
layers = 4     # transformer blocks
vocab = 4096   # vocabulary size
rows = 8       # sequences per batch
seq_len = 64   # tokens per sequence
steps = 3      # timed steps per measurement
noise = 0.05   # time on past `steps` until the median step is known within +-5% (0: exactly `steps` steps)
"""


def parameters(extra: str = "") -> NotebookNode:
    return code(dedent(SIZES).strip() + ("\n" + dedent(extra).strip() if extra else ""), tags=("parameters",))


DEVICE = code(
    """
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        # The models here are small: one thread runs them about as fast as several, and on a shared machine (a
        # Binder, a laptop building something) torch's threads wait on each other for the busy core, up to
        # 15 times slower (the README has the numbers). On a machine of your own, delete this line.
        torch.set_num_threads(1)
    where = torch.cuda.get_device_name() if device == "cuda" else f"the CPU, {torch.get_num_threads()} thread(s)"
    print("Running on", where)
    """
)

MODEL = code(
    """
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
    """
)


def start(title: str, intro: str, *, imports: tuple[str, ...] = (), extra_parameters: str = "") -> list[NotebookNode]:
    return [md(title + "\n\n" + dedent(intro).strip()), setup(*imports), parameters(extra_parameters), DEVICE, MODEL]


def exercise(text: str, solution: str) -> list[NotebookNode]:
    return [
        md(f"## Exercise\n\n{dedent(text).strip()}\n\nThe next cell holds one solution, folded: click it to open."),
        code("# Solution\n" + dedent(solution).strip(), hidden=True),
    ]


# --- 00 where memory goes -------------------------------------------------------------------------------------

NB00 = [
    *start(
        "# 00 · Where the memory goes",
        """
        A training step keeps several kinds of tensors on the device at once. memlab sorts them into five
        categories:

        | category | what it holds | how big |
        |---|---|---|
        | `params` | the weights | 4 bytes per parameter in fp32 |
        | `grads` | one gradient per weight, written by backward | 4 bytes per parameter |
        | `optimizer` | AdamW's two running averages per weight | 8 bytes per parameter |
        | `activations` | what forward saves for backward, and scratch space | grows with rows × tokens |
        | `other` | the batch, and whatever the process already held | |

        The first three are fixed by the model. Activations depend on what you push through it, which makes
        them the part you can most often shrink. This notebook measures all of them on a small model, then
        moves the batch size and the sequence length to see which bars follow.
        """,
        imports=("import plotly.graph_objects as go", "from plotly.subplots import make_subplots"),
    ),
    md(
        """
        ## One training step, measured

        `memlab.measure` runs a few training steps of a plan on the live model and reports the peak memory of a
        steady step (the optimizer state already exists), split by category, and the speed. `memlab.Plan()` is
        plain fp32 training with AdamW. Afterwards the model is exactly as it was.
        """
    ),
    code(
        """
        trial = memlab.measure(model, batch, memlab.Plan(), steps=steps, noise=noise)
        trial
        """
    ),
    md("Set the measurement beside the bytes-per-parameter rule from the table:"),
    code(
        """
        rule = {"params": 4 * n_params, "grads": 4 * n_params, "optimizer": 8 * n_params}
        for name, measured in trial.breakdown.items():
            guess = human(rule[name]) if name in rule else "depends on the batch"
            print(f"{name:12} measured {human(measured):>11}    rule of thumb: {guess}")
        print(f"{'peak':12} measured {human(trial.peak_bytes):>11}")
        """
    ),
    md(
        """
        The breakdown is a snapshot at the moment of the peak. If `grads` reads zero there, nothing is missing:
        in a plain step the peak usually comes at the end of forward, when every activation is saved and
        backward has not started. The previous step's gradients were freed by `zero_grad(set_to_none=True)`, and
        the new ones appear during backward while the activations are released, so the two mostly take turns.
        (With gradient accumulation, notebook 01, the gradients live through the next micro-batch and do show
        up.)

        The figure is the same breakdown as a stacked bar, with the speed beside it:
        """
    ),
    code("memlab.Report([trial]).plot()"),
    md(
        """
        ## More rows, longer sequences

        `Plan(micro_batch=k)` feeds k rows per forward and backward (memlab repeats rows when k is more than the
        batch holds), so one `compare` call walks through batch sizes. For sequence length we cut the batch to
        shorter rows and measure each.
        """
    ),
    code(
        """
        sizes = sorted({max(1, rows // 4), max(1, rows // 2), rows, 2 * rows})
        by_rows = memlab.compare(model, batch, [memlab.Plan(micro_batch=k) for k in sizes], steps=steps, noise=noise)

        lengths = sorted({max(2, seq_len // 4), max(2, seq_len // 2), seq_len})
        by_length = [
            memlab.measure(
                model, {key: value[:, :n] for key, value in batch.items()}, memlab.Plan(), steps=steps, noise=noise
            )
            for n in lengths
        ]
        by_rows
        """
    ),
    code(
        """
        colors = {"params": "#4C78A8", "grads": "#F58518", "optimizer": "#54A24B", "activations": "#E45756"}
        fig = make_subplots(rows=1, cols=2, shared_yaxes=True, subplot_titles=("more rows", "longer rows"))
        for col, (xs, trials) in enumerate([(sizes, by_rows.trials), (lengths, by_length)], start=1):
            for name, color in colors.items():
                ys = [t.breakdown[name] / 2**20 for t in trials]
                fig.add_trace(
                    go.Scatter(x=xs, y=ys, name=name, mode="lines+markers", line_color=color, showlegend=col == 1),
                    row=1, col=col,
                )
        fig.update_xaxes(title_text="rows per step", row=1, col=1)
        fig.update_xaxes(title_text=f"tokens per row ({rows} rows)", row=1, col=2)
        fig.update_yaxes(title_text="MiB at the peak", rangemode="tozero", row=1, col=1)
        fig.update_layout(title="What grows with the batch")
        fig
        """
    ),
    md(
        """
        Params and optimizer state stay flat: the model's own memory does not care about the batch.
        Activations climb. (On a very small batch the peak can move to the optimizer step, where gradients
        exist and activations are gone; the lines then swap.) Activations per token tell whether the climb is
        a straight line: the same bytes per token means linear; bytes per token that grow with the length mean
        some tensor is length × length, as attention scores are when the attention implementation
        materializes them.
        """
    ),
    code(
        """
        def per_token(t, tokens):
            return f"{t.breakdown['activations'] / tokens / 1024:7.1f} KiB of activations per token"


        for k, t in zip(sizes, by_rows.trials):
            print(f"{k:4} rows x {seq_len:4} tokens:", per_token(t, k * seq_len))
        for n, t in zip(lengths, by_length):
            print(f"{rows:4} rows x {n:4} tokens:", per_token(t, rows * n))
        print("attention implementation:", model.config._attn_implementation)
        """
    ),
    *exercise(
        """
        Double `hidden` (the width) and measure again. Which categories grow about 4×, which about 2×, and why?
        Make a guess from the table at the top before you run it.
        """,
        """
        wide_config = LlamaConfig(**{**config.to_dict(), "hidden_size": 2 * hidden, "intermediate_size": 8 * hidden})
        wide = AutoModelForCausalLM.from_config(wide_config).to(device)
        wide_trial = memlab.measure(wide, batch, memlab.Plan(), steps=1, noise=noise)
        for name in ("params", "optimizer", "activations"):
            print(f"{name:12} x{wide_trial.breakdown[name] / max(trial.breakdown[name], 1):.1f}")
        # Weight matrices in the blocks are hidden x hidden, so they grow 4x; the embedding and output tables are
        # vocab x hidden and only double, which pulls the ratio down in a small model. Activations inside the
        # blocks are rows x tokens x hidden (about 2x), but the logits are rows x tokens x vocab and do not grow
        # with the width at all.
        del wide
        """,
    ),
]


# --- 01 gradient accumulation ---------------------------------------------------------------------------------

NB01 = [
    *start(
        "# 01 · Gradient accumulation",
        """
        When a batch of B rows does not fit, split it. Run forward and backward on B/k rows at a time, k times;
        backward adds each micro-batch's gradients to `.grad`; step the optimizer once at the end. If every
        micro-batch's loss is divided by k, the sum is the mean over all B rows: the same gradient, so the same
        training, as the big batch.

        Activations now follow the micro-batch, not the batch. What it costs: k small passes instead of one big
        one, and small passes keep the hardware less busy. This notebook checks both claims with numbers.
        """,
        imports=("import copy",),
    ),
    md(
        """
        ## The same gradient, numerically

        `memlab.apply(model, plan)` puts a plan on a model for real training and returns an object with an
        `optimizer` and `step(batch)`. A hook that runs just before the optimizer's step sees the gradients it
        is about to use. We take them for the whole batch at once, then for the same batch in micro-batches.
        Each run uses a fresh copy of the model, so both start from the same weights.
        """
    ),
    code(
        """
        def gradients_at_step(plan, data=batch):
            \"\"\"The gradients the optimizer receives at its first step, on a copy of the model.\"\"\"
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
        """
    ),
    md(
        """
        Differences near 1e-7 are float32 rounding: the sums happen in another order. Without the division by
        k the gradient would be k times too big. Here is that mistake, made by hand:
        """
    ),
    code(
        """
        k = factors[-1]
        twin = copy.deepcopy(model)
        for start in range(0, rows, rows // k):
            part = {key: value[start : start + rows // k] for key, value in batch.items()}
            twin(**part).loss.backward()  # no division by k
        undivided = [p.grad for p in twin.parameters()]
        norm = lambda grads: float(sum((g.double() ** 2).sum() for g in grads) ** 0.5)  # noqa: E731
        print(f"{k} micro-batches, loss not divided: gradient {norm(undivided) / norm(full):.2f} times the right size")
        del twin, undivided
        """
    ),
    md(
        """
        ## What it costs

        Every plan below trains on the same rows per optimizer step; only the split differs.
        """
    ),
    code(
        """
        plans = [memlab.Plan()] + [memlab.Plan(micro_batch=rows // k, accumulation=k) for k in factors]
        report = memlab.compare(model, batch, plans, steps=steps, noise=noise)
        report
        """
    ),
    code("report.plot()"),
    code(
        """
        plain = report[0]
        for t in report:
            print(
                f"{t.label:8} peak {t.peak_bytes / plain.peak_bytes:5.0%} of plain,",
                f"activations {human(t.breakdown['activations']):>10},",
                f"speed {t.samples_per_s / plain.samples_per_s:5.0%} of plain",
            )
        """
    ),
    md(
        """
        The activations shrink with the micro-batch; params, optimizer state and now the gradients (they are
        kept between micro-batches) do not, so the peak flattens out at the model's own memory. Speed usually
        drops as the micro-batch gets small, a lot on a GPU, whose kernels need many rows to be busy, and less
        on a CPU. The right split is the largest micro-batch that fits.
        """
    ),
    *exercise(
        """
        The Hugging Face loss is a mean over the tokens whose label is not `-100`. Here every row has the same
        number of such tokens. Mask the second half of the labels in the first half of the rows (padding does
        this in real data) and compare the accumulated gradient with the full one again. Why does it no longer
        match?
        """,
        """
        padded = {"input_ids": batch["input_ids"], "labels": batch["labels"].clone()}
        padded["labels"][: rows // 2, seq_len // 2 :] = -100
        full_padded = gradients_at_step(memlab.Plan(), padded)
        halves = gradients_at_step(memlab.Plan(micro_batch=rows // 2, accumulation=2), padded)
        print(f"relative difference with uneven token counts: {relative_difference(halves, full_padded):.1e}")
        # Each micro-batch's loss is a mean over its own tokens; dividing by k then gives a token in the short
        # micro-batch more weight than a token in the long one. The fix is to weight each micro-batch by its
        # share of the tokens (sum of losses over the total token count) instead of dividing by k.
        """,
    ),
]


# --- 02 gradient checkpointing --------------------------------------------------------------------------------

NB02 = [
    *start(
        "# 02 · Gradient checkpointing",
        """
        Backward needs the intermediate results of forward. Normally each transformer block keeps all of its
        intermediate tensors until backward reaches it. With checkpointing, a block keeps only its input; its
        insides are thrown away after forward and computed again, block by block, when backward needs them.

        So activations shrink to one saved input per block plus the insides of the one block being redone.
        The price is a second forward pass through every block, roughly a third more arithmetic per step.
        Hugging Face models switch it on with `model.gradient_checkpointing_enable()`; memlab does that for
        you and switches it back off afterwards.
        """,
        imports=("import copy", "import plotly.graph_objects as go", "from plotly.subplots import make_subplots"),
    ),
    md(
        """
        ## Memory against time, at three batch sizes
        """
    ),
    code(
        """
        sizes = sorted({max(1, rows // 2), rows, 2 * rows})
        plans = [memlab.Plan(micro_batch=k, checkpointing=on) for k in sizes for on in (False, True)]
        report = memlab.compare(model, batch, plans, steps=steps, noise=noise)
        report
        """
    ),
    code("report.plot()"),
    code(
        """
        fig = make_subplots(rows=1, cols=2, subplot_titles=("activations at the peak", "time per step"))
        for on, color in ((False, "#4C78A8"), (True, "#E45756")):
            trials = [t for t in report if t.plan.checkpointing == on]
            name = "checkpointing" if on else "plain"
            fig.add_trace(go.Scatter(x=sizes, y=[t.breakdown["activations"] / 2**20 for t in trials], name=name,
                                     mode="lines+markers", line_color=color), row=1, col=1)
            fig.add_trace(go.Scatter(x=sizes, y=[t.step_time_s * 1000 for t in trials], name=name, showlegend=False,
                                     mode="lines+markers", line_color=color), row=1, col=2)
        fig.update_xaxes(title_text="rows per step")
        fig.update_yaxes(title_text="MiB", rangemode="tozero", row=1, col=1)
        fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=2)
        fig
        """
    ),
    code(
        """
        for k in sizes:
            off, on = (t for t in report if t.plan.micro_batch == k)
            print(f"{k:3} rows: checkpointing keeps {on.breakdown['activations'] / off.breakdown['activations']:4.0%} "
                  f"of the activations and takes {on.step_time_s / off.step_time_s:4.0%} of the time")
        """
    ),
    md(
        """
        On tiny models a step is dominated by overheads, so the time ratio is noisy; the memory ratio is the
        dependable part. The bigger the model and batch, the closer the extra time gets to one more forward.

        ## Seeing the recomputation

        A hook on the first block's MLP counts how often it starts during one training step. (A hook at the
        *end* of the MLP would miss the second run: PyTorch stops recomputing as soon as it has every tensor
        backward asked for.)
        """
    ),
    code(
        """
        twin = copy.deepcopy(model)  # apply trains for real; keep the notebook's model as it is
        calls = []
        hook = twin.model.layers[0].mlp.register_forward_pre_hook(lambda module, args: calls.append(1))
        for on in (False, True):
            calls.clear()
            with memlab.apply(twin, memlab.Plan(checkpointing=on)) as applied:
                applied.step(batch)
            print(f"checkpointing={on}: the first block's MLP ran {len(calls)} time(s) in one step")
        hook.remove()
        del twin
        """
    ),
    *exercise(
        """
        Checkpointing and accumulation both cut activations. For your batch, which gives the lower peak at the
        same rows per step, `Plan(micro_batch=rows // 2, accumulation=2)` or `Plan(checkpointing=True)`? Which
        is faster? What do you get with both?
        """,
        """
        half = max(1, rows // 2)
        options = [
            memlab.Plan(micro_batch=half, accumulation=rows // half),
            memlab.Plan(checkpointing=True),
            memlab.Plan(micro_batch=half, accumulation=rows // half, checkpointing=True),
        ]
        both = memlab.compare(model, batch, options, steps=1, noise=noise)
        for t in both:
            print(f"{t.label:12} peak {human(t.peak_bytes):>10}  {t.samples_per_s:8.1f} samples/s")
        """,
    ),
]


# --- 03 mixed precision ---------------------------------------------------------------------------------------

NB03 = [
    *start(
        "# 03 · Mixed precision: fp16 and bf16",
        """
        Under `torch.autocast`, matrix multiplications and most layers run in a 16-bit type, while the weights
        themselves stay fp32 ("master weights"), so that small updates are not rounded away. There are two
        16-bit types:

        - **fp16** has 5 exponent bits: numbers below about 6e-8 become zero. Gradients are often that small,
          so the loss is multiplied by a large factor before backward and the gradients divided by it before
          the optimizer step. A `GradScaler` picks the factor as it goes: it halves it (and skips the step)
          when a gradient overflows, and raises it again after a run of clean steps.
        - **bf16** keeps fp32's 8 exponent bits and drops mantissa bits instead: the same range as fp32, less
          precision, no scaling needed.

        Memory: tensors saved for backward are 16-bit, so activations shrink. Weights, gradients and optimizer
        state stay fp32, so those bars do not. Speed is a matter of hardware, as the measurement shows.
        """,
    ),
    md("## Small numbers in each type"),
    code(
        """
        small = torch.tensor([1e-3, 1e-5, 1e-7, 1e-9])
        print("fp32:              ", small.tolist())
        print("fp16:              ", small.half().float().tolist())
        print("bf16:              ", small.bfloat16().float().tolist())
        scale = 2.0**16
        print("fp16, scaled first:", ((small * scale).half().float() / scale).tolist())
        """
    ),
    md(
        """
        fp16 loses the smallest values entirely (and rounds the next ones coarsely); scaled by 2^16 first, they
        survive. bf16 keeps them all, with two to three significant digits.

        ## fp32, bf16 and fp16 on this device
        """
    ),
    code(
        """
        plans = [memlab.Plan(precision=p) for p in ("fp32", "bf16", "fp16")]
        report = memlab.compare(model, batch, plans, steps=steps, noise=noise)
        report
        """
    ),
    code("report.plot()"),
    code(
        """
        fp32 = report[0]
        for t in report:
            if t.status != "ok":
                print(f"{t.plan.precision:5} {t.status}: {t.error}")
                continue
            print(f"{t.plan.precision:5} activations {human(t.breakdown['activations']):>10}, "
                  f"speed {t.samples_per_s / fp32.samples_per_s:6.0%} of fp32", *t.notes)
        if device == "cpu":
            print("CPU instruction set PyTorch uses:", torch.backends.cpu.get_cpu_capability())
        """
    ),
    md(
        """
        **Why fp16 is slow on a CPU.** GPUs have matrix units built for fp16 and bf16. Most CPUs have no fast
        fp16 arithmetic: the work goes through conversions to and from fp32 or through slow fallback kernels,
        which only adds time, and the note memlab attaches to the trial says so. bf16 is different on recent
        x86 server CPUs (AVX512-BF16, AMX), which have bf16 dot-product instructions; on older ones it is slow
        too. The speeds above are this machine's answer. On a GPU with tensor cores, both 16-bit types are
        usually much faster than fp32.

        The master weights really do stay fp32:
        """
    ),
    code(
        """
        half = "bf16" if report[1].status == "ok" else "fp16"  # older GPUs have no bf16
        with memlab.apply(model, memlab.Plan(precision=half)) as applied:
            applied.step(batch)  # one real training step
            print(f"weight dtypes during {half} training:", {str(p.dtype) for p in model.parameters()})
        """
    ),
    *exercise(
        """
        Which categories did bf16 shrink compared with fp32, and which stayed the same? Explain each with the
        list at the top. Then: what would change if the weights themselves were stored in bf16 (pure bf16
        training, no fp32 master copy)?
        """,
        """
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
        """,
    ),
]


# --- 04 8-bit Adam --------------------------------------------------------------------------------------------

NB04 = [
    *start(
        "# 04 · 8-bit Adam",
        """
        AdamW keeps two fp32 numbers per weight, a running mean of the gradient and of its square: 8 bytes per
        parameter, twice the weights themselves. bitsandbytes' `AdamW8bit` stores both in 8 bits. To keep them
        accurate, it quantizes in blocks of 256 values, each block with its own scale, so one large value only
        coarsens its own block. The update itself is still computed in fp32.

        That is 2 bytes per parameter instead of 8, a quarter. bitsandbytes keeps tensors with fewer than
        4096 elements (biases, norms) in fp32, where the saving would be tiny anyway. The question is whether
        training still behaves the same: a short run answers it.
        """,
        imports=("import copy", "import plotly.graph_objects as go"),
        extra_parameters="""
        curve_steps = 30   # optimizer steps in the loss-curve run
        lr = 1e-3          # learning rate of that run
        """,
    ),
    md("## The optimizer state, measured"),
    code(
        """
        plans = [memlab.Plan(), memlab.Plan(optimizer="adamw8bit")]
        report = memlab.compare(model, batch, plans, steps=steps, noise=noise)
        report
        """
    ),
    code("report.plot()"),
    code(
        """
        adamw, eight_bit = report
        big = sum(p.numel() for p in model.parameters() if p.numel() >= 4096)
        expected = (2 * big + 8 * (n_params - big)) / (8 * n_params)
        print(f"AdamW state:      {human(adamw.breakdown['optimizer'])}")
        print(f"AdamW8bit state:  {human(eight_bit.breakdown['optimizer'])}")
        print(f"ratio {eight_bit.breakdown['optimizer'] / adamw.breakdown['optimizer']:.2f}; "
              f"{big / n_params:.0%} of the parameters are in tensors big enough for 8 bits, "
              f"which predicts {expected:.2f} (plus a little for the block scales)")
        """
    ),
    md(
        """
        ## Does it train the same?

        Two copies of the model, the same batch, the same learning rate: one with AdamW, one with AdamW8bit.
        `applied.step(batch)` does one optimizer step and returns the loss. On a single repeated batch the
        model memorizes it, so the loss falls quickly; what matters is whether the two curves agree.
        """
    ),
    code(
        """
        def train(optimizer):
            twin = copy.deepcopy(model)
            with memlab.apply(twin, memlab.Plan(optimizer=optimizer), lr=lr) as applied:
                return [applied.step(batch) for _ in range(curve_steps)]


        curves = {name: train(name) for name in ("adamw", "adamw8bit")}
        fig = go.Figure([go.Scatter(y=losses, name=name, mode="lines+markers") for name, losses in curves.items()])
        fig.update_layout(title="AdamW against AdamW8bit", xaxis_title="optimizer step", yaxis_title="loss")
        fig
        """
    ),
    code(
        """
        for name, losses in curves.items():
            print(f"{name:10} loss {losses[0]:.3f} -> {losses[-1]:.3f}")
        """
    ),
    *exercise(
        """
        Which tensors of this model keep fp32 state, and what share of the parameters do they hold? Then
        predict the saving for other shapes, such as the tiny one the tests use (hidden 32, vocab 128) and a
        7B-like one. (Models built on the `meta` device have shapes but no memory, so this costs nothing.)
        """,
        """
        small = {name: p.numel() for name, p in model.named_parameters() if p.numel() < 4096}
        print(f"{len(small)} tensors keep fp32 state, {sum(small.values()) / n_params:.2%} of the parameters:")
        print(sorted(small)[:4], "...")
        for width, words in ((32, 128), (128, 4096), (1024, 32000), (4096, 32000)):
            shape = LlamaConfig(
                **{**config.to_dict(), "hidden_size": width, "intermediate_size": 4 * width, "vocab_size": words}
            )
            with torch.device("meta"):
                shell = AutoModelForCausalLM.from_config(shape)
            sizes = [p.numel() for p in shell.parameters()]
            share = sum(s for s in sizes if s >= 4096) / sum(sizes)
            ratio = (2 * share + 8 * (1 - share)) / 8
            print(f"hidden={width:5} vocab={words:6}: {share:7.2%} of parameters get 8-bit state; ratio {ratio:.2f}")
        # Only the norm weights (one vector of `hidden` numbers each) stay fp32 in a model of any real size.
        """,
    ),
]


# --- 05 offload -----------------------------------------------------------------------------------------------

NB05 = [
    *start(
        "# 05 · Offload to CPU memory",
        """
        Offload trades GPU memory for traffic over the link between CPU and GPU (PCIe, or NVLink-C2C on some
        machines):

        - `offload="optimizer"`: AdamW's state and an fp32 copy of the weights live in (pinned) CPU memory and
          the update runs on the CPU. Each step the gradients travel to the CPU and the new weights travel back.
        - `offload="activations"`: tensors that forward saves for backward are copied to pinned CPU memory as
          they are made and copied back when backward needs them (`torch.autograd.graph.save_on_cpu`).
        - `offload="all"`: both.

        Without a GPU everything already lives in CPU memory, so there is nothing to move. memlab then runs
        the plan unchanged and attaches a note that says so, rather than reporting a saving that does not exist.
        """,
        extra_parameters="""
        link_gb_per_s = 16   # CPU-GPU link in GB/s (PCIe 4.0 x16 is rated ~32 each way; real copies get less)
        """,
    ),
    md("## The four settings on this device"),
    code(
        """
        plans = [memlab.Plan(offload=where) for where in ("none", "optimizer", "activations", "all")]
        report = memlab.compare(model, batch, plans, steps=steps, noise=noise)
        report
        """
    ),
    code("report.plot()"),
    code(
        """
        for t in report:
            print(f"{t.label:22} peak {human(t.peak_bytes):>10}  {t.samples_per_s:8.1f} samples/s  ", *t.notes)
        """
    ),
    md(
        """
        On a GPU the `optimizer` bar shrinks with optimizer offload, and the `activations` bar with activation
        offload, while the steps get slower by the time the copies take (unless they hide behind compute).

        ## When it pays

        Per step, optimizer offload moves the fp32 gradients down and the fp32 weights back up; activation
        offload moves the saved activations down and back. From the plain plan's numbers and the link speed in
        the parameters cell:
        """
    ),
    code(
        """
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
        """
    ),
    md(
        """
        The traffic for optimizer offload grows with the parameters, not with the batch; a larger batch makes
        each step longer, so the same copy time weighs less. Offload pays when:

        1. without it the plan does not fit, and the other remedies (accumulation, checkpointing, bf16, 8-bit
           Adam) are already on or cost more time than the copies;
        2. the copy time is small next to a step, or overlaps with it;
        3. the CPU is fast enough for the update (for optimizer offload it does AdamW over every parameter).

        It rarely pays for a model that fits once the cheaper techniques are on.
        """
    ),
    *exercise(
        """
        Offload and 8-bit Adam both go after the optimizer state. With the numbers above, how much does each
        free, and which costs less time? Measure `Plan(offload="optimizer")` against `Plan(optimizer="adamw8bit")`
        (on a CPU, offload will report no change; on a GPU you get the real trade).
        """,
        """
        pair = [memlab.Plan(offload="optimizer"), memlab.Plan(optimizer="adamw8bit")]
        pair = memlab.compare(model, batch, pair, steps=1, noise=noise)
        for t in pair:
            print(f"{t.label:20} optimizer {human(t.breakdown['optimizer']):>10}  peak {human(t.peak_bytes):>10}  "
                  f"{t.samples_per_s:8.1f} samples/s", *t.notes)
        """,
    ),
]


# --- 06 %%memfit and the panel --------------------------------------------------------------------------------

NB06 = [
    *start(
        "# 06 · `%%memfit` and the panel: the fastest plan that fits",
        """
        The earlier notebooks turned one technique on at a time. In practice you have a memory budget and the
        number of rows you want per optimizer step, and want the fastest combination that fits. memlab
        searches for it on the live model, three ways: the `%%memfit` cell magic, `memlab.fit` in Python,
        and a widget panel to try settings by hand. Then the winner goes onto the model, or into the
        Hugging Face `Trainer`.
        """,
        extra_parameters="""
        budget_fraction = 0.8   # the budget, as a share of what plain training peaks at
        """,
    ),
    md(
        """
        ## Compare chosen plans with `%%memfit`

        `%load_ext memlab` registers the magic. `%%memfit MODEL BATCH --try KEY=V1,V2 ...` measures every
        combination of the values; the cell body is the loss (leave it empty for `model(**batch).loss`). The
        figure fills in while the plans run. `%%memfit?` shows every option.
        """
    ),
    code("%load_ext memlab"),
    code(
        """
        %%memfit model batch --try precision=fp32,bf16 checkpointing=off,on --steps $steps --noise $noise
        loss = model(**batch).loss
        """
    ),
    md(
        """
        `--quiet` leaves out the live figure. The magic returns a `memlab.Report` either way, so `_` picks it up
        in the next cell.
        """
    ),
    code(
        """
        %%memfit model batch --try optimizer=adamw,adamw8bit --steps $steps --noise $noise --quiet
        """
    ),
    code(
        """
        tried = _
        print("fastest of these:", tried.best.label)
        """
    ),
    md(
        """
        ## Search within a budget: `memlab.fit`

        We set the budget below what plain training needs, so plain training will not do. `fit` keeps the
        rows per optimizer step fixed (`batch_size`) and searches micro-batch sizes with accumulation,
        checkpointing, precision, the optimizer and (on a GPU) offload. It measures the plans most likely to
        win first, and skips those that its measurements show cannot fit or cannot be faster. On a CPU the
        budget is enforced by memlab's own accounting, and going over it counts as out of memory.
        """
    ),
    code(
        """
        plain = memlab.measure(model, batch, memlab.Plan(), steps=steps, noise=noise)
        budget = int(budget_fraction * plain.peak_bytes)
        print(f"plain training peaks at {human(plain.peak_bytes)}; the budget is {human(budget)}")
        """
    ),
    code(
        """
        report = memlab.fit(model, batch, budget=budget, batch_size=rows, steps=steps, noise=noise)
        report
        """
    ),
    code("report.plot()"),
    md(
        """
        ## Apply it

        `memlab.apply` puts the best plan on the model; `step` trains one effective batch; `undo` takes the
        techniques off again (the weights keep what they learned).
        """
    ),
    code(
        """
        best = report.best
        print("best plan:", best.plan)
        applied = memlab.apply(model, best.plan)
        losses = [applied.step(batch) for _ in range(3)]
        applied.undo()
        print("losses:", [round(loss, 3) for loss in losses])
        """
    ),
    md(
        """
        The magic does the search and the apply in one cell: with `--budget` and `--batch-size` it searches
        like `fit`, and `--apply` leaves the result on the model as `memfit_applied`:

        ```
        %%memfit model batch --budget 8GiB --batch-size 32 --apply
        ```

        ## The panel

        `memlab.panel(model, batch)` gives one control per technique, a Run button that measures the current
        setting and adds it to the figure and the table, and Apply/Undo buttons. `panel.report` holds every
        run so far. (The panel needs a running kernel; a static copy of the notebook shows no panel.)
        """
    ),
    code(
        """
        board = memlab.panel(model, batch)
        board
        """
    ),
    code(
        """
        board.report  # press Run a few times above, then run this cell again
        """
    ),
    md(
        """
        ## Take the plan to the Trainer

        A plan translates into `TrainingArguments` keywords: the micro-batch becomes
        `per_device_train_batch_size`, accumulation `gradient_accumulation_steps`, and so on.
        """
    ),
    code(
        """
        kwargs = best.plan.to_training_arguments()
        kwargs.setdefault("per_device_train_batch_size", rows)  # micro_batch=None: all rows of the batch
        kwargs
        """
    ),
    code(
        """
        from transformers import TrainingArguments

        args = TrainingArguments(output_dir="memlab-out", report_to="none", use_cpu=device == "cpu", **kwargs)
        print(f"micro-batch {args.per_device_train_batch_size}, accumulation {args.gradient_accumulation_steps},")
        print(f"bf16={args.bf16}, fp16={args.fp16}, optim={args.optim}")
        # then: Trainer(model=model, args=args, train_dataset=...).train()
        """
    ),
    md("Without the Trainer, `best.plan.to_code()` writes the same plan as a plain PyTorch loop:"),
    code("print(best.plan.to_code())"),
    *exercise(
        """
        Halve the budget and search again in one cell with the magic, applying the result. Does anything still
        fit? If so, what did the search give up to get there? Undo it afterwards.
        """,
        """
        half = budget // 2
        %memfit model batch --budget {half}B --batch-size $rows --steps 1 --noise $noise --quiet --apply
        if "memfit_applied" in globals():
            print("applied:", memfit_applied.plan.label())
            memfit_applied.undo()
        """,
    ),
]


# --- 07 will a 7B model fit? ----------------------------------------------------------------------------------

NB07 = [
    md(
        """
        # 07 · Will a 7B model fit?

        Before renting a GPU, it helps to know whether training will fit on it. memlab can run one training
        step on *fake* tensors: they carry shapes and dtypes but no data, so the step allocates nothing and
        computes nothing, while memlab counts every byte a real step would hold. A laptop without a GPU can
        dry-run a 7-billion-parameter model this way in under a minute.

        The question here: can one 24 GiB GPU fully fine-tune a Llama-shaped 7B model on 512-token rows?
        """
    ),
    setup(),
    code(
        """
        # The shape of Llama 2 7B. The tests shrink it; leave it as it is to ask the real question.
        hidden = 4096
        layers = 32
        heads = 32
        intermediate = 11008
        vocab = 32000
        seq_len = 512
        budget = "24GiB"
        """,
        tags=("parameters",),
    ),
    code(
        """
        # With internet, read a real model's config instead (no weights are downloaded):
        #   config = transformers.AutoConfig.from_pretrained("meta-llama/Llama-2-7b-hf")
        config = LlamaConfig(
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            vocab_size=vocab,
        )
        with torch.device("meta"):  # shapes only: no memory
            shell = AutoModelForCausalLM.from_config(config)
        n_params = sum(p.numel() for p in shell.parameters())
        del shell
        print(f"{n_params:,} parameters ({n_params / 1e9:.2f} billion)")
        """
    ),
    md(
        """
        ## The arithmetic first

        Before any activation, full training holds weights, gradients and optimizer state. Per parameter:
        """
    ),
    code(
        """
        per_parameter = {
            "fp32 weights, fp32 grads, AdamW": 4 + 4 + 8,
            "bf16 autocast (fp32 master weights), AdamW": 4 + 4 + 8,
            "fp32 weights, fp32 grads, AdamW8bit": 4 + 4 + 2,
        }
        limit = memlab.parse_budget(budget)
        for setup_name, nbytes in per_parameter.items():
            print(f"{setup_name:45} {nbytes:2} bytes/param = {nbytes * n_params / 2**30:6.1f} GiB "
                  f"({nbytes * n_params / limit:.1f}x the budget)")
        """
    ),
    md(
        """
        Mixed precision does not change this line: it saves activations, not model state. The dry run adds
        what the arithmetic leaves out: activations, temporary buffers, and the moment when they all peak
        together.

        ## The dry run

        `memlab.estimate` takes a config (or a model) and a batch given as shapes. `device="cuda"` asks about a
        GPU even on a machine without one: the fake step runs the CPU's kernels but keeps what CUDA's would
        (its attention backends, autocast dtypes, dropout masks and AdamW update), for the GPU kind `gpu=`
        names (an 80 GB H100 by default). Made on a CPU this way, the estimates of every step measured on an
        H100 so far are within 5% of its peak (the README's benchmarks list them). The notes say what was
        assumed.
        """
    ),
    code(
        """
        shapes = {"input_ids": (1, seq_len), "labels": (1, seq_len)}
        plan = memlab.Plan(precision="bf16", checkpointing=True)
        estimate = memlab.estimate(config, shapes, plan, budget=budget, device="cuda")
        estimate
        """
    ),
    code(
        """
        for note in estimate.notes:
            print("-", note)
        print(f"allocated peak {estimate.peak_bytes / 2**30:.1f} GiB; the budget judges the "
              f"{estimate.verdict_figure}, {estimate.verdict_bytes / 2**30:.1f} GiB")
        """
    ),
    md(
        """
        Read the breakdown with the moment of the peak in mind. With checkpointing, activations are small,
        and the peak often falls in the optimizer step instead: gradients and AdamW's state are all there.
        memlab's AdamW is fused, as the Trainer builds it. A plain loop's `torch.optim.AdamW(params)` runs the
        foreach update on a GPU, which holds a temporary as large as the weights (counted under `other`): ask
        for `optimizer="adamw_foreach"` to estimate that loop as it is.

        The peak is what tensors hold (`max_memory_allocated`). The card shows more: the caching allocator's
        reserve and the CUDA context. `card_bytes` models both, and a budget is judged on it.
        """
    ),
    md("## Which plans fit in the budget?"),
    code(
        """
        plans = [
            memlab.Plan(),
            memlab.Plan(precision="bf16", checkpointing=True),
            memlab.Plan(precision="bf16", checkpointing=True, optimizer="adamw8bit"),
        ]
        report = memlab.Report([memlab.estimate(config, shapes, p, budget=budget, device="cuda") for p in plans],
                               budget=limit)
        report
        """
    ),
    code("report.plot()"),
    code(
        """
        fitting = [t.label for t in report if report.fits(t)]
        smallest = min(report, key=lambda t: t.peak_bytes)
        print(f"fits in {budget}:", ", ".join(fitting) or "none of these plans")
        print(f"smallest peak: {smallest.label}, {smallest.peak_bytes / 2**30:.1f} GiB")
        """
    ),
    md(
        """
        If none fits, full fine-tuning at this size needs more than these techniques. The usual next step is to
        freeze the weights and train small adapters (LoRA; notebook 08): frozen weights need no gradients or
        optimizer state, and QLoRA stores them in 4 bits. The estimate covers both: peft's adapters and the
        4-bit weights' bytes, still on fake tensors. (Other ways out: shard the model state across several GPUs,
        ZeRO or FSDP, or offload the optimizer state to CPU memory, notebook 05.)

        ## What LoRA and QLoRA change
        """
    ),
    code(
        """
        tuned = [
            memlab.Plan(precision="bf16", checkpointing=True),
            memlab.Plan(precision="bf16", checkpointing=True, adapter="lora"),
            memlab.Plan(precision="bf16", checkpointing=True, adapter="qlora"),
        ]
        adapters = memlab.Report(
            [memlab.estimate(config, shapes, p, budget=budget, device="cuda") for p in tuned], budget=limit
        )
        for trial in adapters:
            parts = ", ".join(f"{k} {trial.breakdown[k] / 2**30:.1f}" for k in ("params", "grads", "optimizer"))
            print(f"{trial.label:22} peak {trial.peak_bytes / 2**30:6.1f} GiB ({parts} GiB)")
        """
    ),
    *exercise(
        """
        Which of these GPUs would the smallest plan above fit on, judged by what each card will show
        (`card_bytes`: the allocator's reserve and that GPU's CUDA context; where the reserve is not known,
        the allocated peak, and `verdict_figure` says which)? Then change `seq_len` in the parameters cell to
        2048 and run again: which categories grow?
        """,
        """
        for gpu, gib in (("L4-24GB", 24), ("A100-40GB", 40), ("L40S-48GB", 48), ("H100-80GB", 80)):
            trial = memlab.estimate(config, shapes, smallest.plan, budget=f"{gib}GiB", device="cuda", gpu=gpu)
            verdict = "fits" if trial.fits else "does not fit"
            figure = f"{trial.verdict_figure} {trial.verdict_bytes / 2**30:5.1f} GiB"
            print(f"{gpu:10} {smallest.label}: {figure}, {verdict}")
        """,
    ),
]


# --- 08 LoRA and QLoRA ---------------------------------------------------------------------------------------

NB08 = [
    *start(
        "# 08 · LoRA, QLoRA and pure bf16",
        """
        A full fine-tune trains every weight, so every weight needs a gradient and AdamW's two moments: 16 bytes per
        parameter in fp32, about 112 GB for a 7B model before a single activation. Three levers change what is
        trained and how it is stored:

        | lever | what changes | bytes per base parameter |
        |---|---|---|
        | `weights="bf16"` | weights, gradients and optimizer state in bf16, no fp32 copy | 8 |
        | `adapter="lora"` | the base is frozen; small adapters (peft) train beside each linear layer | 4 (frozen) |
        | `adapter="qlora"` | as LoRA, with the frozen linear weights in 4-bit NF4 (bitsandbytes) | about 0.5 |

        LoRA adds, next to a linear layer `W` (d_out x d_in), two thin matrices `B` (d_out x r) and `A` (r x d_in)
        and trains only those: r x (d_in + d_out) numbers instead of d_in x d_out. memlab puts the adapters on
        the live model for a trial and takes them off again: your model comes back exactly as it was.
        """,
        imports=("import copy", "import plotly.graph_objects as go"),
        extra_parameters="""
        rank = 8           # LoRA rank
        curve_steps = 20   # optimizer steps in the loss-curve run
        lr = 1e-3          # learning rate of that run
        """,
    ),
    md("## Four ways to train the same model, measured"),
    code(
        """
        plans = [
            memlab.Plan(),
            memlab.Plan(weights="bf16"),
            memlab.Plan(adapter="lora", lora_rank=rank),
            memlab.Plan(adapter="qlora", lora_rank=rank),
        ]
        report = memlab.compare(model, batch, plans, steps=steps, noise=noise)
        report
        """
    ),
    code("report.plot()"),
    code(
        """
        full, bf16, lora, qlora = report
        for trial in report:
            trained = trial.breakdown["grads"] + trial.breakdown["optimizer"]
            print(f"{trial.label:14} weights {human(trial.breakdown['params']):>12}   "
                  f"optimizer state {human(trial.breakdown['optimizer']):>12}")
        trainable = sum(
            rank * (m.in_features + m.out_features)
            for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and m is not model.get_output_embeddings()
        )
        print(f"LoRA trains {trainable:,} numbers, {trainable / n_params:.1%} of the model's {n_params:,}")
        """
    ),
    md(
        """
        On a model this small the embedding and the output head (which get no adapter and are not quantized)
        are a large share of the weights; on a 7B model the linear layers hold almost all of them, and QLoRA's
        weights come close to an eighth of fp32.

        ## Does a LoRA model learn?

        `memlab.apply` puts the plan on a copy of the model for real training. Only the adapters are in the
        optimizer; the loss on a repeated batch still falls. `undo` asks what to do with trained adapters:
        `adapter="merge"` adds them into the base weights, `"keep"` leaves them on the model, `"discard"` drops
        them (a plain `undo()` merges them, and says so: nothing trained is lost silently).
        """
    ),
    code(
        """
        def train(plan):
            twin = copy.deepcopy(model)
            with memlab.apply(twin, plan, lr=lr) as applied:
                names = {id(p): n for n, p in twin.named_parameters()}
                trained = [names[id(p)] for g in applied.optimizer.param_groups for p in g["params"]]
                losses = [applied.step(batch) for _ in range(curve_steps)]
                applied.undo(adapter="discard")  # the twin is thrown away, its trained adapters with it
            return trained, losses


        curves = {}
        for plan in (memlab.Plan(), memlab.Plan(adapter="lora", lora_rank=rank)):
            trained, curves[plan.label()] = train(plan)
            print(f"{plan.label():8} trains {len(trained)} tensors, e.g. {trained[0]}")
        fig = go.Figure([go.Scatter(y=losses, name=name, mode="lines+markers") for name, losses in curves.items()])
        fig.update_layout(title="Full fine-tune against LoRA", xaxis_title="optimizer step", yaxis_title="loss")
        fig
        """
    ),
    md(
        """
        To train this way outside memlab, `plan.to_code()` writes the lines (peft's `get_peft_model`, and for
        QLoRA the `BitsAndBytesConfig` to load the model with), and `plan.to_peft_config()` gives the
        `LoraConfig` itself.
        """
    ),
    code('print(memlab.Plan(adapter="qlora", lora_rank=rank, precision="bf16").to_code()[:900])'),
    *exercise(
        """
        How does the optimizer state grow with the rank? Measure LoRA at ranks 2, 8 and 32 and compare the
        optimizer bytes with the count `2 x 4 bytes x rank x (d_in + d_out)` summed over the linear layers.
        """,
        """
        ranks = [2, 8, 32]
        plans = [memlab.Plan(adapter="lora", lora_rank=r) for r in ranks]
        sweep = memlab.compare(model, batch, plans, steps=1, noise=noise)
        linears = [
            m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not model.get_output_embeddings()
        ]
        for r, trial in zip(ranks, sweep):
            counted = sum(8 * r * (m.in_features + m.out_features) for m in linears)
            print(f"rank {r:3}: optimizer {human(trial.breakdown['optimizer']):>12}, counted {human(counted):>12}")
        # The optimizer bytes grow in proportion to the rank (plus AdamW's step counters, a few bytes per tensor).
        """,
    ),
]


# --- 09 optimizers and the loss -----------------------------------------------------------------------------------

NB09 = [
    *start(
        "# 09 · Optimizers and the loss: Adafactor, 8-bit, paged, fused, chunked cross-entropy",
        """
        Two parts of a training step's memory do not depend on the activations' tricks: the optimizer's state,
        which lives as long as training does, and the loss's logits, one number per token and per word of the
        vocabulary. Five levers act on them:

        | lever | what it keeps | bytes per trained parameter |
        |---|---|---|
        | `optimizer="adamw"` | two fp32 moments; built as the Trainer builds it, with torch's fused update | 8 |
        | `optimizer="adamw8bit"` | the two moments in 8 bits, in blocks with their own scale (bitsandbytes) | about 2 |
        | `optimizer="paged_adamw8bit"` | the same, in CUDA memory the driver pages out to the CPU | about 2 |
        | `optimizer="adafactor"` | per matrix, a row and a column of second moments, no first moment | near 0 |
        | `loss="chunked"` | head and cross-entropy by chunks of tokens: one chunk's logits at once | (activations) |

        Adafactor's updates are not Adam's, so it changes how the model trains (memlab's search tries it only
        when asked); the 8-bit moments cost a little accuracy; the chunked loss computes the very same loss and
        gradients, and pays by running the LM head twice.
        """,
        imports=("import copy",),
        extra_parameters="""
        big_vocab = 32768   # vocabulary of the chunked-loss experiment (Llama 3 has 128256 words)
        """,
    ),
    md("## Four optimizers, measured"),
    code(
        """
        optimizers = ["adamw", "adamw8bit", "paged_adamw8bit", "adafactor"]
        plans = [memlab.Plan(optimizer=name) for name in optimizers]
        report = memlab.compare(model, batch, plans, steps=steps, noise=noise)
        report
        """
    ),
    code("report.plot()"),
    code(
        """
        for trial in report:
            state = trial.breakdown["optimizer"]
            print(f"{trial.label:16} optimizer state {human(state):>12} = {state / n_params:5.2f} bytes per parameter")
            for note in trial.notes:
                print("   note:", note)
        """
    ),
    md(
        """
        On a CPU the paged optimizer is the unpaged one (paging is a CUDA feature), and its trial's notes say so.
        On a GPU, bitsandbytes keeps the large states of a paged optimizer in unified memory, outside PyTorch's
        allocator: the driver moves them to CPU memory when the GPU runs short, instead of failing.

        ## Fused AdamW

        `optimizer="adamw"` is `torch.optim.AdamW(..., fused=True)`, what the Trainer builds by default
        (`optim="adamw_torch_fused"`). Fused means one kernel updates every weight: no temporary tensors the size
        of the weights, as the older "foreach" update makes while it runs.
        """
    ),
    code(
        """
        with memlab.apply(copy.deepcopy(model), memlab.Plan()) as applied:
            print(type(applied.optimizer).__name__, "fused:", applied.optimizer.defaults["fused"])
        print(memlab.Plan(optimizer="adafactor").to_training_arguments()["optim"])
        """
    ),
    md(
        """
        ## Chunked cross-entropy

        The loss needs logits: `tokens x vocabulary` numbers, upcast to fp32, kept for backward together with their
        log-softmax. With a large vocabulary they are most of the activations. `loss="chunked"` runs the model up to
        its last hidden states, then the head and the cross-entropy on a few tokens at a time, each chunk under
        `torch.utils.checkpoint`, so that backward recomputes one chunk's logits instead of keeping them all.
        The model below has the same body and a `big_vocab`-word vocabulary.
        """
    ),
    code(
        """
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
        """
    ),
    code(
        """
        # The same loss: one step of each, from the same weights.
        for plan in (memlab.Plan(), memlab.Plan(loss="chunked")):
            with memlab.apply(copy.deepcopy(big), plan) as applied:
                print(f"{plan.label():13} loss {applied.step(big_batch):.6f}")
        """
    ),
    md(
        """
        The chunked loss needs a causal LM with an LM head and the default loss (`model(**batch).loss`, with
        labels in the batch); elsewhere memlab refuses it with a message that says what to write. With the Trainer,
        `plan.to_training_arguments()` turns it into Liger Kernel's fused linear cross-entropy (`pip install
        liger-kernel`, on a GPU); `plan.to_code()` writes the chunked loss out in plain PyTorch.
        """
    ),
    *exercise(
        """
        Adafactor keeps, for a weight matrix of `d_out x d_in`, `d_out + d_in` fp32 numbers (and for a vector, the
        vector's size), plus one 4-byte RMS per tensor. Count that for `model` and compare it with the optimizer
        bytes measured above. How much smaller than AdamW's is it, and why does the ratio shrink as `hidden` grows?
        """,
        """
        counted = 0
        for p in model.parameters():
            counted += 4 * (p.shape[0] + p.shape[1]) if p.dim() == 2 else 4 * p.numel()
            counted += 4
        adamw, adafactor = report[0], report[3]
        print(f"counted {human(counted)}, measured {human(adafactor.breakdown['optimizer'])}")
        print(f"Adafactor keeps {adafactor.breakdown['optimizer'] / adamw.breakdown['optimizer']:.1%} of AdamW's state")
        # A d x d matrix keeps 2d numbers instead of AdamW's 2 d^2: the ratio falls as 1 / d.
        """,
    ),
]


# --- 10 when one GPU is not enough -----------------------------------------------------------------------------

NB10 = [
    md(
        """
        # 10 · When one GPU is not enough

        Fully fine-tuning an 8-billion-parameter model with AdamW holds about 16 bytes per parameter before a
        single activation: some 120 GiB, more than the 80 GiB of the largest common GPU. No lever of notebooks
        01-09 brings that under 80 GiB without changing what is trained. The way out is to spread the model state
        over several GPUs:

        | strategy | what each of N GPUs keeps | engine |
        |---|---|---|
        | **FSDP2** | 1/N of weights, grads, optimizer state; one block whole while it runs | PyTorch, accelerate |
        | **ZeRO-2** | all the 16-bit weights; 1/N of the gradients and optimizer state | DeepSpeed |
        | **ZeRO-3** | 1/N of everything; one layer's full weights while it runs | DeepSpeed |

        Each GPU still holds the activations of its own micro-batch: sharding divides the model state, not the
        activations. memlab answers, on fake tensors and without any GPU, how much each GPU will hold, how many
        GPUs each strategy needs, and writes the accelerate config that runs the plan.
        """
    ),
    setup("import yaml"),
    code(
        """
        # The shape of Llama 3.1 8B. The tests shrink it; leave it as it is to ask the real question.
        hidden = 4096
        layers = 32
        heads = 32
        kv_heads = 8
        intermediate = 14336
        vocab = 128256
        seq_len = 2048     # tokens per row; each GPU trains one row per micro-step
        budget = "80GiB"   # memory of one GPU (an H100 or A100 80GB)
        gpus = 8           # GPUs in the machine
        """,
        tags=("parameters",),
    ),
    md(
        """
        ## The model, on the meta device

        A model built on the `meta` device has every parameter's shape and dtype but no memory, so an 8B model
        costs nothing here. memlab's dry runs copy it onto fake tensors.
        """
    ),
    code(
        """
        # With internet, read the real config instead (no weights are downloaded):
        #   config = transformers.AutoConfig.from_pretrained("meta-llama/Llama-3.1-8B")
        # To train for real later, on the GPUs, load the weights as usual:
        #   model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", torch_dtype=torch.float32)
        config = LlamaConfig(
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            vocab_size=vocab,
            use_cache=False,
        )
        with torch.device("meta"):  # shapes only: no memory
            model = AutoModelForCausalLM.from_config(config)
        n_params = sum(p.numel() for p in model.parameters())

        # One row per GPU. Token values do not change memory, and a few thousand zeros cost nothing.
        ids = torch.zeros(1, seq_len, dtype=torch.long)
        batch = {"input_ids": ids, "labels": ids}
        print(f"{n_params:,} parameters ({n_params / 1e9:.2f} billion); per GPU a batch of 1 x {seq_len} tokens")
        """
    ),
    md("## One GPU: the arithmetic"),
    code(
        """
        limit = memlab.parse_budget(budget)
        state = 16 * n_params  # fp32 weights 4 + grads 4 + AdamW's two moments 8 bytes per parameter
        print(f"model state on one GPU: {human(state)}, {state / limit:.1f}x the {budget} budget")
        print(f"the same state over {gpus} GPUs: {human(state / gpus)} each")
        """
    ),
    md(
        """
        ## Sharded: the peak per GPU

        `%%memfit --dry-run --gpus N` runs the step on fake tensors as each GPU would: FSDP2 for real
        (`fully_shard` over a fake process group, counted by PyTorch's own `FSDPMemTracker`), ZeRO-2 and ZeRO-3
        from DeepSpeed's formulas plus the activations of that same dry run. `BATCH` is what *each* GPU trains
        per micro-step. Without `--strategy`, all three are estimated. bf16 autocast and checkpointing are on,
        as in most LLM recipes; try without them.
        """
    ),
    code("%load_ext memlab"),
    code(
        """
        %%memfit model batch --dry-run --gpus $gpus --budget $budget --try precision=bf16 checkpointing=on --quiet
        """
    ),
    code(
        """
        sharded = _  # the Report: one trial per strategy, each with the peak per GPU
        for trial in sharded:
            held = human(trial.model_state_bytes)
            print(f"{trial.label:28} {human(trial.peak_bytes):>10} per GPU, model state {held:>10}, "
                  f"{'fits' if trial.fits else 'does not fit'}")
        sharded.plot()
        """
    ),
    md(
        """
        ZeRO-2 keeps a whole copy of the 16-bit weights on every GPU, so its peak falls slowest as GPUs are
        added; FSDP2 and ZeRO-3 shard the weights too. The `communication` part is the buffers the engines
        gather and reduce through (DeepSpeed's bucket sizes, FSDP2's all-gather of one block).

        ## How many GPUs, at the least?

        `--gpus auto` (with `--budget`) finds the smallest number of GPUs (1, 2, 4, 8, ...) that fits, for each
        strategy. For ZeRO it costs one dry run; for FSDP2 one per number tried, so here only ZeRO-3 is asked.
        """
    ),
    code(
        "%%memfit model batch --dry-run --gpus auto --strategy zero3 --budget $budget "
        "--try precision=bf16 checkpointing=on"
    ),
    code(
        """
        smallest = _.best
        print(f"ZeRO-3 fits {budget} on {smallest.gpus} GPUs: {human(smallest.peak_bytes)} per GPU")
        """
    ),
    md(
        """
        ## Carry the plan to accelerate

        `Plan.to_accelerate_config(gpus=N, strategy=...)` gives the dict that `accelerate launch --config_file`
        reads, written here as YAML. The training script that goes with it carries the plan's other levers
        (accumulation, the optimizer, checkpointing); launch it with
        `accelerate launch --config_file memlab_accelerate.yaml train.py`.
        """
    ),
    code(
        """
        from memlab.export.accelerate import accelerate_script

        plan = smallest.plan
        accelerate_config = plan.to_accelerate_config(gpus=smallest.gpus, strategy=smallest.strategy)
        text = yaml.safe_dump(accelerate_config, sort_keys=False)
        with open("memlab_accelerate.yaml", "w") as out:
            out.write(text)
        print(text)
        """
    ),
    code(
        """
        print(accelerate_script(plan, strategy=smallest.strategy, model_name="meta-llama/Llama-3.1-8B"))
        """
    ),
    *exercise(
        """
        Your GPUs have 40 GiB (A100 40GB). How many does ZeRO-2 need, and how many ZeRO-3? Why the difference?
        Export the FSDP2 config for 8 of them as YAML too. (`memlab.estimation.sharded.smallest_gpus` is the Python
        form of
        `--gpus auto`: ZeRO-2 and ZeRO-3 share one dry run there.)
        """,
        """
        from memlab.estimation.sharded import smallest_gpus

        tuned = memlab.Plan(precision="bf16", checkpointing=True)
        found = smallest_gpus(model, batch, tuned, budget="40GiB", strategies=["zero2", "zero3"])
        for name, trial in found.items():
            print(name, "no number of GPUs fits" if trial is None else f"{trial.gpus} GPUs, {human(trial.peak_bytes)}")
        # ZeRO-2 keeps all the 16-bit weights on every GPU (2 bytes per parameter, some 15 GiB for 8B), whatever N.
        print(yaml.safe_dump(tuned.to_accelerate_config(gpus=8, strategy="fsdp2"), sort_keys=False))
        """,
    ),
]


# --- 11 inference memory --------------------------------------------------------------------------------------

MODEL11 = code(
    """
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
    """
)

NB11 = [
    md(
        """
        # 11 · Inference memory

        The model is trained; now it has to answer. Inference keeps no gradients and no optimizer state, so
        what is left is the weights, the activations of one forward, and, when generating, the **KV cache**: the
        keys and values of every past token, kept so that each new token runs through the model alone.

        | lever (`memlab.InferencePlan`) | what changes | cost |
        |---|---|---|
        | `weights="bf16"` / `"fp16"` | weights held in 16 bits | half of fp32's bytes |
        | `quantize="int8"` / `"nf4"` | linear weights in 8 or 4 bits (bitsandbytes) | a quarter / an eighth of fp32 |
        | `batch_size=N` | sequences per forward | activations and cache grow with N |
        | `new_tokens=N` | generate N tokens (0: one forward) | the cache grows by one token per step |
        | `kv_cache=False` | recompute the past at every step | less memory, much slower decoding |

        The KV cache of `tokens` tokens for `rows` sequences is exactly
        `2 x layers x kv-heads x head-dim x tokens x rows x bytes per element`. memlab measures all of it on
        the live model under `torch.inference_mode()`, with the same probes, report and bit-exact restore as
        for training.
        """
    ),
    setup(),
    parameters(
        """
        new_tokens = 16  # tokens to generate
        """
    ),
    DEVICE,
    MODEL11,
    md("## Weights: fp32, 16 bits, 8 bits, 4 bits"),
    code(
        """
        plans = [
            memlab.InferencePlan(),
            memlab.InferencePlan(weights="bf16"),
            memlab.InferencePlan(quantize="int8"),
            memlab.InferencePlan(weights="bf16", quantize="nf4"),
        ]
        report = memlab.compare(model, prompts, plans, steps=steps, noise=noise)
        report
        """
    ),
    code("report.plot()"),
    code(
        """
        fp32, bf16, int8, nf4 = (trial.breakdown["params"] for trial in report)
        print(f"bf16 weights: {human(bf16)}, {bf16 / fp32:.0%} of fp32's {human(fp32)}")
        print(f"int8 weights: {human(int8)}, {int8 / fp32:.0%} of fp32's")
        print(f"NF4 weights:  {human(nf4)}, {nf4 / bf16:.0%} of bf16's")
        """
    ),
    md(
        """
        The embedding and the output head are not quantized; on a model this small they are a large share of
        the weights, and on a 7B model the linear layers hold almost all of them.

        ## Generation and the KV cache

        With `new_tokens=N` memlab generates greedily, as `model.generate` does: one prefill forward over the
        prompt, then N - 1 decode steps of one token each. The table shows the prefill's and the decode steps'
        tokens/s apart.
        """
    ),
    code(
        """
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
        """
    ),
    code(
        """
        cached = generation[0]
        head_dim = config.hidden_size // config.num_attention_heads
        layers_, kv_heads = config.num_hidden_layers, config.num_key_value_heads
        formula = 2 * layers_ * kv_heads * head_dim * cached.context_tokens * rows * 2  # 2 bytes per bf16 number
        print(f"KV cache after {new_tokens} new tokens: {human(cached.kv_cache_end_bytes)} measured, "
              f"{human(formula)} by the formula ({cached.context_tokens} tokens per row, bf16)")
        print("the same from memlab:", human(memlab.kv_cache_bytes(config, tokens=cached.context_tokens, batch=rows)))
        """
    ),
    md(
        """
        ## How many prompts at once?

        `memlab.fit_inference` finds the largest batch whose measured peak fits a budget: it measures 1 and 2
        rows, predicts the largest from the line through them, measures that, and one row more.
        """
    ),
    code(
        """
        budget = 2 * generation[0].peak_bytes  # twice what this batch takes: how many more rows fit?
        # The search is about memory: one timed step per size, without the noise rule (noise=0).
        largest = memlab.fit_inference(
            model, prompts, memlab.InferencePlan(weights="bf16", new_tokens=new_tokens), budget=budget, steps=1, noise=0
        )
        print(f"largest batch within {human(budget)}: {largest.best.rows_per_step} rows")
        largest
        """
    ),
    md(
        """
        ## Before you load it: estimate

        `memlab.estimate` runs the same steps on fake tensors: a 7B model's KV cache for a 4096-token context
        is predicted in seconds, without the weights. The magic does all of the above from one line, too.
        """
    ),
    code(
        """
        from memlab.estimation.estimate import load_config

        seven_b = load_config("llama-7b")
        for context in (512, 4096):
            print(f"Llama 2 7B, bf16 KV cache for {context} tokens: "
                  f"{human(memlab.kv_cache_bytes(seven_b, tokens=context, batch=1, dtype='bf16'))}")
        guess = memlab.estimate(model, {"input_ids": (rows, 4 * seq_len)}, memlab.InferencePlan(weights="bf16"))
        print(f"this model, {4 * seq_len} tokens per prompt: peak {human(guess.peak_bytes)}, "
              f"of which KV cache {human(guess.breakdown['kv_cache'])}")
        """
    ),
    code(
        """
        %load_ext memlab
        %memfit model prompts --inference --try weights=bf16 quantize=none,nf4 new_tokens=8 --steps 1 --noise $noise
        """
    ),
    *exercise(
        """
        How does the KV cache grow with the number of generated tokens, and what does it cost per token? Measure
        `new_tokens` of 4, 8 and 16 (bf16 weights) and compare `kv_cache_end_bytes` with the formula.
        """,
        """
        lengths = [4, 8, 16]
        sweep = memlab.compare(
            model, prompts, [memlab.InferencePlan(weights="bf16", new_tokens=n) for n in lengths], steps=1, noise=noise
        )
        per_token = memlab.kv_cache_bytes(config, tokens=1, batch=rows, dtype="bf16")
        for n, trial in zip(lengths, sweep):
            print(f"{n:3} new tokens: cache {human(trial.kv_cache_end_bytes):>10}, "
                  f"formula {human(per_token * trial.context_tokens):>10}")
        # Each generated token adds 2 x layers x kv-heads x head-dim x rows x 2 bytes: a line in the tokens.
        """,
    ),
]


# --- 12 from an OOM in trainer.train() to a plan that fits ----------------------------------------------------

NB12 = [
    md(
        """
        # 12 · From an OOM in `trainer.train()` to a plan that fits

        You already fine-tune with `transformers.Trainer` or TRL's `SFTTrainer`. The first steps run, and an hour
        later `trainer.train()` dies with `CUDA out of memory`. The usual cause is the data: most examples are
        short, a few are long, and the batch that holds the long ones needs far more activation memory than the
        batches before it.

        memlab takes the trainer itself as the live object:

        | call | what it does with a trainer |
        |---|---|
        | `memlab.measure(trainer, plan)` | its model, its `compute_loss`; no batch: the dataset's **worst batch** |
        | `memlab.fit(trainer, budget=...)` | the fastest plan within the budget, judged on that worst batch |
        | `memlab.apply(trainer, plan)` | the plan on the trainer's arguments and model until `undo()` |
        | `memlab.watch(trainer, budget=...)` | every step's memory in `train()`, a warning, a live figure |

        This notebook picks a plan twice, once from a typical batch and once from the worst batch, trains each
        for an epoch under `memlab.watch`, and shows which one would have run out of memory.
        """
    ),
    setup(
        "import trl",
        "from datasets import Dataset",
        "from memlab.errors import MemlabWarning",
        "from tokenizers import Tokenizer, models, pre_tokenizers, trainers",
        "from transformers import PreTrainedTokenizerFast",
    ),
    code(
        """
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
        """,
        tags=("parameters",),
    ),
    DEVICE,
    md(
        """
        ## A dataset with a long tail

        Most examples are short; a few are nearly twenty times longer. A word-level tokenizer is built in memory
        from the texts themselves, so nothing is downloaded.
        """
    ),
    code(
        """
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
        """
    ),
    md(
        """
        ## The trainer

        With internet, the model and tokenizer of a real checkpoint go in the same places:

        ```python
        model = AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M")
        tokenizer = AutoTokenizer.from_pretrained("HuggingFaceTB/SmolLM2-135M")
        ```
        """
    ),
    code(
        """
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
        args = trl.SFTConfig(
            output_dir="nb12-output",
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
        """
    ),
    md(
        """
        ## A typical batch and the worst batch

        The first `rows` examples are a typical batch. `memlab.measure(trainer, plan)` without a batch reads the
        lengths of the whole train dataset, collates its longest examples with the trainer's own collator and
        measures that batch; the trial's notes say which examples it held.
        """
    ),
    code(
        """
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
        """
    ),
    md(
        """
        ## Two plans: one picked on a typical batch, one on the worst

        `memlab.fit` keeps the trainer's effective batch (rows per optimizer step) and searches micro-batch,
        accumulation and checkpointing for the fastest plan within the budget. Given `typical`, it judges every
        plan on that batch; given no batch, on the dataset's worst batch.
        """
    ),
    code(
        """
        space = {"micro_batch": [4, 2, 1], "checkpointing": [False, True]}
        from_typical = memlab.fit(trainer, typical, budget=budget, space=space, steps=steps, noise=noise)
        from_worst = memlab.fit(trainer, budget=budget, space=space, steps=steps, noise=noise)
        print("picked on a typical batch:", from_typical.best.plan.label())
        print("picked on the worst batch:", from_worst.best.plan.label())
        from_worst.plot()
        """
    ),
    md(
        """
        ## Train each for an epoch under `memlab.watch`

        `memlab.apply(trainer, plan)` puts the plan on the trainer until `undo()`; `memlab.watch(trainer,
        budget=...)` records each step's peak and which examples the step trained on, warns once when a step
        comes within 10% of the budget, and in a notebook draws the steps live, then leaves a static figure. On a
        GPU whose memory is the budget, a step over it is where `trainer.train()` dies.
        """
    ),
    code(
        """
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
        """
    ),
    code(
        """
        under = train_watched(from_worst.best.plan)
        """
    ),
    code(
        """
        steps_over, steps_under = over.to_dataframe(), under.to_dataframe()
        print(f"budget {human(budget)}")
        for name, table in (("a typical", steps_over), ("the worst", steps_under)):
            print(f"picked on {name} batch: {(table.peak_bytes > budget).sum()} of {len(table)} steps over it")
        steps_over[["step", "peak_bytes", "samples_per_s", "padded_length"]]
        """
    ),
    md(
        """
        The plan picked on a typical batch was the faster one on that batch, and it fits every short batch: the
        steps over the budget are exactly those that hold the long examples. The plan picked on the worst batch
        pays for them from the first step, and no step goes over.

        On your own fine-tune: `memlab.fit(trainer, budget="24GiB")`, then `memlab.apply(trainer,
        result.best.plan)` and `trainer.train()`; `memlab.export.engines.training_arguments(plan)` writes the same
        plan as `TrainingArguments` keywords for a script. `memlab.panel(trainer)` does the same with buttons.
        """
    ),
    md(
        """
        ## The usual SFT recipe: packing and LoRA

        Most fine-tunes today pack short examples into full rows (`packing=True`: one row holds several examples
        back to back, with `position_ids` that restart at each one) and train LoRA adapters
        (`peft_config=LoraConfig(...)`). memlab takes that trainer as it is: a micro-batch is what the trainer's own
        collator packs from `per_device_train_batch_size` examples, the model keeps the adapters TRL put on it, and
        the plan memlab reports is the trainer's own (its rank, alpha and dropout read from the `LoraConfig`).
        """
    ),
    code(
        """
        from peft import LoraConfig

        packed_args = trl.SFTConfig(
            output_dir="nb12-packed", report_to=[], use_cpu=device == "cpu", save_strategy="no", num_train_epochs=1,
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
        """
    ),
    md(
        """
        Now a budget a little under that peak, as if this were the card's limit: `fit` keeps the trainer's
        effective batch and its adapters and searches micro-batch and checkpointing; the plan it picks trains an
        epoch under `watch`.
        """
    ),
    code(
        """
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
        """
    ),
    *exercise(
        """
        Make the tail longer (`long_words = 250`, in the parameters cell, then run the notebook again) or add
        `accumulation` to the space: `space = {"micro_batch": [4, 2, 1], "accumulation": [1, 2], ...}`. Which
        plan does each fit pick now, and does the worst-batch pick still stay under the budget?
        """,
        """
        space = {"micro_batch": [4, 2, 1], "checkpointing": [False, True], "loss": ["full", "chunked"]}
        result = memlab.fit(trainer, budget=budget, space=space, steps=steps, noise=noise)
        print("picked on the worst batch:", result.best.plan.label())
        train_watched(result.best.plan)
        """,
    ),
]


NOTEBOOKS: dict[str, list[NotebookNode]] = {
    "00_where_memory_goes.ipynb": NB00,
    "01_gradient_accumulation.ipynb": NB01,
    "02_gradient_checkpointing.ipynb": NB02,
    "03_mixed_precision.ipynb": NB03,
    "04_8bit_adam.ipynb": NB04,
    "05_offload.ipynb": NB05,
    "06_memfit_and_panel.ipynb": NB06,
    "07_will_7b_fit.ipynb": NB07,
    "08_lora_and_qlora.ipynb": NB08,
    "09_optimizers_and_loss.ipynb": NB09,
    "10_when_one_gpu_is_not_enough.ipynb": NB10,
    "11_inference_memory.ipynb": NB11,
    "12_from_oom_to_a_plan_that_fits.ipynb": NB12,
}


# --- writing --------------------------------------------------------------------------------------------------


def build(name: str) -> NotebookNode:
    """The notebook ``name`` as nbformat v4, with deterministic cell ids and no outputs."""
    stem = name.split("_", 1)[0]
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    cells = []
    for index, template in enumerate(NOTEBOOKS[name]):
        cell = nbformat.from_dict(template)  # a copy: shared cells (device, model) appear in several notebooks
        cell["id"] = f"nb{stem}-{index:02d}"
        cells.append(cell)
    nb.cells = cells
    nbformat.validate(nb)
    return nb


def render(nb: NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report notebooks that differ from this script")
    args = parser.parse_args(argv)
    stale = []
    for name in NOTEBOOKS:
        path = HERE / name
        text = render(build(name))
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print("out of date (run python notebooks/_build.py):", ", ".join(stale))
        return 1
    if not args.check:
        print(f"wrote {len(stale)} of {len(NOTEBOOKS)} notebooks" if stale else "all notebooks up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
