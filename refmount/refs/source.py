"""Finding and reading a reference set at any fsspec URL: within a deadline, within a size
budget, decompressing as the bytes arrive.

Deciding whether the URL is a JSON file or a Parquet directory costs no download of the
file: a name that ends like a JSON file (``.json``, ``.json.gz``, ...) is one, anything
else is asked for ``URL/.zmetadata``, and the store's own ``info`` tells a directory.  A
JSON file is then read once, in chunks (one streaming GET over HTTP), and decompressed
a chunk at a time, so that a small compressed bomb is refused when its output passes the
budget, not after it has filled the memory.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import IO, Any, TypeVar

import fsspec
import zstandard

from refmount.errors import RefsError
from refmount.refs.urls import child_url, without_query

#: Default of ``max_refs_bytes`` (``--max-refs-size``): the most a reference set's file
#: may hold, compressed or once decompressed.  A million-key kerchunk JSON set is
#: 100-200 MB.
DEFAULT_MAX_REFS_BYTES = 2 << 30
#: Bytes read (or decompressed) at a time; each chunk counts as progress for the deadline.
CHUNK = 4 << 20

T = TypeVar("T")
Progress = Callable[[], None]

_Opener = Callable[[IO[bytes]], IO[bytes]]
_BY_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bz2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
_BY_SUFFIX = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}
_JSON_SUFFIXES = (".json", *(f".json{suffix}" for suffix in _BY_SUFFIX))
_OPENERS: dict[str, _Opener] = {
    "gzip": lambda f: gzip.GzipFile(fileobj=f),
    "bz2": lambda f: bz2.BZ2File(f),
    "xz": lambda f: lzma.LZMAFile(f),  # noqa: SIM115 - closed with the file it wraps
    "zstd": lambda f: zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True),
}


@dataclass
class Found:
    """What is at a reference set's URL: a Parquet directory, or a JSON file's bytes."""

    parquet: bool
    mtime: float
    data: bytes = b""


def filesystem_for(url: str, options: Mapping[str, Any], name: str) -> tuple[Any, str]:
    """The fsspec filesystem and path of a refs location (``name`` is for messages).

    A JSON file over ``http(s)://`` is read through refmount's own fetcher
    (:mod:`refmount.refs.web`): with the ``.netrc`` credentials, cookies and redirect
    rules its chunks are read with."""
    if url.startswith(("http://", "https://")) and json_named(url):
        from refmount.refs.web import WebRefsFileSystem  # the fetcher, only when needed

        return WebRefsFileSystem(url, options), url
    try:
        return fsspec.core.url_to_fs(url, **options)
    except Exception as exc:  # unknown protocol, missing package, bad options, ...
        raise RefsError(f"{name}: cannot open: {type(exc).__name__}: {exc}") from None


def within_deadline(work: Callable[[Progress], T], timeout: float, name: str) -> T:
    """``work(progress)``, run in a thread: :class:`RefsError` when ``timeout`` seconds
    pass without it calling ``progress`` or finishing (a stalled store).  The thread is
    left behind (a blocking read cannot be interrupted), but its next ``progress`` ends
    it, and as a daemon thread it does not keep the process alive."""
    outcome: dict[str, Any] = {}
    done = threading.Event()
    last = [time.monotonic()]
    cancelled = threading.Event()

    def progress() -> None:
        if cancelled.is_set():
            raise RefsError(f"{name}: abandoned after the deadline")
        last[0] = time.monotonic()

    def run() -> None:
        try:
            outcome["value"] = work(progress)
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="refmount-read-refs", daemon=True).start()
    while not done.wait(max(0.0, last[0] + timeout - time.monotonic())):
        if time.monotonic() - last[0] >= timeout:
            cancelled.set()
            raise RefsError(f"{name}: the store did not answer within {timeout:g} s (--timeout)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def find(fs: Any, path: str, name: str, *, max_bytes: int, progress: Progress) -> Found:
    """What is at ``path``: a Parquet reference directory, or a JSON file, read."""
    try:
        return _find(fs, path, name, max_bytes, progress)
    except RefsError:
        raise
    except Exception as exc:  # the store's own errors, whatever their type
        raise RefsError(f"{name}: {_describe(exc)}") from None


def json_named(path: str) -> bool:
    """Whether a reference set's name says it is a JSON file (``.json``, ``.json.gz``...)."""
    return without_query(path).endswith(_JSON_SUFFIXES)


def _find(fs: Any, path: str, name: str, max_bytes: int, progress: Progress) -> Found:
    named_json = json_named(path)
    if not named_json and is_parquet_refs(fs, path):
        progress()
        return Found(True, _mtime(fs.info(child_url(path, ".zmetadata"))))
    progress()
    info = fs.info(path)
    progress()
    if info.get("type") == "directory":
        if named_json and is_parquet_refs(fs, path):
            return Found(True, _mtime(fs.info(child_url(path, ".zmetadata"))))
        raise RefsError(f"{name}: a directory without .zmetadata is not a reference set")
    size = info.get("size")
    if isinstance(size, int) and size > max_bytes:
        raise RefsError(f"{name}: {size} bytes, {_over(max_bytes)}")
    return Found(False, _mtime(info), _read(fs, path, info, name, max_bytes, progress))


