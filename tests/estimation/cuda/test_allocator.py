"""memlab.estimation.cuda.allocator, the caching allocator's model: the default allocator and expandable segments.

The caching allocator model (memlab/estimation/cuda/allocator.py) on cases worked by hand from the rules of
c10/cuda/CUDACachingAllocator.cpp.

The caching allocator's model with expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``):
hand-built traces whose reserved bytes are worked out by hand in each test, beside the default allocator's."""

from __future__ import annotations

import random

import pytest

from memlab.estimation.cuda.allocator import KIB, MIB, CachingAllocator, replay, round_size, segment_size


def test_one_byte_reserves_a_2_mib_small_segment_and_allocates_512_bytes() -> None:
    allocator = CachingAllocator()
    allocator.malloc("a", 1)
    assert (allocator.reserved_bytes, allocator.allocated_bytes, allocator.segments) == (2 * MIB, 512, 1)


def test_small_requests_share_one_small_segment_until_it_is_full() -> None:
    allocator = CachingAllocator()
    for key in range(4):
        allocator.malloc(key, 512 * 1024)  # four halves of a MiB fill one 2 MiB segment exactly
    assert allocator.reserved_bytes == 2 * MIB
    allocator.malloc("one more", 1)
    assert allocator.reserved_bytes == 4 * MIB


def test_exactly_1_mib_is_small_and_one_byte_more_is_large() -> None:
    small, large = CachingAllocator(), CachingAllocator()
    small.malloc("a", MIB)
    large.malloc("a", MIB + 1)
    assert (small.reserved_bytes, large.reserved_bytes) == (2 * MIB, 20 * MIB)
    assert large.allocated_bytes == MIB + 512


def test_5_mib_reserves_a_20_mib_segment_and_the_rest_serves_the_next_large_request() -> None:
    allocator = CachingAllocator()
    allocator.malloc("a", 5 * MIB)
    assert (allocator.reserved_bytes, allocator.allocated_bytes) == (20 * MIB, 5 * MIB)
    allocator.malloc("b", 14 * MIB)  # fits the 15 MiB left: no new segment
    assert allocator.reserved_bytes == 20 * MIB
    # 1 MiB is left: not more than 1 MiB, so the 15 MiB block was not split and b holds all of it.
    assert allocator.allocated_bytes == 20 * MIB


def test_30_mib_reserves_30_mib_and_a_request_over_10_mib_rounds_to_2_mib() -> None:
    allocator = CachingAllocator()
    allocator.malloc("a", 30 * MIB)
    assert allocator.reserved_bytes == 30 * MIB
    allocator.malloc("b", 30 * MIB + 1)
    assert allocator.reserved_bytes == 30 * MIB + 32 * MIB
    assert segment_size(round_size(10 * MIB)) == 10 * MIB and segment_size(round_size(9 * MIB)) == 20 * MIB


def test_a_freed_block_is_reused_by_a_smaller_request_and_split() -> None:
    allocator = CachingAllocator()
    allocator.malloc("a", 40 * MIB)
    allocator.free("a")
    allocator.malloc("b", 12 * MIB)  # 28 MiB left, more than 1 MiB: split
    allocator.malloc("c", 28 * MIB)  # takes the rest: still one segment
    assert (allocator.reserved_bytes, allocator.segments, allocator.allocated_bytes) == (40 * MIB, 1, 40 * MIB)


def test_the_best_fit_is_the_smallest_free_block_that_fits() -> None:
    allocator = CachingAllocator()
    for key, size in (("big", 60 * MIB), ("pin1", 12 * MIB), ("mid", 24 * MIB), ("pin2", 12 * MIB)):
        allocator.malloc(key, size)
    allocator.free("big")
    allocator.free("mid")
    allocator.malloc("x", 22 * MIB)  # the 24 MiB block, not the 60 MiB one
    allocator.malloc("y", 50 * MIB)  # so the 60 MiB block is still whole for this one
    assert allocator.reserved_bytes == (60 + 12 + 24 + 12) * MIB


def test_freed_neighbours_merge_into_one_block() -> None:
    allocator = CachingAllocator()
    allocator.malloc("whole", 30 * MIB)
    allocator.free("whole")
    for key in ("a", "b", "c"):
        allocator.malloc(key, 10 * MIB)  # three blocks of one 30 MiB segment
    assert allocator.reserved_bytes == 30 * MIB
    allocator.free("a")
    allocator.free("c")
    allocator.malloc("d", 12 * MIB)  # two free 10 MiB blocks, not adjacent: a new segment
    assert allocator.reserved_bytes == 42 * MIB
    allocator.free("d")
    allocator.free("b")  # a, b and c merge into the 30 MiB block again
    allocator.malloc("e", 30 * MIB)
    assert allocator.reserved_bytes == 42 * MIB


