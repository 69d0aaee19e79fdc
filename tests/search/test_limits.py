"""memlab.limits (memlab.search.limits): the longest sequences or most rows a plan fits, and its answer as text.

``memlab.limits``' table and answer as text: every column as wide as its widest cell (the "<-" marks in one column
whatever each row's status), the host budget in the answer where the sizes were judged on it, and, under a header
that says the budgets (``memlab estimate --max-tokens``), no budget said again.

Issue 46: memlab.limits, the longest sequences (or the most rows) a plan fits in a budget."""

from __future__ import annotations

import pytest
import torch
from models import lm_batch, tiny_llama
from transformers import LlamaConfig, Qwen2Config

import memlab
from memlab.errors import MemlabError
from memlab.estimation.cuda.gpus import DEFAULT_GPU, GPUS, capped
from memlab.plan import Plan, format_bytes
from memlab.report import Trial
from memlab.search.limits import MAX_RUNS, Limits, resized

BUDGET = 1000
HOST = 2**20


def _trial(peak: int, host: int) -> Trial:
    return Trial(Plan(offload="optimizer"), "ok", peak, {"params": 100, "activations": peak - 100}, None, None, None,
                 "cpu", budget=BUDGET, host_bytes=host, host_budget=HOST)


def _found() -> Limits:
    tried = [(64, _trial(500, 10)), (128, _trial(900, 10)), (256, _trial(1500, 10)), (512, _trial(900, 2 * HOST)),
             (1024, _trial(2000, 2 * HOST))]
    return Limits("tokens", 128, tried[1][1], 256, tried[2][1], BUDGET, tried)


def test_every_row_lines_up_whatever_its_status() -> None:
    lines = _found().to_text().splitlines()
    rows = lines[1:6]
    statuses = {row.split()[3] if row.split()[2] == "no" else row.split()[2] for row in rows}
    assert any("(host)" in row for row in rows) and any("(over budget and host)" in row for row in rows), lines
    assert len(statuses) > 1, lines
    marks = {row.index("<-") for row in rows if "<-" in row}
    assert len(marks) == 1 and len([row for row in rows if "<-" in row]) == 2, lines
    fits_column = lines[0].index("fits")
    assert all(row[fits_column - 1] == " " and row[fits_column] in "yn" for row in rows), lines


def test_the_answer_names_the_host_budget_it_was_judged_on() -> None:
    found = _found()
    assert found.answer() == (f"at most 128 tokens per row fit in {format_bytes(BUDGET)} and the host budget of "
                              f"{format_bytes(HOST)}; 256 do not")


def test_under_a_header_that_says_the_budgets_the_text_says_neither_again() -> None:
    text = _found().to_text(budget_said=True)
    assert format_bytes(BUDGET) not in text and format_bytes(HOST) not in text, text
    assert "at most 128 tokens per row fit in the budget and the host budget; 256 do not" in text, text
    assert format_bytes(BUDGET) in _found().to_text()  # said where no header says it


CONFIG = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                     vocab_size=256, max_position_embeddings=100_000)
SHAPES = {"input_ids": (1, 512), "labels": (1, 512)}


@pytest.mark.parametrize(("vary", "budget", "plan"), [
    ("tokens", "64MiB", memlab.Plan()),
    ("tokens", "40MiB", memlab.Plan(checkpointing=True)),
    ("rows", "96MiB", memlab.Plan()),
])
def test_the_answer_straddles_the_budget_within_eight_dry_runs(vary, budget, plan) -> None:
    found = memlab.limits(CONFIG, plan, budget=budget, batch=SHAPES, vary=vary, device="cpu")
    assert len(found.tried) <= MAX_RUNS
    step = 64 if vary == "tokens" else 1
    assert found.value > 0 and found.next == found.value + step, found.to_text()
    capacity = memlab.parse_budget(budget)
    # checked by separate estimates, not the ones limits made
    at = memlab.estimate(CONFIG, resized(SHAPES, vary, found.value), plan, device="cpu")
    beyond = memlab.estimate(CONFIG, resized(SHAPES, vary, found.next), plan, device="cpu")
    assert at.peak_bytes <= capacity < beyond.peak_bytes
    assert found.trial.peak_bytes == at.peak_bytes
    assert "at most" in found.answer() and str(found.value) in found.to_text()


