"""Chunk keys by encoding and the compact index of one array, without a mount."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pytest

from refmount.errors import FetchError, RefsError
from refmount.icechunk.containers import Containers
from refmount.icechunk.index import ArrayIndex, covered_grid
from refmount.icechunk.keys import ChunkKeys
from refmount.icechunk.location import Location, storage
from refmount.icechunk.manifest import INLINE, NATIVE, VIRTUAL, ArrayRefs, ManifestError
from refmount.refs.chunkgrid import GridError, chunk_counts, regular_shape
from refmount.refs.model import Checksum


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
    assert keys.file_names(np.array([21, 23]), (1, 2)) == ["1", "3"]
    flat = ChunkKeys((2, 3), separator=".")
    assert flat.directory("") == () and flat.file_range(()) == (0, 6)
    assert flat.file_names(np.array([0, 5]), ()) == ["c.0.0", "c.1.2"]


def refs(coords: list[list[int]], kinds: list[int], location: list[int], targets: list[str],
         inline: list[bytes], checksums: list[int] | None = None) -> ArrayRefs:  # fmt: skip
    """One manifest's references of an array, as the manifest reader gives them."""
    n = len(kinds)
    return ArrayRefs(
        node_id="N",
        coords=np.array(coords, np.uint32).reshape(n, -1),
        kinds=np.array(kinds, np.uint8),
        checksums=np.array(checksums or [-1] * n, np.int32),
        offsets=np.arange(n, dtype=np.uint64) * 10,
        lengths=np.full(n, 7, np.uint64),
        location=np.array(location, np.int32),
        targets=pa.array(targets, pa.string()),
        inline=inline,
    )


def test_index_sorted_compact_and_joined_across_manifests() -> None:
    etag, date = Checksum(etag="e"), Checksum(last_modified=5)
    first = refs([[1, 1], [0, 0]], [VIRTUAL, INLINE], [0, 0], ["file:///d/a.nc"], [b"inline"],
                 [0, -1])  # fmt: skip
    second = refs([[0, 2], [1, 0], [5, 5]], [NATIVE, VIRTUAL, VIRTUAL], [0, 1, 1],
                  ["CHUNKID", "file:///d/a.nc"], [], [-1, 0, -1])  # fmt: skip
    extents = ((0, 2), (0, 3))  # the second manifest's: chunk [5, 5] is not the array's
    index = ArrayIndex.from_manifests([(first, [etag], ()), (second, [date], extents)], (2, 3))
    assert index.indices.tolist() == [0, 2, 3, 4]
    assert index.kinds.tolist() == [INLINE, NATIVE, VIRTUAL, VIRTUAL]
    assert index.offsets.tolist() == [10, 0, 10, 0]
    assert index.inline_bytes(0) == b"inline"
    assert index.path(1) == "CHUNKID"
    assert index.path(2) == index.path(3) == "file:///d/a.nc"
    assert len(index.paths) == 3  # each manifest's distinct targets once
    assert [index.checksum_of(row) for row in range(4)] == [None, None, date, etag]
    assert index.row(1) is None and index.row(4) == 3
    assert [c.tolist() for c in index.present(1, 4)] == [[2, 3], [7, 7]]


def test_covered_grid_of_manifests_without_extents() -> None:
    """The chunks held, within a part's extents where it has some of the rank."""
    first = refs([[0, 4], [2, 1]], [NATIVE, NATIVE], [0, 0], ["X"], [])
    second = refs([[6, 0], [9, 9]], [NATIVE, NATIVE], [0, 0], ["X"], [])
    parts = [(first, [], ()), (second, [], ((0, 8), (0, 8)))]
    assert covered_grid(parts, 2) == (7, 5)  # [9, 9] lies outside its part's extents
    assert covered_grid([], 3) == (0, 0, 0)
    with pytest.raises(ManifestError, match="3 dimensions in an array of 2"):
        covered_grid([(refs([[0, 0, 0]], [NATIVE], [0], ["X"], []), [], ())], 2)


