"""Read an Icechunk manifest file (``manifests/<id>``) into compact per-array columns.

Icechunk's Python API enumerates an array's chunk references but not the checksums it
records for virtual chunks (the ETag or last-modified time of the object each one points
into); those live only in the manifest file.  This module reads that file itself.

The layout (icechunk's spec, ``manifest.fbs``): a 39-byte header (12 bytes of magic, a
24-byte writer name, spec version, file type 2, compression 1 = zstd), then a zstd
stream holding one FlatBuffer: ``Manifest{id, arrays: [ArrayManifest{node_id, refs:
[ChunkRef{index, inline, offset, length, chunk_id, location, checksum_etag,
checksum_last_modified, compressed_location, extra}]}], location_dictionary,
compression_algorithm}``.  A spec-2 manifest may store each virtual chunk's URL zstd
compressed with the manifest's dictionary (``compressed_location``).

The file is untrusted: decompression stops at a bound, every offset is checked before it
is followed, and any inconsistency is a :class:`ManifestError` naming the manifest.  The
references of an array are read column-wise with numpy, so an array of a million chunks
costs a few vectorised gathers, not a million Python objects: strings (URLs, ETags,
compressed URLs) are decoded once per distinct value, native chunk ids are spelled in
base32 by numpy.
"""

from __future__ import annotations

import io
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
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

#: the longest URL a compressed location may decompress to
MAX_LOCATION_BYTES = 1 << 16

# vtable slots (field number) of the tables read here
_MANIFEST_ID, _MANIFEST_ARRAYS, _MANIFEST_DICTIONARY, _MANIFEST_COMPRESSION = 0, 1, 2, 3
_ARRAY_NODE_ID, _ARRAY_REFS = 0, 1
_REF_INDEX, _REF_INLINE, _REF_OFFSET, _REF_LENGTH, _REF_CHUNK_ID, _REF_LOCATION = 0, 1, 2, 3, 4, 5
_REF_ETAG, _REF_LAST_MODIFIED, _REF_COMPRESSED_LOCATION = 6, 7, 8
_LOCATIONS_ZSTD = 1

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
#: bytes of strings compared at a time
_GATHER_BYTES = 1 << 22
_HASH_FACTOR = np.uint64(1099511628211)  # FNV's 64-bit prime


class ManifestError(ValueError):
    """A manifest file that cannot be read as one; the message names the manifest."""


def object_id_text(raw: bytes) -> str:
    """An Icechunk object id as icechunk prints it (Crockford base32, no padding)."""
    bits = len(raw) * 8
    value = int.from_bytes(raw, "big") << (-bits % 5)
    digits = -(-bits // 5)
    return "".join(_CROCKFORD[(value >> (5 * (digits - 1 - i))) & 31] for i in range(digits))


def object_ids_text(raw: np.ndarray) -> pa.Array:
    """:func:`object_id_text` of each row of ``raw`` (uint8 ``[n, size]``), as an Arrow
    string array: the base32 digits computed column-wise, no Python string per id."""
    count, size = raw.shape
    bits = np.unpackbits(raw, axis=1)
    digits = -(-size * 8 // 5)
    bits = np.pad(bits, ((0, 0), (0, digits * 5 - size * 8)))
    values = bits.reshape(count, digits, 5) @ np.array([16, 8, 4, 2, 1], np.uint8)
    text = np.frombuffer(_CROCKFORD.encode(), np.uint8)[values]
    offsets = np.arange(0, digits * (count + 1), digits, dtype=np.int32)
    return pa.StringArray.from_buffers(
        count, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(text))
    )


def arrow_array(values: list[bytes], kind: pa.DataType) -> pa.Array:
    """An Arrow string or binary array of ``values``, built from its buffers
    (``pa.array`` of Python objects would import pandas: 0.2 s and 40 MB)."""
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum([len(value) for value in values], out=offsets[1:])
    if offsets[-1] >= 1 << 31:
        raise ManifestError(f"{offsets[-1]} bytes of strings: more than an array holds")
    buffers = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(values))]
    return pa.Array.from_buffers(kind, len(values), buffers)


