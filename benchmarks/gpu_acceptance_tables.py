"""The GPU acceptance run's results as markdown tables (what docs/benchmarks.md shows of the committed JSON), kept
apart from the run itself in benchmarks/gpu_acceptance.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks import common


def _gib(num_bytes: float | None) -> float | None:
    return None if num_bytes is None else round(num_bytes / 2**30, 2)


def markdown(result: dict[str, Any]) -> str:
    """The docs' GPU tables, made from a result of this run (``--markdown FILE`` prints them): a line on the device
    and the counts, then each part in the run's order, its table or sentence, and under it the checks that failed.

    Example:
        >>> part = {"checks": [{"check": "a fits", "passed": False, "ratio": 1.2}, {"check": "b", "passed": True}]}
        >>> print(markdown({"parts": {"cap": part}, "device": {"cpu": "x"}, "versions": {"torch": "2", "transformers":
        ...     "5", "bitsandbytes": None}, "summary": {"passed": 1, "failed": 1}, "seconds": 3, "date": "d"})[60:])
        bitsandbytes None. 1 checks passed, 1 failed, in 3 s (d).
        <BLANKLINE>
        **cap**: 1 of 2 checks passed.
        <BLANKLINE>
        Failed: `a fits` (ratio 1.2).
        <BLANKLINE>
    """
    parts = result["parts"]
    device = result["device"]
    versions = result["versions"]
    summary = result["summary"]
    lines = [
        f"Device: {device.get('gpu', device['cpu'])}, driver {device.get('driver')}, CUDA {device.get('cuda')}; "
        f"torch {versions['torch']}, transformers {versions['transformers']}, bitsandbytes {versions['bitsandbytes']}"
        f". {summary['passed']} checks passed, {summary['failed']} failed, in {result['seconds']:.0f} s "
        f"({result['date']}).",
        "",
    ]
    if summary.get("not_started"):
        lines += [f"Not started (the run's deadline): {', '.join(summary['not_started'])}.", ""]
    for name, part in parts.items():
        if part.get("not_started"):
            continue
        if part.get("unavailable"):
            lines += [f"**{name}**: not run ({part['unavailable']}).", ""]
            continue
        drawn = draw_part(name, part)
        lines += drawn or [_counts(name, part), ""]
        lines += _failed(part)
    return "\n".join(lines)


def draw_part(name: str, part: dict[str, Any]) -> list[str]:
    """A part's table or sentence, where its figures are there; for a part that raised or was cut (its checks only),
    what stopped it; else nothing.

    Example:
        >>> draw_part("cap", {"checks": [{"check": "cap ran to the end", "passed": False, "error": "OOM"}]})
        ['**cap**: did not run to the end (OOM).', '']
    """
    try:
        drawn = RENDERERS[name](part) if name in RENDERERS else []
    except (KeyError, TypeError, IndexError, StopIteration):
        drawn = []
    checks = part.get("checks") or [{}]
    if not drawn and checks[-1].get("passed") is False and checks[-1].get("check", "").endswith("ran to the end"):
        return [_stopped(name, part), ""]
    return drawn


def _counts(name: str, part: dict[str, Any]) -> str:
    checks = part.get("checks", [])
    passed = sum(1 for c in checks if c["passed"] is True)
    return f"**{name}**: {passed} of {len(checks)} checks passed."


FIGURES = ("ratio", "error", "why", "memlab", "reference", "hand_made", "estimate", "measured", "budget", "peak")
"""The figures of a failed check shown beside its name, in this order, where it has them."""


def _failed(part: dict[str, Any]) -> list[str]:
    """The part's failed checks, each with its telling figures (bytes as GiB), as one paragraph."""
    failed = [check for check in part.get("checks", []) if check["passed"] is False]
    if not failed:
        return []
    shown = []
    for check in failed:
        figures = []
        for key in FIGURES:
            value = check.get(key)
            if value is None:
                continue
            if isinstance(value, int) and not isinstance(value, bool) and value > 2**20:
                value = f"{value / 2**30:.2f} GiB"
            elif isinstance(value, str):
                value = value.strip().splitlines()[0][:160]
            figures.append(f"{key} {value}")
        shown.append(f"`{check['check']}`" + (f" ({', '.join(figures)})" if figures else ""))
    return [f"Failed: {'; '.join(shown)}.", ""]


