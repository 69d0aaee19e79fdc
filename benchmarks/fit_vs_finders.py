"""``memlab.fit`` against two ways people find a setting that fits: the seeds' halve-and-double recipe and
accelerate's ``find_executable_batch_size``, on the same model, effective batch and memory budget.

- memlab: ``fit(model, batch, budget=B, batch_size=N)``, its whole default space (micro-batch, checkpointing,
  precision, 8-bit AdamW, and offload on CUDA).
- The seeds' recipe ("reduce the batch size by 2 and increase gradient accumulation by 2, until the batch size is
  1; if that does not work, use mixed precision", then the "exotic" gradient checkpointing): from the full batch,
  halve the micro-batch and double the accumulation until a plan fits; if none does, do the same again with half
  precision (bf16 on the CPU and on GPUs that have it, else fp16), then with half precision and checkpointing.
  The first plan that fits is the answer.
- accelerate: ``accelerate.utils.find_executable_batch_size(starting_batch_size=N)`` around a function that runs
  micro-batch ``b`` with accumulation ``N // b`` (as accelerate's automatic gradient accumulation example does,
  so the effective batch is ``b * (N // b)``, at most N). On a CPU, accelerate reacts only to out-of-memory errors,
  so each attempt runs through memlab with the budget and raises ``torch.OutOfMemoryError`` when the trial's
  status is ``"oom"``. It tunes only the batch size: precision, checkpointing and the optimizer stay as they are.

All three measure through memlab's ``TrialRunner`` with the same ``steps``, ``warmup`` and budget, so a trial costs
the same whoever asks for it. The budget is set from a calibration trial of the full batch without a budget (not
counted for anyone): what an fp32 AdamW plan holds at its optimizer step (parameters, gradients, optimizer
state, other) plus ``--activation-fraction`` of the full batch's activations, so that the plain full-batch plan
does not fit. Reported: trials run,
wall time, the plan each one picks and its samples/s, measured again after the searches in ``rounds`` alternating
rounds (the same for every pick; the best round counts, as ``timeit`` takes the best of its repeats, since other
processes only ever slow a round down), beside the samples/s seen during the search.

Run from the repository root::

    python -m benchmarks.fit_vs_finders            # --small: CPU
    python -m benchmarks.fit_vs_finders --full     # CUDA GPU, a bigger Llama
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from benchmarks import common

NAME = "fit_vs_finders"


@dataclass(frozen=True)
class Size:
    """The model (a Llama from its config), the effective batch, how many steps each trial times, and the noise
    target of the timing (0 at the smoke size, which only exercises the code: exactly ``steps`` steps)."""

    hidden: int
    layers: int
    heads: int
    vocab: int
    batch_size: int
    length: int
    steps: int
    warmup: int
    rounds: int
    noise: float = 0.05


SIZES = {
    "smoke": Size(hidden=32, layers=2, heads=2, vocab=128, batch_size=2, length=16, steps=1, warmup=1, rounds=1,
                  noise=0),
    "small": Size(hidden=256, layers=4, heads=4, vocab=4096, batch_size=8, length=256, steps=3, warmup=1, rounds=3),
    "full": Size(
        hidden=1024, layers=12, heads=16, vocab=32000, batch_size=16, length=1024, steps=3, warmup=1, rounds=3
    ),
}


@dataclass
class Search:
    """What one method did: its trials in order, its answer (None when nothing fits), and how long it took."""

    method: str
    trials: list[Any]
    pick: Any | None
    wall_s: float
    note: str = ""


def half_precision(device: torch.device) -> str:
    """bf16 on the CPU and on GPUs that have it, fp16 on older GPUs."""
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "fp16"
    return "bf16"


def run_fit(model: nn.Module, batch: Any, size: Size, budget: int) -> Search:
    """memlab's ``fit`` over its default space."""
    import memlab

    started = time.perf_counter()
    report = memlab.fit(
        model, batch, budget=budget, batch_size=size.batch_size, steps=size.steps, warmup=size.warmup, progress=False,
        noise=size.noise,
    )
    skipped = len(getattr(report, "skipped", []) or [])
    return Search("memlab.fit", list(report.trials), report.best, time.perf_counter() - started,
                  note=f"{skipped} candidate plans skipped without measuring")


