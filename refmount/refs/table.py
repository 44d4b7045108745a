"""A reference set held in memory as sorted, compact columns (JSON sets of any size).

Keys are sorted by their UTF-8 bytes, so every directory is one contiguous run of rows
(all keys under ``p/`` lie between ``p/`` and ``p0``, ``0`` being the byte after ``/``):
lookups are binary searches and listings are scans that skip whole subdirectories, and
nothing per directory or per key is built beyond the columns themselves.  A file's id is
its row.
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from fsspec.core import split_protocol

from refmount.refs.jsonrefs import WHOLE_FILE
from refmount.refs.model import Child, Ref, RefSet

log = logging.getLogger(__name__)

MAX_WARNINGS = 100  # odd keys reported one by one; past this, a count
MAX_NAME_BYTES = 255
_BAD_KEY = r"(^$)|(^/)|(/$)|(//)|((^|/)\.\.?(/|$))|\x00"


class _SortedKeys:
    """Binary search over a sorted Arrow string column without a Python object per key."""

    def __init__(self, keys: pa.LargeStringArray) -> None:
        self._array = keys
        _, offsets, data = keys.buffers()
        self._offsets = memoryview(offsets).cast("q")[keys.offset : keys.offset + len(keys) + 1]
        self._data = memoryview(data) if data is not None else memoryview(b"")

    def __len__(self) -> int:
        return len(self._array)

    def __getitem__(self, i: int) -> bytes:
        return bytes(self._data[self._offsets[i] : self._offsets[i + 1]])

    def text(self, i: int) -> str:
        return str(self._data[self._offsets[i] : self._offsets[i + 1]], "utf-8")

    def find(self, key: bytes) -> int:
        """The first row whose key is >= ``key``."""
        return bisect.bisect_left(self, key)


class TableRefSet(RefSet):
    def __init__(self, table: pa.Table, urls: list[str], *, mtime: float, name: str) -> None:
        """``table`` has the columns of :meth:`Columns.table`, in file order."""
        self.mtime = mtime
        self.urls = urls
        table, directories = _drop_bad_keys(_sorted_last_wins(table), name)
        self._subdirectories = Counter(d.rpartition("/")[0] for d in directories)
        self._keys = _SortedKeys(table.column("key").combine_chunks())
        self._url_index = _int_view(table.column("url"), "i")
        self._offsets = _int_view(table.column("offset"), "q")
        self._lengths = _int_view(table.column("length"), "q")
        self._inline = table.column("inline").combine_chunks()
        self._extents = _url_extents(table, self.urls)

    def __len__(self) -> int:
        return len(self._keys)

    def file_id(self, key: str) -> int | None:
        encoded = key.encode("utf-8", "surrogatepass")
        row = self._keys.find(encoded)
        if row < len(self._keys) and self._keys[row] == encoded:
            return row
        return None

    def key(self, file_id: int) -> str:
        return self._keys.text(file_id)

    def ref(self, file_id: int) -> Ref:
        url_id = self._url_index[file_id]
        if url_id < 0:
            return Ref(data=self._inline[file_id].as_py())
        length = self._lengths[file_id]
        return Ref(
            url=self.urls[url_id],
            offset=self._offsets[file_id],
            length=None if length == WHOLE_FILE else length,
        )

    def file_size(self, file_id: int) -> int | None:
        length = self._lengths[file_id]  # inline rows hold their data's length
        return None if length == WHOLE_FILE else length

    def is_dir(self, path: str) -> bool:
        if not path:
            return True
        prefix = path.encode("utf-8", "surrogatepass") + b"/"
        row = self._keys.find(prefix)
        return row < len(self._keys) and self._keys[row].startswith(prefix)

    def children(self, path: str, after: int = -1) -> Iterator[Child]:
        keys = self._keys
        prefix = path.encode("utf-8", "surrogatepass") + b"/" if path else b""
        end = keys.find(prefix[:-1] + b"0") if prefix else len(keys)
        row = max(keys.find(prefix), after + 1)
        skip = len(prefix)
        while row < end:
            rest = keys[row][skip:]
            slash = rest.find(b"/")
            if slash < 0:
                yield Child(rest.decode("utf-8", "surrogatepass"), row, row)
                row += 1
            else:
                name = rest[:slash]
                subtree_end = keys.find(prefix + name + b"0")
                # The cursor is the subtree's last row, so resuming skips all of it.
                yield Child(name.decode("utf-8", "surrogatepass"), None, subtree_end - 1)
                row = subtree_end

    def subdirectory_count(self, path: str) -> int:
        return self._subdirectories.get(path, 0)

    def url_extent(self, url: str) -> int | None:
        return self._extents.get(url)

    def protocols(self) -> set[str]:
        return {split_protocol(url)[0] or "file" for url in self.urls}


def _sorted_last_wins(table: pa.Table) -> pa.Table:
    """The rows sorted by key; where a key repeats, its last row wins."""
    if len(table) == 0:
        return table
    table = table.take(pc.sort_indices(table, [("key", "ascending")]))  # a stable sort
    key = table.column("key")
    repeated = pc.equal(key.slice(0, len(table) - 1), key.slice(1))
    if pc.any(repeated).as_py():
        keep = pa.concat_arrays([pc.invert(repeated).combine_chunks(), pa.array([True])])
        table = table.filter(keep)
    return table


def _drop_bad_keys(table: pa.Table, name: str) -> tuple[pa.Table, list[str]]:
    """Drop keys that could not be paths, and files shadowed by a directory.

    Rule: a key with an empty, ``.`` or ``..`` component, a leading or trailing ``/``, a
    NUL, a component over 255 bytes or invalid UTF-8 is skipped; a key that is both a file
    and the prefix of other keys (``a`` and ``a/b``) is a directory, and its own value is
    skipped.  Each skipped key is logged once.  Returns the table and its directories.
    """
    warnings = _Warnings(name)
    bad = _unusable(table.column("key"))
    if pc.any(bad).as_py():
        warnings.keys(table.column("key"), bad, _UNUSABLE)
        table = table.filter(pc.invert(bad))
    key = table.column("key")
    directories = _directories(key)
    shadowed = pc.is_in(key, value_set=pa.array(directories, pa.large_string()))
    if pc.any(shadowed).as_py():
        warnings.keys(key, shadowed, "is also a directory of other keys; the directory is kept")
        table = table.filter(pc.invert(shadowed))
    warnings.summary()
    return table, directories


_UNUSABLE = (
    "not a usable path: empty, '.' or '..' component, leading or trailing '/', NUL, "
    "a component over 255 bytes, or invalid UTF-8"
)


def _unusable(key: pa.ChunkedArray) -> pa.ChunkedArray:
    bad = pc.or_(pc.match_substring_regex(key, _BAD_KEY), pc.match_substring(key, "\ufffd"))
    long = pc.greater(pc.binary_length(key), MAX_NAME_BYTES)
    if pc.any(long).as_py():
        rows = {
            r for r in pc.indices_nonzero(long).to_pylist() if _has_long_component(key[r].as_py())
        }
        bad = pc.or_(bad, pa.array([i in rows for i in range(len(key))]))
    return bad


def _directories(key: pa.ChunkedArray) -> list[str]:
    """Every directory the keys imply (from the few distinct parents, not per key)."""
    nested = pc.filter(key, pc.match_substring(key, "/"))
    parents = pc.unique(pc.replace_substring_regex(nested, r"/[^/]*$", "")).to_pylist()
    directories: set[str] = set()
    for parent in parents:
        while parent and parent not in directories:
            directories.add(parent)
            parent = parent.rpartition("/")[0]
    return sorted(directories)


class _Warnings:
    """One warning per skipped key, up to a bound, then a count."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0

    def keys(self, key: pa.ChunkedArray, mask: pa.ChunkedArray, reason: str) -> None:
        for row in pc.indices_nonzero(mask).to_pylist():
            if self.count < MAX_WARNINGS:
                log.warning("%s: skipping key %r: %s", self.name, key[row].as_py(), reason)
            self.count += 1

    def summary(self) -> None:
        if self.count > MAX_WARNINGS:
            log.warning("%s: skipped %d more keys", self.name, self.count - MAX_WARNINGS)