def _probe(part: dict[str, Any]) -> list[str]:
    return ["**Probe against a hand-made step** (Llama, " + _shape(part["model"]) + "):", "",
            common.markdown_table(
                ["plan", "memlab peak GiB", "hand-made GiB", "ratio", "optimizer state: memlab = counted"],
                [[r["plan"], _gib(r["peak_bytes"]), _gib(r["reference_peak_bytes"]), r["peak_over_reference"],
                  "yes" if r["breakdown"].get("optimizer") == r["reference_optimizer_bytes"] else "no"]
                 for r in part["rows"]]), ""]


def _estimate(part: dict[str, Any]) -> list[str]:
    lines = ["**Dry-run estimate (fake tensors, from the config) against the measured peak:**", "",
             _estimate_table(part), ""]
    diagnostic = part.get("diagnostic")
    if diagnostic:
        lines += [f"**Allocations of 100 MB or more in one tracked step** ({diagnostic['row']}, Llama-1B, 2 x 1024): "
                  f"{len(diagnostic['allocations'])}, {_gib(diagnostic['in_optimizer_bytes'])} GiB under an optimizer "
                  "frame.", ""]
    return lines


def _plans(title: str) -> Any:
    def render(part: dict[str, Any]) -> list[str]:
        reserved = any("plan_fields" in r for r in part["rows"])  # rows of runs after the first say more
        return [f"**{title}** (Llama, {_shape(part['model'])}):", "", common.markdown_table(
            ["plan", "peak GiB", *(["reserved GiB"] if reserved else []), "saving", "optimizer GiB",
             "activations GiB", "samples/s", "speed-up"],
            [[r.get("step", r["plan"]), _gib(r["peak_bytes"]), *([_gib(r.get("reserved_bytes"))] if reserved else []),
              _percent(r.get("memory_saving")), _gib(r["breakdown"].get("optimizer")),
              _gib(r["breakdown"].get("activations")), r["samples_per_s"], r.get("speedup")] for r in part["rows"]],
        ), ""]

    return render


def _fit(fit: dict[str, Any]) -> list[str]:
    fresh = fit["fresh_process"]
    return [f"**fit** on a budget of {_gib(fit['budget_bytes'])} GiB (45% of the plain peak, Llama "
            f"{_shape(fit['model'])}): chose `{fit['best']['plan']}` ({_gib(fit['best']['peak_bytes'])} GiB) after "
            f"{len(fit['trials'])} trials in {fit['fit_seconds']} s, {len(fit['skipped'])} plans skipped; re-measured "
            f"in a fresh process: {_gib(fresh.get('peak_bytes'))} GiB.", ""]


def _cap(cap: dict[str, Any]) -> list[str]:
    drift = next(c for c in cap["checks"] if "to the byte" in c["check"])
    return [f"**Budget cap**: {len(cap['capped'])} trials of plans over a budget of {_gib(cap['budget_bytes'])} GiB "
            f"(60% of the plain peak) all reported oom; memory_allocated moved by {drift.get('drift')} bytes.", ""]


def _estimate_table(part: dict[str, Any]) -> str:
    rows = part["rows"]
    if not any("reserved_peak_bytes" in r for r in rows):  # the first run's rows: the allocated peak only
        return common.markdown_table(
            ["model", "plan", "batch", "estimate GiB", "measured GiB", "estimate / measured"],
            [[r["model"], r["plan"], f"{r['rows']} x {r['length']}", _gib(r["estimate_bytes"]),
              _gib(r["measured_bytes"]), r["estimate_over_measured"]] for r in rows],
        )
    return common.markdown_table(
        ["model", "plan", "batch", "estimate GiB", "measured GiB", "estimate / measured", "reserved GiB",
         "context GiB", "card estimate / measured"],
        [[r["model"], r["plan"], f"{r['rows']} x {r['length']}", _gib(r["estimate_bytes"]), _gib(r["measured_bytes"]),
          r["estimate_over_measured"], _gib(r.get("reserved_peak_bytes")), _gib(r.get("context_bytes")),
          r.get("card_estimate_over_measured")] for r in rows],
    )


