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
current stream); CUDA graphs' private pools and memory fractions are not modelled.

With ``expandable_segments=True`` (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) each pool is one segment
of virtual addresses that grows by mapping physical pages (``ExpandableSegment``, ``try_allocate_expandable_block``):

- the pages are the pool's segment size, 2 MiB (``kSmallBuffer``) for the small pool and 20 MiB (``kLargeBuffer``)
  for the large one; ``reserved`` counts the mapped pages (``map_block`` / ``unmap_block``);
- a request first takes the best-fitting free mapped block, where a free block followed by unmapped addresses (the
  segment's growing end) counts as that much larger, so any other free block that fits is taken before it
  (``get_free_block``'s ``expandable_size``); with none, the lowest free stretch of addresses long enough (free
  mapped blocks and unmapped ones, ``find_expandable_block``) has the pages it lacks mapped and merged into it;
- every block is split when what remains is at least 512 bytes, in both pools (``should_split``);
- ``empty_cache`` (and a page that would not fit the ``capacity``) unmaps every whole page of every free block
  (``release_blocks``, ``unmap_block``); the partly used pages at a free block's ends stay mapped.

Freed neighbours merge across what would have been separate segments, so a later larger request reuses them:
the reserved peak is close to the allocated peak rounded up to pages, at most a page or so above it per pool unless
blocks freed between live ones leave holes no later request fits. Each segment's addresses are taken as
unlimited (PyTorch reserves 1.125 times the GPU's memory of them).
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left, insort
from collections.abc import Hashable, Iterable, Iterator
from contextvars import ContextVar

__all__ = [
    "KIB",
    "MIB",
    "CachingAllocator",
    "assumed_allocator",
    "expandable_segments_assumed",
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
_VIRTUAL = 1 << 56  # an expandable segment's addresses: taken as unlimited
_SMALL_BASE = 1 << 58  # where the small pool's expandable segment starts (the large pool's starts at 0)


_EXPANDABLE: ContextVar[bool] = ContextVar("memlab_expandable_segments", default=False)


@contextlib.contextmanager
def assumed_allocator(expandable_segments: bool) -> Iterator[None]:
    """Every :class:`CachingAllocator` made inside (by a dry run's reserved trace, its replays at depth, FSDP2's)
    models the allocator with or without ``expandable_segments``, unless it is told otherwise: how an estimate's
    card figure assumes the user's ``PYTORCH_CUDA_ALLOC_CONF``.

    Example:
        >>> with assumed_allocator(expandable_segments=True):
        ...     CachingAllocator().expandable_segments, expandable_segments_assumed()
        (True, True)
        >>> CachingAllocator().expandable_segments
        False
    """
    token = _EXPANDABLE.set(bool(expandable_segments))
    try:
        yield
    finally:
        _EXPANDABLE.reset(token)


def expandable_segments_assumed() -> bool:
    """Whether the allocator models made now assume expandable segments (:func:`assumed_allocator`; default no,
    PyTorch's default).

    Example:
        >>> expandable_segments_assumed()
        False
    """
    return _EXPANDABLE.get()


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

    __slots__ = ("address", "allocated", "mapped", "next", "prev", "size", "small")

    def __init__(self, address: int, size: int, small: bool, mapped: bool = True) -> None:
        self.address = address
        self.size = size
        self.small = small
        self.allocated = False
        self.mapped = mapped
        self.prev: _Block | None = None
        self.next: _Block | None = None


def _split(block: _Block, size: int, mapped: bool = True) -> _Block:
    """Cut ``block`` to its first ``size`` bytes; the rest, a new block of the same pool linked after it, returned."""
    rest = _Block(block.address + size, block.size - size, block.small, mapped=mapped)
    rest.prev, rest.next = block, block.next
    if block.next is not None:
        block.next.prev = rest
    block.next = rest
    block.size = size
    return rest


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

    With ``expandable_segments=True`` the large pool grows by 20 MiB pages, and freed blocks merge across them:

        >>> allocator = CachingAllocator(expandable_segments=True)
        >>> allocator.malloc("a", 12 * MIB); allocator.malloc("b", 12 * MIB)  # 24 MiB on two pages
        >>> allocator.free("a"); allocator.free("b"); allocator.malloc("c", 22 * MIB)  # the 40 MiB freed, reused
        >>> allocator.peak_reserved_bytes // MIB, replay([("a", 12 * MIB), ("b", 12 * MIB), ("a", 0), ("b", 0),
        ...                                                ("c", 22 * MIB)]).peak_reserved_bytes // MIB
        (40, 46)
    """

    def __init__(self, capacity: int | None = None, expandable_segments: bool | None = None) -> None:
        self.capacity = capacity
        """The bytes CUDA can give the allocator (None: unlimited): past them, cached segments are released."""
        if expandable_segments is None:
            expandable_segments = expandable_segments_assumed()
        self.expandable_segments = expandable_segments
        """Whether each pool is one expandable segment mapped in pages (``expandable_segments:True``)."""
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
        # Expandable segments: each pool's unmapped blocks by address (at first one block of all its addresses),
        # and its mapped bytes.
        self._unmapped: dict[bool, list[int]] = {True: [], False: []}
        self._unmapped_blocks: dict[int, _Block] = {}
        self._mapped: dict[bool, int] = {True: 0, False: 0}
        if expandable_segments:
            for small, base in ((True, _SMALL_BASE), (False, 0)):
                self._add_unmapped(_Block(base, _VIRTUAL, small, mapped=False))

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
        if self.expandable_segments:
            block = self._take_expandable(rounded, small, index)
        elif index < len(free):
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
            self._reserve(taken)
        remaining = block.size - rounded
        if remaining >= _MIN_BLOCK if small or self.expandable_segments else remaining > _SMALL_SIZE:
            self._add_free(_split(block, rounded))
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
        if self.expandable_segments:
            for block in list(self._free_blocks.values()):
                self._unmap(block)
            return
        for block in list(self._free_blocks.values()):
            if block.prev is None and block.next is None:
                self._remove_free(block)
                self.reserved_bytes -= block.size
                self.segments -= 1

    # ------------------------------------------------------------------------------------------- internals
    def _reserve(self, taken: int) -> None:
        self.reserved_bytes += taken
        if self.reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.reserved_bytes
            if self.reserved_bytes > self.most_reserved_bytes:
                self.most_reserved_bytes = self.reserved_bytes

    def _release(self, block: _Block) -> None:
        block.allocated = False
        self.allocated_bytes -= block.size
        self._merge(block)
        self._add_free(block)

    def _merge(self, block: _Block) -> None:
        """Merge ``block`` (free, out of the free lists) with its free neighbours mapped as it is
        (``try_merge_blocks``)."""
        before = block.prev
        if before is not None and not before.allocated and before.mapped == block.mapped:
            self._remove_free(before) if before.mapped else self._remove_unmapped(before)
            block.address = before.address
            block.size += before.size
            block.prev = before.prev
            if block.prev is not None:
                block.prev.next = block
        after = block.next
        if after is not None and not after.allocated and after.mapped == block.mapped:
            self._remove_free(after) if after.mapped else self._remove_unmapped(after)
            block.size += after.size
            block.next = after.next
            if block.next is not None:
                block.next.prev = block

    # --------------------------------------------------------------------------------- expandable segments
    @staticmethod
    def _page(small: bool) -> int:
        return _SMALL_BUFFER if small else _LARGE_BUFFER

    def _reach(self, address: int) -> int:
        """A free block's size for best fit under expandable segments: with the unmapped addresses after it."""
        block = self._free_blocks[address]
        after = block.next
        return block.size + (after.size if after is not None and not after.mapped else 0)

    def _take_expandable(self, rounded: int, small: bool, index: int) -> _Block:
        """The free block a request of ``rounded`` bytes takes under expandable segments, out of the free lists."""
        free = self._free[small]
        if index < len(free):  # get_free_block: a block before the growing end that fits is taken first
            while index + 1 < len(free) and self._reach(free[index + 1][1]) < self._reach(free[index][1]):
                index += 1
            _, address = free.pop(index)
            return self._free_blocks.pop(address)
        start = self._expandable_start(rounded, small)
        if self.capacity is not None and self.reserved_bytes + self._to_map(start, rounded) > self.capacity:
            self.empty_cache()  # the pages would not fit: release_cached_blocks, then the allocation again
            start = self._expandable_start(rounded, small)
        block = start if start.mapped else self._map(start, min(start.size, rounded))
        while block.size < rounded:  # try_allocate_expandable_block: map what the free block lacks after it
            after = block.next
            assert after is not None and not after.mapped
            block = self._map(after, min(rounded - block.size, after.size))
        self._remove_free(block)
        return block

    def _expandable_start(self, size: int, small: bool) -> _Block:
        """The lowest stretch of free addresses (mapped or not) of at least ``size`` bytes: its first block
        (``find_expandable_block``)."""
        for address in self._unmapped[small]:
            block = self._unmapped_blocks[address]
            if block.prev is not None and not block.prev.allocated:
                block = block.prev
            room, cursor = 0, block  # type: int, _Block | None
            while room < size and cursor is not None and not cursor.allocated:
                room += cursor.size
                cursor = cursor.next
            if room >= size:
                return block
        raise AssertionError("an expandable segment's addresses are unlimited")  # pragma: no cover

    def _to_map(self, start: _Block, size: int) -> int:
        """The bytes of the pages a request of ``size`` bytes maps from ``start`` on."""
        page, mapped, covered = self._page(start.small), 0, 0
        block: _Block | None = start
        while covered < size and block is not None:
            if block.mapped:
                covered += block.size
            else:
                part = -(-min(block.size, size - covered) // page) * page
                mapped += part
                covered += part
            block = block.next
        return mapped

    def _map(self, block: _Block, size: int) -> _Block:
        """Map the pages of the first ``size`` bytes of the unmapped ``block``: a free block, merged with the free
        mapped blocks beside it and in the free lists (``map_block``)."""
        page = self._page(block.small)
        size = -(-size // page) * page
        self._remove_unmapped(block)
        if size < block.size:
            self._add_unmapped(_split(block, size, mapped=False))
        block.mapped = True
        if self._mapped[block.small] == 0:
            self.segments += 1
        self._mapped[block.small] += size
        self._reserve(size)
        self._merge(block)
        self._add_free(block)
        return block

    def _unmap(self, block: _Block) -> None:
        """Unmap every whole page of the free mapped ``block`` (``unmap_block``); its partly used end pages stay."""
        page = self._page(block.small)
        end = block.address + block.size
        begin, stop = -(-block.address // page) * page, end // page * page
        if begin >= stop:
            return
        self._remove_free(block)
        if begin > block.address:
            before = _Block(block.address, begin - block.address, block.small)
            before.prev, before.next = block.prev, block
            if block.prev is not None:
                block.prev.next = before
            block.prev = before
            self._add_free(before)
        if stop < end:
            after = _Block(stop, end - stop, block.small)
            after.prev, after.next = block, block.next
            if block.next is not None:
                block.next.prev = after
            block.next = after
            self._add_free(after)
        block.address, block.size, block.mapped = begin, stop - begin, False
        self._mapped[block.small] -= block.size
        if self._mapped[block.small] == 0:
            self.segments -= 1
        self.reserved_bytes -= block.size
        self._merge(block)
        self._add_unmapped(block)

    def _add_unmapped(self, block: _Block) -> None:
        insort(self._unmapped[block.small], block.address)
        self._unmapped_blocks[block.address] = block

    def _remove_unmapped(self, block: _Block) -> None:
        addresses = self._unmapped[block.small]
        del addresses[bisect_left(addresses, block.address)]
        del self._unmapped_blocks[block.address]

    def _add_free(self, block: _Block) -> None:
        insort(self._free[block.small], (block.size, block.address))
        self._free_blocks[block.address] = block

    def _remove_free(self, block: _Block) -> None:
        free = self._free[block.small]
        del free[bisect_left(free, (block.size, block.address))]
        del self._free_blocks[block.address]


def replay(events: Iterable[tuple[Hashable, int]], expandable_segments: bool | None = None) -> CachingAllocator:
    """The allocator after ``events``: ``(key, bytes)`` pairs in order, as :meth:`CachingAllocator.record` takes them
    (a new key allocates, 0 bytes frees), with or without ``expandable_segments`` (default: as assumed,
    :func:`assumed_allocator`).

    Example:
        >>> events = [("weights", 30 * MIB), ("x", 5 * MIB), ("x", 0), ("y", 1)]
        >>> replay(events).peak_reserved_bytes // MIB  # 30 MiB, a 20 MiB segment for x, a 2 MiB one for y
        52
        >>> replay(events, expandable_segments=True).peak_reserved_bytes // MIB  # two 20 MiB pages, one of 2 MiB
        42
    """
    allocator = CachingAllocator(expandable_segments=expandable_segments)
    for key, size in events:
        allocator.record(key, size)
    return allocator
