"""Buffers that bodies are received into, used again once nobody holds them.

A fetched part's bytes are a ``bytearray`` of 128 KiB or more, and the daemon keeps every
such buffer in a mapping of its own (:mod:`refmount.malloc`): each new one costs a
mapping, a page fault and the zeroing of every 4 KiB page as the body is written into it,
and its ``munmap`` when it is freed.  On the 2-vCPU VMs this runs on a page fault costs
3.7 µs, so a fresh 256 KiB buffer costs about 0.3 ms of CPU, a third of what a cold chunk
costs the daemon in all (``bench/README.md``).  The block cache gives the buffers of the
parts it evicts back here, and the HTTP client takes one of the same size for its next
body: memory already mapped and faulted in.

A buffer is handed out again only when nothing but this pool refers to it: CPython
counts every reference (a landed part that a waiting reader still holds, a memoryview a
FUSE reply or the disk cache's write queue is reading, a caller's variable), so the
reference count tells exactly whether anyone could still read it.  One that is still
held stays in the pool until it is free or pushed out.  What the pool keeps is bounded
by ``limit`` bytes, which the cache takes out of its own budget, so that cache, parts in
flight and free buffers together stay within the one budget the user gave.
"""

from __future__ import annotations

import sys
from collections import OrderedDict, deque

from refmount.malloc import MMAP_THRESHOLD

#: Buffers smaller than this come from the C heap, which reuses them by itself.
SMALLEST = MMAP_THRESHOLD
#: Held buffers looked at for one take before a fresh one is made instead.
_LOOKS = 4


def _references(buffer: bytearray) -> int:
    return sys.getrefcount(buffer)


def _free_count() -> int:
    """The reference count that :func:`_references` reports for a buffer that one local
    name alone holds, measured (it differs between CPython versions)."""
    probe = bytearray(1)
    return _references(probe)


_FREE = _free_count()


class BufferPool:
    """Free ``bytearray`` buffers by size, at most ``limit`` bytes of them."""

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self.held = 0  # bytes of the buffers in the pool
        self.reused = 0  # buffers handed out again
        self.made = 0  # buffers made fresh by take
        self._by_size: OrderedDict[int, deque[bytearray]] = OrderedDict()

    def take(self, size: int) -> bytearray:
        """A buffer of ``size`` bytes, with whatever bytes it held before: the caller
        writes every byte of it (or drops it)."""
        free = self._by_size.get(size)
        if free:
            for _ in range(min(len(free), _LOOKS)):
                buffer = free.popleft()
                if _references(buffer) == _FREE:
                    if not free:
                        del self._by_size[size]
                    self.held -= size
                    self.reused += 1
                    return buffer
                free.append(buffer)  # still read by someone: later, maybe
        self.made += 1
        return bytearray(size)

    def give(self, buffer: object) -> None:
        """Keep ``buffer`` for a later :meth:`take` (it may still be referenced: it is
        not handed out until it is not), or let it go if it is no pool buffer or there
        is no room."""
        if type(buffer) is not bytearray or self.limit <= 0:
            return
        size = len(buffer)
        if size < SMALLEST or size > self.limit:
            return
        free = self._by_size.setdefault(size, deque())
        self._by_size.move_to_end(size)
        free.append(buffer)
        self.held += size
        while self.held > self.limit:
            self._drop_oldest()

    def stats(self) -> dict[str, int]:
        return {"buffers_reused": self.reused, "buffers_made": self.made,
                "buffers_free_bytes": self.held}  # fmt: skip

    def _drop_oldest(self) -> None:
        """Let go of a buffer of the size given back least recently."""
        size, free = next(iter(self._by_size.items()))
        free.popleft()
        self.held -= size
        if not free:
            del self._by_size[size]
