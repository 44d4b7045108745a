"""Read an Icechunk manifest file (``manifests/<id>``) into compact per-array columns.

Icechunk's Python API enumerates an array's chunk references but not the checksums it
records for virtual chunks (the ETag or last-modified time of the object each one points
into); those live only in the manifest file.  This module reads that file itself.

The layout (icechunk's spec, ``manifest.fbs``): a 39-byte header (12 bytes of magic, a
24-byte writer name, spec version, file type 2, compression 1 = zstd), then a zstd
stream holding one FlatBuffer: ``Manifest{id, arrays: [ArrayManifest{node_id, refs:
[ChunkRef{index, inline, offset, length, chunk_id, location, checksum_etag,
checksum_last_modified, compressed_location, extra}]}]}``.

The file is untrusted: decompression stops at a bound, every offset is checked before it
is followed, and any inconsistency is a :class:`ManifestError` naming the manifest.  The
references of an array are read column-wise with numpy, so an array of a million chunks
costs a few vectorised gathers, not a million Python objects.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import zstandard

from refmount.refs.model import Checksum

MAGIC = "ICE🧊CHUNK".encode()
HEADER_SIZE = 39
_SPEC_VERSION_AT = 36
_FILE_TYPE_AT = 37
_COMPRESSION_AT = 38
_FILE_TYPE_MANIFEST = 2
_SPEC_VERSIONS = (1, 2)
_COMPRESSION_NONE = 0
_COMPRESSION_ZSTD = 1

#: default bound on a manifest's decompressed size
MAX_DECOMPRESSED_BYTES = 1 << 30

#: chunk kinds, numbered as icechunk's ``array_chunk_iterator`` numbers them
NATIVE, VIRTUAL, INLINE = 1, 2, 3

# vtable slots (field number) of the tables read here
_MANIFEST_ID, _MANIFEST_ARRAYS = 0, 1
_ARRAY_NODE_ID, _ARRAY_REFS = 0, 1
_REF_INDEX, _REF_INLINE, _REF_CHUNK_ID, _REF_LOCATION = 0, 1, 4, 5
_REF_ETAG, _REF_LAST_MODIFIED, _REF_COMPRESSED_LOCATION = 6, 7, 8

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
#: bytes of strings compared at a time (the gather's index is 8 bytes per byte)
_GATHER_BYTES = 1 << 20


class ManifestError(ValueError):
    """A manifest file that cannot be read as one; the message names the manifest."""


def object_id_text(raw: bytes) -> str:
    """An Icechunk object id as icechunk prints it (Crockford base32, no padding)."""
    bits = len(raw) * 8
    value = int.from_bytes(raw, "big") << (-bits % 5)
    digits = -(-bits // 5)
    return "".join(_CROCKFORD[(value >> (5 * (digits - 1 - i))) & 31] for i in range(digits))


@dataclass(frozen=True, slots=True)
class ArrayRefs:
    """The chunk references one manifest holds for one array, row by row in the
    manifest's order (ascending coordinates).

    ``coords``: uint32 ``[n, ndim]``; ``kinds``: uint8 ``[n]`` (:data:`NATIVE`,
    :data:`VIRTUAL`, :data:`INLINE`); ``checksums``: int32 ``[n]``, an index into
    :attr:`Manifest.checksums`, -1 where the reference carries none."""

    node_id: str
    coords: np.ndarray
    kinds: np.ndarray
    checksums: np.ndarray


@dataclass(frozen=True, slots=True)
class Manifest:
    """A parsed manifest: its arrays by node id (icechunk's printed form) and the
    distinct checksums its virtual references carry."""

    id: str
    spec_version: int
    writer: str
    arrays: dict[str, ArrayRefs]
    checksums: list[Checksum]


def parse_manifest(
    data: bytes, manifest_id: str, max_decompressed: int = MAX_DECOMPRESSED_BYTES
) -> Manifest:
    """Parse the bytes of ``manifests/<manifest_id>``; :class:`ManifestError` on any
    corruption, or when the content would decompress beyond ``max_decompressed`` bytes."""
    spec_version, writer, compression = _read_header(data, manifest_id)
    if compression == _COMPRESSION_ZSTD:
        body = _decompress(memoryview(data)[HEADER_SIZE:], manifest_id, max_decompressed)
    else:
        body = bytearray(data[HEADER_SIZE:])
        if len(body) > max_decompressed:
            raise ManifestError(f"manifest {manifest_id}: {len(body)} bytes exceed the bound")
    return _FlatManifest(body, manifest_id).read(spec_version, writer)


def _read_header(data: bytes, manifest_id: str) -> tuple[int, str, int]:
    if len(data) < HEADER_SIZE:
        raise ManifestError(
            f"manifest {manifest_id}: {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header"
        )
    if data[: len(MAGIC)] != MAGIC:
        raise ManifestError(f"manifest {manifest_id}: not an Icechunk file (bad magic)")
    writer = bytes(data[len(MAGIC) : _SPEC_VERSION_AT]).decode("utf-8", "replace")
    spec_version = data[_SPEC_VERSION_AT]
    if spec_version not in _SPEC_VERSIONS:
        raise ManifestError(f"manifest {manifest_id}: unsupported spec version {spec_version}")
    if data[_FILE_TYPE_AT] != _FILE_TYPE_MANIFEST:
        raise ManifestError(
            f"manifest {manifest_id}: file type {data[_FILE_TYPE_AT]}, not a manifest"
        )
    compression = data[_COMPRESSION_AT]
    if compression not in (_COMPRESSION_NONE, _COMPRESSION_ZSTD):
        raise ManifestError(f"manifest {manifest_id}: unknown compression {compression}")
    return spec_version, writer.rstrip(" \0"), compression


def _decompress(compressed: memoryview, manifest_id: str, limit: int) -> bytearray:
    """The zstd content (all frames), refusing more than ``limit`` bytes before holding
    them: a small file that claims or expands to gigabytes is an error, not a stall.  The
    size a frame declares is allocated once and filled in place (one copy of the content
    in memory, not two)."""
    beyond = ManifestError(
        f"manifest {manifest_id}: decompresses beyond the bound of {limit} bytes"
    )
    try:
        declared = zstandard.frame_content_size(compressed)
        if declared > limit:
            raise beyond
        reader = zstandard.ZstdDecompressor().stream_reader(
            io.BytesIO(compressed), read_across_frames=True
        )
        out = bytearray(max(declared, 0))
        filled = 0
        with memoryview(out) as view:
            while filled < len(out) and (got := reader.readinto(view[filled:])):
                filled += got
        del out[filled:]
        while piece := reader.read(min(1 << 20, limit + 1 - len(out))):
            out += piece
            if len(out) > limit:
                raise beyond
    except zstandard.ZstdError as exc:
        raise ManifestError(f"manifest {manifest_id}: corrupt zstd stream ({exc})") from None
    if not out:
        raise ManifestError(f"manifest {manifest_id}: empty content")
    return out


class _FlatManifest:
    """Bounds-checked reads of the FlatBuffer tables of one manifest."""

    def __init__(self, buf: bytes | bytearray, manifest_id: str) -> None:
        self.buf = buf
        self.u8 = np.frombuffer(buf, dtype=np.uint8)
        self.manifest_id = manifest_id
        self.checksum_of: dict[Checksum, int] = {}
        self.claimed = 0

    def fail(self, what: str) -> ManifestError:
        return ManifestError(f"manifest {self.manifest_id}: corrupt FlatBuffer ({what})")

    def claim(self, nbytes: int, what: str) -> None:
        """Account for ``nbytes`` of the buffer that a ref's own data takes (its slot in a
        refs vector, its index vector, its ETag string).  A writer never shares them, so
        together they fit in the buffer; a hostile file that points many arrays or refs
        at the same bytes would otherwise cost work quadratic in its size."""
        self.claimed += nbytes
        if self.claimed > len(self.buf):
            raise self.fail(f"{what}: more than the manifest holds")

    # -- scalar reads -------------------------------------------------------------------
    def _int(self, pos: int, size: int, what: str, signed: bool = False) -> int:
        if pos < 0 or pos + size > len(self.buf):
            raise self.fail(f"{what} at {pos} outside the buffer")
        return int.from_bytes(self.buf[pos : pos + size], "little", signed=signed)

    def _field(self, table: int, slot: int, size: int, what: str) -> int | None:
        """The position of a field of ``table`` (``None`` when absent)."""
        vtable = table - self._int(table, 4, f"{what} table", signed=True)
        vtable_size = self._int(vtable, 2, f"{what} vtable")
        table_size = self._int(vtable + 2, 2, f"{what} vtable")
        if vtable_size < 4 or vtable_size % 2:
            raise self.fail(f"{what} vtable size {vtable_size}")
        entry = 4 + 2 * slot
        if entry + 2 > vtable_size:
            return None
        offset = self._int(vtable + entry, 2, f"{what} vtable")
        if offset == 0:
            return None
        if offset + size > table_size:
            raise self.fail(f"{what} field past its table")
        if table + offset + size > len(self.buf):
            raise self.fail(f"{what} field outside the buffer")
        return table + offset

    def _follow(self, pos: int, what: str) -> int:
        return pos + self._int(pos, 4, what)

    def _vector(self, table: int, slot: int, element: int, what: str) -> tuple[int, int]:
        """(start of elements, count) of a required vector field."""
        at = self._field(table, slot, 4, what)
        if at is None:
            raise self.fail(f"{what} missing")
        vector = self._follow(at, what)
        count = self._int(vector, 4, what)
        if vector + 4 + count * element > len(self.buf):
            raise self.fail(f"{what} of {count} elements runs past the buffer")
        return vector + 4, count

    # -- tables -------------------------------------------------------------------------
    def read(self, spec_version: int, writer: str) -> Manifest:
        root = self._follow(0, "root")
        id_at = self._field(root, _MANIFEST_ID, 12, "manifest id")
        if id_at is None:
            raise self.fail("manifest id missing")
        stored_id = object_id_text(self.buf[id_at : id_at + 12])
        if stored_id != self.manifest_id:
            raise ManifestError(f"manifest {self.manifest_id}: holds manifest {stored_id}")
        start, count = self._vector(root, _MANIFEST_ARRAYS, 4, "arrays")
        arrays: dict[str, ArrayRefs] = {}
        for i in range(count):
            array = self._follow(start + 4 * i, "array")
            refs = self._read_array(array)
            if refs.node_id in arrays:
                raise self.fail(f"array {refs.node_id} listed twice")
            arrays[refs.node_id] = refs
        return Manifest(
            id=self.manifest_id,
            spec_version=spec_version,
            writer=writer,
            arrays=arrays,
            checksums=list(self.checksum_of),
        )

    def _read_array(self, array: int) -> ArrayRefs:
        node_at = self._field(array, _ARRAY_NODE_ID, 8, "node id")
        if node_at is None:
            raise self.fail("array without node id")
        node_id = object_id_text(self.buf[node_at : node_at + 8])
        start, count = self._vector(array, _ARRAY_REFS, 4, f"refs of array {node_id}")
        refs = _Columns(self, node_id, start, count)
        return ArrayRefs(
            node_id=node_id,
            coords=refs.coords(),
            kinds=refs.kinds(),
            checksums=refs.checksums(),
        )


class _Columns:
    """The ChunkRef tables of one array read column-wise: every position is an int64
    numpy array, checked against the buffer before it is dereferenced."""

    def __init__(self, flat: _FlatManifest, node_id: str, start: int, count: int) -> None:
        self.flat = flat
        self.node_id = node_id
        self.size = len(flat.buf)
        flat.claim(4 * count, f"refs of array {node_id}")
        self.tables = self._follow(start + 4 * np.arange(count, dtype=np.int64), "ref")
        vtables = self.tables - self._gather(self.tables, 4, "ref table", signed=True)
        vtable_sizes = self._gather(vtables, 2, "ref vtable")
        if np.any((vtable_sizes < 4) | (vtable_sizes % 2 == 1)):
            raise self._fail("ref vtable size")
        self._check(vtables + vtable_sizes, "ref vtable")
        self.vtables = vtables
        self.vtable_sizes = vtable_sizes
        self.table_sizes = self._gather(vtables + 2, 2, "ref vtable")

    def _fail(self, what: str) -> ManifestError:
        return self.flat.fail(f"{what} of array {self.node_id}")

    def _check(self, ends: np.ndarray, what: str) -> None:
        if ends.size and int(ends.max()) > self.size:
            raise self._fail(f"{what} outside the buffer")

    def _gather(self, pos: np.ndarray, size: int, what: str, signed: bool = False) -> np.ndarray:
        """Little-endian integers of ``size`` bytes at each of ``pos``."""
        if pos.size and int(pos.min()) < 0:
            raise self._fail(f"{what} before the buffer")
        self._check(pos + size, what)
        if not np.any(pos % size):  # aligned, as a FlatBuffer builder writes them: one gather
            kind = f"<{'i' if signed else 'u'}{size}"
            words = np.frombuffer(self.flat.buf, dtype=kind, count=self.size // size)
            return words[pos // size].astype(np.int64)
        value = np.zeros(pos.shape, dtype=np.int64)
        for byte in range(size):
            value |= self.flat.u8[pos + byte].astype(np.int64) << (8 * byte)
        if signed:
            sign = np.int64(1) << (8 * size - 1)
            value = (value ^ sign) - sign
        return value

    def _follow(self, pos: np.ndarray, what: str) -> np.ndarray:
        return pos + self._gather(pos, 4, what)

    def _present(self, slot: int) -> np.ndarray:
        """The offset of a field within each table (0 where absent)."""
        entry = 4 + 2 * slot
        has_entry = entry + 2 <= self.vtable_sizes
        offsets = np.zeros(self.tables.shape, dtype=np.int64)
        offsets[has_entry] = self._gather(self.vtables[has_entry] + entry, 2, "ref vtable")
        return offsets

    def _field(self, slot: int, size: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        """(mask of tables holding the field, positions of the field in those)."""
        offsets = self._present(slot)
        present = offsets != 0
        if np.any(offsets[present] + size > self.table_sizes[present]):
            raise self._fail(f"{what} field past its table")
        positions = self.tables[present] + offsets[present]
        self._check(positions + size, what)
        return present, positions

    def coords(self) -> np.ndarray:
        present, at = self._field(_REF_INDEX, 4, "index")
        if not np.all(present):
            raise self._fail("chunk ref without index")
        vectors = self._follow(at, "index")
        lengths = self._gather(vectors, 4, "index")
        count = len(self.tables)
        if count == 0:
            return np.zeros((0, 0), dtype=np.uint32)
        ndim = int(lengths[0])
        if np.any(lengths != ndim):
            raise self._fail("chunk indices of different lengths")
        self.flat.claim(count * (4 + 4 * ndim), f"chunk indices of array {self.node_id}")
        self._check(vectors + 4 + 4 * ndim, "index")
        elements = vectors[:, None] + 4 + 4 * np.arange(ndim, dtype=np.int64)[None, :]
        return self._gather(elements, 4, "index").astype(np.uint32)

    def kinds(self) -> np.ndarray:
        """Native where ``chunk_id`` is set, else virtual where a location is, else
        inline: the order icechunk itself decides a reference's kind in."""
        native = self._field(_REF_CHUNK_ID, 12, "chunk id")[0]
        virtual = (
            self._string_positions(_REF_LOCATION, "location")[0]
            | self._vector_positions(_REF_COMPRESSED_LOCATION, "compressed location")[0]
        )
        inline = self._vector_positions(_REF_INLINE, "inline bytes")[0]
        kinds = np.select([native, virtual, inline], [NATIVE, VIRTUAL, INLINE], default=0).astype(
            np.uint8
        )
        if np.any(kinds == 0):
            raise self._fail("chunk ref that is neither native, virtual nor inline")
        return kinds

    def _vector_positions(self, slot: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        """(mask, start of the vector's bytes) for a byte-vector field, bounds checked."""
        present, at = self._field(slot, 4, what)
        vectors = self._follow(at, what)
        lengths = self._gather(vectors, 4, what)
        self._check(vectors + 4 + lengths, what)
        return present, vectors + 4

    def _string_positions(self, slot: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`_vector_positions`; a string also ends with a NUL inside the buffer."""
        present, starts = self._vector_positions(slot, what)
        lengths = self._gather(starts - 4, 4, what)
        self._check(starts + lengths + 1, what)
        return present, starts

    def _distinct_strings(self, starts: np.ndarray, what: str) -> tuple[list[str], np.ndarray]:
        """The distinct strings whose bytes start at ``starts``, and the number of each
        row's among them.  Compared as numpy rows, a length at a time, so that a million
        references to a thousand ETags cost a thousand decodings, not a million."""
        positions, by_position = np.unique(starts, return_inverse=True)
        lengths = self._gather(positions - 4, 4, what)
        self.flat.claim(int(lengths.sum()), f"{what} strings of array {self.node_id}")
        order = np.argsort(lengths, kind="stable")
        bounds = np.flatnonzero(np.diff(lengths[order])) + 1
        numbers = np.empty(len(positions), dtype=np.int64)
        seen: dict[bytes, int] = {}
        u8 = self.flat.u8
        for group in np.split(order, bounds):
            if group.size == 0:
                continue
            length = int(lengths[group[0]])
            step = max(1, _GATHER_BYTES // max(length, 1))
            for lo in range(0, group.size, step):
                rows = group[lo : lo + step]
                if length == 0:
                    texts, inverse = [b""], np.zeros(rows.size, dtype=np.int64)
                else:
                    matrix = u8[positions[rows, None] + np.arange(length)]
                    unique, inverse = np.unique(
                        matrix.view(f"V{length}")[:, 0], return_inverse=True
                    )
                    texts = [row.tobytes() for row in unique]
                local = np.array([seen.setdefault(text, len(seen)) for text in texts])
                numbers[rows] = local[inverse]
        try:
            strings = [text.decode() for text in seen]
        except UnicodeDecodeError:
            raise self._fail(f"{what} not UTF-8") from None
        return strings, numbers[by_position]

    def _numbers(self, checksums: list[Checksum]) -> np.ndarray:
        """Each checksum's number in the manifest's list of distinct checksums."""
        checksum_of = self.flat.checksum_of
        numbers = [checksum_of.setdefault(c, len(checksum_of)) for c in checksums]
        return np.array(numbers, dtype=np.int32)

    def checksums(self) -> np.ndarray:
        index = np.full(self.tables.shape, -1, dtype=np.int32)
        has_etag, etag_starts = self._string_positions(_REF_ETAG, "checksum etag")
        has_time, time_at = self._field(_REF_LAST_MODIFIED, 4, "checksum last modified")
        times = np.zeros(self.tables.shape, dtype=np.int64)
        times[has_time] = self._gather(time_at, 4, "checksum last modified")
        etags, inverse = self._distinct_strings(etag_starts, "checksum etag")
        index[has_etag] = self._numbers([Checksum(etag=etag) for etag in etags])[inverse]
        # Icechunk reads a last-modified time only where there is no ETag, and 0 as none.
        dated = ~has_etag & (times > 0)
        distinct, inverse = np.unique(times[dated], return_inverse=True)
        dates = [Checksum(last_modified=seconds) for seconds in distinct.tolist()]
        index[dated] = self._numbers(dates)[inverse]
        return index
