"""Remote byte ranges: one fetcher (deadlines, retries, length checks) over backends
that move the bytes (local files, fsspec)."""

from refmount.fetch.backend import Version
from refmount.fetch.fetcher import Fetcher, FetchPolicy, FetchStats, classify, protocol_of
from refmount.fetch.local import NOWAIT_MAX, OPEN_LOCAL_FILES

__all__ = [
    "NOWAIT_MAX",
    "OPEN_LOCAL_FILES",
    "FetchPolicy",
    "FetchStats",
    "Fetcher",
    "Version",
    "classify",
    "protocol_of",
]
