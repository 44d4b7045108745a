"""The decoded rows of Parquet record files, as a few compact numpy columns per record.

Imported, with numpy and pyarrow, on the first record read, so that a mount answers
before either has loaded.

A record keeps, per row: whether it is present, a code into the resolved URLs of the
file's distinct paths, the offset and the size, each narrowed to the smallest integer
type that holds its values; raw (inline) data stays a pyarrow array, and only when some
row has any.  A column whose rows all hold one value (every row present, one data file,
one chunk size: common in regularly chunked data) is a zero-stride view of that value.
So 100k rows cost at most about 1.5 MB and often a few hundred kB, never a Python object
per row.

A record file is measured before it is decoded: its footer says how many rows it has and
how many bytes its columns take once decompressed, and a file over the budget is refused
(:class:`RecordTooLarge`) without decompressing anything.

A row with a path or inline data is a key of the set.  One whose reference cannot be
served (a negative or overflowing offset/size, a path that cannot be used) is still a key:
it is listed and stats, and :meth:`Record.ref` refuses it with an error naming the record
file, the row and the reason, so that its read is EIO.  ENOENT would tell a zarr reader
that the chunk does not exist, and it would print fill values.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from refmount.errors import FetchError, RefsError
from refmount.refs.model import Ref

_INT64_MAX = (1 << 63) - 1
_RECORD_OVERHEAD = 512
_COLUMNS = ("path", "offset", "size", "raw")

#: row groups and columns a record file may have: each is a loop turn in the check
MAX_ROW_GROUPS = 4096
MAX_COLUMNS = 256

#: what decoding a malformed record file raises
DECODE_ERRORS = (pa.ArrowException, ValueError, TypeError, OSError, KeyError, IndexError)


class RecordTooLarge(Exception):
    """A record file that would take more rows or bytes than a record may."""


def check_budget(metadata: pq.FileMetaData, max_rows: int, max_bytes: int) -> None:
    """Refuse a record file whose footer announces more than ``max_rows`` rows, or more
    than ``max_bytes`` decompressed bytes in the columns refmount reads (inline data and
    paths included): before anything is decompressed."""
    if metadata.num_rows > max_rows:
        raise RecordTooLarge(f"{metadata.num_rows} rows, more than the record size {max_rows}")
    if metadata.num_row_groups > MAX_ROW_GROUPS or metadata.num_columns > MAX_COLUMNS:
        raise RecordTooLarge(
            f"{metadata.num_row_groups} row groups and {metadata.num_columns} columns, more "
            f"than {MAX_ROW_GROUPS} row groups or {MAX_COLUMNS} columns"
        )
    sizes = dict.fromkeys(_COLUMNS, 0)
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for index in range(row_group.num_columns):
            column = row_group.column(index)
            if column.path_in_schema in sizes:
                sizes[column.path_in_schema] += column.total_uncompressed_size
    if sizes["raw"] > max_bytes:
        raise RecordTooLarge(f"{sizes['raw']} bytes of inline data, more than {max_bytes}")
    total = sum(sizes.values())
    if total > max_bytes:
        raise RecordTooLarge(f"{total} bytes once decompressed, more than {max_bytes}")


def _held_bytes(values: np.ndarray) -> int:
    """Memory an array holds: one item for a zero-stride (constant) view."""
    return values.itemsize if values.ndim and values.strides[0] == 0 else values.nbytes


def compact(values: np.ndarray) -> np.ndarray:
    """The same integers in the smallest of int8/16/32/64 that holds them all, as a
    zero-stride view of one value when they are all equal."""
    if not len(values):
        return values
    low, high = int(values.min()), int(values.max())
    dtype: type[np.signedinteger] = np.int64
    for candidate in (np.int8, np.int16, np.int32):
        info = np.iinfo(candidate)
        if info.min <= low and high <= info.max:
            dtype = candidate
            break
    if low == high:
        return np.broadcast_to(np.array(low, dtype=dtype), values.shape)
    return values.astype(dtype)


class Record:
    """The decoded rows of one record file."""

    __slots__ = (
        "codes", "dense", "nbytes", "offsets", "path", "present", "raw", "sizes", "unusable",
        "urls",
    )  # fmt: skip

    def __init__(
        self,
        present: np.ndarray,
        raw: pa.Array | None,
        codes: np.ndarray,
        urls: list[str | None],
        offsets: np.ndarray,
        sizes: np.ndarray,
        *,
        path: str = "",
        unusable: dict[int, str] | None = None,
    ) -> None:
        #: every row is present: ``present`` holds no per-row values
        self.dense = bool(present.all())
        self.present = np.broadcast_to(np.True_, present.shape) if self.dense else present
        self.raw = raw
        self.codes = compact(codes)
        self.urls = urls
        #: the record file, for messages
        self.path = path
        #: why the path of a code whose URL is None cannot be used
        self.unusable = unusable or {}
        self.offsets = compact(offsets)
        self.sizes = compact(sizes)
        self.nbytes = (
            _RECORD_OVERHEAD
            + sum(map(_held_bytes, (self.present, self.codes, self.offsets, self.sizes)))
            + (0 if raw is None else raw.get_total_buffer_size())
            + sum(len(u) for u in urls if u is not None)
            + sum(map(len, self.unusable.values()))
        )

    def any_in(self, lo: int, hi: int) -> bool:
        """Whether a row in ``[lo, hi)`` is present."""
        hi = min(hi, len(self.present))
        if lo >= hi:
            return False
        return self.dense or bool(self.present[lo:hi].any())

    def has(self, row: int) -> bool:
        if self.dense:
            return 0 <= row < len(self.present)
        return 0 <= row < len(self.present) and bool(self.present[row])

    def rows_in(self, lo: int, hi: int) -> np.ndarray:
        """The present rows in ``[lo, hi)`` (int64), in order."""
        hi = min(hi, len(self.present))
        if lo >= hi:
            return np.empty(0, dtype=np.int64)
        if self.dense:
            return np.arange(lo, hi, dtype=np.int64)
        return np.flatnonzero(self.present[lo:hi]) + lo

    def _inline(self, row: int) -> bytes | None:
        if self.raw is not None:
            data = self.raw[row]
            if data.is_valid:
                return data.as_py()  # type: ignore[no-any-return]
        return None

    def ref(self, row: int) -> Ref:
        """A present row's reference; FetchError (EIO) naming the row and the reason when
        it cannot be served."""
        data = self._inline(row)
        if data is not None:
            return Ref(data=data)
        code = int(self.codes[row])
        url = self.urls[code]
        offset, size = int(self.offsets[row]), int(self.sizes[row])
        problem = self._problem(code, url, offset, size)
        if problem is not None:
            raise FetchError(f"row {row} of {self.path}: {problem}: refused")
        if offset == 0 and size == 0:
            return Ref(url=url, length=None)
        return Ref(url=url, offset=offset, length=size)

    def size(self, row: int) -> int | None:
        """A present row's size as the set knows it (None: a whole remote file).  A row
        that is refused claims its size when that is positive, else 1 byte: a read must
        reach the daemon to fail (the kernel reads a 0-byte file as empty by itself)."""
        data = self._inline(row)
        if data is not None:
            return len(data)
        code = int(self.codes[row])
        offset, size = int(self.offsets[row]), int(self.sizes[row])
        if self._problem(code, self.urls[code], offset, size) is not None:
            return max(size, 1)
        return None if offset == 0 and size == 0 else size

    def _problem(self, code: int, url: str | None, offset: int, size: int) -> str | None:
        """Why a row's reference cannot be served, or None."""
        if url is None:
            return self.unusable.get(code, "unusable path")
        if offset < 0 or size < 0:
            return f"negative offset or size ({offset}, {size})"
        if offset > _INT64_MAX - size:
            return f"offset + size overflows ({offset} + {size})"
        return None


