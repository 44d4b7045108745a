"""glibc's malloc set up for a daemon whose large buffers come and go on many threads.

The daemon's large buffers (fetched parts of 256 KiB to 8 MiB, the bytes a disk read or
a join makes) are allocated by obstore's runtime threads, trio's worker threads and the
serving thread, each of which glibc gives an arena of its own.  glibc's mmap threshold
is dynamic: it starts at 128 KiB, and every time a buffer that was mmap'ed is freed it
rises to that buffer's size (up to 32 MiB).  After the first evicted part, every part is
carved from some thread's arena instead, freed parts leave holes between live ones, and
an arena gives back only what is free at its top: under 16 readers and a 64 MiB cache
the daemon held 290-340 MiB (bench/soak.py), and 110-160 MiB of it was freed memory
that the arenas kept.

A fixed threshold (``mallopt(M_MMAP_THRESHOLD)``, which also turns the dynamic one off)
keeps every buffer of 128 KiB or more in a mapping of its own, returned to the kernel
when it is freed: the same soak then holds 160-180 MiB.  Such a buffer costs a mapping
and its page faults every time: a fetched part pays them anyway (the cache keeps what it
fetches, so a new part is fresh memory either way), but a transient buffer of a fetch
no longer reuses freed memory: in a cold W3 (``bench/request_cost.py``, 12 interleaved
rounds each) the daemon's system CPU rose from 0.44 to 0.51 ms per 256 KiB chunk.  The
alternatives measured under the soak kept more: at most two arenas 248 MiB, two arenas
and ``malloc_trim(0)`` every second 231 MiB (against the 207 MiB allowed).

Bulk work that makes many large temporary arrays at once (reading a manifest of a
million chunk references makes a hundred of 8 MiB) would pay a mapping and its page
faults for each: :func:`bulk_allocations` lets the heap serve them for its duration,
then restores the threshold and hands what was freed back (``malloc_trim``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
#: Buffers of this size or more get a mapping of their own (glibc's initial threshold).
MMAP_THRESHOLD = 128 << 10
#: glibc's default trim threshold: free memory beyond it at a heap's top goes back
TRIM_THRESHOLD = 128 << 10
#: during bulk work: glibc's largest mmap threshold, and a trim threshold to match
BULK_MMAP_THRESHOLD, BULK_TRIM_THRESHOLD = 32 << 20, 1 << 30


class _Fixed:
    """The threshold :func:`tune_malloc` fixed, and the bulk work under way."""

    threshold: int | None = None
    bulk = 0
    lock = threading.Lock()


def is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError):
        return False


def tune_malloc(mmap_threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``mmap_threshold`` bytes; False where the C library
    is not glibc or refuses.  Call before the daemon starts its threads."""
    if not is_glibc():
        log.debug("not glibc: malloc left as it is")
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, mmap_threshold) != 1:
        log.warning("mallopt(M_MMAP_THRESHOLD, %d) refused", mmap_threshold)
        return False
    _Fixed.threshold = mmap_threshold
    log.debug("malloc: buffers of %d bytes or more are mapped apart", mmap_threshold)
    return True


@contextlib.contextmanager
def bulk_allocations() -> Iterator[None]:
    """Large temporary buffers come from the heap (and are reused) while the block runs,
    in any thread; when the last such block ends the fixed threshold is back and the
    freed memory returned.  Nothing changes where :func:`tune_malloc` fixed nothing."""
    if _Fixed.threshold is None:
        yield
        return
    libc = ctypes.CDLL(None)
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    with _Fixed.lock:
        _Fixed.bulk += 1
        if _Fixed.bulk == 1:
            libc.mallopt(M_TRIM_THRESHOLD, BULK_TRIM_THRESHOLD)
            libc.mallopt(M_MMAP_THRESHOLD, BULK_MMAP_THRESHOLD)
    try:
        yield
    finally:
        with _Fixed.lock:
            _Fixed.bulk -= 1
            if _Fixed.bulk == 0:
                libc.mallopt(M_MMAP_THRESHOLD, _Fixed.threshold)
                libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                libc.malloc_trim(0)
