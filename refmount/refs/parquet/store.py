"""The record files of a Parquet set: read within budgets, retried, listed and kept.

Only the ``async`` methods read anything, each in a worker thread (see
``parquet.cache``), under the set's load deadline; the synchronous ones answer from what
is held and never touch the store.  Memory: the LRU's budget, plus the two records handed
out last, plus at most ``WORKERS`` record files being read (each at most the record
budget plus ``_FILE_SLACK``) and one being decoded.

What a failure means for the keys of a record file:

* The record file exists and decodes: each row says (a row with neither path nor raw is
  a chunk that does not exist, the zarr fill-value case).
* The store says the file does not exist, and a listing of the array's directory agrees:
  its chunks do not exist (fsspec writes no file for a record without chunks).
* The store says it does not exist but its directory cannot be listed (HTTP) or lists it:
  it may be gone for a while, so the read is retried, then its keys are I/O errors; never
  "no such key", which a zarr reader would fill with the fill value.
* Any other failure of the store (an HTTP 500, a reset, an exception of any type from the
  filesystem): retried a few times with backoff within the deadline, then an I/O error
  for its keys; the next lookup tries again.
* A file over the record budget (more rows than ``record_size``, more decompressed bytes
  than ``record_bytes``, checked on its footer before decoding) or one that does not
  decode: an I/O error for its keys, logged once with the file's name, and remembered.
"""

from __future__ import annotations

import bisect
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from refmount.errors import FetchError, RefsError
from refmount.redaction import redact_text
from refmount.refs.parquet.cache import CostLRU, SingleFlight
from refmount.refs.parquet.grid import ChunkGrid

if TYPE_CHECKING:  # numpy and pyarrow are imported on the first record read
    from refmount.refs.parquet.records import Record

log = logging.getLogger(__name__)

_RECORD_NAME_RE = re.compile(r"refs\.(0|[1-9][0-9]{0,19})\.parq")
#: bytes of a record file beyond its decompressed budget: footer, page headers
_FILE_SLACK = 1 << 20
#: what a remembered absence or failure costs in the LRU
_MARKER_COST = 64
#: records handed out lately, held whatever the LRU's budget (a listing reads them next)
_RECENT = 2
_RESOLVE_CACHE_MAX = 4096
_WARN_ONCE_MAX = 10_000
ATTEMPTS = 3
FIRST_BACKOFF = 0.2
WORKERS = 4


class _Absent:
    """The record file does not exist: its chunks do not exist."""

    __slots__ = ()
    nbytes = _MARKER_COST


ABSENT = _Absent()


class Failed:
    """A record file that is over budget or does not decode: an error for its keys."""

    __slots__ = ("message",)
    nbytes = _MARKER_COST

    def __init__(self, message: str) -> None:
        self.message = message


Entry = Any  # Record | _Absent | Failed


class _Unusable(NamedTuple):
    """A row path that cannot be used, and why."""

    reason: str