def _inference(part: dict[str, Any]) -> list[str]:
    lines = [f"**Inference** (Llama, {_shape(part['model'])}, {part['new_tokens']} new tokens):", ""]
    lines.append(common.markdown_table(
        ["weights", "prompt", "peak GiB", "params GiB", "KV cache MiB (= kv_cache_bytes)", "prefill tokens/s",
         "decode tokens/s"],
        [[r["weights"], r["prompt_tokens"], _gib(r["peak_bytes"]), _gib(r["breakdown"].get("params")),
          f"{common.mib(r['kv_cache_end_bytes'])} ({_yes(r['kv_cache_end_bytes'] == r['kv_cache_bytes_formula'])})",
          r["prefill_tokens_per_s"], r["decode_tokens_per_s"]] for r in part["rows"]],
    ))
    fitted = part["fit_inference"]
    fresh = fitted["fresh_process"]
    return lines + ["", f"fit_inference on {_gib(fitted['budget_bytes'])} GiB: largest batch {fitted['largest_batch']}"
                        f" ({len(fitted['trials'])} sizes measured); in a fresh process: "
                        f"{_gib(fresh.get('peak_bytes'))} GiB, fits: {fresh.get('fits')}.", ""]


def _ties(ties: dict[str, Any]) -> list[str]:
    return [f"**Ties**: the same plan twice was a tie in {ties['same_plan_twice']['ties']} of "
            f"{ties['same_plan_twice']['of']} runs; a plan {ties['slowdown_calibrated']:.0%} slower was ranked "
            f"slower in {ties['truly_slower']['ranked_slower']} of {ties['truly_slower']['of']}.", ""]


def _trainer_line(title: str, part: dict[str, Any]) -> str:
    best = part["fit"]["best"]
    return (f"**{title}**: fit(trainer) on {_gib(part['budget_bytes'])} GiB chose `{best['plan'] if best else None}`; "
            f"trainer.train() under watch peaked at {_gib(part['watched_peak_bytes'])} GiB"
            f"{_overhead(part.get('overhead'))}.")


def _trainer(trainer: dict[str, Any]) -> list[str]:
    if "budget_bytes" not in trainer:
        return [_stopped("Trainer", trainer), ""]
    lines = [_trainer_line("Trainer", trainer), ""]
    sft = trainer.get("sft") or {}  # the runs before issue 57 ran the SFTTrainer in this part
    if "budget_bytes" in sft:
        lines += [_trainer_line("SFTTrainer (TRL, packing, LoRA with dropout 0.05)", sft), ""]
    elif sft.get("missing"):
        lines += [f"**SFTTrainer**: not run ({sft['missing']}).", ""]
    return lines


def _stopped(title: str, part: dict[str, Any]) -> str:
    """A part that raised or was cut: what stopped it, and the checks it made before."""
    last = part["checks"][-1]
    before = [c for c in part["checks"][:-1] if c["passed"] is not None]
    error = (last.get("error") or "").strip().splitlines()[0][:200] if last["passed"] is False else "?"
    made = f"; {sum(1 for c in before if c['passed'])} of {len(before)} checks before it passed" if before else ""
    return f"**{title}**: did not run to the end ({error}){made}."


def _sft_peft(part: dict[str, Any]) -> list[str]:
    if part.get("missing"):
        return [f"**SFTTrainer with a peft config**: not run ({part['missing']}).", ""]
    head = (f"**SFTTrainer with a LoRA peft_config** (TRL, packing to {part['settings']['max_length']} tokens, the "
            f"trainer's plan `{part.get('own_plan')}`, Llama {_shape(part['model'])}):")
    reference = part.get("train_peak_bytes")
    rows = [["the trainer's own train() (no memlab)", _gib(reference), None],
            *[[what, _gib((part.get(key) or {}).get("peak_bytes")),
               _ratio((part.get(key) or {}).get("peak_bytes"), reference)]
              for what, key in (("memlab.measure(trainer)", "measured"), ("memlab.estimate(trainer)", "estimated"))]]
    lines = [head, "", common.markdown_table(["what", "peak GiB", "/ train()"], rows), ""]
    if "budget_bytes" in part:
        lines += [_trainer_line("fit(trainer)", part), ""]
    if part.get("broken_at"):
        lines += [f"The CUDA context broke at: {part['broken_at']}.", ""]
    return lines