def _has_long_component(key: str) -> bool:
    return any(
        len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for part in key.split("/")
    )


def _url_extents(table: pa.Table, urls: list[str]) -> dict[str, int]:
    """For each URL that only ranges point into, the end of its furthest referenced byte."""
    remote = table.filter(pc.greater_equal(table.column("url"), 0))
    if len(remote) == 0:
        return {}
    grouped = (
        pa.table(
            {
                "url": remote.column("url"),
                "end": pc.add(remote.column("offset"), remote.column("length")),
                "whole": pc.equal(remote.column("length"), WHOLE_FILE),
            }
        )
        .group_by("url")
        .aggregate([("end", "max"), ("whole", "any")])
    )
    return {
        urls[url_id]: end
        for url_id, end, whole in zip(
            grouped.column("url").to_pylist(),
            grouped.column("end_max").to_pylist(),
            grouped.column("whole_any").to_pylist(),
            strict=True,
        )
        if not whole
    }


def _int_view(column: pa.ChunkedArray, fmt: str) -> memoryview:
    array_ = column.combine_chunks()
    buffer = array_.buffers()[1]
    width = array_.type.bit_width // 8
    start = array_.offset
    return memoryview(buffer).cast(fmt)[start : start + len(array_)] if width else memoryview(b"")