def test_segments_are_kept_until_empty_cache_gives_back_the_unused_ones() -> None:
    allocator = CachingAllocator()
    allocator.malloc("kept", 100)
    allocator.malloc("gone", 30 * MIB)
    allocator.free("gone")
    assert allocator.reserved_bytes == 32 * MIB
    allocator.empty_cache()
    assert (allocator.reserved_bytes, allocator.segments) == (2 * MIB, 1)
    allocator.free("kept")
    allocator.empty_cache()
    assert allocator.reserved_bytes == 0


def test_a_split_segment_with_one_live_block_survives_empty_cache() -> None:
    allocator = CachingAllocator()
    allocator.malloc("a", 2 * MIB)
    allocator.malloc("b", 2 * MIB)
    allocator.free("a")
    allocator.empty_cache()
    assert allocator.reserved_bytes == 20 * MIB


def test_peaks_never_decrease_and_reset_starts_them_from_now() -> None:
    rng = random.Random(0)
    allocator = CachingAllocator()
    live: list[int] = []
    peaks = []
    for key in range(2000):
        if live and rng.random() < 0.45:
            allocator.free(live.pop(rng.randrange(len(live))))
        else:
            allocator.malloc(key, rng.choice((1, 700, 300_000, 3 * MIB, 15 * MIB, 70 * MIB)) + rng.randrange(512))
            live.append(key)
        assert allocator.allocated_bytes <= allocator.reserved_bytes <= allocator.peak_reserved_bytes
        assert allocator.allocated_bytes <= allocator.peak_allocated_bytes
        peaks.append(allocator.peak_reserved_bytes)
    assert peaks == sorted(peaks)
    for key in live:
        allocator.free(key)
    assert allocator.allocated_bytes == 0
    allocator.reset_peak()
    assert (allocator.peak_reserved_bytes, allocator.peak_allocated_bytes) == (allocator.reserved_bytes, 0)


def test_record_allocates_reallocates_and_frees() -> None:
    allocator = replay([("w", 4 * MIB), ("w", 30 * MIB)])  # resize_: the new block first, then the old one freed
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (30 * MIB, 50 * MIB)
    allocator.record("w", 0)
    assert allocator.allocated_bytes == 0
    allocator.record("w", 0)  # already gone: nothing
    allocator.record("empty", 0)  # an empty storage never takes a block
    assert allocator.reserved_bytes == 50 * MIB


def test_bad_keys_are_refused() -> None:
    allocator = CachingAllocator()
    allocator.malloc("a", 10)
    with pytest.raises(ValueError, match="already allocated"):
        allocator.malloc("a", 10)
    with pytest.raises(ValueError, match="not allocated"):
        allocator.free("b")


def test_a_growing_cache_releases_the_cached_segments_when_cuda_has_no_room() -> None:
    # A KV cache grown by torch.cat: each step takes a block a little larger than any freed one. Without a capacity
    # every step takes a new segment; with one, the allocator releases its cache before CUDA would run out, as
    # PyTorch's malloc does (release_cached_blocks, then the allocation again).
    unlimited, capped = CachingAllocator(), CachingAllocator(capacity=200 * MIB)
    for allocator in (unlimited, capped):
        for step in range(1, 40):
            allocator.malloc(step, (10 + step) * MIB)
            if step > 1:
                allocator.free(step - 1)
    assert unlimited.peak_reserved_bytes > 1000 * MIB
    assert capped.peak_reserved_bytes <= 200 * MIB
    assert capped.peak_allocated_bytes == unlimited.peak_allocated_bytes


def test_what_does_not_fit_even_without_a_cache_is_over_the_capacity_as_an_out_of_memory_would_be() -> None:
    allocator = CachingAllocator(capacity=20 * MIB)
    allocator.malloc("a", 12 * MIB)
    allocator.malloc("b", 12 * MIB)
    assert allocator.peak_reserved_bytes == 24 * MIB > allocator.capacity


# A training step in miniature: weights, two activations (and a small tensor), the activations freed, then a gradient
# larger than either activation.
STEP = [("w", 30 * MIB), ("a1", 12 * MIB), ("a2", 12 * MIB), ("s", 4 * KIB), ("a1", 0), ("a2", 0), ("g", 22 * MIB)]


