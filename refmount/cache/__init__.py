"""The block cache: parts of remote files shared by every reader, read-ahead, one budget.

``parts`` (a request's bytes and its fetch state), ``streams`` (which reads are
sequential and what to prefetch), ``budget`` (memory and eviction) are pure bookkeeping;
``blockcache`` orchestrates them with the fetcher in a trio nursery.  ``grid`` (walks along
an array's chunk grid: pure) and ``chunkahead`` (which fetches what they predict, across
files) read ahead for readers of chunk keys.
"""

from refmount.cache.blockcache import BLOCK_SIZE, MAX_PART, BlockCache
from refmount.cache.budget import MemoryBudget
from refmount.cache.parts import Part, State
from refmount.cache.streams import SEQ_MIN_BYTES, Prefetch, StreamTracker

__all__ = [
    "BLOCK_SIZE",
    "MAX_PART",
    "SEQ_MIN_BYTES",
    "BlockCache",
    "MemoryBudget",
    "Part",
    "Prefetch",
    "State",
    "StreamTracker",
]
