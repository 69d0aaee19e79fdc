"""What ``memlab estimate`` prints: a short answer to scan, not a log.

First the question as understood (the model, the batch, the budget, the GPU), then the verdict and the best plan,
each plan named once; then the table, one unit per column, the speed columns left out (an estimate times nothing);
then numbered notes, only those that change how the figures read (how the dry run emulates CUDA is in ``--json``);
then the next commands to try. Every line within :data:`WIDTH` columns. The sharded answer (``--gpus``) follows the
same order: its best (the fewest GPUs, then the lowest figure), a table of plans and strategies, where the memory
of each goes (one unit per column), and why a strategy fits on no number of GPUs.
"""

from __future__ import annotations

import argparse
import re
import textwrap
from collections.abc import Sequence
from typing import Any

from memlab.frontends.cli.gpu import cli_gpu
from memlab.live.sharding import ENGINE_NAMES

__all__ = [
    "WIDTH", "budget_words", "count_text", "for_gpu", "gpu_hint", "json_with_verdicts", "kept_notes", "numbered",
    "shape_names", "sharded_text", "single_text", "table_lines", "whole_weights", "wrapped", "zero_note",
]

WIDTH = 120
"""The widest line ``memlab estimate`` prints."""

_HOW = (
    "estimated on CPU kernels",
    "CUDA attention emulated",
    "reserved_bytes:",
    "card figure (reserve + CUDA context) modelled",
    "estimated on fake tensors: peak_bytes is the allocated peak",
)
"""The beginnings of the notes that say how a dry run computed its figures, not how to read them: in ``--json``,
left out of the terminal's answer."""


def wrapped(lines: Sequence[str], width: int = WIDTH, indent: str = "  ") -> list[str]:
    """``lines`` kept within ``width`` columns: a longer line goes on under itself, indented; a command to copy
    (a line of its own, ``memlab ...``) is never cut.

    Example:
        >>> wrapped(["a " * 8], width=8)
        ['a a a a', '  a a a', '  a']
    """
    out = []
    for line in lines:
        if len(line) <= width or line.lstrip().startswith("memlab "):  # a command to copy stays whole
            out.append(line)
            continue
        item = re.match(r"\s*\d+\. ", line)  # a numbered note goes on under its own words
        lead = " " * item.end() if item else line[: len(line) - len(line.lstrip())] + indent
        out += textwrap.wrap(line, width, initial_indent="", subsequent_indent=lead,
                             break_long_words=False, break_on_hyphens=False) or [line]
    return out


def shape_names(shapes: dict[str, Any]) -> str:
    """The built-in shapes as the README lists them, each once: a second name of the same shape in brackets.

    Example:
        >>> shape = ("LlamaConfig", {})
        >>> shape_names({"llama-3-8b": shape, "gpt2": ("GPT2Config", {}), "llama-8b": shape})
        'llama-3-8b (or llama-8b), gpt2'
    """
    first: dict[int, str] = {}
    others: dict[str, list[str]] = {}
    for name, shape in shapes.items():
        owner = first.setdefault(id(shape), name)
        others.setdefault(owner, [])
        if owner != name:
            others[owner].append(name)
    return ", ".join(name + (f" (or {', '.join(more)})" if more else "") for name, more in others.items())


def _sentence(text: str) -> str:
    text = text.strip()
    # a word, not a name in code ("micro_batch = ...", "peak_bytes: ...") nor a plan's label ("qlora: ...")
    if re.match(r"[a-z]+\b(?! =)(?!:)", text):
        text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def numbered(notes: Sequence[str]) -> list[str]:
    """Notes as numbered sentences, each once.

    Example:
        >>> numbered(["the card: reserve + context", "the card: reserve + context", "the load: fp32",
        ...           "qlora: 4-bit weights"])
        ['  1. The card: reserve + context.', '  2. The load: fp32.', '  3. qlora: 4-bit weights.']
    """
    return [f"  {number}. {_sentence(note)}" for number, note in enumerate(dict.fromkeys(notes), start=1)]


