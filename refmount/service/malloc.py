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
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h
#: Buffers of this size or more get a mapping of their own (glibc's initial threshold).
MMAP_THRESHOLD = 128 << 10


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
    log.debug("malloc: buffers of %d bytes or more are mapped apart", mmap_threshold)
    return True
