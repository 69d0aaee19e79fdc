"""The seeds' table (Hugging Face single-GPU guide) through memlab and through ``transformers.Trainer``.

BERT for sequence classification (bert-large with ``--full``: hidden 1024, 24 layers, 16 heads, intermediate
4096, sequence 512; a scaled-down BERT with ``--small``), an effective batch of 4 rows in every row of the
table, random weights and random tokens. Rows: baseline; batch 1 x accumulation 4; + checkpointing; fp16;
batch 1 x accumulation 4 + checkpointing + fp16; 8-bit Adam; batch 1 x accumulation 4 + checkpointing + fp16 +
8-bit Adam; Adafactor; batch 1 x accumulation 4 + checkpointing + fp16 + Adafactor (memlab's ``optimizer="adafactor"``
is transformers' Adafactor as the Trainer's ``optim="adafactor"`` builds it). On the CPU the fp16
rows run in bf16 (``--half auto``): the Trainer accepts ``fp16=True`` there but trains in fp32, because accelerate
turns fp16 autocast on only for non-CPU devices.

For each row, in the same process and one right after the other, ``repeats`` times (memlab first, then the Trainer,
then the Trainer first, and so on, the order turning with each row and repeat; each side's speed is that of its
fastest repeat, as ``timeit`` takes the best of its repeats, and its memory that of the first):

- memlab: ``memlab.measure(model, batch, plan, steps=S, warmup=W)``: the peak of a tracked steady-state step
  (on the CPU memlab's tensor tracking; on CUDA ``max_memory_allocated``) and samples/s from the median of
  ``S`` untimed-by-tracking steps.
- Trainer: ``TrainingArguments(**plan.to_training_arguments(), ...)`` on a fresh copy of the same model, over a
  dataset of random rows, for ``W + 1 + S`` optimizer steps: ``W`` warm-up steps, one tracked step, ``S`` timed
  steps. A ``TrainerCallback`` times each optimizer step from ``on_step_begin`` to ``on_step_end`` (the
  Trainer has already fetched the step's batches then, as memlab has its batch), and samples/s is
  ``4 / median``. ``train_samples_per_second`` is not used: it includes the Trainer's setup. Memory: on the
  CPU the tracked step runs inside memlab's ``MemoryTracker`` (parameters, buffers and the optimizer state as
  its baseline), the same figure memlab reports; on CUDA ``max_memory_allocated`` over the tracked step.
  The Trainer runs with ``max_grad_norm=0`` (memlab's step does not clip gradients), a constant learning rate
  and weight decay equal to memlab's AdamW's (0.01), and no logging, saving or evaluation.

Before the first row, one untimed memlab trial of the baseline warms the process up (allocator, caches), so that
the first row measured is not the one that pays for it. Note that the Trainer's ``adamw_bnb_8bit`` keeps the
optimizer state of embeddings in 32 bits, where memlab's ``adamw8bit`` keeps all of it in 8 bits. Both sides'
AdamW is torch's fused AdamW (``adamw_torch_fused``, the Trainer's default from torch 2.8).

Memory saving = 1 - peak / the baseline row's peak, for each side; the throughput ratio is memlab / Trainer
samples/s (goal: >= 0.95).

Run from the repository root::

    python -m benchmarks.hf_table            # --small: scaled-down BERT on the CPU
    python -m benchmarks.hf_table --full     # bert-large, sequence 512, batch 4, on a CUDA GPU
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from benchmarks import common

NAME = "hf_table"
GOAL = 0.95
ROWS = 4

# The seeds' figures (V100 16 GB, bert-large-uncased, sequence 512, memory from NVML, which includes about
# 1.3 GB of CUDA context): samples/s and MB, per row of the table.
SEEDS = {
    "baseline": (8.86, 14949),
    "bs1 ga4": (7.75, 8681),
    "bs1 ga4 + ckpt": (5.99, 6775),
    "fp16": (18.64, 13939),
    "bs1 ga4 + ckpt + fp16": (10.09, 7275),
    "8-bit Adam": (9.15, 13085),
    "bs1 ga4 + ckpt + fp16 + 8-bit Adam": (10.35, 5363),
    "Adafactor": (7.96, 12295),
    "bs1 ga4 + ckpt + fp16 + Adafactor": (9.06, 4847),
}


@dataclass(frozen=True)
class Size:
    """The BERT (from its config), the sequence length, how many steps to time, and memlab's noise target (0 at the
    smoke size, which only exercises the code: exactly ``steps`` steps)."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    length: int
    steps: int
    warmup: int
    repeats: int
    noise: float = 0.05