def kept_notes(notes: Sequence[str]) -> list[str]:
    """The notes worth a line in the terminal: those that change how the figures read (the load, what the dry run
    has no rule for, rows kept), not those that say how CUDA was emulated (:data:`_HOW`, in ``--json``).

    Example:
        >>> kept_notes(["CUDA attention emulated for an H100", "weights materialised in fp32"])
        ['weights materialised in fp32']
    """
    return [note for note in notes if not note.startswith(_HOW)]


def gpu_hint(args: argparse.Namespace, budget: int | None) -> str | None:
    """Where ``--budget`` is not the memory of the GPU the estimate assumes (no ``--gpu`` given), the ``--gpu`` that
    matches it (the known GPU whose memory is nearest), so that the CUDA context and the allocator's behaviour are
    that card's; None where ``--gpu`` is given, the device is the CPU or the budget is the GPU's.

    Example:
        >>> args = argparse.Namespace(gpu=None, device=None)
        >>> print(gpu_hint(args, 24 * 2**30))  # doctest: +ELLIPSIS
        the budget is not the memory of the GPU the estimate assumes, 79.18 GiB: for a 24 GB card \
add --gpu RTX4090-24GB
        >>> gpu_hint(args, 80 * 2**30) is None
        True
    """
    from memlab.estimation.cuda.gpus import GPUS, kind_or_default
    from memlab.plan import format_bytes

    if budget is None or cli_gpu(args) is not None or getattr(args, "device", None) == "cpu":
        return None
    assumed = kind_or_default(None)
    if abs(budget - assumed.memory_bytes) <= 0.1 * assumed.memory_bytes:
        return None
    nearest = min(GPUS.values(), key=lambda kind: abs(kind.memory_bytes - budget))
    if abs(nearest.memory_bytes - budget) > 0.1 * budget:
        return (f"the budget is not the memory of the GPU the estimate assumes, {format_bytes(assumed.memory_bytes)}; "
                "--gpu names another card (memlab estimate --help lists the kinds memlab knows)")
    size = nearest.name.rsplit("-", 1)[-1].replace("GB", " GB")
    return (f"the budget is not the memory of the GPU the estimate assumes, {format_bytes(assumed.memory_bytes)}: "
            f"for a {size} card add --gpu {nearest.name}")


def _card_note(args: argparse.Namespace, report: Any) -> str | None:
    """What the card column is, and the CUDA context it counts (the header names the GPU), once."""
    from memlab.plan import format_bytes

    cards = [trial for trial in report.trials if trial.status == "ok" and trial.card_bytes is not None]
    if not cards:
        return None
    context = cards[0].context_bytes
    counted = "" if context is None else f", {format_bytes(context)}"
    return (f"the card column is the caching allocator's reserve + the CUDA context{counted} (what nvidia-smi shows); "
            "fits are judged on it")


