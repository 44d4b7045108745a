"""refmount.icechunk.manifest against manifests icechunk 2.3 itself wrote: by hand with
``set_virtual_ref`` (ETag and datetime checksums, native and inline chunks, an array of
more than 1000 refs whose locations icechunk compresses) and through VirtualiZarr, every
reference equal to what icechunk's own iterator gives; and corrupted copies of them,
each a :class:`ManifestError` naming the manifest."""

from __future__ import annotations

import asyncio
import datetime
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import zstandard

from refmount.icechunk.location import Location
from refmount.icechunk.manifest import (
    HEADER_SIZE,
    INLINE,
    NATIVE,
    VIRTUAL,
    ArrayRefs,
    Manifest,
    ManifestError,
    parse_manifest,
)
from refmount.icechunk.repository import Repository, Version
from refmount.icechunk.view import _chunk_keys
from refmount.refs.model import Checksum

icechunk = pytest.importorskip("icechunk")
zarr = pytest.importorskip("zarr")
icechunk.set_logs_filter("error")

WHEN = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
MANY = 1200  # icechunk compresses the locations of an array with >= 1000 refs


def _create(path: Path, sources: Path) -> icechunk.Repository:
    prefix = sources.as_uri() + "/"
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(
        icechunk.VirtualChunkContainer(prefix, icechunk.local_filesystem_store(str(sources)))
    )
    access = {prefix: icechunk.credentials.LocalFileSystemAccess}
    return icechunk.Repository.create(
        icechunk.local_filesystem_storage(str(path)),
        config,
        authorize_virtual_chunk_access=access,
    )


def _manifests(repo_path: Path, repo: icechunk.Repository) -> dict[str, Manifest]:
    """Every manifest of the head of main, parsed, by node path."""
    info = repo.inspect_snapshot(repo.lookup_branch("main"))
    parsed = {}
    for entry in info["manifests"]:
        data = (repo_path / "manifests" / entry["id"]).read_bytes()
        assert len(data) == entry["size_bytes"]
        parsed[entry["id"]] = parse_manifest(data, entry["id"])
    by_path = {}
    for node in info["nodes"]:
        for manifest_ref in node.get("manifest_refs", []):
            by_path[node["path"]] = (parsed[manifest_ref["id"]], node["id"])
    return by_path


def _array(by_path: dict, path: str) -> tuple[Manifest, ArrayRefs]:
    manifest, node_id = by_path[path]
    return manifest, manifest.arrays[node_id]


def _icechunk_columns(repo: icechunk.Repository, path: str) -> tuple[np.ndarray, np.ndarray]:
    """Coordinates and kinds as icechunk's own iterator lists them."""
    store = repo.readonly_session("main").store

    async def collect() -> tuple[np.ndarray, np.ndarray]:
        coords, kinds = [], []
        async for batch in store.array_chunk_iterator(path.lstrip("/")):
            coords.append(batch[0])
            kinds.append(batch[1])
        return np.concatenate(coords), np.concatenate(kinds)

    return asyncio.run(collect())


@pytest.fixture(scope="module")
def by_hand(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, icechunk.Repository]:
    base = tmp_path_factory.mktemp("icechunk-by-hand")
    sources = base / "sources"
    sources.mkdir()
    (sources / "a.bin").write_bytes(bytes(range(256)) * 64)
    repo = _create(base / "repo", sources)
    session = repo.writable_session("main")
    store = session.store
    group = zarr.group(store)
    group.create_array("virt", shape=(6, 4), chunks=(2, 2), dtype="u1", compressors=None)
    group.create_array("many", shape=(MANY,), chunks=(1,), dtype="u1", compressors=None)
    native = group.create_array("native", shape=(8,), chunks=(2,), dtype="u1")
    native[:] = np.arange(8, dtype="u1")  # small chunks: icechunk keeps them inline
    big = group.create_array("big", shape=(4096,), chunks=(2048,), dtype="u1", compressors=None)
    big[:] = np.arange(4096, dtype=np.uint32).astype("u1")  # above the inline threshold
    url = (sources / "a.bin").as_uri()
    store.set_virtual_ref("virt/c/0/0", url, offset=0, length=4, checksum='"etag-one"')
    store.set_virtual_ref("virt/c/0/1", url, offset=4, length=4, checksum=WHEN)
    store.set_virtual_ref("virt/c/1/0", url, offset=8, length=4)
    store.set_virtual_ref("virt/c/2/1", url, offset=12, length=4, checksum='"etag-one"')
    store.set_virtual_ref("virt/c/1/1", url, offset=16, length=4, checksum="etag-two")
    for i in range(MANY):
        stamp = "etag-even" if i % 2 == 0 else WHEN + datetime.timedelta(seconds=i % 3)
        store.set_virtual_ref(f"many/c/{i}", f"{url}?{i}", offset=i, length=1, checksum=stamp)
    session.commit("by hand")
    return base / "repo", repo