def decode(
    data: bytes,
    path: str,
    resolve: Callable[[str, str], str],
    warn: Callable[..., None],
    *,
    max_rows: int,
    max_bytes: int,
) -> Record:
    """A record file's bytes as a :class:`Record`; raises :class:`RecordTooLarge` when
    over the budget (see :func:`check_budget`), one of ``DECODE_ERRORS`` when they are not
    a usable record.  ``resolve(target, path)`` is a row path as a URL (RefsError saying
    why when it cannot be used); ``warn(tag, message, *args)`` logs once per tag."""
    buffer = pa.BufferReader(data)
    metadata = pq.read_metadata(buffer)
    check_budget(metadata, max_rows, max_bytes)
    names = set(metadata.schema.to_arrow_schema().names)
    parquet_file = pq.ParquetFile(
        buffer, metadata=metadata, read_dictionary=["path"] if "path" in names else None
    )
    table = parquet_file.read(
        columns=[c for c in _COLUMNS if c in names], use_pandas_metadata=False
    )
    n = table.num_rows
    raw = _raw_column(table)
    codes, urls, unusable = _path_column(table, n, path, resolve)
    offsets = _int_column(table, "offset", n)
    sizes = _int_column(table, "size", n)

    if raw is None and n and _all_usable(codes, urls, offsets, sizes):
        return Record(np.ones(n, dtype=bool), raw, codes, urls, offsets, sizes, path=path)
    has_raw = (
        np.zeros(n, dtype=bool) if raw is None else raw.is_valid().to_numpy(zero_copy_only=False)
    )
    has_path = codes >= 0
    url_ok = np.array([u is not None for u in urls] + [False], dtype=bool)
    has_url = url_ok[codes]  # code -1 (no path) picks the final False
    negative = (offsets < 0) | (sizes < 0)
    bad_range = has_url & (negative | (offsets > _INT64_MAX - np.maximum(sizes, 0)))
    errors = int(np.count_nonzero(~has_raw & (has_path & ~has_url | bad_range)))
    if errors:
        warn(
            f"rows:{path}",
            "%s: %d rows with a negative or overflowing offset/size or an unusable path: "
            "their keys are I/O errors",
            path,
            errors,
        )
    present = has_raw | has_path
    return Record(present, raw, codes, urls, offsets, sizes, path=path, unusable=unusable)


