"""memlab.limits on trainers narrows to one step (issue 68): the answer equals a brute-force scan of estimates over
every multiple of a small range (GRPO with and without a reference model, by tokens and by rows; DPO by rows), and
on figures shaped as a 0.5B GRPO step's on CUDA (a kink where the peak moves from the logits to the attention mask's
padded copy in the last layer's backward, a dip where the copy is skipped, the whole card above the capped one) the
answer is one step below a size that does not fit, within MAX_RUNS tries and MAX_SECONDS. Tiny Llamas on CPU."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("trl")
from trl_trainers import make_dpo_trainer, make_grpo_trainer  # noqa: E402

import memlab  # noqa: E402
from memlab.search.limits_trainer import sized  # noqa: E402

GIB = 2**30
CONTEXT = 2**29


def _figure(trainer: Any, vary: str, size: int) -> int:
    """The figure that judges ``size``: a separate estimate of the trainer with that size set (not limits' own)."""
    with sized(trainer, vary, size):
        return memlab.estimate(trainer, device="cpu").verdict_bytes


def _scanned(figures: dict[int, int], budget: int) -> tuple[int, int | None]:
    """The brute-force answer: the largest size whose figure, and every smaller size's, fits; and the next size."""
    value, following = 0, None
    for size in sorted(figures):
        if figures[size] > budget:
            following = size
            break
        value = size
    return value, following


@pytest.mark.parametrize(("make", "vary", "sizes"), [
    (lambda path: make_grpo_trainer(path), "tokens", range(4, 44, 4)),
    (lambda path: make_grpo_trainer(path, beta=0.1), "tokens", range(4, 44, 4)),  # a reference model's log-probs
    (lambda path: make_grpo_trainer(path), "rows", range(2, 14, 2)),  # whole prompts of num_generations=2
    (lambda path: make_dpo_trainer(path), "rows", range(1, 7)),  # at most the dataset's 6 pairs
], ids=["grpo-tokens", "grpo-reference-tokens", "grpo-rows", "dpo-rows"])
@pytest.mark.slow
def test_the_answer_equals_a_scan_of_every_multiple(tmp_path: Any, make: Callable[[Any], Any], vary: str,
                                                    sizes: Sequence[int]) -> None:
    trainer = make(tmp_path)
    figures = {size: _figure(trainer, vary, size) for size in sizes}
    ordered = sorted(figures.values())
    assert len(set(ordered)) > 3 and list(figures.values()) == ordered  # the figure grows with the size here
    # a budget a third of the way between two sizes two thirds up the range: no size is tried at it first
    at = list(sizes)[2 * len(sizes) // 3]
    budget = figures[at] + (figures[at + sizes[1] - sizes[0]] - figures[at]) // 3
    found = memlab.limits(trainer, budget=budget, vary=vary, multiple=sizes[1] - sizes[0], device="cpu")
    assert (found.value, found.next) == _scanned(figures, budget) == (at, at + sizes[1] - sizes[0]), found.to_text()
    assert found.trial.verdict_bytes == figures[found.value] and not found.notes


def _shaped(monkeypatch: pytest.MonkeyPatch, peak: Callable[[int], int], whole_card_adds: int = 0,
            prompt: int = 60) -> dict[int, int]:
    """Estimates replaced by figures of a 0.5B GRPO step's shape on CUDA (``peak(size)`` allocated; the reserve 0.9
    GiB above it, 0.7 GiB more where the mask's copy holds the peak, ``whole_card_adds`` more on the card not held
    to the budget); returns the card figure of each size the card held to the budget gave, as it is asked."""
    asked: dict[int, int] = {}

    def estimate(trainer: Any, plan: Any = None, *, budget: int, gpu: Any = None, **_: Any) -> memlab.Trial:
        # the card held to the budget is memlab.estimation.cuda.gpus.capped's kind; the whole card, the kind asked for
        size, capped = int(trainer.max_completion_length), " capped at " in getattr(gpu, "name", "")
        allocated = peak(size)
        reserved = allocated + int(0.9 * GIB) + (int(0.7 * GIB) if _copied(size, prompt) else 0) + (
            0 if capped else whole_card_adds)
        if capped:
            asked[size] = reserved + CONTEXT
        return memlab.Trial(memlab.Plan(), "ok", allocated, {"activations": allocated}, None, None, None,
                            "cuda:0", budget=budget, reserved_bytes=reserved, context_bytes=CONTEXT, estimated=True)

    monkeypatch.setattr(sys.modules["memlab.estimation.estimate"], "estimate", estimate)
    return asked


def _copied(size: int, prompt: int = 60) -> bool:
    """Whether the memory-efficient kernel's padded copy of the mask (B x heads x L x L) holds the peak: past the
    logits' peak, and where the sequence (``prompt`` + ``size``) is not a multiple of 16 (the copy is skipped there)."""
    return size > 3300 and (size + prompt) % 16 != 0


def _kinked(size: int, prompt: int = 60) -> int:
    """A 0.5B GRPO step's allocated peak: the logits' (linear) or, past 3,300 tokens, the last layer's backward with
    the mask's copy (quadratic: 8 x 14 heads x L x L bf16), as its estimates give them (8.50 GiB at 3,136 tokens,
    10.50 at 4,032)."""
    linear = int(7.2 * GIB + 0.42 * GIB * size / 1024)
    return max(linear, int(6.0 * GIB) + 224 * (size + prompt) ** 2) if _copied(size, prompt) else linear


def _grpo(tmp_path: Any) -> Any:
    trainer = make_grpo_trainer(tmp_path, max_completion_length=256)
    trainer.model.config.max_position_embeddings = 32768
    return trainer


def test_a_kinked_figure_is_narrowed_to_one_step(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The figures that stopped limits 896 tokens apart after 8 tries (3,136 fit, 4,032 not): one step apart now."""
    trainer = _grpo(tmp_path)
    asked = _shaped(monkeypatch, _kinked)
    budget = 12 * GIB
    found = memlab.limits(trainer, budget=budget, vary="tokens", device="cuda", gpu="H100-80GB")
    every = {size: _kinked(size) + int(0.9 * GIB) + (int(0.7 * GIB) if _copied(size) else 0) + CONTEXT
             for size in range(64, 32768 - 8, 64)}
    assert (found.value, found.next) == _scanned(every, budget), found.to_text()
    assert len(found.tried) <= memlab.search.limits.MAX_RUNS and not found.notes
    assert set(asked) == {size for size, _ in found.tried}


def test_a_size_that_fits_only_as_a_dip_is_not_the_answer(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the sequence is a multiple of 16 the mask's copy is skipped, so a longer completion can need less: with
    64-token prompts, every multiple of 16 completion tokens (the doublings tried first among them) is such a dip. The
    answer is the largest size below the first that does not fit, as a scan of every multiple of 4 finds it."""
    trainer = _grpo(tmp_path)
    _shaped(monkeypatch, lambda size: _kinked(size, 64), prompt=64)
    every = {size: _kinked(size, 64) + int(0.9 * GIB) + (int(0.7 * GIB) if _copied(size, 64) else 0) + CONTEXT
             for size in range(4, 32768 - 8, 4)}
    budget = every[3604] - 1
    value, following = _scanned(every, budget)
    assert [size for size in every if size > following and every[size] <= budget]  # sizes fit above one that does not
    found = memlab.limits(trainer, budget=budget, vary="tokens", multiple=4, device="cuda", gpu="H100-80GB")
    assert (found.value, found.next) == (value, following) == (3600, 3604), found.to_text()
    assert any("fit by their own figure, but 3604 do not" in note for note in found.notes), found.notes


def test_the_answer_is_checked_on_the_whole_card(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer's dry runs, as a model's, run on the card held to the budget, whose allocator gives its cache back;
    the answer is a size whose figure fits on the whole card too, and the note names the sizes that fit only
    under the cap."""
    trainer = _grpo(tmp_path)
    _shaped(monkeypatch, _kinked, whole_card_adds=int(0.1 * GIB))
    budget = 12 * GIB
    found = memlab.limits(trainer, budget=budget, vary="tokens", device="cuda", gpu="H100-80GB")
    whole = {size: _kinked(size) + int(0.9 * GIB) + int(0.1 * GIB) + (int(0.7 * GIB) if _copied(size) else 0) + CONTEXT
             for size in range(64, 32768 - 8, 64)}
    assert (found.value, found.next) == _scanned(whole, budget), found.to_text()
    assert found.trial.card_bytes == whole[found.value] <= budget
    assert any("completion tokens fit only if the capped allocator" in note for note in found.notes), found.notes


def test_the_search_stops_at_its_time_and_says_so(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No size is started once the tries so far and one more of their average would pass MAX_SECONDS; the answer
    still straddles the budget and its note says how far apart and which limit stopped it."""
    trainer = _grpo(tmp_path)
    _shaped(monkeypatch, lambda size: (time.sleep(0.2), _kinked(size))[1])
    monkeypatch.setattr(sys.modules["memlab.search.narrow"], "MAX_SECONDS", 1.0)
    found = memlab.limits(trainer, budget=12 * GIB, vary="tokens", device="cuda", gpu="H100-80GB")
    assert len(found.tried) <= 5  # 0.2 s each: the fifth would end past 1 s
    assert found.trial.card_bytes <= 12 * GIB < found.next_trial.card_bytes and found.next - found.value > 64
    assert any(f"not narrowed below {found.next - found.value} completion tokens: the search stopped at its limit "
               "of 1 s" in note for note in found.notes), found.notes
