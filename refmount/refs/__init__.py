"""Reference sets: reading, validating and indexing them (JSON and Parquet)."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from refmount.errors import RefsError
from refmount.refs.model import Child, Ref, RefSet
from refmount.refs.source import (
    filesystem_for,
    is_parquet_refs,
    modification_time,
    read_refs_bytes,
)
from refmount.refs.urls import UrlResolver

__all__ = ["Child", "Ref", "RefSet", "RefsError", "open_refset"]

log = logging.getLogger(__name__)


def open_refset(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    remote_protocol: str | None = None,
    allow_local: bool = False,
    timeout: float = 60.0,
    progress: Callable[[str, int, int], None] | None = None,
) -> RefSet:
    """Read and validate the reference set at ``url`` (a JSON file, plain or compressed,
    or a Parquet reference directory), raising :class:`RefsError` with the reason.
    ``timeout`` bounds each later load of a lazily read part (a Parquet record file).
    ``progress(stage, keys, nbytes)`` hears of each stage (reading, parsing, indexing,
    loaded) with the keys and bytes known so far."""
    report = progress or _no_progress
    report("reading", 0, 0)
    fs, path = filesystem_for(url, storage_options or {})
    resolve = UrlResolver(url, remote_protocol=remote_protocol, allow_local=allow_local)
    if is_parquet_refs(fs, path):
        from refmount.refs.parquet import ParquetRefSet

        mtime = modification_time(fs, f"{path.rstrip('/')}/.zmetadata")
        refset = ParquetRefSet.open(fs, path, resolve=resolve, mtime=mtime, load_timeout=timeout)
        report("loaded", 0, 0)
        return refset
    mtime = modification_time(fs, path)
    if _is_directory(fs, path):
        raise RefsError(f"{url}: a directory without .zmetadata is not a reference set")
    # Each format's modules (and pyarrow) are imported only when that format is met:
    # a Parquet set should be mounted before pyarrow would have finished importing.  A
    # large JSON set is parsed in two processes, and Arrow imported while the other parses.
    from refmount.refs import jsonsplit

    raw = read_refs_bytes(fs, path)
    nbytes = len(raw)
    report("parsing", 0, nbytes)
    with jsonsplit.collector_paused():
        parts = jsonsplit.parse_in_parts(raw, meanwhile=_import_table)
        from refmount.refs import jsonrefs
        from refmount.refs.table import TableRefSet

        columns = jsonrefs.load(raw, url, resolve, parts)
    del raw, parts
    table = columns.table()
    report("indexing", table.num_rows, nbytes)
    refset = TableRefSet(table, columns.urls, mtime=mtime, name=url)
    del table, columns
    _release_freed_memory()
    log.info("%s: %d keys referencing %d remote files", url, len(refset), len(refset.urls))
    report("loaded", len(refset), nbytes)
    return refset


def _no_progress(stage: str, keys: int, nbytes: int) -> None:
    pass


def _import_table() -> None:
    importlib.import_module("refmount.refs.table")


def _release_freed_memory() -> None:
    """Hand the parse's freed memory back to the system, so its peak does not stay
    resident: glibc's heap keeps what the parsed JSON and the index's sort and filters
    held (the JSON set's arrays come from it, see ``arrays.POOL``), Arrow's own pool what
    any other Arrow work freed."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _is_directory(fs: Any, path: str) -> bool:
    try:
        return bool(fs.isdir(path))
    except OSError:
        return False