@dataclass(frozen=True, slots=True)
class ArrayRefs:
    """The chunk references one manifest holds for one array, row by row in the
    manifest's order (ascending coordinates).

    ``coords``: uint32 ``[n, ndim]``; ``kinds``: uint8 ``[n]`` (:data:`NATIVE`,
    :data:`VIRTUAL`, :data:`INLINE`); ``checksums``: int32 ``[n]``, an index into
    :attr:`Manifest.checksums`, -1 where the reference carries none; ``offsets`` and
    ``lengths``: uint64 ``[n]`` (an inline chunk's: 0 and its size); ``location``: int32 ``[n]``, an
    index into ``targets`` (native chunk ids and virtual chunk URLs, each distinct one
    once) or, for inline chunks, into ``inline`` (their bytes)."""

    node_id: str
    coords: np.ndarray
    kinds: np.ndarray
    checksums: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    location: np.ndarray
    targets: pa.Array
    inline: list[bytes]


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
    data: bytes,
    manifest_id: str,
    max_decompressed: int = MAX_DECOMPRESSED_BYTES,
    node_ids: Collection[str] | None = None,
) -> Manifest:
    """Parse the bytes of ``manifests/<manifest_id>`` (of its arrays, those of
    ``node_ids`` when given); :class:`ManifestError` on any corruption, or when the
    content would decompress beyond ``max_decompressed`` bytes."""
    spec_version, writer, compression = _read_header(data, manifest_id)
    if compression == _COMPRESSION_ZSTD:
        body = _decompress(memoryview(data)[HEADER_SIZE:], manifest_id, max_decompressed)
    else:
        body = bytearray(data[HEADER_SIZE:])
        if len(body) > max_decompressed:
            raise ManifestError(f"manifest {manifest_id}: {len(body)} bytes exceed the bound")
    return _FlatManifest(body, manifest_id).read(spec_version, writer, node_ids)


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