def is_parquet_refs(fs: Any, root: str) -> bool:
    """Whether ``root`` holds a Parquet reference set: asked as ``ROOT/.zmetadata``
    rather than "is it a directory", which stores such as HTTP cannot answer."""
    try:
        return bool(fs.isfile(child_url(root, ".zmetadata")))
    except Exception:  # any failure to find it means: not Parquet
        return False


def compression_of(name: str, head: bytes) -> str | None:
    for magic, kind in _BY_MAGIC:
        if head.startswith(magic):
            return kind
    for suffix, kind in _BY_SUFFIX.items():
        if without_query(name).endswith(suffix):
            return kind  # named so but without the magic: the decompressor will say why
    return None


def _over(max_bytes: int) -> str:
    return f"over the limit of {_size(max_bytes)} for a reference set (--max-refs-size)"


def _size(count: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift and count % (1 << shift) == 0:
            return f"{count >> shift} {unit}"
    return f"{count} bytes"


class _Counted:
    """The raw bytes of a refs file, read a chunk at a time, counted against the budget;
    the first chunk, already read to look at its magic, is given back first."""

    def __init__(self, raw: IO[bytes], name: str, max_bytes: int, progress: Progress) -> None:
        self._raw, self._name, self._max, self._progress = raw, name, max_bytes, progress
        self._count = 0
        self._first = self._next(CHUNK)

    @property
    def head(self) -> bytes:
        return self._first

    def _next(self, size: int) -> bytes:
        data = self._raw.read(size)
        self._count += len(data)
        if self._count > self._max:
            raise RefsError(f"{self._name}: {_over(self._max)}")
        self._progress()
        return data

    def read(self, size: int = -1) -> bytes:
        size = size if 0 < size < CHUNK else CHUNK
        if self._first:
            data, self._first = self._first[:size], self._first[size:]
            return data
        return self._next(size)

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        pass


def _read(
    fs: Any, path: str, info: Mapping[str, Any], name: str, max_bytes: int, progress: Progress
) -> bytes:
    """The whole, decompressed content of the file at ``path``."""
    with _open(fs, path, info) as raw:
        if _is_local(fs):
            kind = compression_of(path, raw.read(8))
            raw.seek(0)
            if kind is None:  # read in one go: no chunks to join (a copy of it all)
                size = info.get("size")
                data = raw.read(min(size, max_bytes) + 1 if isinstance(size, int) else -1)
                if len(data) > max_bytes:
                    raise RefsError(f"{name}: {_over(max_bytes)}")
                return data
        stream = _Counted(raw, name, max_bytes, progress)
        kind = compression_of(path, stream.head)
        if kind is None:
            return b"".join(iter(lambda: stream.read(CHUNK), b""))
        try:
            return _decompress(_OPENERS[kind](stream), name, kind, max_bytes, progress)
        except (OSError, EOFError, lzma.LZMAError, zstandard.ZstdError) as exc:
            raise RefsError(f"{name}: cannot decompress ({kind}): {exc}") from None


def _is_local(fs: Any) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def _open(fs: Any, path: str, info: Mapping[str, Any]) -> IO[bytes]:
    from fsspec.implementations.http import HTTPFileSystem

    if isinstance(fs, HTTPFileSystem):
        # One streaming GET for the whole body (a sized HTTP file would ask range by
        # range).  Passing a size spares the second HEAD fsspec would make for it; a
        # streamed file does not use it.  The body is asked for as it is stored: a
        # transfer encoding would be decoded before it could be counted.
        headers = {**fs.kwargs.get("headers", {}), "Accept-Encoding": "identity"}
        return fs.open(path, "rb", block_size=0, size=info.get("size") or 1, headers=headers)
    return fs.open(path, "rb")


def _decompress(
    stream: IO[bytes], name: str, kind: str, max_bytes: int, progress: Progress
) -> bytes:
    chunks, size = [], 0
    while chunk := stream.read(CHUNK):  # at most CHUNK bytes: a bomb stops at the budget
        size += len(chunk)
        if size > max_bytes:
            raise RefsError(f"{name}: expands ({kind}) {_over(max_bytes)}")
        chunks.append(chunk)
        progress()
    return b"".join(chunks)


def _mtime(info: Mapping[str, Any]) -> float:
    """The modification time in an ``info`` answer, or now when the store gives none."""
    found = modification_time(info)
    return time.time() if found is None else found


def modification_time(info: Mapping[str, Any]) -> float | None:
    """The modification time in an fsspec ``info`` answer (any store's field for it, or
    an HTTP ``Last-Modified`` header), or None when it gives none."""
    for field in ("mtime", "LastModified", "last_modified", "created", "updated"):
        value = info.get(field)
        if isinstance(value, int | float):
            return float(value)
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
    header = info.get("Last-Modified")  # HTTP
    if isinstance(header, str):
        try:
            return parsedate_to_datetime(header).timestamp()
        except (TypeError, ValueError):
            pass
    return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, IsADirectoryError):
        return "is a directory without .zmetadata (not a Parquet reference set)"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return f"cannot read: {type(exc).__name__}: {exc}"
