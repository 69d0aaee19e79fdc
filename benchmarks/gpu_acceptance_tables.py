"""The GPU acceptance run's results as markdown tables (what docs/benchmarks.md shows of the committed JSON), kept
apart from the run itself in benchmarks/gpu_acceptance.py."""

from __future__ import annotations

from typing import Any

from benchmarks import common


def _gib(num_bytes: float | None) -> float | None:
    return None if num_bytes is None else round(num_bytes / 2**30, 2)


def markdown(result: dict[str, Any]) -> str:
    """The README's GPU tables, made from a result of this run (``--markdown FILE`` prints them)."""
    parts = result["parts"]
    device = result["device"]
    versions = result["versions"]
    lines = [
        f"Device: {device.get('gpu', device['cpu'])}, driver {device.get('driver')}, CUDA {device.get('cuda')}; "
        f"torch {versions['torch']}, transformers {versions['transformers']}, bitsandbytes {versions['bitsandbytes']}"
        f". {result['summary']['passed']} checks passed, {result['summary']['failed']} failed, in "
        f"{result['seconds']:.0f} s ({result['date']}).",
        "",
    ]
    if "probe" in parts:
        lines += ["**Probe against a hand-made step** (Llama, " + _shape(parts["probe"]["model"]) + "):", ""]
        lines.append(common.markdown_table(
            ["plan", "memlab peak GiB", "hand-made GiB", "ratio", "optimizer state: memlab = counted"],
            [[r["plan"], _gib(r["peak_bytes"]), _gib(r["reference_peak_bytes"]), r["peak_over_reference"],
              "yes" if r["breakdown"].get("optimizer") == r["reference_optimizer_bytes"] else "no"]
             for r in parts["probe"]["rows"]],
        ))
        lines.append("")
    if "estimate" in parts:
        lines += ["**Dry-run estimate (fake tensors, from the config) against the measured peak:**", ""]
        lines.append(_estimate_table(parts["estimate"]))
        lines.append("")
    for name, title in (("levers", "Each lever alone"), ("cumulative", "Levers added one by one")):
        if name not in parts:
            continue
        part = parts[name]
        lines += [f"**{title}** (Llama, {_shape(part['model'])}):", ""]
        reserved = any("plan_fields" in r for r in part["rows"])  # rows of runs after the first say more
        lines.append(common.markdown_table(
            ["plan", "peak GiB", *(["reserved GiB"] if reserved else []), "saving", "optimizer GiB",
             "activations GiB", "samples/s", "speed-up"],
            [[r.get("step", r["plan"]), _gib(r["peak_bytes"]), *([_gib(r.get("reserved_bytes"))] if reserved else []),
              _percent(r.get("memory_saving")), _gib(r["breakdown"].get("optimizer")),
              _gib(r["breakdown"].get("activations")), r["samples_per_s"], r.get("speedup")] for r in part["rows"]],
        ))
        lines.append("")
    if "fit" in parts:
        fit = parts["fit"]
        fresh = fit["fresh_process"]
        lines.append(
            f"**fit** on a budget of {_gib(fit['budget_bytes'])} GiB (45% of the plain peak, Llama "
            f"{_shape(fit['model'])}): chose `{fit['best']['plan']}` ({_gib(fit['best']['peak_bytes'])} GiB) after "
            f"{len(fit['trials'])} trials in {fit['fit_seconds']} s, {len(fit['skipped'])} plans skipped; re-measured "
            f"in a fresh process: {_gib(fresh.get('peak_bytes'))} GiB."
        )
        lines.append("")
    if "cap" in parts:
        cap = parts["cap"]
        drift = next(c for c in cap["checks"] if "to the byte" in c["check"])
        lines.append(
            f"**Budget cap**: {len(cap['capped'])} trials of plans over a budget of {_gib(cap['budget_bytes'])} GiB "
            f"(60% of the plain peak) all reported oom; memory_allocated moved by {drift.get('drift')} bytes."
        )
        lines.append("")
    lines += _newer_parts(parts)
    return "\n".join(lines)


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