SIZES = {
    "smoke": Size(
        hidden=32, layers=2, heads=2, intermediate=64, vocab=128, length=16, steps=2, warmup=1, repeats=1, noise=0
    ),
    "small": Size(
        hidden=256, layers=4, heads=4, intermediate=1024, vocab=30522, length=512, steps=3, warmup=1, repeats=3
    ),
    "full": Size(
        hidden=1024, layers=24, heads=16, intermediate=4096, vocab=30522, length=512, steps=8, warmup=2, repeats=3
    ),
}


@dataclass(frozen=True)
class Row:
    """One row of the table: a memlab plan, whose TrainingArguments the Trainer runs."""

    name: str
    micro_batch: int
    accumulation: int = 1
    checkpointing: bool = False
    half: bool = False
    optimizer: str = "adamw"  # memlab's name

    def plan(self, half: str) -> Any:
        """The memlab Plan of this row."""
        import memlab

        return memlab.Plan(
            micro_batch=self.micro_batch, accumulation=self.accumulation, checkpointing=self.checkpointing,
            precision=half if self.half else "fp32", optimizer=self.optimizer,
        )

    def training_arguments(self, half: str) -> dict[str, Any]:
        """TrainingArguments keywords: the plan's (``plan.to_training_arguments()``)."""
        arguments: dict[str, Any] = self.plan(half).to_training_arguments()
        return arguments


TABLE = (
    Row("baseline", micro_batch=4),
    Row("bs1 ga4", micro_batch=1, accumulation=4),
    Row("bs1 ga4 + ckpt", micro_batch=1, accumulation=4, checkpointing=True),
    Row("fp16", micro_batch=4, half=True),
    Row("bs1 ga4 + ckpt + fp16", micro_batch=1, accumulation=4, checkpointing=True, half=True),
    Row("8-bit Adam", micro_batch=4, optimizer="adamw8bit"),
    Row("bs1 ga4 + ckpt + fp16 + 8-bit Adam", micro_batch=1, accumulation=4, checkpointing=True, half=True,
        optimizer="adamw8bit"),
    Row("Adafactor", micro_batch=4, optimizer="adafactor"),
    Row("bs1 ga4 + ckpt + fp16 + Adafactor", micro_batch=1, accumulation=4, checkpointing=True, half=True,
        optimizer="adafactor"),
)