def single_text(args: argparse.Namespace, header: str, report: Any, budget: int | None,
                suggestions: Sequence[str]) -> list[str]:
    """The answer of ``memlab estimate`` on one GPU: ``header`` (the question), the verdict and the best plan, the
    table, numbered notes, and ``suggestions`` (the commands after it, :func:`memlab.frontends.cli.estimate.next
    .suggestion_lines`), each plan once, within :data:`WIDTH` columns.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report import Report, Trial
        >>> args = argparse.Namespace(gpu=None, device=None)
        >>> trial = Trial(Plan(), "ok", 2**30, {"params": 2**30}, None, None, None, "cuda", estimated=True)
        >>> print("\\n".join(single_text(args, "tiny: ...", Report([trial], budget=79 * 2**30), 79 * 2**30, [])))
        ... # doctest: +NORMALIZE_WHITESPACE
        tiny: ...
        Verdict: plain fits the budget.
        Best: plain, peak 1.00 GiB; nothing was timed: the lowest figure among the plans that fit
        <BLANKLINE>
          plan  status        peak GiB params GiB grads GiB optimizer GiB activations GiB other GiB
        ★ plain ok (estimate)      1.0        1.0         0             0               0         0
        <BLANKLINE>
        Notes:
          1. Card figure unknown (the allocator's reserve or the CUDA context is not known); fits are judged on the
             allocated peak.
    """
    from memlab.plan import format_bytes
    from memlab.report.views.tables import judged_text, nothing_fits_reason

    lines = [header]
    trials = report.trials
    fitting = [trial for trial in trials if report.fits(trial)]
    best = report.best
    host = [trial.host_budget for trial in trials if trial.host_budget is not None]  # --host-budget
    failed = sum(trial.status == "error" for trial in trials)
    if budget is None and not host:
        done = len(trials) - failed
        lines.append(f"Verdict: {done} plan{'s' if done != 1 else ''} estimated (no budget to judge).")
    elif fitting:
        count = (f"{fitting[0].label} fits" if len(trials) == 1
                 else f"{len(fitting)} of the {len(trials)} plans fit")
        judged = [*(["the budget"] if budget is not None else []),  # the header says the budget
                  *([f"the host budget of {format_bytes(min(host))}"] if host else [])]
        lines.append(f"Verdict: {count} {' and '.join(judged)}.")
    else:
        reason = nothing_fits_reason(report)
        if reason and budget is not None:  # the header says the budget
            reason = reason.replace(f"the budget of {format_bytes(budget)}", "the budget")
        tried = f"{trials[0].label} does not fit" if len(trials) == 1 else f"none of the {len(trials)} plans tried fits"
        lines.append(f"Verdict: {tried}" + (f": {reason}." if reason else "."))
    if failed:  # the exit status says it too (memlab.frontends.cli.errors.estimate_status)
        rows = "its row says" if failed == 1 else "their rows say"
        lines[-1] += f" {failed} plan{'s' if failed != 1 else ''} could not be estimated: {rows} error, a note why."
    if best is not None:
        lines.append(f"Best: {best.label}, {judged_text(best)}; nothing was timed: the lowest figure among the plans "
                     "that fit")
    elif report.suggestions:
        first = report.suggestions[0]
        lines.append(f"Best: {first.label}, estimated to fit: {judged_text(first)}; outside what you tried (its "
                     "command under Next)")
    lines += ["", *table_lines(report, timed=False)]
    notes: list[str] = []
    card = _card_note(args, report)
    if card is None:  # on CUDA without a reserve or a context: the card figure unknown, and what was judged instead
        from memlab.report.views.tables import card_line

        card = card_line(report)
    if card is not None:
        notes.append(card)
    from memlab.report.host import host_lines

    notes += host_lines(report)
    grads = grads_note(report)
    if grads:
        notes.append(grads)
    zero = zero_note(report)
    if zero is not None:
        notes.append(zero)
    hint = gpu_hint(args, budget)
    if hint is not None:
        notes.append(hint)
    from memlab.report.views.tables import shared_notes

    shared = shared_notes(report)
    notes += kept_notes(shared)
    for trial in trials:
        notes += [f"{trial.label}: {note}" for note in kept_notes([n for n in trial.notes if n not in shared])]
        if trial.error:
            notes.append(f"{trial.label}: {trial.error}")
    if notes:
        lines += ["", "Notes:", *numbered(notes)]
    if suggestions:
        lines += ["", *suggestions]
    return wrapped(lines)


def grads_note(report: Any) -> str | None:
    """Where a plan that trains shows no gradients at its peak (a LoRA step peaks before its adapters' gradients
    exist): that they come after the peak, and how large they get; None where no plan does.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report import Report, Trial
        >>> from memlab.report.timeline import Timeline, TimelinePeak
        >>> peak = TimelinePeak(10, "backward", "", {"grads": 0, "activations": 10}, {})
        >>> line = Timeline(["grads", "activations"], [0, 1], {"grads": [0, 3], "activations": [10, 2]},
        ...                 [("backward", 0, 1)], peak)
        >>> lora = Trial(Plan(adapter="lora"), "ok", 10, {"grads": 0, "activations": 10}, None, None, None, "cuda",
        ...              timeline=line)
        >>> print(grads_note(Report([lora])))
        the grads column is 0 at the peak: lora peaks in backward before any gradient is kept; its gradients, 3 B at \
most, come later in the step
    """
    from memlab.plan import format_bytes

    said = []
    for trial in report.trials:
        line = trial.timeline
        if trial.status != "ok" or trial.breakdown.get("grads", 0) or line is None:
            continue
        most = max(line.series.get("grads", [0]) or [0])
        if most:
            said.append(f"{trial.label} peaks in {line.peak.phase or 'its step'} before any gradient is kept; its "
                        f"gradients, {format_bytes(most)} at most, come later in the step")
    return f"the grads column is 0 at the peak: {'; '.join(said)}" if said else None