def _newer_parts(parts: dict[str, Any]) -> list[str]:
    """The tables of the parts added after the first GPU run (inference, ties, the trainers, the diagnostic, the
    loads and the held-out families)."""
    lines: list[str] = []
    if "inference" in parts and "rows" in parts["inference"]:
        part = parts["inference"]
        lines += [f"**Inference** (Llama, {_shape(part['model'])}, {part['new_tokens']} new tokens):", ""]
        lines.append(common.markdown_table(
            ["weights", "prompt", "peak GiB", "params GiB", "KV cache MiB (= kv_cache_bytes)", "prefill tokens/s",
             "decode tokens/s"],
            [[r["weights"], r["prompt_tokens"], _gib(r["peak_bytes"]), _gib(r["breakdown"].get("params")),
              f"{common.mib(r['kv_cache_end_bytes'])} ({_yes(r['kv_cache_end_bytes'] == r['kv_cache_bytes_formula'])})",
              r["prefill_tokens_per_s"], r["decode_tokens_per_s"]] for r in part["rows"]],
        ))
        fitted = part["fit_inference"]
        fresh = fitted["fresh_process"]
        lines += ["", f"fit_inference on {_gib(fitted['budget_bytes'])} GiB: largest batch {fitted['largest_batch']}"
                      f" ({len(fitted['trials'])} sizes measured); in a fresh process: "
                      f"{_gib(fresh.get('peak_bytes'))} GiB, fits: {fresh.get('fits')}.", ""]
    if "ties" in parts and "same_plan_twice" in parts["ties"]:
        ties = parts["ties"]
        lines += [f"**Ties**: the same plan twice was a tie in {ties['same_plan_twice']['ties']} of "
                  f"{ties['same_plan_twice']['of']} runs; a plan {ties['slowdown_calibrated']:.0%} slower was ranked "
                  f"slower in {ties['truly_slower']['ranked_slower']} of {ties['truly_slower']['of']}.", ""]
    if "trainer" in parts and "budget_bytes" in parts["trainer"]:
        trainer = parts["trainer"]
        best = trainer["fit"]["best"]
        lines += [f"**Trainer**: fit(trainer) on {_gib(trainer['budget_bytes'])} GiB chose "
                  f"`{best['plan'] if best else None}`; trainer.train() under watch peaked at "
                  f"{_gib(trainer['watched_peak_bytes'])} GiB{_overhead(trainer.get('overhead'))}.", ""]
        sft = trainer.get("sft") or {}
        if "budget_bytes" in sft:
            best = sft["fit"]["best"]
            lines += [f"**SFTTrainer** (TRL, packing, LoRA with dropout 0.05): fit(trainer) on "
                      f"{_gib(sft['budget_bytes'])} GiB chose `{best['plan'] if best else None}`; trainer.train() "
                      f"under watch peaked at {_gib(sft['watched_peak_bytes'])} GiB{_overhead(sft.get('overhead'))}.",
                      ""]
        elif sft.get("missing"):
            lines += [f"**SFTTrainer**: not run ({sft['missing']}).", ""]
    if "loads" in parts and "rows" in parts["loads"]:
        lines += _loads_table(parts["loads"])
    if "heldout" in parts and "rows" in parts["heldout"]:
        lines += ["**Held-out families: the CPU-made estimate against the measured peaks:**", "",
                  _heldout_table(parts["heldout"]), ""]
    diagnostic = (parts.get("estimate") or {}).get("diagnostic")
    if diagnostic:
        lines += [f"**Allocations of 100 MB or more in one tracked step** ({diagnostic['row']}, Llama-1B, 2 x 1024): "
                  f"{len(diagnostic['allocations'])}, {_gib(diagnostic['in_optimizer_bytes'])} GiB under an optimizer "
                  "frame.", ""]
    return lines


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


def _heldout_table(part: dict[str, Any]) -> str:
    return common.markdown_table(
        ["model", "plan", "batch", "estimate GiB", "measured GiB", "estimate / measured", "reserved GiB",
         "reserved estimate / measured", "card estimate / measured"],
        [[r["model"], r["plan"], f"{r['rows']} x {r['length']}", _gib(r["estimate_bytes"]), _gib(r["measured_bytes"]),
          r["estimate_over_measured"], _gib(r.get("reserved_peak_bytes")), r.get("reserved_estimate_over_measured"),
          r.get("card_estimate_over_measured")] for r in part["rows"]],
    )


def _shape(model: dict[str, Any]) -> str:
    size = f"{model['parameters'] / 1e9:.2f}B parameters, " if "parameters" in model else ""
    return f"{size}hidden {model['hidden']} x {model['layers']} layers, batch {model['rows']} x {model['length']}"


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def _percent(value: float | None) -> str | None:
    return None if value is None else f"{100 * value:.0f}%"
