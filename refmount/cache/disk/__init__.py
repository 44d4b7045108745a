"""A persistent chunk cache on local disk, shared by every refmount process that uses
the same directory (``--disk-cache DIR``).

``entry`` (the file format, checked on every read), ``index`` (the shared, advisory LRU
index and the eviction plan), ``store`` (the directory: temporary files, renames, locks
of live processes) and ``validators`` (which version of an object is current) are each
testable alone; ``cache`` runs them for one process, and ``tier`` puts them in front of
a fetcher, where the block cache fetches its parts.
"""

from refmount.cache.disk.cache import DiskCache, DiskCacheConfig
from refmount.cache.disk.store import DiskCacheError
from refmount.cache.disk.tier import DiskTier

__all__ = ["DiskCache", "DiskCacheConfig", "DiskCacheError", "DiskTier"]