def zero_note(report: Any) -> str | None:
    """Where a memory column shows 0 beside ``< 0.01``: that the 0 is none at all at the peak (the columns split the
    peak by category), not a small figure rounded down, and which cells; None where the table has not both.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report import Report, Trial
        >>> lora = Trial(Plan(adapter="lora"), "ok", 2**30, {"params": 2**30 - 9, "activations": 9}, None, None,
        ...              None, "cuda")
        >>> print(zero_note(Report([lora])))
        a 0 in a memory column is none at all at the peak, not a small figure rounded (that is < 0.01): \
grads, optimizer and other in lora
        >>> zero_note(Report([Trial(Plan(), "ok", 9, {"params": 9}, None, None, None, "cuda")])) is None
        True
    """
    from memlab.report.views.tables import table_rows

    ran = [(trial, row) for trial, row in zip(report.trials, table_rows(report), strict=True) if trial.status == "ok"]
    if not any(row[name] == "< 0.01" for _, row in ran for name in report.categories):
        return None
    cells: dict[str, list[str]] = {}
    for trial, row in ran:
        none = [name for name in report.categories if row[name] == "0"]
        if none:
            cells.setdefault(", ".join(none[:-1]) + (" and " if len(none) > 1 else "") + none[-1], []).append(
                trial.label)
    if not cells:
        return None
    said = "; ".join(f"{names} in {' and '.join(labels)}" for names, labels in cells.items())
    return f"a 0 in a memory column {ZERO_WORDS}: {said}"


ZERO_WORDS = "is none at all at the peak, not a small figure rounded (that is < 0.01)"
"""What a 0 beside ``< 0.01`` in a table of memory means (:func:`zero_note`)."""


def table_lines(report: Any, *, timed: bool | None = None) -> list[str]:
    """The text table's lines alone (its header and a line per trial, no notes column, no summary): what
    ``memlab estimate`` prints before its own summary. ``timed`` False leaves out the speed columns (an estimate has
    none); None keeps them where a row has a figure.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report import Report, Trial
        >>> r = Report([Trial(Plan(), "ok", 2**30 + 1024, {"params": 2**30, "other": 1024}, None, None, None,
        ...                   "cuda", estimated=True)])
        >>> print("\\n".join(table_lines(r)))
          plan  status        peak GiB params GiB grads GiB optimizer GiB activations GiB other GiB
        ★ plain ok (estimate)      1.0        1.0         0             0               0    < 0.01
    """
    from memlab.report.views.tables import SPEEDS, headers, shown_columns, table_rows, table_units, text_lines

    rows = table_rows(report)
    keys = [key for key in shown_columns(rows, with_mark=True, categories=report.categories) if key != "notes"]
    if timed is None:
        timed = any(row[key] not in ("", "-") for row in rows for key in SPEEDS)
    if not timed:
        keys = [key for key in keys if key not in (*SPEEDS, "spread")]
    lines = text_lines(rows, headers(report), keys)
    judged_host = any(trial.host_budget is not None for trial in report.trials)
    if max(map(len, lines), default=0) > WIDTH and "host" in keys and not judged_host:
        # Unjudged host bytes give way to the memory columns in a narrow answer; the notes say what they hold.
        keys = [key for key in keys if key != "host"]
        lines = text_lines(rows, headers(report), keys)
    if max(map(len, lines), default=0) > WIDTH:  # the size unit said once, above the table, not in every header
        (unit, _), _ = table_units(report)
        bare = {key: name.removesuffix(f" {unit}") for key, name in headers(report).items()}
        lines = [f"Memory in {unit}:", *text_lines(rows, bare, keys)]
    return lines