def test_virtual_refs_carry_the_checksums_written(by_hand) -> None:
    manifest, refs = _array(_manifests(*by_hand), "/virt")
    assert manifest.writer.startswith("ic-2.")
    assert refs.coords.dtype == np.uint32
    assert refs.coords.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1], [2, 1]]
    assert refs.kinds.tolist() == [VIRTUAL] * 5
    written = [
        Checksum(etag='"etag-one"'),
        Checksum(last_modified=int(WHEN.timestamp())),
        None,
        Checksum(etag="etag-two"),
        Checksum(etag='"etag-one"'),
    ]
    got = [manifest.checksums[i] if i >= 0 else None for i in refs.checksums.tolist()]
    assert got == written
    assert len(set(manifest.checksums)) == len(manifest.checksums)


def test_coordinates_and_kinds_equal_icechunks_iterator(by_hand) -> None:
    repo_path, repo = by_hand
    by_path = _manifests(repo_path, repo)
    for path in ("/virt", "/many", "/native", "/big"):
        _, refs = _array(by_path, path)
        coords, kinds = _icechunk_columns(repo, path)
        assert np.array_equal(refs.coords, coords), path
        assert np.array_equal(refs.kinds, kinds), path
    assert set(_array(by_path, "/native")[1].kinds.tolist()) == {INLINE}
    assert set(_array(by_path, "/big")[1].kinds.tolist()) == {NATIVE}
    assert _array(by_path, "/big")[1].checksums.tolist() == [-1, -1]


def test_compressed_locations_keep_coords_and_checksums(by_hand) -> None:
    repo_path, _ = by_hand
    manifest, refs = _array(_manifests(repo_path, by_hand[1]), "/many")
    raw = (repo_path / "manifests" / manifest.id).read_bytes()
    body = zstandard.ZstdDecompressor().decompressobj().decompress(raw[HEADER_SIZE:])
    assert b"?1199" not in body  # the locations really are stored compressed
    assert refs.coords[:, 0].tolist() == list(range(MANY))
    expected = [
        Checksum(etag="etag-even")
        if i % 2 == 0
        else Checksum(last_modified=int(WHEN.timestamp()) + i % 3)
        for i in range(MANY)
    ]
    assert [manifest.checksums[i] for i in refs.checksums.tolist()] == expected


