"""Listing a catalog's source: which reference sets a directory or URL prefix holds.

The listing walks the source one directory at a time (``ls``: S3 and GCS page their
answers, HTTP reads an index page), never deeper than :data:`MAX_DEPTH`, stops with an
error past :data:`MAX_ENTRIES` entries, and fails when the store stays silent for the
deadline (``--timeout``).  A directory holding ``.zmetadata`` is a Parquet reference set
and is not walked into.  HTTP index pages (nginx's autoindex) hide dot files, so there a
directory named ``*.parq`` or ``*.parquet`` is asked for its ``.zmetadata``.  A
directory holding ``repo`` is an Icechunk repository (one set, not walked into either);
what the listing says of its ``repo`` object, which every commit rewrites, is its
signature.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from refmount.catalog.names import JSON_SUFFIXES, PARQUET_SUFFIXES, Found
from refmount.errors import RefsError
from refmount.redaction import redact_url
from refmount.refs import source as refs_source
from refmount.refs.urls import without_query

log = logging.getLogger(__name__)

MAX_DEPTH = 16
MAX_ENTRIES = 1_000_000
SIGNATURE_FIELDS = ("ETag", "etag", "mtime", "LastModified", "last_modified", "size", "created")


def is_catalog(url: str, options: Mapping[str, Any], timeout: float) -> bool:
    """Whether ``url`` is a directory or prefix that is not a Parquet reference set
    itself (no ``.zmetadata`` at its top): a catalog of sets."""
    if without_query(url).rstrip("/").endswith(JSON_SUFFIXES):
        return False
    name = redact_url(url)
    try:
        fs, path = refs_source.filesystem_for(url, options, name)

        def probe(progress: refs_source.Progress) -> bool:
            if refs_source.is_parquet_refs(fs, path):
                return False
            progress()
            return bool(fs.isdir(path))

        return refs_source.within_deadline(probe, timeout, name)
    except Exception as exc:  # not a catalog: loading it as one set says what is wrong
        log.debug("%s is not a catalog: %s", name, exc)
        return False


def list_sets(
    url: str,
    options: Mapping[str, Any],
    *,
    timeout: float,
    max_entries: int = MAX_ENTRIES,
    max_depth: int = MAX_DEPTH,
) -> list[Found]:
    """Every reference set below ``url`` (RefsError when the source cannot be listed)."""
    name = redact_url(url)
    fs, root = refs_source.filesystem_for(url, options, name)
    try:
        return refs_source.within_deadline(
            lambda progress: _walk(fs, root, max_entries, max_depth, progress), timeout, name
        )
    except RefsError:
        raise
    except Exception as exc:  # the store's own errors, whatever their type
        raise RefsError(f"{name}: cannot list: {type(exc).__name__}: {exc}") from None


def _walk(
    fs: Any, root: str, max_entries: int, max_depth: int, progress: refs_source.Progress
) -> list[Found]:
    http = _is_http(fs)
    fs.invalidate_cache()  # a listing cached by fsspec (s3fs keeps one) would hide changes
    found: list[Found] = []
    pending: list[tuple[str, str, int]] = [(root.rstrip("/"), "", 0)]
    seen = 0
    while pending:
        path, relative, depth = pending.pop()
        entries = _children(fs, path, http)
        progress()
        seen += len(entries)
        if seen > max_entries:
            raise RefsError(f"{redact_url(root)}: more than {max_entries:,} entries to list")
        for child, entry in sorted(entries.items()):
            shown = unquote(child) if http else child
            source = f"{relative}/{shown}" if relative else shown
            full = f"{path}/{child}"
            if entry.get("type") == "directory":
                marker = _parquet_marker(fs, full, http, child)
                progress()
                if marker is None:
                    marker = _repository_marker(fs, full)
                    progress()
                if marker is not None:
                    found.append(_found(fs, source, full, True, marker))
                elif depth + 1 < max_depth:
                    pending.append((full, source, depth + 1))
            elif child.endswith(JSON_SUFFIXES):
                found.append(_found(fs, source, full, False, entry))
    return found


def _children(fs: Any, path: str, http: bool) -> dict[str, dict[str, Any]]:
    """The entries of one directory by name (links of an index page that lead out of
    it, to a query or a fragment, are no entries)."""
    entries = {}
    prefix = path + "/"
    target = path + "/" if http else path
    for entry in fs.ls(target, detail=True):
        name = str(entry.get("name", ""))
        if not name.startswith(prefix):
            continue
        child = name[len(prefix) :].rstrip("/")
        if not child or "/" in child or child in (".", "..") or (http and "?" in child):
            continue
        if http and "#" in child:
            continue
        entries[child] = entry
    return entries


def _parquet_marker(fs: Any, path: str, http: bool, name: str) -> dict[str, Any] | None:
    """The ``info`` of the ``.zmetadata`` that makes ``path`` a Parquet set, or None."""
    if http and not name.endswith(PARQUET_SUFFIXES):
        return None
    try:
        info = fs.info(f"{path}/.zmetadata")
    except (FileNotFoundError, OSError):
        return None
    return info if info.get("type", "file") == "file" else None


def _repository_marker(fs: Any, path: str) -> dict[str, Any] | None:
    """The ``info`` of the ``repo`` object that makes ``path`` an Icechunk repository,
    or None."""
    try:
        info = fs.info(f"{path}/repo")
    except (FileNotFoundError, OSError):
        return None
    return info if info.get("type", "file") == "file" else None


def _found(fs: Any, source: str, path: str, parquet: bool, info: Mapping[str, Any]) -> Found:
    signature = tuple(f"{k}={info[k]}" for k in SIGNATURE_FIELDS if info.get(k) is not None)
    return Found(source, _url(fs, path), parquet, refs_source.modification_time(info), signature)


def _url(fs: Any, path: str) -> str:
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(fs, LocalFileSystem) or "://" in path:
        return path
    return str(fs.unstrip_protocol(path))


def _is_http(fs: Any) -> bool:
    from fsspec.implementations.http import HTTPFileSystem

    return isinstance(fs, HTTPFileSystem)