def test_nothing_fits_and_bad_input() -> None:
    found = memlab.limits(CONFIG, budget="1MiB", batch=SHAPES, device="cpu")
    assert found.value == 0 and found.trial is None and "nothing fits" in found.answer()
    with pytest.raises(MemlabError, match="vary='tokens' or vary='rows'"):
        memlab.limits(CONFIG, budget="1GiB", batch=SHAPES, vary="length")
    with pytest.raises(MemlabError, match="budget"):
        memlab.limits(CONFIG, budget="24", batch=SHAPES)


def test_measured_on_a_live_model_with_a_cpu_budget() -> None:
    model = tiny_llama(layers=2, width=32)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    batch = lm_batch(rows=2, length=16)
    plain = memlab.measure(model, batch, memlab.Plan(), steps=1, warmup=0, noise=0, progress=False)
    budget = int(plain.peak_bytes * 1.5)
    found = memlab.limits(model, budget=budget, batch=batch, vary="rows")
    assert found.measured and found.value >= 2 and found.next == found.value + 1, found.to_text()
    assert found.trial.status == "ok" and found.trial.peak_bytes <= budget
    assert found.next_trial.status == "oom" or found.next_trial.peak_bytes > budget  # recovered, not raised
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    again = memlab.measure(model, resized(batch, "rows", found.next), memlab.Plan(), steps=1, warmup=0, noise=0,
                           progress=False)
    assert again.peak_bytes > budget


WIDER = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                    vocab_size=4096, max_position_embeddings=4096)


def test_nothing_fits_says_why_and_what_would_fit() -> None:
    """Issue 61 item 15: value=0 said nothing of why or what to try."""
    found = memlab.limits(WIDER, budget="20MiB", batch=SHAPES, device="cpu")
    assert found.value == 0
    assert found.reason is not None and "optimizer state alone hold" in found.reason, found.reason
    assert found.suggestions, found.to_text()
    smallest = resized(SHAPES, "tokens", found.tried[0][0])
    for suggested in found.suggestions:  # each checked by its own estimate at the smallest size
        again = memlab.estimate(WIDER, smallest, suggested.plan, device="cpu")
        assert again.peak_bytes <= 20 * 2**20
    shown = repr(found)
    assert found.reason in shown and found.suggestions[0].plan.label() in shown and "Plan(" in shown


def test_the_command_line_says_why_and_what_to_try(tmp_path) -> None:
    import argparse
    import io

    from memlab.frontends.cli.limits import run_limits

    args = argparse.Namespace(model="wider", config=None, batch="1x512", budget="20MiB", max_tokens=True,
                              max_rows=False, device="cpu", gpu=None, json=False, gpus=None, strategy=None)
    text = io.StringIO()
    assert run_limits(args, WIDER, SHAPES, [memlab.Plan()], 20 * 2**20, text, say=lambda line: None) == 1
    out = text.getvalue()
    assert "why: 64 tokens per row need" in out
    assert "memlab estimate wider --batch 1x512 --budget 20MiB --device cpu --try" in out and "--max-tokens" in out


# Qwen2's 151,936-token vocabulary on a small body: the loss's logits hold most of a long row's memory, as in issue
# 57 item 4's run (bf16 + checkpointing, one row, under a real cap of the caching allocator).
QWEN2 = Qwen2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                    tie_word_embeddings=True)
CKPT_BF16 = memlab.Plan(precision="bf16", checkpointing=True)
ROW = {"input_ids": (1, 1024), "labels": (1, 1024)}


def _on_the_capped_card(size: int, budget: int) -> memlab.Trial:
    """A separate estimate at ``size`` with the allocator replayed under the cap the budget sets."""
    return memlab.estimate(QWEN2, resized(ROW, "tokens", size), CKPT_BF16, device="cuda", budget=budget,
                           gpu=capped(None, budget))


