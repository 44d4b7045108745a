"""Reference sets: reading, validating and indexing them (JSON and Parquet)."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from refmount.errors import RefsError
from refmount.redaction import redact_text, redact_url
from refmount.refs import source
from refmount.refs.model import Child, Ref, RefSet
from refmount.refs.source import DEFAULT_MAX_REFS_BYTES
from refmount.refs.urls import UrlResolver

__all__ = ["DEFAULT_MAX_REFS_BYTES", "Child", "Ref", "RefSet", "RefsError", "open_refset"]

log = logging.getLogger(__name__)


def open_refset(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    remote_protocol: str | None = None,
    allow_local: bool = False,
    timeout: float = 60.0,
    max_refs_bytes: int = DEFAULT_MAX_REFS_BYTES,
    progress: Callable[[str, int, int], None] | None = None,
) -> RefSet:
    """Read and validate the reference set at ``url`` (a JSON file, plain or compressed,
    or a Parquet reference directory), raising :class:`RefsError` with the reason.

    Finding and reading it fails when the store stays silent for ``timeout`` seconds;
    ``timeout`` also bounds each later load of a lazily read part (a Parquet record
    file).  A JSON file may hold at most ``max_refs_bytes``, compressed or not.  Messages
    never show credentials of a URL (``user:pass@``, query strings).
    ``progress(stage, keys, nbytes)`` hears of each stage (reading, parsing, indexing,
    loaded) with the keys and bytes known so far.  A JSON key ``name/`` (VirtualiZarr's
    chunk key of a rank-0 array) is read as ``name/0``, the key Zarr asks for, where
    ``name/.zarray`` is a key."""
    try:
        return _open(
            url,
            storage_options or {},
            remote_protocol,
            allow_local,
            timeout,
            max_refs_bytes,
            progress or _no_progress,
        )
    except RefsError as exc:
        raise RefsError(redact_text(str(exc))) from None


def _open(
    url: str,
    options: Mapping[str, Any],
    remote_protocol: str | None,
    allow_local: bool,
    timeout: float,
    max_refs_bytes: int,
    report: Callable[[str, int, int], None],
) -> RefSet:
    name = redact_url(url)
    report("reading", 0, 0)
    fs, path = source.filesystem_for(url, options, name)
    resolve = UrlResolver(url, remote_protocol=remote_protocol, allow_local=allow_local)
    found = source.within_deadline(
        lambda progress: source.find(fs, path, name, max_bytes=max_refs_bytes, progress=progress),
        timeout,
        name,
    )
    if found.parquet:
        from refmount.refs.parquet import ParquetRefSet

        refset = source.within_deadline(
            lambda _progress: ParquetRefSet.open(
                fs, path, resolve=resolve, mtime=found.mtime, load_timeout=timeout
            ),
            timeout,
            name,
        )
        report("loaded", 0, 0)
        return refset
    # Each format's modules (and pyarrow) are imported only when that format is met:
    # a Parquet set should be mounted before pyarrow would have finished importing.  A
    # large JSON set is parsed in two processes, and Arrow imported while the other parses.
    from refmount.refs import jsonsplit

    raw, found.data = found.data, b""
    nbytes = len(raw)
    report("parsing", 0, nbytes)
    with jsonsplit.collector_paused():
        parts = jsonsplit.parse_in_parts(raw, meanwhile=_import_table)
        from refmount.refs import jsonrefs
        from refmount.refs.table import TableRefSet

        try:
            columns = jsonrefs.load(raw, name, resolve, parts)
        except RefsError as exc:  # the message names the key; the file goes first
            text = str(exc)
            raise RefsError(text if text.startswith(f"{name}: ") else f"{name}: {text}") from None
    del raw, parts
    table = columns.table()
    report("indexing", table.num_rows, nbytes)
    refset = TableRefSet(table, columns.urls, mtime=found.mtime, name=name)
    del table, columns
    release_freed_memory()
    log.info("%s: %d keys referencing %d remote files", name, len(refset), len(refset.urls))
    report("loaded", len(refset), nbytes)
    return refset


def _no_progress(stage: str, keys: int, nbytes: int) -> None:
    pass


def _import_table() -> None:
    importlib.import_module("refmount.refs.table")


def release_freed_memory() -> None:
    """Hand the parse's freed memory back to the system, so its peak does not stay
    resident: glibc's heap keeps what the parsed JSON and the index's sort and filters
    held (the JSON set's arrays come from it, see ``arrays.POOL``), Arrow's own pool what
    any other Arrow work freed."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