def _gib(value: float | None) -> str:
    from memlab.report.views.tables import in_unit

    return "-" if value is None else in_unit(value, ("GiB", 2**30))


def sharded_text(args: argparse.Namespace, header: str, trials: Sequence[tuple[Any, str, Any]], budget: int | None,
                 searched: Sequence[str], *, weights_bytes: dict[str, int] | None = None) -> list[str]:
    """The answer of ``memlab estimate --gpus``: ``header``, the best (the fewest GPUs that fit, then the lowest
    figure), a table of each plan and strategy (GPUs, the peak and card per GPU, the verdict and the figure it
    judged), where each one's memory goes per GPU (a row per part, a column per strategy, one unit), why a strategy
    fits on no number of GPUs, the notes and ``searched`` (:func:`memlab.frontends.cli.estimate.next.searched_lines`).

    ``weights_bytes``: each plan label's whole weights (what ZeRO-2 keeps on every GPU), for the reason a strategy
    fits nowhere.

    Example:
        >>> from memlab.plan import Plan
        >>> args = argparse.Namespace(gpu=None, device=None, gpus="auto")
        >>> print("\\n".join(sharded_text(args, "tiny", [(Plan(), "zero2", None)], 2**30, [],
        ...                               weights_bytes={"plain": 2**31})))  # doctest: +NORMALIZE_WHITESPACE +ELLIPSIS
        tiny
        Best: none fits the budget on up to 1024 GPUs.
        <BLANKLINE>
         plan  strategy GPUs peak/GPU GiB card/GPU GiB verdict
         plain zero2       -            -            - fits on no number of GPUs up to 1024 [1]
        <BLANKLINE>
        Notes:
          1. ZeRO-2 keeps the whole weights on every GPU (it shards the gradients and optimizer state): 2.00 GiB, more
             than the budget, on any number of GPUs.
          2. The budget is not the memory of the GPU the estimate assumes, 79.18 GiB; --gpu names another card
             (memlab estimate --help lists the kinds memlab knows).
    """
    from memlab.plan import format_bytes
    from memlab.report.views.tables import verdict_text

    lines = [header]
    ran = [(plan, name, trial) for plan, name, trial in trials if trial is not None and trial.status == "ok"]
    fitting = [item for item in ran if item[2].fits]
    if budget is None:
        lines.append("Best: no budget to judge; the per-GPU figures below.")
    elif fitting:
        plan, name, trial = min(fitting, key=lambda item: (item[2].gpus, item[2].verdict_bytes))
        figure = "card" if trial.card_bytes is not None else "allocated peak"
        lines.append(f"Best: {plan.label()} with {name} on {trial.gpus} GPU{'s' if trial.gpus != 1 else ''} "
                     f"({figure} {format_bytes(trial.verdict_bytes)} per GPU): the fewest GPUs that fit, then the "
                     "lowest figure")
    else:
        lines.append("Best: none fits the budget on up to 1024 GPUs.")  # the header says the budget
    notes: list[str] = []
    peak_only = _peak_only_note(ran, budget)
    if peak_only is not None:
        notes.append(peak_only)
    rows = [["plan", "strategy", "GPUs", "peak/GPU GiB", "card/GPU GiB", "verdict"]]
    for plan, name, trial in trials:
        if trial is None:
            reason = _nowhere(name, plan, budget, weights_bytes or {})
            notes.append(reason)
            rows.append([plan.label(), name, "-", "-", "-",
                         f"fits on no number of GPUs up to 1024 [{len(notes)}]"])
        elif trial.status != "ok":
            notes.append(f"{plan.label()} with {name}: {trial.error}")
            rows.append([plan.label(), name, str(trial.gpus), "-", "-", f"error [{len(notes)}]"])
        else:
            judged = budget is not None or trial.host_budget is not None  # "by the card figure" as "(card figure)"
            verdict = re.sub(r" by the (.+)", r" (\1)", verdict_text(trial, trial.fits)) if judged else ""
            if peak_only is not None and "allocated peak" in verdict:  # the note says why this figure
                verdict += f" [{notes.index(peak_only) + 1}]"
            rows.append([plan.label(), name, str(trial.gpus), _gib(trial.peak_bytes), _gib(trial.card_bytes),
                         verdict])
    lines += ["", *_aligned(rows, left=(0, 1, 5))]
    parts = list(dict.fromkeys(key for _, _, trial in ran for key in trial.detail))
    if parts:  # a row per part, a column per plan and strategy: as narrow as the table above, one unit for all
        from memlab.report.views.tables import in_unit

        largest = max(value for _, _, trial in ran for value in trial.detail.values())
        unit = ("GiB", 2**30) if largest >= 10 * 2**30 else ("MiB", 2**20)
        several = len({plan.label() for plan, _, _ in ran}) > 1
        detail = [["part", *(f"{plan.label()} {name}" if several else name for plan, name, _ in ran)]]
        detail += [[key, *(in_unit(trial.detail.get(key) or 0, unit) for _, _, trial in ran)] for key in parts]
        cells = {cell for row in detail[1:] for cell in row[1:]}
        if {"0", "< 0.01"} <= cells:
            notes.append(f"a 0 under where the peak goes {ZERO_WORDS}")
        lines += ["", f"Where the peak goes, per GPU ({unit[0]}):", *_aligned(detail, left=(0,))]
    hint = gpu_hint(args, budget)
    if hint is not None:
        notes.append(hint)
    if notes:
        lines += ["", "Notes:", *numbered(notes)]
    if searched:
        lines += ["", *searched]
    return wrapped(lines)