def run_recipe(runner: Any, size: Size, device: torch.device) -> Search:
    """The seeds' recipe: halve micro-batch / double accumulation; then half precision; then + checkpointing."""
    import memlab

    half = half_precision(device)
    stages = [memlab.Plan(), memlab.Plan(precision=half), memlab.Plan(precision=half, checkpointing=True)]
    trials: list[Any] = []
    started = time.perf_counter()
    for stage in stages:
        micro = size.batch_size
        while micro >= 1:
            plan = stage.replace(micro_batch=None if micro == size.batch_size else micro)
            trial = runner.run(plan.replace(accumulation=size.batch_size // micro))
            trials.append(trial)
            if trial.fits:
                return Search("seeds' recipe", trials, trial, time.perf_counter() - started)
            if micro == 1:
                break
            micro = max(1, micro // 2)
    return Search("seeds' recipe", trials, None, time.perf_counter() - started, note="nothing fits")


def run_accelerate(runner: Any, size: Size) -> Search:
    """accelerate's ``find_executable_batch_size``: micro-batch from N down by 10% per out-of-memory."""
    from accelerate.utils import find_executable_batch_size

    import memlab

    trials: list[Any] = []

    @find_executable_batch_size(starting_batch_size=size.batch_size)
    def attempt(batch_size: int) -> Any:
        micro = None if batch_size == size.batch_size else batch_size
        trial = runner.run(memlab.Plan(micro_batch=micro, accumulation=max(1, size.batch_size // batch_size)))
        trials.append(trial)
        if not trial.fits:
            # What accelerate recognises: a RuntimeError whose one argument contains " out of memory."
            raise torch.OutOfMemoryError(f"memlab budget: out of memory. ({trial.error or 'over the budget'})")
        return trial

    started = time.perf_counter()
    note = ""
    try:
        pick = attempt()
    except RuntimeError as error:  # "No executable batch size found, reached zero."
        pick, note = None, str(error)
    return Search("accelerate find_executable_batch_size", trials, pick, time.perf_counter() - started, note=note)


def remeasure(
    model: nn.Module, batch: Any, plans: Sequence[Any], size: Size, rounds: int
) -> list[list[float]]:
    """Samples/s of each plan, measured again in ``rounds`` rounds (the order turns each round), no budget."""
    import memlab

    speeds: list[list[float]] = [[] for _ in plans]
    for number in range(rounds):
        order = list(range(len(plans)))
        shift = number % max(1, len(order))
        for index in order[shift:] + order[:shift]:
            trial = memlab.measure(model, batch, plans[index], steps=max(3, size.steps), warmup=size.warmup,
                                   noise=size.noise)
            if trial.samples_per_s is not None:
                speeds[index].append(trial.samples_per_s)
    return speeds


def _trial_row(trial: Any) -> dict[str, Any]:
    return {
        "plan": trial.label,
        "status": trial.status,
        "fits": trial.fits,
        "peak_bytes": trial.peak_bytes,
        "samples_per_s": trial.samples_per_s,
        "rows_per_step": trial.rows_per_step,
    }


def run(size: Size, device: torch.device, activation_fraction: float, lr: float = 1e-5) -> dict[str, Any]:
    """Calibrate the budget, run the three searches, measure their picks again, and describe it all."""
    import memlab
    from memlab.options import RunOptions
    from memlab.runner.trial import TrialRunner

    model = common.llama_model(
        hidden=size.hidden, layers=size.layers, heads=size.heads, vocab=size.vocab, positions=size.length
    ).to(device)
    batch = common.to_device(common.lm_batch(vocab=size.vocab, rows=size.batch_size, length=size.length), device)
    calibration = memlab.measure(model, batch, memlab.Plan(), steps=1, warmup=size.warmup, lr=lr, noise=size.noise)
    if calibration.status != "ok":
        raise RuntimeError(f"the calibration trial failed: {calibration.error}")
    activations = calibration.breakdown["activations"]
    gradients = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    parts = calibration.breakdown
    floor = parts["params"] + gradients + parts["optimizer"] + parts["other"]
    budget = int(floor + activation_fraction * activations)
    common.release(device)

    def with_runner(search: Callable[[Any], Search]) -> Search:
        runner = TrialRunner(
            model, batch, RunOptions(steps=size.steps, warmup=size.warmup, budget=budget, lr=lr, noise=size.noise)
        )
        with runner.session():
            return search(runner)

    searches = [
        run_fit(model, batch, size, budget),
        with_runner(lambda runner: run_recipe(runner, size, device)),
        with_runner(lambda runner: run_accelerate(runner, size)),
    ]
    common.release(device)
    picks = [s.pick for s in searches if s.pick is not None]
    unique = list(dict.fromkeys(p.plan for p in picks))
    speeds = dict(zip(unique, remeasure(model, batch, unique, size, size.rounds), strict=True))
    methods = []
    for search in searches:
        pick = search.pick
        again = speeds.get(pick.plan, []) if pick is not None else []
        methods.append({
            "method": search.method,
            "trials_run": len(search.trials),
            "wall_s": round(search.wall_s, 2),
            "pick": None if pick is None else {
                **_trial_row(pick),
                "plan_fields": asdict(pick.plan),
                "samples_per_s_in_search": pick.samples_per_s,
                "samples_per_s_remeasured": max(again) if again else None,
                "samples_per_s_remeasured_rounds": again,
            },
            "trials": [_trial_row(t) for t in search.trials],
            "note": search.note,
        })
    return {
        "model": {
            "class": type(model).__name__,
            "parameters": sum(p.numel() for p in model.parameters()),
            **{k: v for k, v in asdict(size).items() if k in ("hidden", "layers", "heads", "vocab")},
        },
        "batch": {"batch_size": size.batch_size, "length": size.length},
        "steps": size.steps,
        "warmup": size.warmup,
        "lr": lr,
        "budget_bytes": budget,
        "budget": {
            "activation_fraction": activation_fraction,
            "calibration_plan": calibration.label,
            "calibration_peak_bytes": calibration.peak_bytes,
            "calibration_breakdown": calibration.breakdown,
            "floor_bytes": floor,
            "rule": (
                "budget = floor + activation_fraction * the calibration's activations; floor = parameters + "
                "gradients + AdamW state + other, all live at the optimizer step of an fp32 AdamW plan"
            ),
        },
        "half_precision": half_precision(device),
        "methods": methods,
    }


def markdown(result: dict[str, Any]) -> str:
    """One row per method: trials, wall time, the plan it picks, its peak and samples/s."""
    rows = []
    for method in result["methods"]:
        pick = method["pick"] or {}
        rows.append([
            method["method"],
            method["trials_run"],
            method["wall_s"],
            pick.get("plan", "nothing fits"),
            pick.get("rows_per_step"),
            common.mib(pick.get("peak_bytes")),
            common.rounded(pick.get("samples_per_s_remeasured"), 2),
            common.rounded(pick.get("samples_per_s_in_search"), 2),
        ])
    headers = [
        "method", "trials", "wall s", "plan picked", "rows/step", "peak MiB", "samples/s (re-measured)",
        "samples/s (in search)",
    ]
    return common.markdown_table(headers, rows)


def figure(result: dict[str, Any]) -> Any:
    """Samples/s of each pick, trials run and wall time, per method."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = [m["method"] for m in result["methods"]]
    picks = [m["pick"] or {} for m in result["methods"]]
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=("samples/s of the plan picked", "trials run", "wall time (s)"),
        horizontal_spacing=0.08,
    )
    colors = ["#2CA02C", "#4C78A8", "#F58518"]
    fig.add_trace(
        go.Bar(
            x=names, y=[p.get("samples_per_s_remeasured") for p in picks], marker_color=colors,
            text=[p.get("plan", "nothing fits") for p in picks], textposition="auto",
        ),
        row=1, col=1,
    )
    fig.add_trace(go.Bar(x=names, y=[m["trials_run"] for m in result["methods"]], marker_color=colors), row=1, col=2)
    fig.add_trace(go.Bar(x=names, y=[m["wall_s"] for m in result["methods"]], marker_color=colors), row=1, col=3)
    device = result["device"].get("gpu") or result["device"]["cpu"]
    fig.update_layout(
        title=f"fit against the seeds' recipe and accelerate (budget {common.mib(result['budget_bytes'])} MiB, "
        f"batch {result['batch']['batch_size']}x{result['batch']['length']}, on {device})",
        showlegend=False,
    )
    return fig


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the comparison, print it, write ``fit_vs_finders-<device>.json`` and ``.html``; return the result."""
    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    parser.add_argument(
        "--activation-fraction", type=float, default=0.3,
        help="the budget holds the fixed memory plus this fraction of the full batch's activations (default 0.3)",
    )
    args = parser.parse_args(argv)
    common.quiet()
    device = common.resolve_device(args, parser)
    result = common.metadata_for(NAME, device, args.size)
    result.update(run(SIZES[args.size], device, args.activation_fraction))
    result["markdown"] = markdown(result)
    stem = common.result_stem(NAME, device, args.size)
    path = common.write_json(result, args.out / f"{stem}.json")
    common.write_figure(figure(result), args.out / f"{stem}.html")
    print(result["markdown"])
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
