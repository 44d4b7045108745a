"""One cache entry on disk: its name, and the bytes it holds behind a checked header.

An entry is one *unit* of one version of one remote object: the bytes of the aligned
range ``[offset, offset + length)`` (256 KiB by default) that have been fetched, as one
or more *spans*.  The version is named by a *validator* (an ETag, a generation, size and
Last-Modified, or device, inode, size and mtime of a local file).  The entry's name is a
hash of URL, validator, offset and length, so a changed object is a different entry:
old bytes are never found for a new version; two reference sets that point at the same
bytes find the same entries; and however a read was cut (a whole zarr chunk, a block of
read-ahead), the bytes it fetched land in the units it covers, where any later read of
them finds them.

Layout (integers little-endian)::

    magic "RMDC" | version u16 | span count u16 | offset u64 | length u64 | eof u64
    | data size u64 | data crc32 u32 | url length u32 | validator length u32
    | url | validator | spans (start u64, end u64, absolute) | header crc32 u32
    | data (the spans' bytes, in order)

``eof`` is where the object ends, when a fetch found it inside the unit (else
``NO_EOF``).  Everything is checked on every read: magic, version, header checksum,
that the header names the entry looked for (a hash collision or a misplaced file is a
miss, not data), that the spans are ordered, disjoint and inside the unit, the data's
size against the spans and the file, and the data's CRC-32.  A file that fails any
check is *corrupt*: the reader takes it for a miss and removes it.
"""

from __future__ import annotations

import functools
import hashlib
import struct
import zlib
from dataclasses import dataclass, field

MAGIC = b"RMDC"
FORMAT_VERSION = 1
NO_EOF = (1 << 64) - 1
_FIXED = struct.Struct("<4sHHQQQQIII")
_SPAN = struct.Struct("<QQ")
_CRC = struct.Struct("<I")
#: The longest URL or validator an entry records (longer ones are not cached).
MAX_FIELD = 8192
MAX_SPANS = 4096


@dataclass(frozen=True)
class EntryKey:
    """The unit ``[offset, offset + length)`` of ``url`` as ``validator`` names its
    version."""

    url: str
    validator: str
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length

    @functools.cached_property
    def name(self) -> str:
        """``ab/cdef...``: the entry's path under the data directory (256 subdirectories,
        so that no directory grows huge).  Computed once per key."""
        digest = hashlib.sha256(
            b"\0".join(
                (
                    self.url.encode("utf-8", "surrogateescape"),
                    self.validator.encode("utf-8", "surrogateescape"),
                    str(self.offset).encode(),
                    str(self.length).encode(),
                )
            )
        ).hexdigest()
        return f"{digest[:2]}/{digest[2:]}"

    def cacheable(self) -> bool:
        return (
            len(self.url.encode("utf-8", "surrogateescape")) <= MAX_FIELD
            and len(self.validator.encode("utf-8", "surrogateescape")) <= MAX_FIELD
            and self.offset >= 0
            and self.length > 0
        )

    @functools.cached_property
    def whole_header_length(self) -> int:
        """How long the header of an entry holding the whole unit (one span) is."""
        return (
            _FIXED.size
            + len(self.url.encode("utf-8", "surrogateescape"))
            + len(self.validator.encode("utf-8", "surrogateescape"))
            + _SPAN.size
            + _CRC.size
        )


class CorruptEntry(Exception):
    """A file that is not a whole, intact entry for the key it was looked up by."""


@dataclass
class Entry:
    """What a unit holds: ``spans`` (absolute ``(start, end)``, ordered, disjoint, not
    touching) whose bytes are ``data`` in order, and where the object ends if known."""

    spans: list[tuple[int, int]] = field(default_factory=list)
    data: bytes | memoryview = b""
    eof: int | None = None

    @property
    def size(self) -> int:
        return len(self.data)

    def get(self, start: int, end: int) -> memoryview | None:
        """Bytes ``[start, end)``, or fewer where the object ends before ``end``; None
        when the entry does not hold them all."""
        pos = 0
        for lo, hi in self.spans:
            if lo <= start < hi:
                stop = end if end <= hi else (hi if self.eof == hi else None)
                if stop is None:
                    return None
                view = memoryview(self.data)
                return view[pos + start - lo : pos + stop - lo]
            pos += hi - lo
        if self.eof is not None and start >= self.eof:
            return memoryview(b"")
        return None

    def merged(self, start: int, piece: bytes | memoryview, eof: int | None) -> Entry | None:
        """This entry with ``piece`` at ``start`` added (and ``eof`` learnt); None when
        it adds nothing."""
        if not self.spans and piece:  # the common case: a new entry, no copy
            return Entry([(start, start + len(piece))], piece, eof)
        segments: list[tuple[int, bytes | memoryview]] = []
        pos = 0
        view = memoryview(self.data)
        for lo, hi in self.spans:
            segments.append((lo, view[pos : pos + hi - lo]))
            pos += hi - lo
        if piece:
            segments.append((start, piece))
        segments.sort(key=lambda s: s[0])
        spans: list[tuple[int, int]] = []
        pieces: list[bytes | memoryview] = []
        for lo, seg in segments:
            hi = lo + len(seg)
            if spans and lo <= spans[-1][1]:
                last_lo, last_hi = spans[-1]
                if hi > last_hi:
                    pieces.append(seg[last_hi - lo :])
                    spans[-1] = (last_lo, hi)
            else:
                spans.append((lo, hi))
                pieces.append(seg)
        new_eof = self.eof if eof is None else eof
        if spans == self.spans and new_eof == self.eof:
            return None
        return Entry(spans, b"".join(pieces), new_eof)