def test_index_refuses_what_cannot_be() -> None:
    with pytest.raises(ManifestError, match="outside the grid"):
        ArrayIndex.from_manifests([(refs([[2, 0]], [NATIVE], [0], ["X"], []), [], ())], (2, 3))
    twice = refs([[0, 0], [0, 0]], [NATIVE, NATIVE], [0, 1], ["X", "Y"], [])
    with pytest.raises(ManifestError, match="twice"):
        ArrayIndex.from_manifests([(twice, [], ())], (2, 3))


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


@pytest.mark.parametrize(
    ("url", "options", "named"),
    [
        ("gs://bucket/repo", {"token": "cloud"}, "no equivalent for the option token='cloud'"),
        ("az://container/repo", {"credential": "x"}, "no equivalent for the option credential"),
        ("az://container/repo", {}, "no Azure account"),
    ],
)
def test_repository_options_icechunk_cannot_take_are_named(
    url: str, options: dict, named: str
) -> None:
    with pytest.raises(RefsError, match=re.escape(named)):
        storage(Location.of(url), options)


def test_an_abfs_url_names_its_account() -> None:
    made = storage(Location.of("abfs://container@acct.dfs.core.windows.net/repo"), {"anon": True})
    assert "acct" in repr(made) and "container" in repr(made)


def _rect(*dims: object) -> dict:
    return {"name": "rectilinear", "configuration": {"kind": "inline", "chunk_shapes": list(dims)}}


def test_relative_locations_resolve_through_named_containers() -> None:
    """As icechunk 2.3: ``vcc://NAME/PATH`` is NAME's prefix then PATH, authorized as any
    URL; a name no container has is refused, never guessed."""
    allowed = Containers(
        ["file:///data", "s3://bucket/ok/"],
        names={"local": "file:///data", "bucket": "s3://bucket/ok/"},
        local_allowed=True,
    )
    assert allowed.target("vcc://local/a.nc", "k") == "/data/a.nc"
    assert allowed.target("vcc://bucket/x/y.nc", "k") == "s3://bucket/ok/x/y.nc"
    assert allowed.target("file:///data/a.nc", "k") == "/data/a.nc"
    for url in ("vcc://nosuch/a.nc", "vcc://local"):
        with pytest.raises(FetchError, match="names no virtual chunk container"):
            allowed.target(url, "k")
    with pytest.raises(FetchError, match="outside every virtual chunk container"):
        allowed.target("vcc://local/../etc/passwd", "k")
    with pytest.raises(FetchError, match="outside every"):  # the prefix is a directory
        allowed.target("file:///database/x", "k")


@pytest.mark.parametrize(
    ("grid", "shape", "counts", "regular"),
    [
        ({"name": "regular", "configuration": {"chunk_shape": [4, 3]}}, [10, 6], (3, 2), [4, 3]),
        (_rect([[4, 2], 2], [3, 3]), [10, 6], (3, 2), None),
        (_rect([[5, 2]], [3, 3]), [10, 6], (2, 2), [5, 3]),
        (_rect([4, 4, 4], 3), [10, 6], (3, 2), [4, 3]),
        (_rect([2, 5, 3], [6]), [10, 6], (3, 1), None),
        (_rect([[2, 1 << 60]], [6]), [10, 6], (5, 1), [2, 6]),
    ],
)
def test_chunk_grids(grid: dict, shape: list, counts: tuple, regular: list | None) -> None:
    assert chunk_counts(grid, shape) == counts
    assert regular_shape(grid, shape) == regular


@pytest.mark.parametrize(
    "grid",
    [_rect([2, 3], [6]), _rect([[2, 0]], [6]), _rect([[2]], [6]), {"name": "hexagonal"}],
)
def test_chunk_grids_refused(grid: dict) -> None:
    with pytest.raises(GridError):
        chunk_counts(grid, [10, 6])