def _all_usable(
    codes: np.ndarray, urls: list[str | None], offsets: np.ndarray, sizes: np.ndarray
) -> bool:
    """Whether every row is a usable reference: the common case, told by a few bounds
    instead of masks over every row."""
    return (
        int(codes.min()) >= 0
        and None not in urls
        and int(offsets.min()) >= 0
        and int(sizes.min()) >= 0
        and int(offsets.max()) + int(sizes.max()) <= _INT64_MAX
    )


def _raw_column(table: pa.Table) -> pa.Array | None:
    """The raw column, or None when no row has inline data."""
    if "raw" not in table.column_names:
        return None
    column = table.column("raw")
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.large_binary())
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        raise TypeError(f"column 'raw' has type {column.type}")
    if column.null_count == len(column):
        return None
    return column.combine_chunks()


def _int_column(table: pa.Table, name: str, n: int) -> np.ndarray:
    if name not in table.column_names:
        return np.zeros(n, dtype=np.int64)
    column = table.column(name).cast(pa.int64())
    if column.null_count:
        column = pc.fill_null(column, 0)
    return column.to_numpy().astype(np.int64, copy=False)


def _path_column(
    table: pa.Table, n: int, path: str, resolve: Callable[[str, str], str]
) -> tuple[np.ndarray, list[str | None], dict[int, str]]:
    """Per-row codes (-1: null) into the resolved URLs of the distinct paths (None for
    one that cannot be used), and why each such path cannot."""
    if "path" not in table.column_names:
        return np.full(n, -1, dtype=np.int32), [], {}
    column = table.column("path")
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    combined = column.unify_dictionaries().combine_chunks()
    indices = combined.indices
    if indices.null_count:
        indices = pc.fill_null(indices, -1)
    codes = indices.to_numpy().astype(np.int32, copy=False)
    values = combined.dictionary.cast(pa.string()).to_pylist()
    urls: list[str | None] = []
    unusable: dict[int, str] = {}
    for code, value in enumerate(values):
        try:
            urls.append(resolve(value, path))
        except RefsError as exc:
            urls.append(None)
            unusable[code] = str(exc)
    return codes, urls, unusable
