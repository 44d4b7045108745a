"""Chunk keys by encoding and the compact index of one array, without a mount."""

from __future__ import annotations

import numpy as np
import pytest

from refmount.errors import FetchError
from refmount.icechunk.containers import Containers
from refmount.icechunk.index import ArrayIndex
from refmount.icechunk.keys import ChunkKeys
from refmount.icechunk.manifest import INLINE, NATIVE, VIRTUAL, ManifestError


@pytest.mark.parametrize(
    ("document", "index", "key"),
    [
        ({}, 5, "c/1/2"),
        ({"chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}}},
         5, "c.1.2"),
        ({"chunk_key_encoding": {"name": "v2"}}, 5, "1.2"),
        ({"chunk_key_encoding": {"name": "v2", "configuration": {"separator": "/"}}}, 5, "1/2"),
    ],
)  # fmt: skip
def test_keys_by_encoding(document: dict, index: int, key: str) -> None:
    keys = ChunkKeys.from_metadata(document, (2, 3))
    assert keys.name(index) == key
    assert keys.parse(key) == index
    for bad in ("c/1/3", "c/01/2", "c/1", "c/1/2/0", "1.2.0", "", "c/+1/2", "c/1/٣"):
        assert keys.parse(bad) is None, bad


def test_rank0_keys() -> None:
    assert ChunkKeys.from_metadata({}, ()).name(0) == "c"
    assert ChunkKeys.from_metadata({}, ()).parse("c") == 0
    assert ChunkKeys.from_metadata({"chunk_key_encoding": {"name": "v2"}}, ()).name(0) == "0"


def test_nested_directories() -> None:
    keys = ChunkKeys((2, 3, 4))
    assert keys.top == "c"
    assert keys.directory("c") == ()
    assert keys.directory("c/1/2") == (1, 2)
    assert keys.directory("c/2") is None  # outside the grid
    assert keys.directory("c/1/2/3") is None  # a chunk, not a directory
    assert keys.file_range((1,)) is None
    assert keys.file_range((1, 2)) == (20, 24)
    assert keys.file_names([21, 23], (1, 2)) == ["1", "3"]
    flat = ChunkKeys((2, 3), separator=".")
    assert flat.directory("") == () and flat.file_range(()) == (0, 6)
    assert flat.file_names([0, 5], ()) == ["c.0.0", "c.1.2"]


def batch(coords: list[list[int]], kinds: list[int], paths: list[str], inline: dict) -> tuple:
    n = len(kinds)
    return (
        np.array(coords, np.uint32).reshape(n, -1),
        np.array(kinds, np.uint8),
        paths,
        np.arange(n, dtype=np.uint64) * 10,
        np.full(n, 7, np.uint64),
        inline,
    )


def test_index_sorted_compact_and_joinable() -> None:
    first = batch([[1, 1], [0, 0]], [VIRTUAL, INLINE], ["file:///d/a.nc", ""], {1: b"inline"})
    second = batch([[0, 2], [1, 0]], [NATIVE, VIRTUAL], ["CHUNKID", "file:///d/a.nc"], {})
    index = ArrayIndex.build([first, second], (2, 3), node_id="N", manifest_ids=("M",))
    assert index.indices.tolist() == [0, 2, 3, 4]
    assert index.kinds.tolist() == [INLINE, NATIVE, VIRTUAL, VIRTUAL]
    assert index.inline_bytes(0) == b"inline"
    assert index.path(1) == "CHUNKID"
    assert index.path(2) == index.path(3) == "file:///d/a.nc"
    assert len(index.paths) == 4  # each distinct path once per batch
    assert index.row(1) is None and index.row(4) == 3
    assert index.present(1, 4).tolist() == [2, 3]
    assert index.rows_of(np.array([[1, 1], [0, 1], [0, 0]])).tolist() == [3, -1, 0]
    assert (index.node_id, index.manifest_ids) == ("N", ("M",))


def test_index_refuses_what_cannot_be() -> None:
    with pytest.raises(ManifestError, match="outside the grid"):
        ArrayIndex.build([batch([[2, 0]], [NATIVE], ["X"], {})], (2, 3))
    with pytest.raises(ManifestError, match="twice"):
        ArrayIndex.build([batch([[0, 0], [0, 0]], [NATIVE, NATIVE], ["X", "Y"], {})], (2, 3))
    with pytest.raises(ManifestError, match="kind"):
        ArrayIndex.build([batch([[0, 0]], [9], ["X"], {})], (2, 3))


def test_containers() -> None:
    allowed = Containers(["file:///data/", "s3://bucket/ok/"], local_allowed=True)
    assert allowed.target("file:///data/a.nc", "k") == "/data/a.nc"
    assert allowed.target("s3://bucket/ok/x", "k") == "s3://bucket/ok/x"
    for url in ("file:///data/../etc/passwd", "s3://bucket/other/x", "https://evil/x"):
        with pytest.raises(FetchError, match="outside every virtual chunk container"):
            allowed.target(url, "k")
    with pytest.raises(FetchError, match="--allow-local"):
        Containers(["file:///data/"], local_allowed=False).target("file:///data/a.nc", "k")
    narrowed = Containers(["s3://bucket/"], narrowed=["s3://bucket/ok/"], local_allowed=False)
    with pytest.raises(FetchError, match="--containers"):
        narrowed.target("s3://bucket/no/x", "k")
    assert narrowed.protocols() == {"s3"}


def test_virtual_refs_carry_the_manifest_checksums(tmp_path) -> None:
    import trio

    from refmount.icechunk import open_repository
    from tests.support.icechunk_repos import build_repository

    built = build_repository(tmp_path)
    refset = open_repository(str(built.root), options={})
    try:
        file_id = trio.run(refset.find_file, "temp/c/0/0/0")
        native_id = trio.run(refset.find_file, "native/c/0/0")
        assert file_id is not None and native_id is not None
        ref = refset.ref(file_id)
        assert ref.url == str(built.netcdf)
        assert ref.checksum is not None and ref.checksum.etag is None
        # VirtualiZarr records "not modified after" a second past the scan
        assert ref.checksum.last_modified >= int(built.netcdf.stat().st_mtime)
        assert refset.ref(native_id).checksum is None
    finally:
        refset.close()