def test_the_recorded_step_reserves_its_allocated_peak_rounded_to_pages_with_expandable_segments() -> None:
    # Default: segments of 30, 12 and 12 MiB (requests of 10 MiB or more round to 2 MiB), a 2 MiB small segment;
    # the freed 12 MiB segments stay apart, so the 22 MiB gradient takes a new segment: 30+12+12+2+22 = 78 MiB.
    default = replay(STEP)
    assert default.peak_reserved_bytes == 78 * MIB
    # Expandable: the weights map two 20 MiB pages [0, 40); a1 needs a third page [40, 60) and takes [30, 42); a2
    # takes [42, 54) from the mapped rest; the small tensor maps one 2 MiB page. Freed, a1 and a2 merge with the
    # free end into [30, 60), where the gradient fits: 60 + 2 = 62 MiB.
    expandable = replay(STEP, expandable_segments=True)
    assert expandable.peak_reserved_bytes == 62 * MIB
    # Both allocate the same: 30 + 12 + 12 MiB and the small block's 4 KiB at once.
    assert default.peak_allocated_bytes == expandable.peak_allocated_bytes == 54 * MIB + 4 * KIB
    # ... and 62 MiB is that peak rounded up to pages, per pool: 54 MiB to 60 (20 MiB pages), 4 KiB to 2 MiB.
    assert expandable.peak_reserved_bytes == 60 * MIB + 2 * MIB
    assert expandable.segments == 2  # one growing segment per pool


def test_empty_cache_unmaps_whole_free_pages_and_keeps_partly_used_ones() -> None:
    allocator = replay(STEP, expandable_segments=True)
    allocator.empty_cache()  # the free [52, 60) lies inside the page [40, 60), which g still uses
    assert allocator.reserved_bytes == 62 * MIB
    allocator.free("g")
    allocator.empty_cache()  # free [30, 60): the page [40, 60) goes, [20, 40) keeps the weights' end
    assert allocator.reserved_bytes == 42 * MIB
    allocator.free("w")
    allocator.free("s")
    allocator.empty_cache()
    assert allocator.reserved_bytes == 0 and allocator.segments == 0
    # Default, for comparison: empty_cache gives back whole segments only (a1's and a2's), 78 - 24 = 54 MiB.
    default = replay(STEP)
    default.empty_cache()
    assert default.reserved_bytes == 54 * MIB


def test_a_free_block_before_the_growing_end_is_taken_before_the_end() -> None:
    allocator = CachingAllocator(expandable_segments=True)
    allocator.malloc("x", 16 * MIB)  # page [0, 20): x at [0, 16)
    allocator.malloc("y", 10 * MIB)  # the free [16, 20) grows by the page [20, 40): y at [16, 26), [26, 40) free
    allocator.free("x")  # a 16 MiB hole at [0, 16)
    # Best fit by size is the 14 MiB end [26, 40), but the end counts as large as its unmapped addresses: the
    # 16 MiB hole is taken instead (z at [0, 12)) ...
    allocator.malloc("z", 12 * MIB)
    assert allocator.reserved_bytes == 40 * MIB
    # ... so 15 MiB fits neither the 4 MiB left of the hole nor the 14 MiB end: one more page, 60 MiB.
    allocator.malloc("v", 15 * MIB)
    assert allocator.reserved_bytes == 60 * MIB
    assert allocator.peak_allocated_bytes == (10 + 12 + 15) * MIB  # y, z and v at once


def test_pages_that_would_not_fit_the_capacity_release_the_cached_ones_first() -> None:
    allocator = CachingAllocator(capacity=60 * MIB, expandable_segments=True)
    for key in ("s1", "s2", "s3"):  # 1 MiB each: two small pages
        allocator.malloc(key, 1 * MIB)
    for key in ("s1", "s2", "s3"):
        allocator.free(key)
    assert allocator.reserved_bytes == 4 * MIB
    allocator.malloc("big", 58 * MIB)  # three 20 MiB pages: 4 + 60 > 60, so the small pages are unmapped first
    assert allocator.reserved_bytes == allocator.peak_reserved_bytes == 60 * MIB
    assert allocator.segments == 1


def test_expandable_segments_change_nothing_for_the_default_allocator() -> None:
    # The default's rules, unchanged: 5 MiB in a 20 MiB segment, split; 16 MiB in its own; the freed 5 MiB merged.
    allocator = CachingAllocator()
    allocator.malloc("a", 5 * MIB)
    allocator.malloc("b", 16 * MIB)
    allocator.free("a")
    allocator.malloc("c", 3 * MIB)
    assert (allocator.reserved_bytes, allocator.segments) == (36 * MIB, 2)
    assert not allocator.expandable_segments