def _distinct_rows(matrix: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """The distinct rows of a uint8 matrix, and each row's number among them: rows are
    hashed column-wise and grouped by hash, then checked byte for byte against their
    group's first (cheaper than sorting the rows as byte strings); a collision
    falls back to sorting them."""
    hashes = np.zeros(len(matrix), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in matrix.T:
            hashes = hashes * _HASH_FACTOR + column
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    if not np.array_equal(matrix, matrix[first[inverse]]):
        unique, inverse = np.unique(matrix.view(f"V{matrix.shape[1]}")[:, 0], return_inverse=True)
        return [row.tobytes() for row in unique], inverse
    return [matrix[row].tobytes() for row in first.tolist()], inverse


class _FlatManifest:
    """Bounds-checked reads of the FlatBuffer tables of one manifest."""

    def __init__(self, buf: bytes | bytearray, manifest_id: str) -> None:
        self.buf = buf
        self.u8 = np.frombuffer(buf, dtype=np.uint8)
        self.manifest_id = manifest_id
        self.checksum_of: dict[Checksum, int] = {}
        self.claimed = 0
        self.locations: zstandard.ZstdDecompressor | None = None

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
    def read(
        self, spec_version: int, writer: str, node_ids: Collection[str] | None = None
    ) -> Manifest:
        root = self._follow(0, "root")
        id_at = self._field(root, _MANIFEST_ID, 12, "manifest id")
        if id_at is None:
            raise self.fail("manifest id missing")
        stored_id = object_id_text(self.buf[id_at : id_at + 12])
        if stored_id != self.manifest_id:
            raise ManifestError(f"manifest {self.manifest_id}: holds manifest {stored_id}")
        self.locations = self._location_decompressor(root)
        start, count = self._vector(root, _MANIFEST_ARRAYS, 4, "arrays")
        arrays: dict[str, ArrayRefs] = {}
        seen: set[str] = set()
        for i in range(count):
            array = self._follow(start + 4 * i, "array")
            node_id = self._node_id(array)
            if node_id in seen:
                raise self.fail(f"array {node_id} listed twice")
            seen.add(node_id)
            if node_ids is None or node_id in node_ids:
                arrays[node_id] = self._read_array(array, node_id)
        return Manifest(
            id=self.manifest_id,
            spec_version=spec_version,
            writer=writer,
            arrays=arrays,
            checksums=list(self.checksum_of),
        )

    def _location_decompressor(self, root: int) -> zstandard.ZstdDecompressor | None:
        """What decompresses the manifest's compressed locations: zstd with the
        manifest's dictionary (None when it declares another algorithm)."""
        algorithm_at = self._field(root, _MANIFEST_COMPRESSION, 1, "compression algorithm")
        algorithm = _LOCATIONS_ZSTD if algorithm_at is None else self.buf[algorithm_at]
        if algorithm != _LOCATIONS_ZSTD:
            return None
        if self._field(root, _MANIFEST_DICTIONARY, 4, "location dictionary") is None:
            return zstandard.ZstdDecompressor()
        start, count = self._vector(root, _MANIFEST_DICTIONARY, 1, "location dictionary")
        try:
            dictionary = zstandard.ZstdCompressionDict(bytes(self.buf[start : start + count]))
            return zstandard.ZstdDecompressor(dict_data=dictionary)
        except zstandard.ZstdError as exc:
            raise self.fail(f"location dictionary: {exc}") from None

    def _node_id(self, array: int) -> str:
        node_at = self._field(array, _ARRAY_NODE_ID, 8, "node id")
        if node_at is None:
            raise self.fail("array without node id")
        return object_id_text(self.buf[node_at : node_at + 8])

    def _read_array(self, array: int, node_id: str) -> ArrayRefs:
        start, count = self._vector(array, _ARRAY_REFS, 4, f"refs of array {node_id}")
        refs = _Columns(self, node_id, start, count)
        kinds = refs.kinds()
        location, targets, inline = refs.targets(kinds)
        lengths = refs.uint64(_REF_LENGTH, "length")
        is_inline = kinds == INLINE
        if is_inline.any():  # an inline chunk's length is its bytes' (as icechunk says)
            sizes = np.array([len(data) for data in inline], dtype=np.uint64)
            lengths[is_inline] = sizes[location[is_inline]]
        return ArrayRefs(
            node_id=node_id,
            coords=refs.coords(),
            kinds=kinds,
            checksums=refs.checksums(),
            offsets=refs.uint64(_REF_OFFSET, "offset"),
            lengths=lengths,
            location=location,
            targets=targets,
            inline=inline,
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
        # A builder writes each distinct vtable once (refs of the same shape share one):
        # fields are located per distinct vtable, then spread to the tables using it.
        vtables, self.which = np.unique(
            self.tables - self._gather(self.tables, 4, "ref table", signed=True),
            return_inverse=True,
        )
        vtable_sizes = self._gather(vtables, 2, "ref vtable")
        if np.any((vtable_sizes < 4) | (vtable_sizes % 2 == 1)):
            raise self._fail("ref vtable size")
        self._check(vtables + vtable_sizes, "ref vtable")
        self.vtables = vtables
        self.vtable_sizes = vtable_sizes
        self.table_sizes = self._gather(vtables + 2, 2, "ref vtable")
        self._read: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}  # by field

    def _fail(self, what: str) -> ManifestError:
        return self.flat.fail(f"{what} of array {self.node_id}")

    def _check(self, ends: np.ndarray, what: str) -> None:
        if ends.size and int(ends.max()) > self.size:
            raise self._fail(f"{what} outside the buffer")

    def _gather(self, pos: np.ndarray, size: int, what: str, signed: bool = False) -> np.ndarray:
        """Little-endian integers of ``size`` bytes at each of ``pos``.  (Few temporary
        arrays: the daemon's allocator maps each large one afresh.)"""
        if pos.size and (int(pos.min()) < 0 or int(pos.max()) + size > self.size):
            raise self._fail(f"{what} outside the buffer")
        if not np.bitwise_and(pos, size - 1).any():  # aligned, as a builder writes them
            kind = f"<{'i' if signed else 'u'}{size}"
            words = np.frombuffer(self.flat.buf, dtype=kind, count=self.size // size)
            return words.take(pos >> (size.bit_length() - 1)).astype(np.int64, copy=False)
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
        """The offset of a field within the tables of each distinct vtable (0: absent)."""
        entry = 4 + 2 * slot
        has_entry = entry + 2 <= self.vtable_sizes
        offsets = np.zeros(self.vtables.shape, dtype=np.int64)
        offsets[has_entry] = self._gather(self.vtables[has_entry] + entry, 2, "ref vtable")
        return offsets

    def _field(self, slot: int, size: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        """(mask of tables holding the field, positions of the field in those); each
        field's read once (the kinds and the targets both need them)."""
        known = self._read.get(("field", slot))
        if known is None:
            known = self._read[("field", slot)] = self._read_field(slot, size, what)
        return known

    def _read_field(self, slot: int, size: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        offsets = self._present(slot)
        has = offsets != 0
        if np.any(has & (offsets + size > self.table_sizes)):
            raise self._fail(f"{what} field past its table")
        if has.all():
            present = np.ones(self.tables.shape, dtype=bool)
            positions = self.tables + offsets[self.which]
        else:
            present = has[self.which]
            positions = self.tables[present] + offsets[self.which[present]]
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
        known = self._read.get(("vector", slot))
        if known is None:
            known = self._read[("vector", slot)] = self._read_vector(slot, what)
        return known

    def _read_vector(self, slot: int, what: str) -> tuple[np.ndarray, np.ndarray]:
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

    def uint64(self, slot: int, what: str) -> np.ndarray:
        """An unsigned 64-bit field of every table (0 where absent, its default)."""
        present, at = self._field(slot, 8, what)
        values = np.zeros(self.tables.shape, dtype=np.uint64)
        values[present] = self._gather(at, 8, what).view(np.uint64)
        return values

    def targets(self, kinds: np.ndarray) -> tuple[np.ndarray, pa.Array, list[bytes]]:
        """(location, targets, inline) of :class:`ArrayRefs`: native chunk ids first,
        then the distinct URLs of virtual chunks (stored plain or compressed)."""
        location = np.zeros(kinds.shape, dtype=np.int32)
        native = kinds == NATIVE
        has_id, id_at = self._field(_REF_CHUNK_ID, 12, "chunk id")
        raw = self.flat.u8[id_at[native[has_id], None] + np.arange(12, dtype=np.int64)]
        chunk_ids = object_ids_text(raw)
        location[native] = np.arange(len(chunk_ids), dtype=np.int32)
        virtual = kinds == VIRTUAL
        has_plain, plain_at = self._string_positions(_REF_LOCATION, "location")
        plain = virtual & has_plain
        urls, plain_numbers = self._distinct_strings(plain_at[plain[has_plain]], "location")
        packed = virtual & ~has_plain
        has_packed, packed_at = self._vector_positions(
            _REF_COMPRESSED_LOCATION, "compressed location"
        )
        blobs, packed_numbers = self._distinct_bytes(
            packed_at[packed[has_packed]], "compressed location"
        )
        number_of: dict[str, int] = {}
        base = len(chunk_ids)
        for rows, texts, numbers in (
            (plain, urls, plain_numbers),
            (packed, [self._location(blob) for blob in blobs], packed_numbers),
        ):
            distinct = [number_of.setdefault(text, base + len(number_of)) for text in texts]
            location[rows] = np.array(distinct, dtype=np.int32)[numbers] if distinct else 0
        urls = arrow_array([text.encode() for text in number_of], pa.string())
        targets = pa.concat_arrays([chunk_ids, urls])
        inline, location[kinds == INLINE] = self._inline(kinds == INLINE)
        return location, targets, inline

    def _location(self, blob: bytes) -> str:
        """A compressed location's URL (bounded, UTF-8)."""
        decompressor = self.flat.locations
        if decompressor is None:
            raise self._fail("compressed location in a manifest without zstd locations")
        try:
            if zstandard.frame_content_size(blob) > MAX_LOCATION_BYTES:
                raise self._fail(f"compressed location of more than {MAX_LOCATION_BYTES} bytes")
            return decompressor.decompress(blob, max_output_size=MAX_LOCATION_BYTES).decode()
        except (zstandard.ZstdError, UnicodeDecodeError) as exc:
            raise self._fail(f"compressed location: {exc}") from None

    def _inline(self, rows: np.ndarray) -> tuple[list[bytes], np.ndarray]:
        """The distinct inline byte strings of ``rows``, and each row's among them."""
        present, starts = self._vector_positions(_REF_INLINE, "inline bytes")
        return self._distinct_bytes(starts[rows[present]], "inline bytes")

    def _distinct_bytes(self, starts: np.ndarray, what: str) -> tuple[list[bytes], np.ndarray]:
        """The distinct byte strings whose bytes start at ``starts``, and the number of
        each row's among them.  Compared as numpy rows, a length at a time, so that a
        million references to a thousand ETags cost a thousand Python objects, not a
        million."""
        if (np.diff(starts) < 0).all():  # as a FlatBuffer builder writes them: back to front
            positions, by_position = starts[::-1], np.arange(len(starts))[::-1]
        else:
            positions, by_position = np.unique(starts, return_inverse=True)
        lengths = self._gather(positions - 4, 4, what)
        self.flat.claim(int(lengths.sum()), f"{what} of array {self.node_id}")
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
            # row p: the ``length`` bytes at p (a view; gathering rows copies only them)
            windows = np.lib.stride_tricks.sliding_window_view(u8, max(length, 1))
            for lo in range(0, group.size, step):
                rows = group[lo : lo + step]
                if length == 0:
                    texts, inverse = [b""], np.zeros(rows.size, dtype=np.int64)
                else:
                    matrix = windows[positions[rows]]
                    texts, inverse = _distinct_rows(matrix)
                local = np.array([seen.setdefault(text, len(seen)) for text in texts])
                numbers[rows] = local[inverse]
        return list(seen), numbers[by_position]

    def _distinct_strings(self, starts: np.ndarray, what: str) -> tuple[list[str], np.ndarray]:
        """As :meth:`_distinct_bytes`, decoded (ManifestError when not UTF-8)."""
        texts, numbers = self._distinct_bytes(starts, what)
        try:
            return [text.decode() for text in texts], numbers
        except UnicodeDecodeError:
            raise self._fail(f"{what} not UTF-8") from None

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