def encode(key: EntryKey, entry: Entry) -> list[bytes | memoryview]:
    """The file of ``entry``: its header, then its data."""
    if len(entry.spans) > MAX_SPANS:
        raise ValueError(f"{len(entry.spans)} spans")
    url = key.url.encode("utf-8", "surrogateescape")
    validator = key.validator.encode("utf-8", "surrogateescape")
    head = _FIXED.pack(
        MAGIC,
        FORMAT_VERSION,
        len(entry.spans),
        key.offset,
        key.length,
        NO_EOF if entry.eof is None else entry.eof,
        entry.size,
        zlib.crc32(entry.data),
        len(url),
        len(validator),
    )
    head += url + validator + b"".join(_SPAN.pack(lo, hi) for lo, hi in entry.spans)
    return [head + _CRC.pack(zlib.crc32(head)), entry.data]


def encoded_length(key: EntryKey, entry: Entry) -> int:
    """How long the file of ``entry`` is (what :func:`encode` makes), without making it."""
    return key.whole_header_length + _SPAN.size * (len(entry.spans) - 1) + entry.size


@dataclass(frozen=True)
class Header:
    """A checked header: the entry's spans and end of object, and where its data is."""

    spans: list[tuple[int, int]]
    eof: int | None
    size: int
    data_crc: int
    data_offset: int


def header_length(head: bytes | bytearray) -> int:
    """How many bytes the header that ``head`` starts has (its first bytes tell)."""
    if len(head) < _FIXED.size:
        raise CorruptEntry(f"{len(head)} bytes: shorter than a header")
    *_, url_len, val_len = _FIXED.unpack_from(head)
    count = _FIXED.unpack_from(head)[2]
    if url_len > MAX_FIELD or val_len > MAX_FIELD or count > MAX_SPANS:
        raise CorruptEntry("header fields too long")
    return _FIXED.size + url_len + val_len + count * _SPAN.size + _CRC.size


def decode_header(key: EntryKey, head: bytes | bytearray) -> Header:
    """The header at the start of ``head`` (which holds at least ``header_length``
    bytes, or it is truncated), checked against ``key``, or :class:`CorruptEntry`."""
    need = header_length(head)
    if len(head) < need:
        raise CorruptEntry("truncated header")
    magic, version, count, offset, length, eof, size, data_crc, url_len, val_len = (
        _FIXED.unpack_from(head)
    )
    if magic != MAGIC:
        raise CorruptEntry("not an entry (bad magic)")
    if version != FORMAT_VERSION:
        raise CorruptEntry(f"format version {version}, not {FORMAT_VERSION}")
    head_end = need - _CRC.size
    (head_crc,) = _CRC.unpack_from(head, head_end)
    view = memoryview(head)
    if zlib.crc32(view[:head_end]) != head_crc:
        raise CorruptEntry("header checksum mismatch")
    at = _FIXED.size
    url = bytes(view[at : at + url_len]).decode("utf-8", "surrogateescape")
    validator = bytes(view[at + url_len : at + url_len + val_len]).decode(
        "utf-8", "surrogateescape"
    )
    if (url, validator, offset, length) != (key.url, key.validator, key.offset, key.length):
        raise CorruptEntry("the header names another entry")
    at += url_len + val_len
    spans = [_SPAN.unpack_from(head, at + i * _SPAN.size) for i in range(count)]
    previous = offset - 1
    for lo, hi in spans:
        if not (previous < lo < hi <= offset + length):
            raise CorruptEntry("spans out of order or outside the unit")
        previous = hi
    if sum(hi - lo for lo, hi in spans) != size:
        raise CorruptEntry("the spans do not add up to the data")
    if eof != NO_EOF and not (offset <= eof <= offset + length and previous <= eof):
        raise CorruptEntry("end of object outside the unit")
    return Header(spans, None if eof == NO_EOF else eof, size, data_crc, need)


def with_data(header: Header, data: bytes | memoryview) -> Entry:
    """The entry of ``header`` and the bytes found after it, checked."""
    if len(data) != header.size:
        raise CorruptEntry(f"{len(data)} bytes of data, the header says {header.size}")
    if zlib.crc32(data) != header.data_crc:
        raise CorruptEntry("data checksum mismatch")
    return Entry(header.spans, data, header.eof)


def decode(key: EntryKey, blob: bytes) -> Entry:
    """The entry in a file's whole contents ``blob``, looked up by ``key``, or
    :class:`CorruptEntry`."""
    header = decode_header(key, blob)
    return with_data(header, memoryview(blob)[header.data_offset :])