ENGINES = ENGINE_NAMES
"""Each strategy as its engine names it (:data:`memlab.live.sharding.ENGINE_NAMES`)."""


def _peak_only_note(ran: Sequence[tuple[Any, str, Any]], budget: int | None) -> str | None:
    """Where some strategies' rows are judged on the allocated peak (no card figure: ZeRO's, from DeepSpeed's
    formulas, no step traced), which and why, and that the others are judged on the card figure; None where every
    row is judged on one figure, or none is judged.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.estimation.sharded.fsdp2 import ShardedTrial
        >>> def rank(strategy, reserved):
        ...     return ShardedTrial(Plan(), "ok", 9, {}, None, None, None, "cuda", gpus=2, strategy=strategy,
        ...                         reserved_bytes=reserved, context_bytes=None if reserved is None else 2**29)
        >>> print(_peak_only_note([(Plan(), "fsdp2", rank("fsdp2", 12)), (Plan(), "zero3", rank("zero3", None))], 99))
        ZeRO-3 is judged on its allocated peak, the other strategies on the card figure: ZeRO's figures come from \
DeepSpeed's formulas and the FSDP2 run's activations, not a traced step, so its allocator's reserve, and so its card \
figure, is not known; keep a margin for the reserve and the CUDA context, 512.0 MiB
    """
    from memlab.plan import format_bytes

    judged = [trial for _, _, trial in ran if budget is not None or trial.host_budget is not None]
    unknown = list(dict.fromkeys(ENGINES.get(trial.strategy, trial.strategy) for trial in judged
                                 if trial.card_bytes is None))
    if not unknown:
        return None
    contexts = {trial.context_bytes for trial in judged if trial.context_bytes}
    context = f", {format_bytes(contexts.pop())}" if len(contexts) == 1 else ""
    others = ", the other strategies on the card figure" if any(t.card_bytes is not None for t in judged) else ""
    its = "its" if len(unknown) == 1 else "their"
    return (f"{' and '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} judged on {its} allocated peak{others}: "
            "ZeRO's figures come from DeepSpeed's formulas and the FSDP2 run's activations, not a traced step, so "
            f"{its} allocator's reserve, and so {its} card figure, is not known; keep a margin for the reserve and the "
            f"CUDA context{context}")