def test_the_answer_does_not_count_on_the_capped_allocator_giving_its_cache_back() -> None:
    """Under a cap the allocator gives its cached segments back and tries again before it runs out, but fragmentation
    can stop that: on an H100 the answer limits gave (1,792 tokens of the boundary model, found on the capped
    replay) reserved 38 MB under the cap uncapped and ran out of memory under it
    (benchmarks/results/boundary_capped-cuda-nvidia-h100-80gb-hbm3.json). A size that fits only thanks to the release
    is not the answer: the answer's card figure is within the budget on the whole card, the sizes above it are over
    it, and the note names the size the capped replay alone would have answered."""
    context = GPUS[DEFAULT_GPU].context_bytes
    uncapped = memlab.estimate(QWEN2, resized(ROW, "tokens", 1280), CKPT_BF16, device="cuda")
    budget = uncapped.reserved_bytes - 4 * 2**20 + context  # the uncapped card is 4 MiB over
    rescued = _on_the_capped_card(1280, budget)
    assert rescued.reserved_bytes <= budget - context and rescued.fits  # the capped replay: its cache given back

    found = memlab.limits(QWEN2, CKPT_BF16, budget=budget, batch=ROW, device="cuda", multiple=256)
    assert 0 < found.value < 1280 and found.next is not None and found.value < found.next <= 1280, found.to_text()
    at = memlab.estimate(QWEN2, resized(ROW, "tokens", found.value), CKPT_BF16, device="cuda", budget=budget)
    beyond = memlab.estimate(QWEN2, resized(ROW, "tokens", found.next), CKPT_BF16, device="cuda", budget=budget)
    assert at.card_bytes <= budget < beyond.card_bytes  # on the whole card: separate estimates, not limits' own
    assert found.trial.card_bytes == at.card_bytes
    assert any("1280 tokens fit only if the capped allocator" in note for note in found.notes), found.notes


def test_an_answer_within_the_budget_and_the_next_over_it_on_a_named_card() -> None:
    """On a named GPU with a budget of its whole card (the CLI's --gpu), the same holds: no cap below the card."""
    kind = GPUS["L4-24GB"]
    found = memlab.limits(QWEN2, CKPT_BF16, budget=kind.memory_bytes, batch=ROW, device="cuda", gpu="L4-24GB",
                          multiple=4096)
    assert found.value and found.next == found.value + 4096, found.to_text()
    assert found.trial.card_bytes <= kind.memory_bytes < found.next_trial.card_bytes


def test_an_answer_found_after_every_step_down_was_over_is_checked_on_the_whole_card_too() -> None:
    """Past the sizes walked one step at a time below the capped replay's answer, the answer left was the largest size
    tried below them, a capped replay never checked on the whole card: a size that fits only if the capped allocator
    gives its cache back could be named. Now every size the answer falls to is checked too. Here the release saves
    2.5 GiB: the capped replay fits up to 2,304 tokens, the whole card up to 768, and the dry runs tried 1,024 (the
    batch's length), 2,048, 2,304 and 4,096."""
    from memlab.search.limits import UNCAPPED_CHECKS, _answer, _checked_without_release

    step, budget, context = 256, 8 * 2**30, 800 * 2**20

    def card(size: int, released: bool) -> Trial:
        reserved = 7 * 2**30 + 256 * 2**20 + (size - 1024) * 400 * 2**20 // step - (2560 * 2**20 if released else 0)
        return Trial(Plan(), "ok", reserved, {}, None, None, None, "cuda:0", reserved_bytes=reserved,
                     context_bytes=context)

    tried = {size: card(size, released=True) for size in (1024, 2048, 2304, 4096)}  # the capped replay's tries
    assert [size for size, trial in tried.items() if trial.card_bytes <= budget] == [1024, 2048, 2304]
    checked: list[int] = []

    def whole_card(size: int) -> Trial:
        checked.append(size)
        return card(size, released=False)

    over = _checked_without_release(tried, budget, step, whole_card)
    found = _answer(tried, budget, "tokens", step, False, None, None, None)
    assert found.value == 768 and found.trial.card_bytes <= budget, found.to_text()  # checked on the whole card
    assert over == checked[:-1] == [2304, 2048, 1792, 1024] and len(over) > UNCAPPED_CHECKS