def test_virtualizarr_records_modification_times(tmp_path: Path) -> None:
    netCDF4 = pytest.importorskip("netCDF4")
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import LocalStore
    from virtualizarr import open_virtual_dataset
    from virtualizarr.parsers import HDFParser

    sources = tmp_path / "sources"
    sources.mkdir()
    path = sources / "t.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("t", 12)
        ds.createDimension("x", 10)
        var = ds.createVariable("temp", "f4", ("t", "x"), zlib=True, chunksizes=(4, 5))
        var[:] = np.arange(120, dtype="f4").reshape(12, 10)
    repo = _create(tmp_path / "repo", sources)
    registry = ObjectStoreRegistry({"file://": LocalStore()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vds = open_virtual_dataset(path.as_uri(), registry=registry, parser=HDFParser())
        session = repo.writable_session("main")
        vds.vz.to_icechunk(session.store, last_updated_at=WHEN)
        session.commit("virtualizarr")
    manifest, refs = _array(_manifests(tmp_path / "repo", repo), "/temp")
    assert refs.coords.tolist() == [[t, x] for t in range(3) for x in range(2)]
    assert refs.kinds.tolist() == [VIRTUAL] * 6
    assert set(refs.checksums.tolist()) == {0}
    assert manifest.checksums == [Checksum(last_modified=int(WHEN.timestamp()))]


def _virt_manifest(by_hand) -> tuple[str, bytes]:
    repo_path, repo = by_hand
    manifest, _ = _array(_manifests(repo_path, repo), "/virt")
    return manifest.id, (repo_path / "manifests" / manifest.id).read_bytes()


def _recompressed(data: bytes, body: bytes) -> bytes:
    return data[:HEADER_SIZE] + zstandard.ZstdCompressor().compress(body)


def test_truncated_manifests_are_refused(by_hand) -> None:
    manifest_id, data = _virt_manifest(by_hand)
    for end in range(len(data)):
        with pytest.raises(ManifestError, match=manifest_id):
            parse_manifest(data[:end], manifest_id)
    body = zstandard.ZstdDecompressor().decompressobj().decompress(data[HEADER_SIZE:])
    for end in range(len(body)):
        with pytest.raises(ManifestError, match=manifest_id):
            parse_manifest(_recompressed(data, body[:end]), manifest_id)


def test_bit_flips_give_a_manifest_error_or_a_manifest(by_hand) -> None:
    """A single-bit flip of the file or of its decompressed FlatBuffer either parses or
    raises ManifestError naming the manifest; never another exception."""
    manifest_id, data = _virt_manifest(by_hand)
    body = zstandard.ZstdDecompressor().decompressobj().decompress(data[HEADER_SIZE:])
    refused = 0
    # every bit of the FlatBuffer; of the compressed file, every third (zstd refuses most)
    cases = ((data, bytes, 3), (body, lambda b: _recompressed(data, b), 1))
    for source, rebuild, step in cases:
        for bit in range(0, len(source) * 8, step):
            flipped = bytearray(source)
            flipped[bit // 8] ^= 1 << (bit % 8)
            try:
                parse_manifest(rebuild(bytes(flipped)), manifest_id)
            except ManifestError as exc:
                assert manifest_id in str(exc)
                refused += 1
    assert refused > len(body) * 8 // 4


def test_header_fields_are_checked(by_hand) -> None:
    manifest_id, data = _virt_manifest(by_hand)
    cases = {
        0: b"X",  # magic
        36: b"\x09",  # spec version
        37: b"\x01",  # file type: a snapshot
        38: b"\x07",  # compression
    }
    for at, value in cases.items():
        with pytest.raises(ManifestError, match=manifest_id):
            parse_manifest(data[:at] + value + data[at + 1 :], manifest_id)
    with pytest.raises(ManifestError, match="holds manifest"):
        parse_manifest(data, "0" * 20)


def test_a_manifest_that_decompresses_beyond_the_bound_is_refused(by_hand) -> None:
    manifest_id, data = _virt_manifest(by_hand)
    body = zstandard.ZstdDecompressor().decompressobj().decompress(data[HEADER_SIZE:])
    huge = _recompressed(data, body + bytes(64 << 20))
    assert len(huge) < 1 << 20
    with pytest.raises(ManifestError, match=f"{manifest_id}.*beyond the bound"):
        parse_manifest(huge, manifest_id, max_decompressed=8 << 20)
    assert parse_manifest(data, manifest_id, max_decompressed=len(body)).id == manifest_id
    with pytest.raises(ManifestError, match="beyond the bound"):
        parse_manifest(data, manifest_id, max_decompressed=len(body) - 1)


def test_frames_without_a_declared_size_or_several_read_the_same(by_hand) -> None:
    manifest_id, data = _virt_manifest(by_hand)
    body = zstandard.ZstdDecompressor().decompressobj().decompress(data[HEADER_SIZE:])
    undeclared = zstandard.ZstdCompressor(write_content_size=False)
    assert zstandard.frame_content_size(undeclared.compress(body)) == -1
    expected = parse_manifest(data, manifest_id)
    variants = {
        "undeclared": data[:HEADER_SIZE] + undeclared.compress(body),
        "two frames": _recompressed(data, body[:100])
        + zstandard.ZstdCompressor().compress(body[100:]),
    }
    for name, variant in variants.items():
        got = parse_manifest(variant, manifest_id)
        assert got.checksums == expected.checksums, name
        for node_id, refs in expected.arrays.items():
            assert np.array_equal(got.arrays[node_id].coords, refs.coords), name
            assert np.array_equal(got.arrays[node_id].checksums, refs.checksums), name
    endless = data[:HEADER_SIZE] + undeclared.compress(body + bytes(64 << 20))
    with pytest.raises(ManifestError, match="beyond the bound"):
        parse_manifest(endless, manifest_id, max_decompressed=8 << 20)


def _arrays_sharing_refs(body: bytes, copies: int) -> bytes:
    """The FlatBuffer ``body`` (one array) made hostile: a new root listing ``copies``
    arrays of distinct node ids that all point at the first array's refs (and at the
    first root's dictionary of compressed locations).  The new tables
    go in front of the old ones (every uoffset points forward); the old bytes move by a
    multiple of 8 and keep their alignment and relative offsets."""

    def u32(at: int) -> int:
        return struct.unpack_from("<I", body, at)[0]

    def field(table: int, slot: int) -> int:
        vtable = table - struct.unpack_from("<i", body, table)[0]
        return table + struct.unpack_from("<H", body, vtable + 4 + 2 * slot)[0]

    root = u32(0)
    root_vtable = root - struct.unpack_from("<i", body, root)[0]
    root_size = struct.unpack_from("<H", body, root_vtable + 2)[0]
    arrays = field(root, 1) + u32(field(root, 1))
    array = arrays + 4 + u32(arrays + 4)
    array_vtable = array - struct.unpack_from("<i", body, array)[0]
    array_size = struct.unpack_from("<H", body, array_vtable + 2)[0]
    node_at, refs_at = field(array, 0) - array, field(array, 1) - array
    refs = array + refs_at + u32(array + refs_at)

    def align(n: int) -> int:
        return -(-n // 8) * 8

    new_root = 8
    vector = align(new_root + root_size)
    tables = align(vector + 4 + 4 * copies)
    table_room = align(array_size)
    shift = align(tables + table_room * copies - 4)  # old position p moves to p + shift
    out = bytearray(4 + shift) + body[4:]
    out[new_root : new_root + root_size] = body[root : root + root_size]
    struct.pack_into("<i", out, new_root, new_root - (root_vtable + shift))
    struct.pack_into("<I", out, 0, new_root)
    arrays_field = new_root + field(root, 1) - root
    struct.pack_into("<I", out, arrays_field, vector - arrays_field)
    struct.pack_into("<I", out, vector, copies)
    dictionary = field(root, 2)  # the locations' dictionary, when the root has one
    if dictionary != root:
        moved = new_root + dictionary - root
        struct.pack_into("<I", out, moved, dictionary + u32(dictionary) + shift - moved)
    for k in range(copies):
        table = tables + table_room * k
        out[table : table + array_size] = body[array : array + array_size]
        struct.pack_into("<i", out, table, table - (array_vtable + shift))
        out[table + node_at : table + node_at + 8] = k.to_bytes(8, "big")
        struct.pack_into("<I", out, table + refs_at, refs + shift - (table + refs_at))
        struct.pack_into("<I", out, vector + 4 + 4 * k, table - (vector + 4 + 4 * k))
    return bytes(out)


def test_arrays_sharing_one_refs_vector_are_refused_not_reread(by_hand) -> None:
    """Many arrays pointing at the same (large) refs: work quadratic in the file's size
    unless refused; refused once their refs claim more bytes than the manifest holds."""
    repo_path, repo = by_hand
    manifest, _ = _array(_manifests(repo_path, repo), "/many")
    data = (repo_path / "manifests" / manifest.id).read_bytes()
    body = zstandard.ZstdDecompressor().decompressobj().decompress(data[HEADER_SIZE:])
    two = parse_manifest(_recompressed(data, _arrays_sharing_refs(body, 2)), manifest.id)
    assert [len(refs.coords) for refs in two.arrays.values()] == [MANY, MANY]  # a fair copy
    hostile = _recompressed(data, _arrays_sharing_refs(body, 5000))
    with pytest.raises(ManifestError, match=f"{manifest.id}.*more than the manifest holds"):
        parse_manifest(hostile, manifest.id)


def _icechunk_references(repo: icechunk.Repository, path: str) -> list[tuple]:
    """Every reference of an array as icechunk's own iterator gives it: (coordinates,
    kind, native chunk id or URL, offset, length, inline bytes)."""
    store = repo.readonly_session("main").store

    async def collect() -> list[tuple]:
        rows = []
        async for coords, kinds, paths, offsets, lengths, inline in store.array_chunk_iterator(
            path.lstrip("/")
        ):
            for i, kind in enumerate(kinds.tolist()):
                target = paths[i] if kind != INLINE else None
                rows.append((tuple(coords[i].tolist()), kind, target, int(offsets[i]),
                             int(lengths[i]), inline.get(i)))  # fmt: skip
        return rows

    return asyncio.run(collect())


def _refmount_references(refs: ArrayRefs) -> list[tuple]:
    rows = []
    for i, kind in enumerate(refs.kinds.tolist()):
        at = int(refs.location[i])
        target = refs.targets[at].as_py() if kind != INLINE else None
        data = refs.inline[at] if kind == INLINE else None
        coords = tuple(refs.coords[i].tolist())
        rows.append((coords, kind, target, int(refs.offsets[i]), int(refs.lengths[i]), data))
    return rows


def test_every_reference_equals_icechunks_iterator(by_hand) -> None:
    """Key, kind, chunk id or URL, offset, length and inline bytes of every reference of
    arrays of virtual (plain and compressed locations), native and inline chunks."""
    repo_path, repo = by_hand
    by_path = _manifests(repo_path, repo)
    kinds_seen: set[int] = set()
    for path in ("/virt", "/many", "/native", "/big"):
        _, refs = _array(by_path, path)
        expected = _icechunk_references(repo, path)
        got = _refmount_references(refs)
        assert got == expected, path
        kinds_seen.update(refs.kinds.tolist())
    assert kinds_seen == {NATIVE, VIRTUAL, INLINE}
    _, many = _array(by_path, "/many")
    assert len(many.targets) == MANY  # each compressed URL decompressed once, all distinct


def test_every_key_of_the_mounted_index_equals_icechunks_iterator(by_hand) -> None:
    """What a mount serves: the index ``Repository.array_index`` builds, named by chunk
    key, against icechunk's iterator for every array of the repository."""
    repo_path, repo = by_hand
    opened = Repository(Location.of(str(repo_path)), {}, Version(), 60)
    try:
        nodes, _ = opened.nodes()
        arrays = [node for node in nodes if node.is_array]
        assert {node.path for node in arrays} == {"virt", "many", "native", "big"}
        for node in arrays:
            keys, _, refused = _chunk_keys(node)
            assert refused is None, refused
            index = opened.array_index(node, keys.grid)
            got = {}
            for row, chunk in enumerate(index.indices.tolist()):
                kind = int(index.kinds[row])
                target = index.path(row) if kind != INLINE else index.inline_bytes(row)
                got[keys.name(chunk)] = (kind, target, int(index.offsets[row]),
                                         int(index.lengths[row]))  # fmt: skip
            expected = {}
            for coords, kind, target, offset, length, data in _icechunk_references(repo, node.path):
                key = "c/" + "/".join(map(str, coords))
                expected[key] = (kind, target if kind != INLINE else data, offset, length)
            assert got == expected, node.path
    finally:
        opened.close()


def test_bit_flips_in_compressed_locations_give_a_manifest_error_or_a_manifest(by_hand) -> None:
    """The same for the manifest whose URLs are zstd-compressed with its dictionary (a
    sample of its bits: every one would take minutes): a flip in the dictionary or in a
    compressed URL is a ManifestError naming the manifest, or decodes."""
    repo_path, repo = by_hand
    manifest, _ = _array(_manifests(repo_path, repo), "/many")
    data = (repo_path / "manifests" / manifest.id).read_bytes()
    body = zstandard.ZstdDecompressor().decompressobj().decompress(data[HEADER_SIZE:])
    refused = 0
    for bit in range(0, len(body) * 8, 503):
        flipped = bytearray(body)
        flipped[bit // 8] ^= 1 << (bit % 8)
        try:
            parse_manifest(_recompressed(data, bytes(flipped)), manifest.id)
        except ManifestError as exc:
            assert manifest.id in str(exc)
            refused += 1
    assert refused > 0