def _rl(part: dict[str, Any]) -> list[str]:
    """TRL's DPO and GRPO trainers: each one's own train() beside the estimates made on the GPU and as on a laptop."""
    if part.get("missing"):
        return [f"**TRL's DPO and GRPO trainers**: not run ({part['missing']}).", ""]
    grpo = part["settings"]["grpo"]
    model = part["model"]
    head = (f"**TRL's DPO and GRPO trainers** (bf16, Qwen2 hidden {model['hidden']} x {model['layers']} layers, "
            f"vocabulary {model['vocab']:,}; GRPO {grpo['generations']} "
            f"generations of {grpo['completion']} tokens, beta {grpo['beta']}; the laptop's estimate made in a process "
            "that saw no GPU and no Triton):")
    rows = []
    for name, row in part["trainers"].items():
        made, laptop = row.get("gpu_made") or {}, row.get("laptop_made") or {}
        reference = row.get("train_peak_bytes")
        rows.append([name, _gib(reference), _gib(made.get("peak_bytes")), _ratio(made.get("peak_bytes"), reference),
                     _gib(laptop.get("peak_bytes")), row.get("laptop_over_gpu_made")])
    headers = ["trainer", "train() GiB", "estimate GiB", "/ train()", "laptop's GiB", "/ estimate"]
    lines = [head, "", common.markdown_table(headers, rows), ""]
    if part.get("broken_at"):
        lines += [f"The CUDA context broke at: {part['broken_at']}.", ""]
    return lines


def _grpo(title: str) -> Callable[[dict[str, Any]], list[str]]:
    """The GRPO parts of issue 86: each trainer's own train() beside the GPU-made and laptop-made estimates."""

    def render(part: dict[str, Any]) -> list[str]:
        if part.get("missing"):
            return [f"**{title}**: not run ({part['missing']}).", ""]
        settings, model = part["settings"], part["model"]
        grpo = settings["grpo"]
        laptop = "on the meta device" if settings.get("laptop_on_meta") else "built on the CPU"
        head = (f"**{title}** ({model['family']}, hidden {model['hidden']} x {model['layers']} layers, vocabulary "
                f"{model['vocab']:,}, weights {settings.get('dtype')}; {grpo['generations']} generations of "
                f"{grpo['completion']} tokens after {grpo['prompt']}, beta {grpo['beta']}; the laptop's trainer "
                f"{laptop}, in a process that saw no GPU and no Triton):")
        rows = []
        for name, row in part["trainers"].items():
            made, theirs = row.get("gpu_made") or {}, row.get("laptop_made") or {}
            reference = row.get("train_peak_bytes")
            rows.append([name, _gib(reference), _gib(made.get("peak_bytes")), _ratio(made.get("peak_bytes"), reference),
                         _gib(theirs.get("peak_bytes")), _ratio(theirs.get("peak_bytes"), reference)])
        headers = ["trainer", "train() GiB", "GPU-made GiB", "/ train()", "laptop-made GiB", "/ train()"]
        return [head, "", common.markdown_table(headers, rows), ""]

    return render


def _fp8(part: dict[str, Any]) -> list[str]:
    """Pure bf16 with torchao's float8: a user's loop against the laptop-made estimate."""
    head = (f"**Pure bf16 and torchao's float8** (Llama {_shape(part['model'])}, estimated for "
            f"{part['estimated_for']}; float8: {part['float8']}):")
    rows = [[r["row"], _gib(r["loop"].get("allocated_bytes")), _gib(r["estimate"].get("peak_bytes")),
             r["estimate_over_allocated"], _gib(r["loop"].get("card_bytes")), _gib(r["estimate"].get("card_bytes")),
             r["card_estimate_over_measured"]] for r in part["rows"]]
    headers = ["plan", "loop's allocated GiB", "estimate GiB", "/ loop", "loop's reserved + context GiB",
               "card estimate GiB", "/ loop"]
    return [head, "", common.markdown_table(headers, rows), ""]