def test_random_traces_keep_the_books_and_give_everything_back() -> None:
    rng = random.Random(60)
    for _ in range(30):
        allocator = CachingAllocator(expandable_segments=True)
        live: list[int] = []
        pages = {True: 2 * MIB, False: 20 * MIB}
        for step in range(200):
            if live and rng.random() < 0.45:
                allocator.free(live.pop(rng.randrange(len(live))))
            else:
                allocator.malloc(step, rng.choice([rng.randrange(1, 1 * MIB), rng.randrange(1 * MIB, 64 * MIB)]))
                live.append(step)
            if rng.random() < 0.05:
                allocator.empty_cache()
            mapped = sum(allocator._mapped.values())
            assert allocator.reserved_bytes == mapped and mapped % (2 * MIB) == 0
            assert allocator.allocated_bytes <= allocator.reserved_bytes
            assert all(allocator._mapped[small] % pages[small] == 0 for small in pages)
        for key in live:
            allocator.free(key)
        allocator.empty_cache()
        assert allocator.reserved_bytes == 0 and allocator.allocated_bytes == 0


def _tiny_llama() -> object:
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                       vocab_size=32000)


def test_an_estimate_says_its_card_figure_assumes_expandable_segments_and_keeps_its_allocated_peak() -> None:
    import memlab
    from memlab.estimation.dryrun.reserved import EXPANDABLE_NOTE, RESERVED_NOTE

    shapes = {"input_ids": (4, 256), "labels": (4, 256)}
    default = memlab.estimate(_tiny_llama(), shapes, memlab.Plan(), device="cuda", gpu="H200-141GB")
    expandable = memlab.estimate(_tiny_llama(), shapes, memlab.Plan(), device="cuda", gpu="H200-141GB",
                                 expandable_segments=True)
    assert default.peak_bytes == expandable.peak_bytes
    assert default.reserved_bytes is not None and expandable.reserved_bytes is not None
    # The logits' and the embedding's tensors (tens of MiB) take their own segments by default; expandable, the
    # large pool is the allocated bytes rounded up to 20 MiB pages, and never less than the allocated peak.
    assert expandable.peak_bytes < expandable.reserved_bytes < default.reserved_bytes
    assert RESERVED_NOTE in default.notes and EXPANDABLE_NOTE not in default.notes
    assert EXPANDABLE_NOTE in expandable.notes
    assert expandable.card_bytes == expandable.reserved_bytes + expandable.context_bytes


def test_expandable_segments_must_be_true_or_false() -> None:
    import pytest

    import memlab
    from memlab.errors import MemlabError

    with pytest.raises(MemlabError, match="expandable_segments=True"):
        memlab.estimate(_tiny_llama(), {"input_ids": (1, 8)}, memlab.Plan(), expandable_segments="yes")  # type: ignore[arg-type]


def test_fit_suggests_expandable_segments_where_only_the_reserve_missed_the_budget() -> None:
    import dataclasses

    import memlab
    from memlab.options import RunOptions
    from memlab.report import Trial
    from memlab.search.allocator import EXPANDABLE_SUGGESTION, expandable_suggestions
    from tests.models import lm_batch, tiny_llama

    model, batch = tiny_llama(), lm_batch(rows=8, length=512)
    plan = memlab.Plan()
    default = memlab.estimate(model, batch, plan, device="cuda")
    expandable = memlab.estimate(model, batch, plan, device="cuda", expandable_segments=True)
    assert expandable.card_bytes < default.card_bytes
    budget = (expandable.card_bytes + default.card_bytes) // 2
    # What fit measured on CUDA: the allocated peak and the context fit, the reserve does not.
    measured = dataclasses.replace(default, device="cuda:0", estimated=False, notes=())
    found = expandable_suggestions(model, batch, [measured], RunOptions(budget=budget))
    assert [trial.plan for trial in found] == [plan.replace(expandable_segments=True)]  # the plan to apply
    assert found[0].notes[0] == EXPANDABLE_SUGGESTION and found[0].card_bytes <= budget
    assert 'os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"' in EXPANDABLE_SUGGESTION
    # No suggestion where the allocated peak itself is over, nor where the process already has them.
    tight = RunOptions(budget=measured.peak_bytes)
    assert expandable_suggestions(model, batch, [measured], tight) == []
    failed = Trial(plan, "error", 0, {}, None, None, None, "cuda:0")
    assert expandable_suggestions(model, batch, [failed], RunOptions(budget=budget)) == []


def test_a_live_cuda_trial_says_when_it_ran_with_expandable_segments() -> None:
    from memlab.live.device import MEASURED_EXPANDABLE_NOTE, measured_allocator_notes

    assert measured_allocator_notes("cuda", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}) == (
        MEASURED_EXPANDABLE_NOTE,)
    assert measured_allocator_notes("cuda", {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}) == ()
    # PYTORCH_CUDA_ALLOC_CONF is read first; PYTORCH_ALLOC_CONF only where it is not set.
    assert measured_allocator_notes("cuda", {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}) != ()
    assert measured_allocator_notes("cuda", {"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF":
                                             "expandable_segments:True"}) == ()
