"""The caching allocator model (memlab/estimation/cuda/allocator.py) on cases worked by hand from the rules of
c10/cuda/CUDACachingAllocator.cpp."""

from __future__ import annotations

import random

import pytest

from memlab.estimation.cuda.allocator import MIB, CachingAllocator, replay, round_size, segment_size


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