def _cast_reserve(part: dict[str, Any]) -> list[str]:
    """Built in fp32, cast to bf16, trained: the program's peaks against the laptop-made estimate."""
    head = (f"**The cast-after-load reserve** (each family built in fp32 on the GPU, `.to(torch.bfloat16)`, fused "
            f"AdamW; estimated for {part['estimated_for']} with `Plan(weights=\"bf16\")` and "
            "`load={\"dtype\": torch.float32}`):")
    rows = [[r["model"], f"{r['rows']} x {r['length']}", _gib(r["program"].get("allocated_bytes")),
             _gib(r["estimate"].get("peak_bytes")), r["estimate_over_measured"],
             _gib(r["program"].get("reserved_peak_bytes")), _gib(r["estimate"].get("reserved_bytes")),
             r["reserved_estimate_over_measured"]] for r in part["rows"]]
    headers = ["model", "batch", "allocated GiB", "estimate GiB", "/ allocated", "reserved GiB",
               "reserved estimate GiB", "/ reserved"]
    return [head, "", common.markdown_table(headers, rows), ""]


def _compile_families(part: dict[str, Any]) -> list[str]:
    """A user's loop, eager and compiled, on each family against the laptop-made estimate."""
    rows = []
    for family, found in part["families"].items():
        for variant in ("eager", "compiled"):
            loop, made = found["measured"].get(variant) or {}, found["estimates"].get(variant) or {}
            allocated, reserved = loop.get("allocated_bytes"), loop.get("reserved_bytes")
            rows.append([family, variant, _gib(allocated), _gib(made.get("peak_bytes")),
                         _ratio(made.get("peak_bytes"), allocated), _gib(reserved), _gib(made.get("reserved_bytes")),
                         _ratio(made.get("reserved_bytes"), reserved)])
    headers = ["family", "step", "loop's allocated GiB", "estimate GiB", "/ loop", "loop's reserved GiB",
               "reserved estimate GiB", "/ loop"]
    return [f"**torch.compile on more families** (estimated for {part['estimated_for']} as on a laptop):", "",
            common.markdown_table(headers, rows), ""]


def bar_markdown(rows: list[dict[str, Any]]) -> str:
    """The bar: one line of counts, then each part's newest GPU result (the run's JSON named), its checks, device,
    commit (``<=`` where the run recorded none: the last commit before its date) and date, and the part's limit.

    Example:
        >>> print(bar_markdown([{"part": "cap", "limit_s": 60, "verdict": "passed", "passed": 5, "failed": 0,
        ...     "device": "NVIDIA H200", "commit": None, "commit_before": "abc1234",
        ...     "date": "2026-11-26T01:55:05+00:00", "source": "x.json"},
        ...     {"part": "fp8", "limit_s": 120}]))
        2 parts; on its newest GPU run 1 passed, 0 failed; 1 never ran on a GPU.
        <BLANKLINE>
        | part | newest run | checks passed / failed | device | commit | date (UTC) | limit s | result |
        |:--|:--|:--|:--|:--|:--|--:|:--|
        | cap | pass | 5 / 0 | NVIDIA H200 | <= abc1234 | 2026-11-26 01:55 | 60 | x.json |
        | fp8 | never run | - | - | - | - | 120 | - |
    """
    shown, counts = [], {"passed": 0, "failed": 0, "never": 0}
    for row in rows:
        ran = row.get("verdict")
        counts["never" if ran in (None, "not judged") else ran] += 1
        newest = {"passed": "pass", "failed": "FAIL", "not judged": "not judged", None: "never run"}[ran]
        commit = row.get("commit") or (f"<= {row['commit_before']}" if row.get("commit_before") else None)
        date = row["date"][:16].replace("T", " ") if row.get("date") else None
        shown.append([row["part"], newest, f"{row['passed']} / {row['failed']}" if ran else None, row.get("device"),
                      commit, date, row.get("limit_s"), row.get("source")])
    head = (f"{len(rows)} parts; on its newest GPU run {counts['passed']} passed, {counts['failed']} failed; "
            f"{counts['never']} never ran on a GPU.")
    headers = ["part", "newest run", "checks passed / failed", "device", "commit", "date (UTC)", "limit s", "result"]
    return "\n".join([head, "", common.markdown_table(headers, shown)])


