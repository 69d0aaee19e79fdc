"""A model of PyTorch's CUDA caching allocator: a trace of allocations and frees in, reserved bytes out.

What ``torch.cuda.max_memory_reserved`` says is more than what tensors hold (``max_memory_allocated``): the caching
allocator takes memory from CUDA in segments, rounds every request up, splits segments into blocks, reuses free
blocks by best fit and keeps every segment it has taken until ``empty_cache`` (or a failed allocation) gives the
free ones back. A dry run sees every storage its fake step allocates and frees, in order
(:class:`~memlab.measure.tracker.MemoryTracker`'s ``on_storage``); replayed through :class:`CachingAllocator` they
give the reserved peak the GPU would show.

Written by hand because PyTorch has no simulator of its caching allocator: ``torch.cuda.memory`` can record a real
run's trace (``_record_memory_history``) but replays nothing, and needs a GPU. The rules are those of
``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch 2.x; read at the source of the torch 2.13 line), with its default
settings (no ``PYTORCH_CUDA_ALLOC_CONF``):

- a request is rounded up to a multiple of 512 bytes (``round_size``, ``kMinBlockSize``);
- requests up to 1 MiB (``kSmallSize``) come from the small pool, whose segments are 2 MiB (``kSmallBuffer``);
  larger ones from the large pool, whose new segment is 20 MiB (``kLargeBuffer``) for requests under 10 MiB
  (``kMinLargeAlloc``) and otherwise the request rounded up to 2 MiB (``kRoundLarge``): ``get_allocation_size``;
- a request takes the smallest free block of its pool that is large enough, the lowest address among equals
  (``get_free_block``: blocks ordered by stream, size, address); only when there is none is a segment taken;
- the block is split when what remains is at least 512 bytes (small pool) or more than 1 MiB (large pool:
  ``should_split`` with the default ``max_split_size``, unlimited); the rest stays free in the same segment;
- a freed block merges with its free neighbours in the segment (``free_block``, ``try_merge_blocks``);
- segments are never given back, except by ``empty_cache`` (``release_cached_blocks``: every segment with no
  allocated block), and when CUDA has no room for a new segment: ``malloc`` then releases the cached segments
  the same way and tries again (with the default ``max_split_size``, ``release_available_cached_blocks`` frees
  nothing). The room is the allocator's ``capacity`` (the card's memory less the CUDA context) when it is given.

``allocated`` counts whole blocks, as the allocator does: a block that was not split (a 12 MiB segment for an
11.5 MiB request) counts in full. One stream is assumed (a training step's forward and backward run on the
current stream); expandable segments, CUDA graphs' private pools and memory fractions are not modelled.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Hashable, Iterable

__all__ = [
    "KIB",
    "MIB",
    "CachingAllocator",
    "replay",
    "round_size",
    "segment_size",
]

KIB = 1024
MIB = 1024 * KIB
_MIN_BLOCK = 512  # kMinBlockSize
_SMALL_SIZE = 1 * MIB  # kSmallSize
_SMALL_BUFFER = 2 * MIB  # kSmallBuffer
_LARGE_BUFFER = 20 * MIB  # kLargeBuffer
_MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc
_ROUND_LARGE = 2 * MIB  # kRoundLarge


def round_size(size: int) -> int:
    """The bytes the caching allocator hands out for a request of ``size`` bytes: at least 512, a multiple of 512.

    Example:
        >>> round_size(1), round_size(512), round_size(513), round_size(4 * MIB)
        (512, 512, 1024, 4194304)
    """
    if size < _MIN_BLOCK:
        return _MIN_BLOCK
    return -(-size // _MIN_BLOCK) * _MIN_BLOCK


def segment_size(size: int) -> int:
    """The bytes of the segment the allocator takes from CUDA when no free block fits a (rounded) request of
    ``size`` bytes: 2 MiB up to 1 MiB, 20 MiB under 10 MiB, else the request rounded up to 2 MiB.

    Example:
        >>> [segment_size(n) // MIB for n in (512, 1 * MIB, 1 * MIB + 512, 10 * MIB, 30 * MIB + 1)]
        [2, 2, 20, 10, 32]
    """
    if size <= _SMALL_SIZE:
        return _SMALL_BUFFER
    if size < _MIN_LARGE_ALLOC:
        return _LARGE_BUFFER
    return -(-size // _ROUND_LARGE) * _ROUND_LARGE


class _Block:
    """A stretch of one segment: allocated or free, linked to its neighbours in the segment."""

    __slots__ = ("address", "allocated", "next", "prev", "size", "small")

    def __init__(self, address: int, size: int, small: bool) -> None:
        self.address = address
        self.size = size
        self.small = small
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


class CachingAllocator:
    """PyTorch's CUDA caching allocator, replayed: :meth:`malloc` and :meth:`free` in the order the program made
    them, and the allocator's statistics after each (see the module's notes for the rules).

    Attributes:
        reserved_bytes / peak_reserved_bytes: bytes of the segments taken from CUDA, now and at most
            (``torch.cuda.memory_reserved`` / ``max_memory_reserved``).
        allocated_bytes / peak_allocated_bytes: bytes of the allocated blocks, now and at most
            (``torch.cuda.memory_allocated`` / ``max_memory_allocated``).
        segments: how many segments are reserved now.

    Example:
        >>> allocator = CachingAllocator()
        >>> allocator.malloc("a", 5 * MIB)        # a 20 MiB segment, split
        >>> allocator.malloc("b", 16 * MIB)       # more than the 15 MiB left: a 16 MiB segment
        >>> allocator.free("a"); allocator.malloc("c", 3 * MIB)  # the freed 5 MiB merged back: 20 MiB, split
        >>> allocator.reserved_bytes // MIB, allocator.peak_allocated_bytes // MIB
        (36, 21)

    With a ``capacity``, a segment that would not fit beside the reserved ones first frees the cached ones:

        >>> allocator = CachingAllocator(capacity=40 * MIB)
        >>> allocator.malloc("a", 30 * MIB); allocator.free("a"); allocator.malloc("b", 32 * MIB)
        >>> allocator.reserved_bytes // MIB, allocator.peak_reserved_bytes // MIB
        (32, 32)
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        """The bytes CUDA can give the allocator (None: unlimited): past them, cached segments are released."""
        self.reserved_bytes = 0
        self.allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self.most_reserved_bytes = 0
        """The most reserved at any time since the allocator was made, whatever :meth:`reset_peak` did: what
        ``max_memory_reserved`` reads over a whole call (set-up and teardown included) after one reset before it."""
        self.segments = 0
        # Free blocks of each pool (small: True) as (size, address), sorted: best fit is a bisection.
        self._free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        self._free_blocks: dict[int, _Block] = {}  # address -> free block
        self._live: dict[Hashable, _Block | None] = {}  # key -> its block (None for an empty storage)
        self._next_address = 0

    # ------------------------------------------------------------------------------------------------ events
    def malloc(self, key: Hashable, size: int) -> None:
        """Allocate ``size`` bytes under ``key`` (a key not allocated now); 0 bytes take no block, as on CUDA."""
        if key in self._live:
            raise ValueError(f"key {key!r} is already allocated; free it first")
        if size <= 0:
            self._live[key] = None
            return
        rounded = round_size(size)
        small = rounded <= _SMALL_SIZE
        free = self._free[small]
        index = bisect_left(free, (rounded, -1))
        if index < len(free):
            _, address = free.pop(index)
            block = self._free_blocks.pop(address)
        else:
            taken = segment_size(rounded)
            if self.capacity is not None and self.reserved_bytes + taken > self.capacity:
                # cudaMalloc would fail: release_cached_blocks, then the allocation is tried again (and still
                # over the capacity, it is the out-of-memory error, which the peak shows).
                self.empty_cache()
            block = _Block(self._next_address, taken, small)
            self._next_address += taken
            self.segments += 1
            self.reserved_bytes += taken
            if self.reserved_bytes > self.peak_reserved_bytes:
                self.peak_reserved_bytes = self.reserved_bytes
                if self.reserved_bytes > self.most_reserved_bytes:
                    self.most_reserved_bytes = self.reserved_bytes
        remaining = block.size - rounded
        if remaining >= _MIN_BLOCK if small else remaining > _SMALL_SIZE:
            rest = _Block(block.address + rounded, remaining, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = rounded
            self._add_free(rest)
        block.allocated = True
        self._live[key] = block
        self.allocated_bytes += block.size
        if self.allocated_bytes > self.peak_allocated_bytes:
            self.peak_allocated_bytes = self.allocated_bytes

    def free(self, key: Hashable) -> None:
        """Free the block of ``key``: it merges with its free neighbours and stays reserved."""
        try:
            block = self._live.pop(key)
        except KeyError:
            raise ValueError(f"key {key!r} is not allocated") from None
        if block is not None:
            self._release(block)

    def record(self, key: Hashable, size: int) -> None:
        """The storage ``key`` now holds ``size`` bytes (0: it is gone): the one callback a tracker needs. A new key
        is allocated; a live key with a new size is reallocated (the new block is taken before the old one is
        given back: ``resize_`` copies); a live key at 0 bytes is freed; anything else changes nothing.

        Example:
            >>> allocator = CachingAllocator()
            >>> allocator.record(1, 3000); allocator.record(1, 0); allocator.record(1, 0)
            >>> allocator.allocated_bytes, allocator.reserved_bytes // MIB
            (0, 2)
        """
        if key not in self._live:
            if size > 0:
                self.malloc(key, size)
            return
        if size <= 0:
            self.free(key)
            return
        old = self._live.pop(key)
        self.malloc(key, size)
        if old is not None:
            self._release(old)

    def holds(self, key: Hashable) -> bool:
        """Whether ``key`` is allocated now.

        Example:
            >>> allocator = CachingAllocator(); allocator.malloc("a", 10)
            >>> allocator.holds("a"), allocator.holds("b")
            (True, False)
        """
        return key in self._live

    def reset_peak(self) -> None:
        """Start both peaks again from now (``torch.cuda.reset_peak_memory_stats``)."""
        self.peak_reserved_bytes = self.reserved_bytes
        self.peak_allocated_bytes = self.allocated_bytes

    def empty_cache(self) -> None:
        """Give back every segment with no allocated block (``torch.cuda.empty_cache``).

        Example:
            >>> allocator = CachingAllocator()
            >>> allocator.malloc("a", 100); allocator.malloc("b", 30 * MIB); allocator.free("b")
            >>> allocator.empty_cache(); allocator.reserved_bytes // MIB
            2
        """
        for block in list(self._free_blocks.values()):
            if block.prev is None and block.next is None:
                self._remove_free(block)
                self.reserved_bytes -= block.size
                self.segments -= 1

    # ------------------------------------------------------------------------------------------- internals
    def _release(self, block: _Block) -> None:
        block.allocated = False
        self.allocated_bytes -= block.size
        before = block.prev
        if before is not None and not before.allocated:
            self._remove_free(before)
            block.address = before.address
            block.size += before.size
            block.prev = before.prev
            if block.prev is not None:
                block.prev.next = block
        after = block.next
        if after is not None and not after.allocated:
            self._remove_free(after)
            block.size += after.size
            block.next = after.next
            if block.next is not None:
                block.next.prev = block
        self._add_free(block)

    def _add_free(self, block: _Block) -> None:
        insort(self._free[block.small], (block.size, block.address))
        self._free_blocks[block.address] = block

    def _remove_free(self, block: _Block) -> None:
        free = self._free[block.small]
        del free[bisect_left(free, (block.size, block.address))]
        del self._free_blocks[block.address]


def replay(events: Iterable[tuple[Hashable, int]]) -> CachingAllocator:
    """The allocator after ``events``: ``(key, bytes)`` pairs in order, as :meth:`CachingAllocator.record` takes them
    (a new key allocates, 0 bytes frees).

    Example:
        >>> allocator = replay([("weights", 30 * MIB), ("x", 5 * MIB), ("x", 0), ("y", 1)])
        >>> allocator.peak_reserved_bytes // MIB  # 30 MiB, a 20 MiB segment for x, a 2 MiB one for y
        52
    """
    allocator = CachingAllocator()
    for key, size in events:
        allocator.record(key, size)
    return allocator