class RandomRows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``count`` rows of random tokens with a class label each, as the dicts the Trainer collates."""

    def __init__(self, *, vocab: int, count: int, length: int, seed: int = 2) -> None:
        self.batch = common.classification_batch(vocab=vocab, rows=count, length=length, seed=seed)
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {key: value[index] for key, value in self.batch.items()}


def measure_memlab(
    model: nn.Module, batch: dict[str, torch.Tensor], plan: Any, size: Size, device: torch.device, lr: float
) -> dict[str, Any]:
    """One row through ``memlab.measure`` (the model visits ``device`` for it and goes back to the CPU)."""
    import memlab
    from memlab.events import StepFinished

    seconds: list[float] = []

    def collect(event: Any) -> None:
        if isinstance(event, StepFinished) and event.kind == "timed":
            seconds.append(event.seconds)

    model.to(device)
    try:
        trial = memlab.measure(
            model, common.to_device(batch, device), plan, steps=size.steps, warmup=size.warmup, lr=lr,
            callback=collect, noise=size.noise,
        )
    finally:
        model.to("cpu")
        common.release(device)
    return {
        "status": trial.status,
        "error": trial.error,
        "peak_bytes": trial.peak_bytes if trial.status != "error" else None,
        "breakdown": trial.breakdown if trial.status == "ok" else None,
        "samples_per_s": trial.samples_per_s,
        "step_time_s": trial.step_time_s,
        "step_times_s": seconds if trial.status == "ok" else [],
        "notes": list(trial.notes),
    }


def _step_clock(device: torch.device, tracked: int) -> Any:
    """A TrainerCallback that times each optimizer step and measures memory over step number ``tracked``."""
    from transformers import TrainerCallback

    from memlab.measure.tracker import MemoryTracker
    from memlab.techniques.optimizer import state_tensors

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.peak_bytes: int | None = None
            self._tracker: MemoryTracker | None = None
            self._started = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == tracked:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                    torch.cuda.reset_peak_memory_stats(device)
                else:
                    model, optimizer = kwargs["model"], kwargs["optimizer"]
                    baseline = {
                        "params": [*model.parameters(), *model.buffers()],
                        "optimizer": state_tensors(getattr(optimizer, "optimizer", optimizer)),
                    }
                    self._tracker = MemoryTracker(baseline=baseline, device=device)
                    self._tracker.__enter__()
            common.synchronize(device)
            self._started = time.perf_counter()

        def close(self) -> None:
            """Leave the tracker if a failed step left it entered."""
            if self._tracker is not None:
                self._tracker.__exit__(None, None, None)
                self._tracker = None

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            common.synchronize(device)
            seconds = time.perf_counter() - self._started
            number = state.global_step - 1
            if number == tracked:
                if self._tracker is not None:
                    self._tracker.__exit__(None, None, None)
                    self.peak_bytes = self._tracker.peak_bytes
                    self._tracker = None
                else:
                    self.peak_bytes = int(torch.cuda.max_memory_allocated(device))
            elif number > tracked:
                self.seconds.append(seconds)

    return StepClock()


def reset_bitsandbytes_overrides() -> None:
    """Forget the per-parameter overrides the Trainer registers in bitsandbytes' global ``GlobalOptimManager``.

    For ``adamw_bnb_8bit`` the Trainer registers every ``nn.Embedding`` weight for 32-bit optimizer state. The
    manager is a process-wide singleton that keeps those modules (the Trainer's copy of the model) alive, and keys
    the override by the parameter's (group, index) position too, so that any later bitsandbytes optimizer gets
    32-bit settings for whatever parameter sits at the same position. memlab's own 8-bit optimizer keeps a
    private manager with only the overrides that name its parameters; the reset frees the copy and keeps the next
    Trainer row as clean as the first.
    """
    import sys

    if "bitsandbytes" in sys.modules:
        from bitsandbytes.optim import GlobalOptimManager

        GlobalOptimManager.get_instance().initialize()


def measure_trainer(
    model: nn.Module, row: Row, half: str, size: Size, device: torch.device, lr: float
) -> dict[str, Any]:
    """One row through ``transformers.Trainer`` on a copy of ``model``: step times and the tracked step's peak."""
    from transformers import PrinterCallback, Trainer, TrainingArguments

    steps = size.warmup + 1 + size.steps
    dataset = RandomRows(vocab=size.vocab, count=steps * ROWS, length=size.length)
    clock = _step_clock(device, tracked=size.warmup)
    copied = copy.deepcopy(model)
    trainer = None
    try:
        with tempfile.TemporaryDirectory(prefix="memlab-hf-table-") as output_dir:
            arguments = TrainingArguments(
                output_dir=output_dir,
                **row.training_arguments(half),
                max_steps=steps,
                learning_rate=lr,
                lr_scheduler_type="constant",
                warmup_steps=0,
                weight_decay=0.01,  # torch.optim.AdamW's default, which memlab's AdamW keeps
                max_grad_norm=0.0,
                use_cpu=device.type == "cpu",
                report_to="none",
                save_strategy="no",
                eval_strategy="no",
                logging_strategy="no",
                disable_tqdm=True,
                dataloader_num_workers=0,
                seed=0,
            )
            trainer = Trainer(model=copied, args=arguments, train_dataset=dataset, callbacks=[clock])
            trainer.remove_callback(PrinterCallback)  # it prints the final metrics even without logging
            trainer.train()
        step = common.median(clock.seconds)
        return {
            "status": "ok",
            "error": None,
            "peak_bytes": clock.peak_bytes,
            "samples_per_s": ROWS / step if step else None,
            "step_time_s": step,
            "step_times_s": clock.seconds,
            "mixed_precision": str(trainer.accelerator.mixed_precision),
            "optimizer": type(getattr(trainer.optimizer, "optimizer", trainer.optimizer)).__name__,
        }
    except Exception as error:  # noqa: BLE001 - a row that fails is reported in the table, not raised
        from memlab.measure.oom import is_oom_error

        lines = str(error).strip().splitlines()
        return {
            "status": "oom" if is_oom_error(error) else "error",
            "error": f"{type(error).__name__}: {lines[0] if lines else ''}",
            "peak_bytes": None,
            "samples_per_s": None,
            "step_time_s": None,
        }
    finally:
        clock.close()
        del trainer, copied
        reset_bitsandbytes_overrides()
        common.release(device)


def run(
    size: Size, device: torch.device, half: str = "fp16", lr: float = 1e-5, only: Sequence[int] | None = None
) -> dict[str, Any]:
    """Every row of the table (or the rows numbered in ``only``, from 1; the baseline always runs) through memlab
    and the Trainer; savings against the baseline and speed ratios."""
    model = common.bert_classifier(
        hidden=size.hidden, layers=size.layers, heads=size.heads, intermediate=size.intermediate, vocab=size.vocab,
        positions=max(512, size.length),
    )
    batch = common.classification_batch(vocab=size.vocab, rows=ROWS, length=size.length)
    measure_memlab(model, batch, TABLE[0].plan(half), Size(**{**asdict(size), "steps": 1}), device, lr)  # warm-up
    rows: list[dict[str, Any]] = []
    chosen = [row for number, row in enumerate(TABLE, 1) if only is None or number == 1 or number in only]
    for number, row in enumerate(chosen):
        plan = row.plan(half)
        name = row.name.replace("fp16", half)
        result: dict[str, Any] = {
            "row": name,
            "plan": plan.label(),
            "training_arguments": row.training_arguments(half),
        }
        runs: dict[str, list[dict[str, Any]]] = {"memlab": [], "trainer": []}
        for repeat in range(size.repeats):
            order = ("memlab", "trainer") if (number + repeat) % 2 == 0 else ("trainer", "memlab")
            for side in order:
                started = time.perf_counter()
                if side == "trainer":
                    outcome = measure_trainer(model, row, half, size, device, lr)
                else:
                    outcome = measure_memlab(model, batch, plan, size, device, lr)
                outcome["wall_s"] = round(time.perf_counter() - started, 2)
                runs[side].append(outcome)
        for side, done in runs.items():
            result[side] = _combine(done)
        memlab_rate, trainer_rate = result["memlab"]["samples_per_s"], result["trainer"]["samples_per_s"]
        result["throughput_ratio"] = memlab_rate / trainer_rate if memlab_rate and trainer_rate else None
        seeds = SEEDS[row.name]
        result["seeds_v100"] = {"samples_per_s": seeds[0], "memory_mb": seeds[1]}
        rows.append(result)
        print(f"  {name}: memlab {_rate(memlab_rate)}, Trainer {_rate(trainer_rate)} samples/s", flush=True)
    for side in ("memlab", "trainer"):
        base = rows[0][side].get("peak_bytes")
        for result in rows:
            peak = result[side].get("peak_bytes")
            ran = result[side]["status"] == "ok"
            result[side]["memory_saving"] = 1 - peak / base if base and peak and ran else None
    ratios = [r["throughput_ratio"] for r in rows if r["throughput_ratio"] is not None]
    same_work = [r["throughput_ratio"] for r in rows if r["throughput_ratio"] is not None and "8-bit" not in r["row"]]
    parameters = sum(p.numel() for p in model.parameters())
    return {
        "model": {"class": type(model).__name__, "parameters": parameters, **asdict(size)},
        "batch": {"rows_per_step": ROWS, "length": size.length},
        "half_precision": half,
        "half_precision_note": half_note(half, device),
        "lr": lr,
        "memory_figure": (
            "CPU: peak live tensor bytes of one tracked steady-state step (memlab's MemoryTracker, parameters, "
            "buffers and optimizer state included) for both sides; CUDA: torch.cuda.max_memory_allocated over "
            "that step (no CUDA context, unlike the seeds' NVML figures)"
        ),
        "throughput_figure": (
            "samples/s = 4 rows / median seconds per optimizer step (batches already fetched), best of the "
            "repeats; every step time is in step_times_s"
        ),
        "repeats": size.repeats,
        "trainer_settings": (
            "max_grad_norm=0 (memlab does not clip), lr_scheduler_type=constant, weight_decay=0.01 (AdamW's "
            "default, as memlab), no logging, saving or evaluation"
        ),
        "eight_bit_note": (
            "the Trainer's adamw_bnb_8bit keeps the optimizer state of nn.Embedding weights in 32 bits "
            "(register_module_override(..., {'optim_bits': 32})); memlab's adamw8bit keeps every state in 8 bits, "
            "so the Trainer's 8-bit rows hold more optimizer memory, the more so the larger the embeddings' share"
        ),
        "rows": rows,
        "throughput_ratio_median": common.median(ratios),
        "throughput_ratio_min": min(ratios) if ratios else None,
        "goal": GOAL,
        "meets_goal": bool(ratios) and min(ratios) >= GOAL,
        # The 8-bit rows differ in work, not in overhead: the Trainer updates embeddings with 32-bit Adam.
        "throughput_ratio_min_same_work": min(same_work) if same_work else None,
        "meets_goal_same_work": bool(same_work) and min(same_work) >= GOAL,
    }


def _combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The repeats of one side of a row as one: the first run's memory, the speed of the fastest repeat (each
    repeat's speed comes from the median of its timed steps), and the wall time summed.

    Best of repeats, as ``timeit`` does: other processes only ever slow a repeat down, so the fastest is the
    closest to what the plan costs on this machine."""
    combined = dict(runs[0])
    seconds = [s for run in runs for s in run.get("step_times_s", [])]
    if all(run["status"] == "ok" and run.get("step_time_s") for run in runs):
        step = min(run["step_time_s"] for run in runs)
        combined["step_time_s"] = step
        combined["samples_per_s"] = ROWS / step
        combined["samples_per_s_per_repeat"] = [run["samples_per_s"] for run in runs]
    else:
        failed = next((run for run in runs if run["status"] != "ok"), runs[0])
        combined.update(status=failed["status"], error=failed.get("error"), samples_per_s=None, step_time_s=None)
    combined["step_times_s"] = [round(s, 6) for s in seconds]
    combined["wall_s"] = round(sum(run.get("wall_s", 0.0) for run in runs), 2)
    return combined


def half_note(half: str, device: torch.device) -> str:
    """Why the seeds' fp16 rows run in ``half`` here, for the JSON."""
    if device.type != "cpu":
        return f"the seeds' fp16 rows run as {half}"
    if half == "bf16":
        return (
            "the seeds' fp16 rows run as bf16 on the CPU: TrainingArguments accepts fp16=True with use_cpu=True, "
            "but accelerate enables fp16 autocast only on non-CPU devices (Accelerator.native_amp stays False), "
            "so the Trainer would train those rows in fp32 while memlab runs real fp16 autocast"
        )
    return (
        "fp16 on the CPU: memlab runs fp16 autocast (slow: CPUs have no fast fp16 matrix units) while the "
        "Trainer trains in fp32 (accelerate enables fp16 autocast only on non-CPU devices): the fp16 rows do not "
        "compare like with like"
    )


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _percent(value: float | None) -> str | None:
    return None if value is None else f"{100 * value:.0f}%".replace("-0%", "0%")


def markdown(result: dict[str, Any]) -> str:
    """The table as markdown: memory (MiB) and saving, samples/s of both sides and their ratio."""
    table = []
    for row in result["rows"]:
        mem, trn = row["memlab"], row["trainer"]
        memlab_memory = common.mib(mem.get("peak_bytes")) if mem["status"] == "ok" else mem["status"]
        table.append([
            row["row"],
            memlab_memory,
            _percent(mem.get("memory_saving")),
            common.rounded(mem.get("samples_per_s"), 2),
            common.mib(trn.get("peak_bytes")) if trn["status"] == "ok" else trn["status"],
            _percent(trn.get("memory_saving")),
            common.rounded(trn.get("samples_per_s"), 2),
            common.rounded(row["throughput_ratio"], 3),
        ])
    headers = [
        "row", "memlab MiB", "saving", "memlab samples/s", "Trainer MiB", "saving", "Trainer samples/s",
        "memlab/Trainer",
    ]
    return common.markdown_table(headers, table)


def figure(result: dict[str, Any]) -> Any:
    """Peak memory (left) and samples/s (right) per row, memlab and Trainer side by side."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = [row["row"] for row in result["rows"]]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Peak memory (MiB)", "Samples/s"), horizontal_spacing=0.1)
    for side, label, color in (("memlab", "memlab", "#4C78A8"), ("trainer", "Trainer", "#F58518")):
        memory = [common.mib(row[side].get("peak_bytes")) if row[side]["status"] == "ok" else None
                  for row in result["rows"]]
        speed = [row[side].get("samples_per_s") for row in result["rows"]]
        fig.add_trace(go.Bar(name=label, x=names, y=memory, marker_color=color, legendgroup=side), row=1, col=1)
        fig.add_trace(
            go.Bar(name=label, x=names, y=speed, marker_color=color, legendgroup=side, showlegend=False),
            row=1, col=2,
        )
    device = result["device"].get("gpu") or result["device"]["cpu"]
    fig.update_layout(
        title=f"The seeds' table through memlab and transformers.Trainer ({result['model']['parameters'] / 1e6:.0f}M"
        f"-parameter BERT, sequence {result['batch']['length']}, on {device})",
        barmode="group",
    )
    fig.update_xaxes(tickangle=-30)
    return fig


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the table, print it as markdown, write ``hf_table-<device>.json`` and ``.html``; return the result."""
    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    parser.add_argument(
        "--half", choices=("auto", "fp16", "bf16"), default="auto",
        help="the half precision of the seeds' fp16 rows; auto (default): fp16 on CUDA, as in the seeds' table, "
        "and bf16 on the CPU, where the Trainer silently trains fp16=True in fp32",
    )
    parser.add_argument(
        "--rows", type=lambda text: [int(x) for x in text.split(",")],
        help="run only these rows of the table, by number from 1, e.g. 1,7,8 (the baseline, row 1, always runs)",
    )
    parser.add_argument(
        "--repeats", type=int, default=None,
        help="how many times each row runs on each side (default: the size's, 3 for --small and --full)",
    )
    args = parser.parse_args(argv)
    common.quiet()
    device = common.resolve_device(args, parser)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: write a number of repeats >= 1")
    size = SIZES[args.size] if args.repeats is None else dataclasses.replace(SIZES[args.size], repeats=args.repeats)
    result = common.metadata_for(NAME, device, args.size)
    half = args.half if args.half != "auto" else ("fp16" if device.type == "cuda" else "bf16")
    result.update(run(size, device, half=half, only=args.rows))
    stem = common.result_stem(NAME, device, args.size)
    result["markdown"] = markdown(result)
    path = common.write_json(result, args.out / f"{stem}.json")
    common.write_figure(figure(result), args.out / f"{stem}.html")
    print(result["markdown"])
    print(f"memlab/Trainer throughput: median {_rate(result['throughput_ratio_median'])}, "
          f"min {_rate(result['throughput_ratio_min'])}, min without the 8-bit rows "
          f"{_rate(result['throughput_ratio_min_same_work'])} (goal >= {GOAL})")
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