def _peft_model(part: dict[str, Any]) -> list[str]:
    lines = [f"**The user's own get_peft_model model** (LoRA r{part['lora']['r']} on every linear layer, Llama "
             f"{_shape(part['model'])}):", "", common.markdown_table(
                 ["plan", "hand-made GiB", "memlab measured GiB", "measured / hand-made", "estimate GiB",
                  "estimate / hand-made"],
                 [[r["plan"], _gib(r["hand_made_bytes"]), _gib((r["measured"] or {}).get("peak_bytes")),
                   r["measured_over_hand_made"], _gib((r["estimated"] or {}).get("peak_bytes")),
                   r["estimate_over_hand_made"]] for r in part["rows"]]), ""]
    fit = part.get("fit") or {}
    if fit:
        best = fit.get("best") or {}
        lines += [f"fit on {_gib(fit['budget_bytes'])} GiB chose `{best.get('plan')}`; re-run by hand: "
                  f"{_gib(fit.get('hand_made_bytes'))} GiB.", ""]
    if part.get("broken_at"):
        lines += [f"The CUDA context broke at: {part['broken_at']}.", ""]
    return lines


def _timeline(part: dict[str, Any]) -> list[str]:
    return [f"**A step's timeline against the allocator** (Llama, {_shape(part['model'])}):", "",
            common.markdown_table(
                ["plan", "timeline peak GiB", "max_memory_allocated (hand-made step) GiB", "timeline / hand-made",
                 "snapshot peak GiB", "timeline / snapshot", "the peak"],
                [[r["plan"], _gib(r["timeline_peak_bytes"]), _gib(r["max_memory_allocated"]),
                  r["timeline_over_allocated"], _gib(r["snapshot_peak_bytes"]), r["timeline_over_snapshot"],
                  r.get("peak")] for r in part["rows"]]), ""]


def _fill(part: dict[str, Any]) -> list[str]:
    # Results before 2026-11-27 ran the limits boundary inside this part, under "limits".
    return [f"**Levers that fill the budget** (Llama, {_shape(part['model'])}): the estimate against the measured "
            "peak:", "", common.markdown_table(
                ["lever", "plan", "tokens", "measured GiB", "estimate GiB", "estimate / measured", "status"],
                [[r["kind"], r["plan"], r["tokens"], _gib(r["measured_bytes"]), _gib(r["estimated_bytes"]),
                  r["estimate_over_measured"], r["status"]] for r in part["rows"]]), "",
            *(_boundary(part["limits"]) if "limits" in part else [])]


def _boundary(limits: dict[str, Any]) -> list[str]:
    tries = limits["estimated_tries"]  # the tries themselves since 2026-11-26, a count before
    estimated_tries = len(tries) if isinstance(tries, list) else tries
    return [f"limits on {_gib(limits['budget_bytes'])} GiB: measured {limits['measured_value']} tokens "
            f"({limits['measured_tries']} tries), estimated {limits['estimated_value']} "
            f"({estimated_tries} tries); the next size {limits['measured_next']} (None: the model's "
            "longest).", ""]


def _compared(title: str) -> Any:
    """The estimate-against-measured families (heldout, heldout_off, encdec): with a hand-made step where run."""

    def render(part: dict[str, Any]) -> list[str]:
        hand = any("hand_made_bytes" in r for r in part["rows"])
        return [f"**{title}: the CPU-made estimate against the measured peaks:**", "", common.markdown_table(
            ["model", "plan", "batch", *(["hand-made GiB", "measured / hand-made"] if hand else []), "estimate GiB",
             "measured GiB", "estimate / measured", "reserved GiB", "reserved estimate / measured"],
            [[r["model"], r["plan"], f"{r['rows']} x {r['length']}",
              *([_gib(r.get("hand_made_bytes")), r.get("measured_over_hand_made")] if hand else []),
              _gib(r["estimate_bytes"]), _gib(r["measured_bytes"]), r["estimate_over_measured"],
              _gib(r.get("reserved_peak_bytes")), r.get("reserved_estimate_over_measured")] for r in part["rows"]]),
            ""]

    return render