class WarnOnce:
    """Log a warning once per tag (a bounded number of tags)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, tag: str, message: str, *args: object) -> None:
        if tag in self._seen:
            return
        if len(self._seen) < _WARN_ONCE_MAX:
            self._seen.add(tag)
        log.warning(message, *args)


class RecordStore:
    """Loads and holds the decoded records of one set's arrays."""

    def __init__(
        self,
        fs: Any,
        root: str,
        *,
        record_size: int,
        resolve: Callable[[str], str],
        cache_bytes: int,
        record_bytes: int,
        load_timeout: float,
    ) -> None:
        self.record_size = record_size
        self.record_bytes = record_bytes
        self.load_timeout = load_timeout
        self._fs = fs
        self._root = root
        self._root_lists: bool | None = None
        self._resolve = resolve
        self._resolved: dict[str, str | _Unusable] = {}
        self._lru: CostLRU[tuple[int, int], Entry] = CostLRU(cache_bytes, _cost)
        self._recent: OrderedDict[tuple[int, int], Record] = OrderedDict()
        #: array index -> record numbers whose files exist (None: cannot be listed)
        self._listed: dict[int, list[int] | None] = {}
        self._loads: SingleFlight[object] = SingleFlight(WORKERS)
        #: one record decoded at a time: a decode's memory is the budget's, not WORKERS'
        self._decoding = threading.Lock()
        self.warn_once = WarnOnce()
        #: record files opened so far (tests and statistics)
        self.reads = 0

    # --- what is held: never any I/O ----------------------------------------------------

    def held(self, arr: ChunkGrid, record_no: int) -> Record | _Absent | None:
        """A held record, ``ABSENT`` when its file is known not to exist, or None when
        it is not held (not loaded, evicted, or failed)."""
        key = (arr.index, record_no)
        entry = self._lru.get(key) or self._recent.get(key)
        if entry is None:
            return ABSENT if self._listed_absent(arr, record_no) else None
        return None if isinstance(entry, Failed) else entry

    def next_record(self, arr: ChunkGrid, record_no: int, last: int) -> int | None:
        """The first record number from ``record_no`` up to ``last`` that may have a file
        (as far as a listing of the array's directory tells, when there is one)."""
        listed = self._listed.get(arr.index)
        if listed is not None:
            pos = bisect.bisect_left(listed, record_no)
            if pos == len(listed):
                return None
            record_no = listed[pos]
        return record_no if record_no <= last else None

    def _listed_absent(self, arr: ChunkGrid, record_no: int) -> bool:
        listed = self._listed.get(arr.index)
        if listed is None:
            return False
        pos = bisect.bisect_left(listed, record_no)
        return pos == len(listed) or listed[pos] != record_no

    # --- loading --------------------------------------------------------------------------

    async def record(self, arr: ChunkGrid, record_no: int) -> Record | None:
        """A decoded record, or None when its file does not exist; FetchError (EIO) when
        it cannot be read or used."""
        key = (arr.index, record_no)
        entry = self._lru.get(key) or self._recent.get(key)
        if entry is None:
            if self._listed_absent(arr, record_no):
                return None
            entry = await self._loads.run(
                key,
                lambda: self._load(arr, record_no),
                timeout=self.load_timeout,
                what=self.path(arr, record_no),
                keep=lambda loaded: self._lru.put(key, loaded),
            )
        if entry is ABSENT:
            return None
        if isinstance(entry, Failed):
            raise FetchError(entry.message)
        if key not in self._recent:
            self._recent[key] = entry
            if len(self._recent) > _RECENT:
                self._recent.popitem(last=False)
        return entry  # type: ignore[no-any-return]

    async def list_records(self, arr: ChunkGrid) -> None:
        """List the array's record files once, so that listings skip absent records
        without reading them (FetchError when the store fails to answer)."""
        if arr.index not in self._listed:
            await self._loads.run(
                ("ls", arr.index),
                lambda: self._listing(arr),
                timeout=self.load_timeout,
                what=f"listing {arr.record_dir}",
            )

    def path(self, arr: ChunkGrid, record_no: int) -> str:
        return f"{arr.record_dir}/refs.{record_no}.parq"

    # --- in worker threads ----------------------------------------------------------------

    def _load(self, arr: ChunkGrid, record_no: int) -> Entry:
        path = self.path(arr, record_no)
        data = self._retried(path, lambda: self._read(arr, record_no, path))
        if isinstance(data, _Absent | Failed):
            return data
        from refmount.refs.parquet.records import DECODE_ERRORS, RecordTooLarge, decode

        try:
            with self._decoding:
                return decode(
                    data,
                    path,
                    self._resolve_one,
                    self.warn_once,
                    max_rows=self.record_size,
                    max_bytes=self.record_bytes,
                )
        except RecordTooLarge as exc:
            return self._failed(path, f"over the record budget: {exc}")
        except DECODE_ERRORS as exc:
            return self._failed(path, f"unreadable record file ({exc})")

    def _read(self, arr: ChunkGrid, record_no: int, path: str) -> bytes | _Absent | Failed:
        """The file's bytes, at most the budget's (``ABSENT`` when a listing agrees that
        the file does not exist; FileNotFoundError when none does)."""
        limit = self.record_bytes + _FILE_SLACK
        self.reads += 1
        try:
            with self._fs.open(path, "rb") as f:
                size = getattr(f, "size", None)
                if isinstance(size, int) and size > limit:
                    return self._failed(path, f"over the record budget: {size} bytes")
                data = f.read(limit + 1)
        except FileNotFoundError:
            listed = self._listing(arr)
            if listed is not None and record_no not in listed:
                return ABSENT
            raise
        if len(data) > limit:
            return self._failed(path, f"over the record budget: more than {limit} bytes")
        return bytes(data)

    def _listing(self, arr: ChunkGrid) -> list[int] | None:
        """Record numbers whose files exist, from one listing of the array's directory
        (remembered); None when the store cannot list it (a store such as HTTP: then
        every record is tried).  An array directory that a store which lists the set's
        root does not have holds no records."""
        if arr.index in self._listed:
            return self._listed[arr.index]
        names = self._ls(arr.record_dir)
        if names is None and arr.record_dir != self._root and self._lists_root():
            names = []
        numbers = None
        if names is not None:
            nrecords = -(-arr.nchunks // self.record_size)
            numbers = []
            for name in names:
                match = _RECORD_NAME_RE.fullmatch(str(name).rstrip("/").rpartition("/")[2])
                if match and int(match[1]) < nrecords:
                    numbers.append(int(match[1]))
            numbers.sort()
        self._listed[arr.index] = numbers
        return numbers

    def _lists_root(self) -> bool:
        if self._root_lists is None:
            self._root_lists = self._ls(self._root) is not None
        return self._root_lists

    def _ls(self, path: str) -> list[str] | None:
        """A directory's entries; None when the store says it has no such directory or
        cannot list (FetchError when it fails to answer)."""
        try:
            return self._retried(  # type: ignore[no-any-return]
                f"listing {path}",
                lambda: self._fs.ls(path, detail=False),
                final=(FileNotFoundError, NotImplementedError),
            )
        except (FileNotFoundError, NotImplementedError):
            return None

    def _retried(
        self, what: str, attempt: Callable[[], Any], final: tuple[type[Exception], ...] = ()
    ) -> Any:
        """``attempt()``, tried again after an exception with growing pauses, as long as
        the load deadline allows; the last failure is a FetchError.  Exceptions of the
        ``final`` types are raised at once."""
        deadline = time.monotonic() + self.load_timeout
        pause = FIRST_BACKOFF
        for number in range(1, ATTEMPTS + 1):
            try:
                return attempt()
            except final:
                raise
            except Exception as exc:  # any failure of the store is one
                if number == ATTEMPTS or time.monotonic() + pause > deadline:
                    raise FetchError(f"{what}: {_describe(exc)} ({number} attempts)") from None
                log.info("%s: %s (attempt %d, trying again)", what, _describe(exc), number)
            time.sleep(pause)
            pause *= 2
        raise AssertionError("unreachable")

    def _failed(self, path: str, reason: str) -> Failed:
        self.warn_once(path, "%s: %s: its keys are I/O errors", path, reason)
        return Failed(f"{path}: {reason}")

    def _resolve_one(self, target: str, record_path: str) -> str:
        """A row path as a full URL; RefsError saying why (logged once per path) when it
        cannot be used."""
        found = self._resolved.get(target)
        if found is None:
            try:
                if not target:
                    raise RefsError("an empty path")
                found = self._resolve(target)
            except (RefsError, ValueError) as exc:
                found = _Unusable(redact_text(str(exc)))
                self.warn_once(f"url:{target}", "%s: unusable path %r: %s", record_path,
                               target, found.reason)  # fmt: skip
            if len(self._resolved) >= _RESOLVE_CACHE_MAX:
                self._resolved.clear()
            self._resolved[target] = found
        if isinstance(found, _Unusable):
            raise RefsError(found.reason)
        return found

    # --- statistics and cleanup -----------------------------------------------------------

    @property
    def cache_bytes(self) -> int:
        """Bytes of decoded records held in the LRU now."""
        return self._lru.bytes

    @property
    def cached_records(self) -> int:
        return len(self._lru)

    def close(self) -> None:
        self._lru.clear()
        self._recent.clear()
        self._listed.clear()


def _describe(exc: Exception) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file, and its directory does not say it is absent"
    if isinstance(exc, FetchError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _cost(entry: Entry) -> int:
    return int(entry.nbytes)