def whole_weights(model: Any, plans: Any) -> dict[str, int]:
    """Each plan's whole weights in bytes (each parameter once; 2 bytes each for bf16 weights, else 4): what ZeRO-2
    keeps on every GPU. Empty where the model is a config (its parameters are not counted here).

    Example:
        >>> import torch
        >>> from memlab.plan import Plan
        >>> whole_weights(torch.nn.Linear(4, 4), [Plan(), Plan(weights="bf16")])
        {'plain': 80, 'bf16-weights': 40}
    """
    parameters = getattr(model, "parameters", None)
    if not callable(parameters):
        return {}
    count = sum(p.numel() for p in {id(p): p for p in parameters()}.values())
    return {plan.label(): count * (2 if plan.weights == "bf16" else 4) for plan in plans}


def _nowhere(strategy: str, plan: Any, budget: int | None, weights: dict[str, int]) -> str:
    """Why ``strategy`` fits ``plan`` on no number of GPUs up to 1024 (the budget's size is the header's)."""
    from memlab.plan import format_bytes

    whole = weights.get(plan.label())
    if strategy == "zero2" and whole is not None and budget is not None and whole > budget:
        return (f"ZeRO-2 keeps the whole weights on every GPU (it shards the gradients and optimizer state): "
                f"{format_bytes(whole)}, more than the budget, on any number of GPUs")
    return (f"{ENGINES.get(strategy, strategy)} with {plan.label()}: even at 1024 GPUs the per-GPU peak passes the "
            "budget (what sharding does not divide: the activations, the gathered layers, the communication buffers)")


def _aligned(rows: list[list[str]], left: tuple[int, ...]) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [" " + " ".join(cell.ljust(widths[i]) if i in left else cell.rjust(widths[i])
                           for i, cell in enumerate(row)).rstrip() for row in rows]


def budget_words(args: argparse.Namespace, budget: int | None) -> str:
    """``, budget: the A100-40GB's 39.49 GiB`` where the budget is the GPU's memory (no --budget given)."""
    from memlab.plan import format_bytes

    if args.budget is not None:  # the unit spelled out: 24GB is 10^9-byte gigabytes, 24GiB 2^30-byte
        from memlab.report.format import budget_words

        return f", budget {budget_words(str(args.budget))}"
    if budget is None:
        return ""
    return f", budget: its memory, {format_bytes(budget)} (--budget SIZE sets another)"


def json_with_verdicts(report: Any) -> str:
    """The report as JSON, each trial (and suggestion) with ``verdict``: the words its table row shows in ``status``
    (``ok (estimate)``, ``does not fit (over budget)``...), beside ``status`` (whether it ran) and ``fits``.

    Example:
        >>> import json
        >>> from memlab.plan import Plan
        >>> from memlab.report import Report, Trial
        >>> trial = Trial(Plan(), "ok", 900, {"params": 900}, None, None, None, "cuda", estimated=True)
        >>> row = json.loads(json_with_verdicts(Report([trial], budget=800)))["trials"][0]
        >>> row["status"], row["fits"], row["verdict"]
        ('ok', False, 'does not fit (over budget)')
    """
    import json

    from memlab.report.views.tables import status_text

    data = report.to_dict()
    for row, trial in zip(data["trials"], report.trials, strict=True):
        row["verdict"] = status_text(trial, report.fits(trial))
    for row, trial in zip(data["suggestions"], report.suggestions, strict=True):
        row["verdict"] = status_text(trial, report.fits(trial))
    # what the table's "Best:" line says: the plan's label and why (None when nothing fits)
    from memlab.report.views.verdicts import best_caption

    best = report.best
    data["best"] = None if best is None else {"label": best.label, "why": best_caption(report)}
    return json.dumps(data, indent=2, default=str)


def for_gpu(args: argparse.Namespace) -> str:
    """``, for an H100-80GB`` where the estimate is for CUDA (the GPU kind whose CUDA context it models)."""
    from memlab.estimation.cuda.gpus import kind_or_default

    return "" if args.device == "cpu" else f", for {kind_or_default(cli_gpu(args)).called}"


def count_text(number: int) -> str:
    for size, unit in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if number >= size:
            return f"{number / size:.2f}{unit}"
    return str(number)
