"""``memlab estimate NAME --budget 24GiB --max-tokens`` (``--max-rows``): the longest sequences (or the most rows)
each plan fits in the budget, from :func:`memlab.limits`' dry runs, as a table of the sizes tried."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from memlab.errors import MemlabError
from memlab.frontends.cli.errors import estimate_status
from memlab.frontends.cli.gpu import cli_gpu
from memlab.plan import Plan, format_bytes

__all__ = ["run_limits"]


def run_limits(
    args: argparse.Namespace,
    model: Any,
    batch: dict[str, tuple[int, ...]],
    plans: Sequence[Plan],
    budget: int | None,
    out: TextIO,
    *,
    say: Callable[[str], None],
    load: Any = None,
) -> int:
    """Print, for each plan, the sizes tried and the largest that fits; exit status 0 when every plan fits at
    some size, 1 otherwise, 3 where a size could not be estimated (its status error:
    :func:`~memlab.frontends.cli.errors.estimate_status`).

    Example:
        >>> import io
        >>> from memlab.estimation.estimate import load_config, meta_model
        >>> args = argparse.Namespace(model="tiny", max_tokens=True, max_rows=False, device="cpu", gpu=None,
        ...                           json=False, gpus=None, strategy=None)
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        ...                      vocab_size=256, max_position_embeddings=8192)
        >>> text = io.StringIO()
        >>> run_limits(args, config, {"input_ids": (1, 512), "labels": (1, 512)}, [Plan()], 2**26, text,
        ...            say=lambda line: None)
        0
        >>> print(text.getvalue().splitlines()[0])
        tiny: the longest sequences that fit, 1 row per batch, budget: its memory, 64.0 MiB
        >>> "at most 4864 tokens per row fit in the budget" in text.getvalue()
        True

    Where nothing fits, the output says why and the commands that try what is estimated to fit instead.
    """
    from memlab.search.limits import MAX_RUNS, limits

    if budget is None:
        raise MemlabError("--max-tokens and --max-rows need a budget; write for example --budget 24GiB, or --gpu "
                          "A100-80GB")
    if getattr(args, "gpus", None) not in (None, "1") or getattr(args, "strategy", None) not in (None, "none"):
        raise MemlabError("--max-tokens and --max-rows are for one GPU; drop --gpus/--strategy")
    vary = "rows" if args.max_rows and not args.max_tokens else "tokens"
    from memlab.frontends.cli.host import host_budget

    keywords: dict[str, Any] = {"device": args.device or "cuda", "gpu": cli_gpu(args), "load": load,
                                "host_budget": host_budget(args)}  # each size judged on the host too
    found = []
    for plan in plans:
        say(f"{plan.label()}: trying sizes (at most {MAX_RUNS} dry runs)")
        found.append(limits(model, plan, budget=budget, batch=batch, vary=vary, **keywords))
    if args.json:
        print(json.dumps([{"plan": result.trial.plan.label() if result.trial else plan.label(), "vary": vary,
                           "value": result.value, "next": result.next, "budget": budget,
                           "tried": [[size, trial.status, trial.verdict_bytes] for size, trial in result.tried]}
                          for plan, result in zip(plans, found, strict=True)], indent=1), file=out)
    else:
        rows, tokens = batch["input_ids"]
        kept = f"{rows} row{'s' if rows != 1 else ''} per batch" if vary == "tokens" else f"{tokens} tokens per row"
        # The budgets said once, here, as the one-GPU answer's header says them; the tables call them "the budget".
        from memlab.estimation.cuda.gpus import kind_or_default
        from memlab.report.format import budget_words

        gpu = "" if args.device == "cpu" else f", for {kind_or_default(cli_gpu(args)).called}"
        given = f"budget {budget_words(str(args.budget))}" if getattr(args, "budget", None) is not None else (
            f"budget: its memory, {format_bytes(budget)}")
        host = keywords["host_budget"]
        print(f"{args.model}: the {'longest sequences' if vary == 'tokens' else 'most rows'} that fit, {kept}{gpu}, "
              f"{given}" + ("" if host is None else f", host budget {format_bytes(host)}"), file=out)
        from memlab.frontends.cli.estimate.next import command_for, plan_try

        flag = "--max-rows" if vary == "rows" else "--max-tokens"
        for plan, result in zip(plans, found, strict=True):
            print(f"\n{plan.label()}", file=out)
            print(result.to_text(lambda other: f"{command_for(args, plan_try(other))} {flag}", budget_said=True),
                  file=out)
    return estimate_status(fits=all(result.value for result in found), judged=True,
                           errors=sum(trial.status == "error" for result in found for _, trial in result.tried))