def _vlm(part: dict[str, Any]) -> list[str]:
    model = part["model"]
    return [f"**A VLM** ({model['name']}, {part['rows'][0]['rows']} x {part['rows'][0]['length']} tokens, "
            f"{part['rows'][0]['image_tokens']} of them the image's):", "", common.markdown_table(
                ["plan", "hand-made GiB", "measured GiB", "measured / hand-made", "estimate GiB",
                 "estimate / measured", "reserved estimate / measured"],
                [[r["plan"], _gib(r["hand_made_bytes"]), _gib(r["measured_bytes"]), r["measured_over_hand_made"],
                  _gib(r["estimate_bytes"]), r["estimate_over_measured"], r["reserved_estimate_over_measured"]]
                 for r in part["rows"]]), ""]


def _pytest(part: dict[str, Any]) -> list[str]:
    return [f"**tests/gpu**: {part.get('summary')}.", ""]


def _hf_table(part: dict[str, Any]) -> list[str]:
    return [f"**The seeds' table** (`{part['file']}`): memlab / Trainer throughput, median "
            f"{part['throughput_ratio_median']}, lowest doing the same work {part['throughput_ratio_min_same_work']}.",
            ""]


def _overhead(overhead: dict[str, Any] | None) -> str:
    if not overhead or overhead.get("ratio") is None:
        return ""
    return f"; watch's overhead per step {100 * (overhead['ratio'] - 1):+.1f}% (goal under 3%)"


def _loads_table(part: dict[str, Any]) -> list[str]:
    """The loads section's rows: each load and workload measured beside its CPU-made estimate."""
    model = part["model"]
    title = (f"**Loads as users load** (Llama, {model['parameters'] / 1e9:.2f}B parameters saved in bf16; LoRA "
             f"`{part['train_plan']}` on {' x '.join(map(str, part['train']))}, generation of {part['new_tokens']} "
             f"tokens after {' x '.join(map(str, part['prompt']))}; each in a fresh process):")
    table = common.markdown_table(
        ["load", "workload", "estimate GiB", "measured GiB", "estimate / measured", "reserved GiB",
         "reserved estimate / measured", "context GiB", "card estimate / measured", "load peak GiB"],
        [[r["load"], r["workload"], _gib(r.get("estimate_bytes")), _gib(r.get("peak_bytes")),
          r.get("estimate_over_measured"), _gib(r.get("reserved_peak_bytes")), r.get("reserved_estimate_over_measured"),
          _gib(r.get("context_bytes")), r.get("card_estimate_over_measured"), _gib(r.get("load_peak_bytes"))]
         for r in part["rows"]],
    )
    return [title, "", table, ""]


def _shape(model: dict[str, Any]) -> str:
    size = f"{model['parameters'] / 1e9:.2f}B parameters, " if "parameters" in model else ""
    return f"{size}hidden {model['hidden']} x {model['layers']} layers, batch {model['rows']} x {model['length']}"


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def _percent(value: float | None) -> str | None:
    return None if value is None else f"{100 * value:.0f}%"


def _ratio(value: float | None, reference: float | None) -> float | None:
    return None if value is None or not reference else round(value / reference, 4)


RENDERERS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "rl": _rl, "sft_peft": _sft_peft, "peft_model": _peft_model, "encdec": _compared("Encoder-decoders"), "vlm": _vlm,
    "heldout_off": _compared("The held-out rows that were off"), "timeline": _timeline, "fill": _fill,
    "boundary": _boundary,
    "trainer": _trainer, "loads": _loads_table, "estimate": _estimate, "probe": _probe,
    "heldout": _compared("Held-out families"), "pytest": _pytest, "cumulative": _plans("Levers added one by one"),
    "levers": _plans("Each lever alone"), "inference": _inference, "cap": _cap, "fit": _fit, "ties": _ties,
    "hf_table": _hf_table, "fp8": _fp8, "cast_reserve": _cast_reserve, "compile_families": _compile_families,
    "grpo_1024": _grpo("GRPO at 1,024 completion tokens"), "grpo_8b": _grpo("A Qwen3-8B-shaped LoRA GRPO step"),
}
"""Each part's table or sentence by name; a part without one (or whose figures are missing) gets its counts."""
