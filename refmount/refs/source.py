"""Reading a reference set's bytes from any fsspec URL, decompressing as needed."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

import fsspec
import zstandard

from refmount.errors import RefsError

#: A compressed refs file may not expand beyond this (a zip bomb must not exhaust memory).
MAX_REFS_BYTES = 16 << 30

_Opener = Callable[[IO[bytes]], IO[bytes]]
_BY_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bz2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
_BY_SUFFIX = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}
_OPENERS: dict[str, _Opener] = {
    "gzip": lambda f: gzip.GzipFile(fileobj=f),
    "bz2": lambda f: bz2.BZ2File(f),
    "xz": lambda f: lzma.LZMAFile(f),  # noqa: SIM115 - closed with the file it wraps
    "zstd": lambda f: zstandard.ZstdDecompressor().stream_reader(f),
}


def filesystem_for(url: str, options: Mapping[str, Any]) -> tuple[Any, str]:
    """The fsspec filesystem and path of a refs location."""
    try:
        return fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError, TypeError) as exc:
        raise RefsError(f"{url}: cannot open: {exc}") from None


def modification_time(fs: Any, path: str) -> float:
    """The refs location's mtime in seconds, or now when the store gives none."""
    try:
        info = fs.info(path)
    except OSError as exc:
        raise RefsError(f"{path}: {_describe(exc)}") from None
    for field in ("mtime", "LastModified", "last_modified", "created", "updated"):
        value = info.get(field)
        if isinstance(value, int | float):
            return float(value)
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
    return time.time()


def is_parquet_refs(fs: Any, root: str) -> bool:
    """Whether ``root`` holds a Parquet reference set: asked as ``ROOT/.zmetadata``
    rather than "is it a directory", which stores such as HTTP cannot answer."""
    try:
        return bool(fs.isfile(f"{root.rstrip('/')}/.zmetadata"))
    except (OSError, ValueError):
        return False


def compression_of(name: str, head: bytes) -> str | None:
    for magic, kind in _BY_MAGIC:
        if head.startswith(magic):
            return kind
    for suffix, kind in _BY_SUFFIX.items():
        if name.endswith(suffix):
            return kind  # named so but without the magic: the decompressor will say why
    return None


def read_refs_bytes(fs: Any, path: str) -> bytes:
    """The whole (decompressed) content of a refs file.

    The file is read whole, in one read, and decompressed from memory if need be: a read
    after a look at its first bytes takes a buffered path that costs as much again."""
    try:
        with fs.open(path, "rb") as raw:
            data = raw.read(MAX_REFS_BYTES + 1)
        if len(data) > MAX_REFS_BYTES:
            raise RefsError(f"{path}: larger than {MAX_REFS_BYTES >> 30} GiB")
        kind = compression_of(path, data[:8])
        if kind is not None:
            data = _decompress(_OPENERS[kind](io.BytesIO(data)), path, kind)
    except RefsError:
        raise
    except (OSError, EOFError, lzma.LZMAError, zstandard.ZstdError) as exc:
        raise RefsError(f"{path}: {_describe(exc)}") from None
    return data


def _decompress(stream: IO[bytes], path: str, kind: str) -> bytes:
    chunks, size = [], 0
    while chunk := stream.read(16 << 20):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_REFS_BYTES:
            raise RefsError(f"{path}: expands beyond {MAX_REFS_BYTES >> 30} GiB ({kind})")
    return b"".join(chunks)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, IsADirectoryError):
        return "is a directory without .zmetadata (not a Parquet reference set)"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return f"cannot read: {exc}"
