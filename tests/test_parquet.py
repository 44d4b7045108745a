"""Parquet reference sets (LazyReferenceMapper layout): keys, ids, listings, laziness.

Sets are built for real: with fsspec's ``LazyReferenceMapper`` (what kerchunk's
``refs_to_dataframe`` uses) from a JSON refs dict and key by key, and with pyarrow for
hostile rows.  No zarr.
"""

from __future__ import annotations

import base64
import errno
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import trio
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.reference import LazyReferenceMapper

from refmount.errors import FetchError, RefsError
from refmount.refs.model import Child, Ref
from refmount.refs.parquet import NotLoaded, ParquetRefSet
from refmount.refs.source import is_parquet_refs
from refmount.refs.values import inline_bytes
from refmount.tree import ROOT_INODE, Owner, Tree
from tests.support.parquet_sets import refs_to_parquet, write_record, write_set


class CountingFS(LocalFileSystem):
    """A local filesystem that remembers what was opened and listed."""

    cachable = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opened: list[str] = []
        self.listed: list[str] = []

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        self.opened.append(self._strip_protocol(path))
        return super()._open(path, mode, **kwargs)

    def ls(self, path: str, detail: bool = False, **kwargs: Any) -> Any:
        self.listed.append(self._strip_protocol(path))
        return super().ls(path, detail=detail, **kwargs)


def resolve_in(base: Path) -> Callable[[str], str]:
    """Relative paths are files next to the reference set; URLs stay as written."""
    return lambda path: path if "://" in path else str(base / path)


class CountingResolver:
    def __init__(self, base: Path) -> None:
        self.inner = resolve_in(base)
        self.calls: list[str] = []

    def __call__(self, path: str) -> str:
        self.calls.append(path)
        return self.inner(path)


def file_id(rs: ParquetRefSet, key: str) -> int | None:
    """The file id of a key, its record loaded as a lookup through the mount loads it."""
    return trio.run(rs.find_file, key)


def ref(rs: ParquetRefSet, fid: int) -> Ref:
    return trio.run(rs.file_ref, fid)


def listing(rs: ParquetRefSet, path: str, after: int = -1, limit: int | None = None) -> list[Child]:
    """A whole listing as readdir makes it: ``ensure`` then the entries ``children``
    gives from held records, resumed after the last one until none comes."""
    out: list[Child] = []
    while limit is None or len(out) < limit:
        trio.run(rs.ensure, path, after)
        batch = list(itertools.islice(rs.children(path, after), limit and limit - len(out)))
        if not batch:
            break
        out += batch
        after = batch[-1].cursor
    return out


def zarray(shape: list[int], chunks: list[int], **extra: Any) -> str:
    meta = {
        "shape": shape,
        "chunks": chunks,
        "dtype": "<i2",
        "compressor": None,
        "fill_value": 0,
        "filters": None,
        "order": "C",
        "zarr_format": 2,
        **extra,
    }
    return json.dumps(meta)


def b64(data: bytes) -> str:
    return "base64:" + base64.b64encode(data).decode()


# --- (a) a JSON refs dict converted by LazyReferenceMapper ----------------------------

RECORD_SIZE = 5
X_GRID = (4, 4)  # shape [7, 10], chunks [2, 3]
X_MISSING = {3, 6, 10, 11, 12, 13, 14}  # 10..14 is all of record 2: no file


def build_source(tmp_path: Path) -> dict[str, Any]:
    """A JSON refs dict covering every kind of value, in refmount's key spelling."""
    data = bytes(range(256)) * 8
    (tmp_path / "data.bin").write_bytes(data)
    (tmp_path / "whole.bin").write_bytes(b"whole file contents")
    refs: dict[str, Any] = {
        ".zgroup": '{"zarr_format": 2}',
        ".zattrs": '{"title": "parquet test", "n": 3}',
        "x/.zarray": zarray([7, 10], [2, 3]),
        "x/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["a", "b"]}),
        "s/.zarray": zarray([], []),
        "s/0": b64(b"\x07\x00"),
        "g/.zgroup": '{"zarr_format": 2}',
        "g/sub/.zgroup": '{"zarr_format": 2}',
        "g/sub/y/.zarray": zarray([5], [2]),
        "g/sub/y/0": ["data.bin", 100, 4],
        "g/sub/y/1": ["data.bin", 104, 4],
        "g/sub/y/2": ["s3://bucket/far/away.nc", 7, 9],
        "n/.zarray": zarray([4, 4, 3], [2, 2, 3], dimension_separator="/"),
        "n/0/0/0": ["data.bin", 0, 12],
        "n/0/1/0": b64(b"nested inline"),
        "n/1/1/0": ["whole.bin"],
        "e/.zarray": zarray([0, 5], [1, 5]),
    }
    for index in range(X_GRID[0] * X_GRID[1]):
        if index in X_MISSING:
            continue
        key = f"x/{index // 4}.{index % 4}"
        if index % 4 == 0:
            refs[key] = b64(bytes([index]) * 5)
        elif index % 4 == 1:
            refs[key] = ["whole.bin"]
        elif index == 2:
            refs[key] = "plain text chunk"
        else:
            refs[key] = ["data.bin", 10 * index, 3 + index]
    return refs


def write_converted(refs: dict[str, Any], out: Path) -> None:
    """fsspec cannot write ``/``-separated chunk keys (they split on the last
    ``/``): hand them the same chunk with ``.`` separators, which index identically."""
    spelled = {}
    for key, value in refs.items():
        if key.startswith("n/") and not key.endswith(".zarray"):
            key = "n/" + key[2:].replace("/", ".")
        spelled[key] = value
    refs_to_parquet(spelled, out, record_size=RECORD_SIZE)


def expected_ref(value: Any, key: str, resolve: Callable[[str], str]) -> Ref:
    if isinstance(value, list):
        url = resolve(value[0])
        if len(value) == 1:
            return Ref(url=url)
        return Ref(url=url, offset=value[1], length=value[2])
    if key.rpartition("/")[2].startswith(".z"):
        return Ref(data=inline_bytes(json.loads(value), key))
    return Ref(data=inline_bytes(value, key))


@pytest.fixture
def kc(tmp_path: Path) -> tuple[ParquetRefSet, dict[str, Any], CountingFS, CountingResolver]:
    refs = build_source(tmp_path)
    out = tmp_path / "refs.parq"
    write_converted(refs, out)
    fs = CountingFS()
    resolver = CountingResolver(tmp_path)
    rs = ParquetRefSet.open(fs, str(out), resolve=resolver, mtime=1234.5)
    return rs, refs, fs, resolver


def walk(rs: ParquetRefSet, path: str = "") -> Iterator[tuple[str, Child]]:
    for child in listing(rs, path):
        full = f"{path}/{child.name}" if path else child.name
        yield full, child
        if child.file_id is None:
            yield from walk(rs, full)


def names(rs: ParquetRefSet, path: str, after: int = -1) -> list[str]:
    return [c.name for c in listing(rs, path, after)]


def test_open_reads_only_zmetadata(kc) -> None:
    rs, _, fs, resolver = kc
    assert fs.opened == [f"{rs.root}/.zmetadata"]
    assert fs.listed == []
    assert rs.record_reads == 0 and rs.cached_records == 0 and rs.cache_bytes == 0
    assert resolver.calls == []
    assert rs.mtime == 1234.5
    assert rs.record_size == RECORD_SIZE
    # metadata and directories need no record file either
    assert names(rs, "") == [".zattrs", ".zgroup", ".zmetadata", "e", "g", "n", "s", "x"]
    assert file_id(rs, "x/.zarray") is not None
    assert rs.is_dir("g/sub/y") and rs.is_dir("n/1/0")
    counts = [rs.subdirectory_count(p) for p in ["", "x", "n", "n/0", "n/0/1", "nope"]]
    assert counts == [5, 0, 2, 2, 0, 0]
    assert rs.record_reads == 0 and fs.opened == [f"{rs.root}/.zmetadata"]


def test_directory_listings(kc) -> None:
    rs, _, _, _ = kc
    x_chunks = [f"{i // 4}.{i % 4}" for i in range(16) if i not in X_MISSING]
    assert names(rs, "x") == [".zarray", ".zattrs", *x_chunks]
    assert names(rs, "s") == [".zarray", "0"]
    assert names(rs, "g") == [".zgroup", "sub"]
    assert names(rs, "g/sub") == [".zgroup", "y"]
    assert names(rs, "g/sub/y") == [".zarray", "0", "1", "2"]
    assert names(rs, "e") == [".zarray"]
    # nested: every in-grid index directory, chunk files only when they exist
    assert names(rs, "n") == [".zarray", "0", "1"]
    assert names(rs, "n/0") == ["0", "1"]
    assert names(rs, "n/1") == ["0", "1"]
    assert names(rs, "n/0/0") == ["0"]
    assert names(rs, "n/0/1") == ["0"]
    assert names(rs, "n/1/0") == []
    assert names(rs, "n/1/1") == ["0"]
    for path in ["", "x", "g", "g/sub", "g/sub/y", "n", "n/0", "n/1/1", "e", "s"]:
        subdirs = sum(1 for c in listing(rs, path) if c.file_id is None)
        assert rs.subdirectory_count(path) == subdirs, path
    # not directories
    for path in ["x/0.0", "x/.zarray", "n/0/0/0", "n/2", "n/0/2", "n/00", "nope", "x/0"]:
        assert not rs.is_dir(path), path
        assert list(listing(rs, path)) == []
    for path in ["", "x", "g", "g/sub", "g/sub/y", "n", "n/0", "n/1/1", "e", "s"]:
        assert rs.is_dir(path), path
        assert file_id(rs, path) is None


def test_every_key_matches_the_source(kc, tmp_path: Path) -> None:
    rs, refs, _, resolver = kc
    resolve = resolve_in(tmp_path)
    listed = {path: child.file_id for path, child in walk(rs) if child.file_id is not None}
    assert set(listed) == {*refs, ".zmetadata"}
    for key, value in refs.items():
        fid = file_id(rs, key)
        assert fid is not None, key
        assert listed[key] == fid
        assert rs.key(fid) == key
        assert ref(rs, fid) == expected_ref(value, key, resolve), key
    # resolve ran once per distinct path string
    assert sorted(resolver.calls) == ["data.bin", "s3://bucket/far/away.nc", "whole.bin"]
    assert ref(rs, file_id(rs, "x/0.1")) == Ref(url=str(tmp_path / "whole.bin"), length=None)
    assert ref(rs, file_id(rs, "x/0.2")) == Ref(data=b"plain text chunk")
    assert ref(rs, file_id(rs, "n/1/1/0")) == Ref(url=str(tmp_path / "whole.bin"))
    assert ref(rs, file_id(rs, "g/sub/y/2")) == Ref(
        url="s3://bucket/far/away.nc", offset=7, length=9
    )


def test_file_ids_are_dense_and_invert(kc) -> None:
    rs, refs, _, _ = kc
    meta = sorted(k for k in [*refs, ".zmetadata"] if k.rpartition("/")[2].startswith(".z"))
    assert [file_id(rs, k) for k in meta] == list(range(len(meta)))
    m = len(meta)
    # arrays in sorted name order: e (0 chunks), g/sub/y (3), n (4), s (1), x (16)
    assert file_id(rs, "g/sub/y/0") == m
    assert file_id(rs, "n/0/0/0") == m + 3
    assert file_id(rs, "n/1/1/0") == m + 3 + 3
    assert file_id(rs, "s/0") == m + 7
    assert file_id(rs, "x/0.0") == m + 8
    assert file_id(rs, "x/3.3") == m + 8 + 15
    for fid in range(m + 24):
        key = rs.key(fid)
        if file_id(rs, key) is not None:
            assert file_id(rs, key) == fid
    assert rs.key(m + 8 + 3) == "x/0.3"  # a missing chunk's id still names its key
    for bad in (-1, m + 24, 10**20):
        with pytest.raises(KeyError):
            rs.key(bad)
        with pytest.raises(KeyError):
            ref(rs, bad)
    with pytest.raises(KeyError):
        ref(rs, m + 8 + 3)  # no such chunk


@pytest.mark.parametrize(
    "key",
    [
        "x/1",  # too few indices for a 2-D array
        "x/0.0.0",  # too many
        "x/0.4",  # outside the 4x4 grid
        "x/4.0",
        "x/-0.0",  # sign
        "x/+1.0",
        "x/00.0",  # leading zeros: not canonical, not a file
        "x/0.01",
        "x/ 1.0",
        "x/1.0 ",
        "x/1..0",
        "x/.0",
        "x/0x1.0",
        "x/1_0.0",
        "x/\u0661.0",  # ARABIC-INDIC DIGIT ONE
        "x/" + "9" * 5000 + ".0",
        "x/0.3",  # missing chunk (empty row)
        "x/2.2",  # in a record whose file does not exist
        "x/2.3",
        "x",
        "x/",
        "/x/0.0",
        "x//0.0",
        "s/1",
        "s/0.0",
        "s/00",
        "n/0.0.0",  # the wrong separator for a '/' array
        "n/0/0",
        "n/0/0/1",
        "n/2/0/0",
        "n/1/0/0",  # missing
        "e/0.0",
        "g/sub/y/3",
        "g/sub/0",
        "nope",
        "nope/0",
        ".zmetadata/x",
        "",
    ],
)
def test_not_a_file(kc, key: str) -> None:
    rs, _, _, _ = kc
    assert file_id(rs, key) is None


def test_consolidated_zmetadata(kc) -> None:
    rs, refs, _, _ = kc
    fid = file_id(rs, ".zmetadata")
    data = ref(rs, fid).data
    assert data is not None
    doc = json.loads(data)
    meta_keys = {k for k in refs if k.rpartition("/")[2].startswith(".z")}
    assert doc["zarr_consolidated_format"] == 1
    assert set(doc["metadata"]) == meta_keys
    for key in meta_keys:
        assert doc["metadata"][key] == json.loads(refs[key])
    assert data == json.dumps(doc, separators=(",", ":")).encode()


def test_resume_after_any_cursor(kc) -> None:
    rs, _, _, _ = kc
    for path in ["", "x", "n", "n/0", "n/1/1", "g/sub/y", "s", "e"]:
        full = list(listing(rs, path))
        cursors = [c.cursor for c in full]
        assert cursors == sorted(set(cursors)), path
        for i, child in enumerate(full):
            assert list(listing(rs, path, child.cursor)) == full[i + 1 :], (path, i)
        assert list(listing(rs, path, -1)) == full
    # cursors of an array directory: metadata first, then 2 + chunk index
    assert [c.cursor for c in listing(rs, "x")][:4] == [0, 1, 2, 3]
    assert [c.cursor for c in listing(rs, "x")][-1] == 2 + 15
    # resuming at a cursor that belongs to a missing chunk
    assert names(rs, "x", 2 + 10) == ["3.3"]
    assert names(rs, "x", 2 + 9) == ["3.3"]


def test_resume_does_not_rescan(tmp_path: Path) -> None:
    """Resuming deep in a large directory jumps to the record; every resume agrees with
    one full listing (rows with gaps, batches crossing records)."""
    root = tmp_path / "big"
    n, size = 100_000, 10_000
    write_set(root, {"a/.zarray": zarray([n], [1])}, record_size=size)
    for r in range(n // size):
        rows = range(r * size, (r + 1) * size)
        paths = [None if i % 7 == 3 else "f.bin" for i in rows]
        write_record(root / "a" / f"refs.{r}.parq", paths, list(rows), [1] * size)
    rs = ParquetRefSet.open(LocalFileSystem(), str(root), resolve=str, mtime=0)
    tail = list(listing(rs, "a", 1 + n - 5))
    assert [c.name for c in tail] == ["99996", "99997", "99999"]
    assert rs.record_reads == 1
    full = list(listing(rs, "a"))
    assert rs.record_reads == n // size
    present = [i for i in range(n) if i % 7 != 3]
    assert [c.name for c in full[1:]] == [str(i) for i in present]
    assert [c.cursor for c in full[1:]] == [1 + i for i in present]
    for pos in [*range(0, len(full), 997), len(full) - 1]:
        resumed = listing(rs, "a", full[pos].cursor, limit=300)[:300]
        assert resumed == full[pos + 1 : pos + 301]
    # a cursor of a chunk that does not exist resumes at the next one that does
    assert listing(rs, "a", 1 + 10, limit=1)[0].name == "11"
    assert listing(rs, "a", 1 + 9, limit=1)[0].name == "11"


# --- hostile input ------------------------------------------------------------------


def open_set(root: Path, **kwargs: Any) -> ParquetRefSet:
    kwargs.setdefault("resolve", lambda p: f"memory://{p}")
    return ParquetRefSet.open(LocalFileSystem(), str(root), mtime=0, **kwargs)


@pytest.mark.parametrize(
    ("zmetadata", "message"),
    [
        (b"{not json", ".zmetadata: invalid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"metadata": {}}', "'record_size' must be an integer from 1"),
        (b'{"metadata": {}, "record_size": "10"}', "record_size"),
        (b'{"metadata": {}, "record_size": 0}', "record_size"),
        (b'{"metadata": {}, "record_size": -3}', "record_size"),
        (b'{"metadata": {}, "record_size": true}', "record_size"),
        (b'{"metadata": {}, "record_size": 1.5}', "record_size"),
        (b'{"metadata": {}, "record_size": 2147483648}', "record_size"),
        (b'{"metadata": [], "record_size": 10}', "'metadata' must be a JSON object"),
        (b'{"record_size": 10}', "'metadata' must be a JSON object"),
    ],
)
def test_bad_zmetadata(tmp_path: Path, zmetadata: bytes, message: str) -> None:
    (tmp_path / ".zmetadata").write_bytes(zmetadata)
    with pytest.raises(RefsError, match=message.replace("(", r"\(")):
        open_set(tmp_path)


def test_missing_zmetadata(tmp_path: Path) -> None:
    with pytest.raises(RefsError, match="no such file"):
        open_set(tmp_path)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[1]", "must be a JSON object"),
        ({"shape": [4], "chunks": [0]}, "chunks must be positive"),
        ({"shape": [-1], "chunks": [1]}, "shape must be a list of non-negative integers"),
        ({"shape": [4.0], "chunks": [1]}, "shape must be"),
        ({"shape": [True], "chunks": [1]}, "shape must be"),
        ({"shape": 4, "chunks": [1]}, "shape must be"),
        ({"chunks": [1]}, "shape must be"),
        ({"shape": [4], "chunks": "1"}, "chunks must be"),
        ({"shape": [4, 4], "chunks": [1]}, "different lengths"),
        ({"shape": [4], "chunks": [1], "dimension_separator": "-"}, "dimension_separator"),
    ],
)
def test_bad_zarray(tmp_path: Path, value: Any, message: str) -> None:
    write_set(tmp_path, {".zgroup": {"zarr_format": 2}, "grp/arr/.zarray": value})
    with pytest.raises(RefsError, match=message) as info:
        open_set(tmp_path)
    assert "grp/arr/.zarray" in str(info.value)


@pytest.mark.parametrize("value", [3, None, [1, 2], True])
def test_bad_metadata_value(tmp_path: Path, value: Any) -> None:
    write_set(tmp_path, {"grp/.zattrs": value})
    with pytest.raises(RefsError, match=r"grp/\.zattrs"):
        open_set(tmp_path)


def test_too_many_chunks(tmp_path: Path) -> None:
    write_set(tmp_path, {"big/.zarray": {"shape": [2**40, 2**20], "chunks": [1, 1]}})
    with pytest.raises(RefsError, match=r"big/\.zarray"):
        open_set(tmp_path)


def test_odd_keys_are_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_set(
        tmp_path,
        {
            ".zgroup": {"zarr_format": 2},
            ".zmetadata": {"metadata": {}, "zarr_consolidated_format": 1},  # replaced
            "../evil/.zgroup": {"zarr_format": 2},
            "a//b": "x",
            "/abs": "x",
            "c/./d": "x",
            "nul\0/x": "x",
            "long/" + "n" * 256: "x",
            "arr/.zarray": {"shape": [4], "chunks": [1]},
            "arr/.zattrs": '{"k": "v"}',
            "arr/0": "would collide with a chunk",  # digit names below an array
            "arr/7up": "digit first",
            "arr/sub/.zarray": {"shape": [1], "chunks": [1]},  # array inside an array
            "arr/sub/.zattrs": {},
            "arr/notes": "kept: a plain file in the array directory",
            "clash": "a file that is also a directory",
            "clash/.zgroup": {"zarr_format": 2},
            "text": "not JSON at all",
            "jsontext": '{"a": [1, 2]}',
        },
    )
    with caplog.at_level(logging.WARNING, logger="refmount.refs"):
        rs = open_set(tmp_path)
    assert names(rs, "") == [".zgroup", ".zmetadata", "arr", "clash", "jsontext", "text"]
    assert names(rs, "arr") == [".zarray", ".zattrs", "notes"]
    assert names(rs, "clash") == [".zgroup"]
    assert file_id(rs, "clash") is None and rs.is_dir("clash")
    assert ref(rs, file_id(rs, "text")) == Ref(data=b"not JSON at all")
    assert ref(rs, file_id(rs, "jsontext")) == Ref(data=b'{"a": [1, 2]}')
    assert ref(rs, file_id(rs, "arr/.zattrs")) == Ref(data=b'{"k": "v"}')
    doc = json.loads(ref(rs, file_id(rs, ".zmetadata")).data)
    assert doc == {
        "metadata": {
            ".zgroup": {"zarr_format": 2},
            "arr/.zarray": {"shape": [4], "chunks": [1]},
            "arr/.zattrs": {"k": "v"},
            "arr/notes": "kept: a plain file in the array directory",
            "clash/.zgroup": {"zarr_format": 2},
            "text": "not JSON at all",
            "jsontext": {"a": [1, 2]},
        },
        "zarr_consolidated_format": 1,
    }
    warned = caplog.text
    for key in ["../evil/.zgroup", "a//b", "/abs", "c/./d", "arr/0", "arr/7up", "'clash'"]:
        assert key in warned, key
    assert "skipping array 'arr/sub'" in warned


def test_bad_rows_are_refused_keys(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A row with a path whose reference cannot be served is a key all the same (listed,
    with a size), and its reference is a FetchError naming the key, the record file's row
    and the reason: EIO through the mount, never "no such key" (a fill value)."""

    def resolve(path: str) -> str:
        if path.startswith("/etc"):
            raise RefsError(f"target {path!r} is a local file")
        return f"s3://b/{path}"

    write_set(tmp_path, {"a/.zarray": {"shape": [10], "chunks": [1]}}, record_size=10)
    record = tmp_path / "a" / "refs.0.parq"
    write_record(
        record,
        ["f", "f", "f", "f", "/etc/passwd", "", None, None, "f", "f"],
        [0, -1, 5, 2**63 - 2, 0, 0, 0, 3, 0, 4],
        [4, 4, -5, 10, 4, 4, 0, 3, 0, 0],
        [None, None, None, None, None, None, b"inline", None, None, None],
    )
    with caplog.at_level(logging.WARNING, logger="refmount.refs"):
        rs = open_set(tmp_path, resolve=resolve, record_cache_bytes=0)
        assert names(rs, "a") == [".zarray", "0", "1", "2", "3", "4", "5", "6", "8", "9"]
        for _ in range(3):  # re-read each time: the cache holds nothing
            absent = [file_id(rs, f"a/{i}") is None for i in range(10)]
            assert absent == [i == 7 for i in range(10)]  # neither path nor raw
    assert ref(rs, file_id(rs, "a/0")) == Ref(url="s3://b/f", offset=0, length=4)
    assert ref(rs, file_id(rs, "a/6")) == Ref(data=b"inline")
    assert ref(rs, file_id(rs, "a/8")) == Ref(url="s3://b/f", length=None)
    assert ref(rs, file_id(rs, "a/9")) == Ref(url="s3://b/f", offset=4, length=0)
    reasons = {
        1: "negative offset or size (-1, 4)",
        2: "negative offset or size (5, -5)",
        3: f"offset + size overflows ({2**63 - 2} + 10)",
        4: "target '/etc/passwd' is a local file",
        5: "an empty path",
    }
    for row, reason in reasons.items():
        with pytest.raises(FetchError) as raised:
            ref(rs, file_id(rs, f"a/{row}"))
        assert str(raised.value) == f"a/{row}: row {row} of {record}: {reason}: refused"
        assert raised.value.errno == errno.EIO
    # the size the row claims; 1 byte when it claims none (a read must reach the daemon)
    sizes = {i: rs.file_size(file_id(rs, f"a/{i}")) for i in [0, 1, 2, 3, 4, 5, 6, 8, 9]}
    assert sizes == {0: 4, 1: 4, 2: 1, 3: 10, 4: 4, 5: 4, 6: 6, 8: None, 9: 0}
    rows = [r for r in caplog.records if "their keys are I/O errors" in r.getMessage()]
    assert len(rows) == 1 and "5 rows" in rows[0].getMessage()
    assert sum("/etc/passwd" in r.getMessage() for r in caplog.records) == 1


def test_unreadable_record_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_set(
        tmp_path,
        {
            "garbage/.zarray": {"shape": [2], "chunks": [1]},
            "floats/.zarray": {"shape": [2], "chunks": [1]},
            "textraw/.zarray": {"shape": [2], "chunks": [1]},
            "nopath/.zarray": {"shape": [2], "chunks": [1]},
            "onlyraw/.zarray": {"shape": [2], "chunks": [1]},
            "intraw/.zarray": {"shape": [2], "chunks": [1]},
        },
    )
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "refs.0.parq").write_bytes(b"PAR1 this is not parquet PAR1")
    write_record(tmp_path / "floats" / "refs.0.parq", ["f", "f"], [0.5, 1.0], [1, 1])
    (tmp_path / "textraw").mkdir()
    pq.write_table(
        pa.table({"raw": pa.array(["text raw", None]), "path": ["p", "p"]}),
        tmp_path / "textraw" / "refs.0.parq",
    )
    write_record(tmp_path / "nopath" / "refs.0.parq", None, [1, 2], [3, 4], [b"r", None])
    write_record(tmp_path / "onlyraw" / "refs.0.parq", None, None, None, [None, b"only"])
    (tmp_path / "intraw").mkdir()
    pq.write_table(pa.table({"raw": [1, 2]}), tmp_path / "intraw" / "refs.0.parq")
    with caplog.at_level(logging.WARNING, logger="refmount.refs"):
        rs = open_set(tmp_path)
        for _ in range(2):  # remembered: read and decoded once
            for name in ("garbage", "floats", "intraw"):
                with pytest.raises(FetchError, match=f"{name}/refs.0.parq: unreadable record"):
                    names(rs, name)
                with pytest.raises(FetchError, match="unreadable record"):
                    file_id(rs, f"{name}/0")
    assert rs.record_reads == 3
    assert names(rs, "textraw") == [".zarray", "0", "1"]
    assert ref(rs, file_id(rs, "textraw/0")) == Ref(data=b"text raw")
    # no offset/size columns: a path row is a whole file
    assert ref(rs, file_id(rs, "textraw/1")) == Ref(url="memory://p", length=None)
    assert names(rs, "nopath") == [".zarray", "0"]
    assert names(rs, "onlyraw") == [".zarray", "1"]
    assert ref(rs, file_id(rs, "onlyraw/1")) == Ref(data=b"only")
    unreadable = [r for r in caplog.records if "unreadable record file" in r.getMessage()]
    assert len(unreadable) == 3


def test_several_row_groups_and_plain_strings(tmp_path: Path) -> None:
    """Dictionaries differ per row group; a plain (not dictionary) path column works."""
    write_set(
        tmp_path,
        {"d/.zarray": {"shape": [6], "chunks": [1]}, "p/.zarray": {"shape": [3], "chunks": [1]}},
        record_size=6,
    )
    write_record(
        tmp_path / "d" / "refs.0.parq",
        ["u0", "u1", "u0", "u2", None, "u2"],
        [1, 2, 3, 4, 5, 6],
        [1, 1, 1, 1, 1, 1],
        row_group_size=2,
    )
    (tmp_path / "p").mkdir()
    pq.write_table(
        pa.table({"path": ["a", None, "b"], "offset": [0, 0, 9], "size": [0, 0, 1]}),
        tmp_path / "p" / "refs.0.parq",
    )
    rs = open_set(tmp_path)
    got = {c.name: ref(rs, c.file_id) for c in listing(rs, "d") if not c.name.startswith(".")}
    assert got == {
        "0": Ref(url="memory://u0", offset=1, length=1),
        "1": Ref(url="memory://u1", offset=2, length=1),
        "2": Ref(url="memory://u0", offset=3, length=1),
        "3": Ref(url="memory://u2", offset=4, length=1),
        "5": Ref(url="memory://u2", offset=6, length=1),
    }
    assert names(rs, "p") == [".zarray", "0", "2"]
    assert ref(rs, file_id(rs, "p/2")) == Ref(url="memory://b", offset=9, length=1)


def test_root_array_and_one_dimensional_nested(tmp_path: Path) -> None:
    write_set(
        tmp_path,
        {".zarray": {"shape": [3, 2], "chunks": [1, 1]}, ".zattrs": {}},
        record_size=4,
    )
    # rows 2 and 3 pad the record past the grid's 6 chunks: never served
    write_record(tmp_path / "refs.1.parq", ["u", "u", "u", "u"], [0, 0, 8, 0], [4, 0, 4, 0])
    rs = open_set(tmp_path)
    assert names(rs, "") == [".zarray", ".zattrs", ".zmetadata", "2.0", "2.1"]
    assert file_id(rs, "2.0") == 3 + 4 and rs.key(7) == "2.0"
    assert file_id(rs, "0.0") is None  # record 0 has no file
    assert ref(rs, file_id(rs, "2.1")) == Ref(url="memory://u")

    other = tmp_path / "other"
    write_set(other, {"v/.zarray": {"shape": [3], "chunks": [1], "dimension_separator": "/"}})
    write_record(other / "v" / "refs.0.parq", ["u", None, "u"], [1, 0, 3], [1, 0, 1])
    rs = open_set(other)
    assert names(rs, "v") == [".zarray", "0", "2"]
    assert file_id(rs, "v/2") is not None and not rs.is_dir("v/0")


def test_is_parquet_refs(kc, tmp_path: Path) -> None:
    rs, _, _, _ = kc
    fs = LocalFileSystem()
    assert is_parquet_refs(fs, rs.root)
    assert is_parquet_refs(fs, rs.root + "/")
    (tmp_path / "plain.json").write_text("{}")
    assert not is_parquet_refs(fs, str(tmp_path / "plain.json"))
    assert not is_parquet_refs(fs, str(tmp_path / "x"))  # a directory without .zmetadata
    assert not is_parquet_refs(fs, str(tmp_path / "missing"))


# --- laziness, the LRU and ensure() --------------------------------------------------


def test_records_are_read_lazily(kc) -> None:
    rs, _, fs, _ = kc
    root = rs.root
    assert file_id(rs, "x/0.1") is not None
    assert fs.opened[1:] == [f"{root}/x/refs.0.parq"]
    assert file_id(rs, "x/0.2") is not None  # same record: cached
    assert file_id(rs, "x/2.1") is not None  # record 1
    assert fs.listed == []
    # record 2: no file, and the directory's listing agrees: its chunks do not exist
    assert file_id(rs, "x/2.2") is None
    assert fs.opened[1:] == [f"{root}/x/refs.{r}.parq" for r in (0, 1, 2)]
    assert fs.listed == [f"{root}/x"]
    assert file_id(rs, "x/2.3") is None  # known missing: not tried again
    assert rs.record_reads == 3
    list(listing(rs, "x"))  # the listing is remembered, the missing record skipped
    assert fs.listed == [f"{root}/x"]
    assert fs.opened[-1] == f"{root}/x/refs.3.parq"
    assert rs.record_reads == 4


def test_lru_is_bounded(kc) -> None:
    rs, refs, _, _ = kc
    everything = [(p, c) for p, c in walk(rs)]
    reads = rs.record_reads
    one_record = 0
    for key in ["x/0.0", "x/2.0", "x/3.3", "g/sub/y/0", "n/0/0/0", "s/0"]:  # every record
        alone = ParquetRefSet.open(LocalFileSystem(), rs.root, resolve=str, mtime=0)
        assert file_id(alone, key) is not None
        one_record = max(one_record, alone.cache_bytes)
    assert rs.cache_bytes <= 256 << 20 and rs.cached_records == reads
    list(walk(rs))
    assert rs.record_reads == reads  # all cached

    small = ParquetRefSet.open(
        LocalFileSystem(),
        rs.root,
        resolve=resolve_in(Path(rs.root).parent),
        mtime=0,
        record_cache_bytes=one_record,
    )
    assert [(p, c) for p, c in walk(small)] == everything
    for key in refs:
        assert ref(small, file_id(small, key)) == ref(rs, file_id(rs, key))
        assert small.cache_bytes <= one_record
    assert small.cached_records <= 1 + 2  # one record plus known-missing markers
    assert small.record_reads > reads

    none = ParquetRefSet.open(
        LocalFileSystem(),
        rs.root,
        resolve=resolve_in(Path(rs.root).parent),
        mtime=0,
        record_cache_bytes=0,
    )
    assert [(p, c) for p, c in walk(none)] == everything
    assert none.cache_bytes == 0 and none.cached_records == 0


def test_record_memory_is_compact(tmp_path: Path) -> None:
    """100k rows into a few files cost a few bytes per row, not Python objects."""
    n = 100_000
    write_set(tmp_path, {"a/.zarray": {"shape": [n], "chunks": [1]}}, record_size=n)
    urls = [f"s3://bucket/a/long/prefix/to/the/data/file_{i % 30:02d}.nc" for i in range(n)]
    write_record(tmp_path / "a" / "refs.0.parq", urls, list(range(n)), [100] * n)
    rs = open_set(tmp_path)
    assert file_id(rs, "a/99999") is not None
    assert rs.cached_records == 1
    # int8 codes and int32 offsets per row; one size and "every row served" held once
    assert 5 * n <= rs.cache_bytes < 5 * n + 4096
    assert ref(rs, file_id(rs, "a/31")) == Ref(
        url="memory://s3://bucket/a/long/prefix/to/the/data/file_01.nc", offset=31, length=100
    )


def test_constant_columns_are_held_once(tmp_path: Path) -> None:
    """One data file and one chunk size for every row: only the offsets are per row, and
    every row still reads back exactly."""
    n = 100_000
    write_set(tmp_path, {"a/.zarray": {"shape": [n], "chunks": [1]}}, record_size=n)
    write_record(
        tmp_path / "a" / "refs.0.parq", ["one.nc"] * n, range(0, 4096 * n, 4096), [4096] * n
    )
    rs = open_set(tmp_path)
    for i in (0, 1, 12_345, n - 1):
        assert ref(rs, file_id(rs, f"a/{i}")) == Ref(
            url="memory://one.nc", offset=4096 * i, length=4096
        )
    assert 4 * n <= rs.cache_bytes < 4 * n + 4096  # int32 offsets, nothing else per row
    assert file_id(rs, f"a/{n}") is None


def test_sparse_and_short_records(tmp_path: Path) -> None:
    """A record whose rows are not all served keeps one byte per row to tell which are; a
    record file with fewer rows than the record size serves only the rows it has."""
    n, size = 30_000, 10_000
    write_set(tmp_path, {"a/.zarray": {"shape": [n], "chunks": [1]}}, record_size=size)
    for r in range(3):
        rows = range(r * size, (r + 1) * size if r < 2 else r * size + 10)
        paths = ["f" if r != 1 or i % 3 == 0 else None for i in rows]
        write_record(tmp_path / "a" / f"refs.{r}.parq", paths, list(rows), [7] * len(rows))
    rs = open_set(tmp_path)
    served = [i for i in range(2 * size + 10) if not size <= i < 2 * size or i % 3 == 0]
    assert [c.name for c in listing(rs, "a")][1:] == [str(i) for i in served]
    assert rs.cached_records == 3
    # record 0: int16 offsets; record 1: int16 offsets and a byte per row; record 2: 10 rows
    assert 2 * size + 3 * size < rs.cache_bytes < 2 * size + 3 * size + 4 * 4096
    for i in (0, size - 1, size, size + 1, size + 3, 2 * size - 1, 2 * size + 9, 2 * size + 10):
        expected = Ref(url="memory://f", offset=i, length=7) if i in served else None
        fid = file_id(rs, f"a/{i}")
        assert (None if fid is None else ref(rs, fid)) == expected, i
    with pytest.raises(KeyError):
        ref(rs, file_id(rs, "a/0") + size + 1)


def test_find_file_and_file_ref_load_in_a_thread(kc) -> None:
    """The async lookups load each record once; a file id without a chunk is a KeyError;
    the synchronous lookups then answer from what is held, and never load."""
    rs, refs, fs, resolver = kc
    keys = [*refs, "x/0.3", "x/2.2", "x/4.0", "n/1/0/0", "nope", "x/.zarray"]
    cold = ParquetRefSet.open(fs, rs.root, resolve=resolver, mtime=0)
    with pytest.raises(NotLoaded, match=r"x/0\.0"):
        cold.file_id("x/0.0")
    with pytest.raises(NotLoaded):
        cold.ref(cold.file_id("x/.zarray") + 20)
    assert cold.record_reads == 0

    async def main() -> dict[str, tuple[int | None, Ref | None]]:
        found = {}
        for key in keys:
            fid = await rs.find_file(key)
            found[key] = (fid, None if fid is None else await rs.file_ref(fid))
        with pytest.raises(KeyError):
            await rs.file_ref(rs.file_id("x/0.0") + 3)  # chunk 3 is missing
        return found

    found = trio.run(main)
    # x: records 0 to 3 (2 has no file: tried once, then the directory listed);
    # g/sub/y, n, s: one each
    assert rs.record_reads == 7 and fs.listed == [f"{rs.root}/x"]
    for key in keys:
        assert (rs.file_id(key), None) == (found[key][0], None), key
        if found[key][0] is not None:
            assert rs.ref(found[key][0]) == found[key][1]
    assert found["x/2.2"] == found["x/0.3"] == found["nope"] == (None, None)
    assert found["x/0.1"] == (rs.file_id("x/0.1"), Ref(url=resolver.inner("whole.bin")))
    assert rs.record_reads == 7


def test_a_directory_stat_reads_no_record(kc, tmp_path: Path) -> None:
    """Listing the root and stating every directory (what `ls -l` of the mount does)
    loads no record file; a chunk's stat loads its record, once."""
    rs, _, fs, _ = kc

    async def remote_size(url: str) -> int:
        return 19

    tree = Tree(rs, Owner(0, 0), remote_size)

    async def main() -> None:
        for entry in await tree.listing(ROOT_INODE):
            node = await tree.node(entry.inode)
            assert node.size == (entry.size or 0)
        n = await tree.lookup(ROOT_INODE, "n")
        assert n is not None and (await tree.node(n)).nlink == 4
        n0 = await tree.lookup(n, "0")
        assert n0 is not None and (await tree.node(n0)).nlink == 4
        x = await tree.lookup(ROOT_INODE, "x")
        assert x is not None and (await tree.node(x)).nlink == 2
        assert rs.record_reads == 0
        chunk = await tree.lookup(x, "1.3")  # chunk 7: data.bin, 70, 10
        assert chunk is not None and (await tree.node(chunk)).size == 10
        assert await tree.ref(chunk) == Ref(url=str(tmp_path / "data.bin"), offset=70, length=10)
        assert await tree.lookup(x, "1.3") == chunk
        assert await tree.lookup(x, "1.2") is None  # chunk 6: no row

    trio.run(main)
    assert rs.record_reads == 1 and fs.opened[1:] == [f"{rs.root}/x/refs.1.parq"]


def test_lookups_load_in_a_thread_once(kc) -> None:
    """Concurrent lookups of one record share one load; ensure() loads what a listing
    resumed at a cursor needs, and nothing for metadata or index directories."""
    rs, _, fs, _ = kc
    root = rs.root

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(rs.find_file, "x/2.1")
                nursery.start_soon(rs.find_file, "g/sub/y/1")
        assert rs.record_reads == 2
        await rs.find_file("x/2.1")
        for path in ["x/.zarray", "g", "no/such/thing", "x/9.9", "n", "n/0"]:
            await rs.ensure(path)
        assert rs.record_reads == 2
        # a listing resumed after chunk 9 needs record 3 (record 2 has no file)
        await rs.ensure("x", 2 + 9)
        assert fs.listed == [f"{root}/x"]
        assert fs.opened[-1] == f"{root}/x/refs.3.parq"
        await rs.ensure("n/1/1")
        await rs.ensure("s")

    trio.run(main)
    reads = rs.record_reads
    assert reads == 5
    assert [c.name for c in rs.children("x", 2 + 9)] == ["3.3"]
    assert file_id(rs, "x/2.1") is not None and file_id(rs, "g/sub/y/1") is not None
    assert names(rs, "n/1/1") == ["0"] and names(rs, "s") == [".zarray", "0"]
    assert rs.record_reads == reads


# --- (b) written by fsspec's LazyReferenceMapper key by key -------------------------


class RefMapping(Mapping[str, bytes]):
    """The bytes of every key, as a mount would serve them (local targets only)."""

    def __init__(self, rs: ParquetRefSet) -> None:
        self.rs = rs

    def __getitem__(self, key: str) -> bytes:
        fid = file_id(self.rs, key)
        if fid is None:
            raise KeyError(key)
        found = ref(self.rs, fid)
        if found.data is not None:
            return found.data
        assert found.url is not None
        with open(found.url, "rb") as f:
            f.seek(found.offset)
            return f.read() if found.length is None else f.read(found.length)

    def __iter__(self) -> Iterator[str]:
        return (p for p, c in walk(self.rs) if c.file_id is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def test_lazy_reference_mapper(tmp_path: Path) -> None:
    """A set written by fsspec's own LazyReferenceMapper (sparse records, a scalar, nested
    groups) serves, key by key, the bytes fsspec's reader serves."""
    root = tmp_path / "ref.parquet"
    lz = LazyReferenceMapper.create(str(root), record_size=7)
    lz[".zgroup"] = json.dumps({"zarr_format": 2}).encode()
    lz[".zattrs"] = json.dumps({"about": "lazy"}).encode()
    lz["temp/.zarray"] = zarray([9, 10], [2, 3]).encode()
    lz["scalar/.zarray"] = zarray([], []).encode()
    lz["deep/.zgroup"] = lz["deep/er/.zgroup"] = json.dumps({"zarr_format": 2}).encode()
    lz["deep/er/name/.zarray"] = zarray([1], [1]).encode()
    chunks = {f"temp/{i}.{j}": bytes([i, j]) * 6 for i in range(2) for j in range(4)}
    chunks["temp/4.3"] = b"last"
    chunks["scalar/0"] = b"\x01\x02"
    chunks["deep/er/name/0"] = b"n"
    for key, value in chunks.items():
        lz[key] = value
    lz.flush()

    rs = ParquetRefSet.open(LocalFileSystem(), str(root), resolve=str, mtime=0)
    assert names(rs, "") == [".zattrs", ".zgroup", ".zmetadata", "deep", "scalar", "temp"]
    assert names(rs, "deep/er") == [".zgroup", "name"]
    assert names(rs, "deep/er/name") == [".zarray", "0"]
    assert names(rs, "scalar") == [".zarray", "0"]
    assert names(rs, "temp") == [
        ".zarray",
        *(f"{i}.{j}" for i in range(2) for j in range(4)),
        "4.3",
    ]
    ref_fs = fsspec.filesystem("reference", fo=str(root), remote_protocol="file")
    mapping = RefMapping(rs)
    assert {k for k in mapping if not k.rpartition("/")[2].startswith(".z")} == set(chunks)
    for key in mapping:
        if key == ".zmetadata":
            continue  # fsspec serves the stored file; refmount's is consolidated metadata
        if key.rpartition("/")[2].startswith(".z"):
            assert json.loads(mapping[key]) == json.loads(ref_fs.cat_file(key)), key
        else:
            assert mapping[key] == ref_fs.cat_file(key) == chunks[key], key


# --- store failures: retries, unexpected exception types, deadlines ---------------------


class FaultyFS(LocalFileSystem):
    """Local files whose next opens or listings fail with queued exceptions (of any type,
    as a remote filesystem may raise), or stall for a while."""

    cachable = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.open_faults: list[BaseException] = []
        self.ls_faults: list[BaseException] = []
        self.stall = 0.0
        self.opens = 0

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        self.opens += 1
        time.sleep(self.stall)
        if self.open_faults:
            raise self.open_faults.pop(0)
        return super()._open(path, mode, **kwargs)

    def ls(self, path: str, detail: bool = False, **kwargs: Any) -> Any:
        if self.ls_faults:
            raise self.ls_faults.pop(0)
        return super().ls(path, detail=detail, **kwargs)


def faulty_set(tmp_path: Path, **kwargs: Any) -> tuple[ParquetRefSet, FaultyFS]:
    """Array ``a``: 6 chunks in records of 2, record 1 absent (its chunks do not exist)."""
    root = tmp_path / "faulty.parq"
    write_set(root, {"a/.zarray": zarray([6], [1])}, record_size=2)
    for record in (0, 2):
        write_record(root / "a" / f"refs.{record}.parq", ["f", "f"], [0, 1], [1, 1])
    fs = FaultyFS()
    rs = ParquetRefSet.open(fs, str(root), resolve=str, mtime=0, **kwargs)
    fs.opens = 0  # .zmetadata
    return rs, fs


def test_store_failures_are_retried_then_fetch_errors(tmp_path: Path) -> None:
    rs, fs = faulty_set(tmp_path)
    # fewer failures than attempts, of types no store should raise: retried, then served
    fs.open_faults = [RuntimeError("boom"), KeyError("odd")]
    assert file_id(rs, "a/0") is not None and fs.opens == 3
    # as many failures as attempts: an I/O error for its keys, naming file and cause
    fs.open_faults = [ZeroDivisionError("weird")] * 3
    with pytest.raises(FetchError, match=r"a/refs\.2\.parq: ZeroDivisionError: weird \(3 "):
        file_id(rs, "a/4")
    # not remembered: the next lookup reads again
    assert file_id(rs, "a/5") is not None
    # the store says "no such file" but lists it: gone for now, an I/O error, not absent
    rs, fs2 = faulty_set(tmp_path)
    fs2.open_faults = [FileNotFoundError("gone")] * 3
    with pytest.raises(FetchError, match="no such file, and its directory does not say"):
        file_id(rs, "a/4")
    # absent, and the listing agrees: no such key
    assert file_id(rs, "a/2") is None and file_id(rs, "a/3") is None


def test_a_failing_listing_is_a_fetch_error_until_it_answers(tmp_path: Path) -> None:
    rs, fs = faulty_set(tmp_path)
    fs.ls_faults = [ConnectionResetError("reset")] * 3
    with pytest.raises(FetchError, match=r"listing .*ConnectionResetError: reset"):
        names(rs, "a")
    assert names(rs, "a") == [".zarray", "0", "1", "4", "5"]


def test_a_stalled_load_fails_its_waiters_at_the_deadline_and_is_joined(tmp_path: Path) -> None:
    """A record load that stalls answers every waiter with an I/O error at the deadline;
    lookups meanwhile join the load rather than start another; its result, when it comes,
    is kept."""
    rs, fs = faulty_set(tmp_path, load_timeout=0.5)
    fs.stall = 2.0
    failures: list[float] = []

    async def lookup() -> None:
        started = time.monotonic()
        with pytest.raises(FetchError, match=r"not loaded within 0\.5 s"):
            await rs.find_file("a/0")
        failures.append(time.monotonic() - started)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(lookup)
        await lookup()  # the first load still runs: joined, not restarted
        with trio.fail_after(60):  # ... and then kept, once it comes, however busy the machine
            while rs.cached_records == 0:
                await trio.sleep(0.05)

    trio.run(main)
    # Each waiter was answered by the deadline (its message names it); one load, joined.
    assert len(failures) == 6
    assert fs.opens == 1
    fs.stall = 0.0
    assert file_id(rs, "a/0") is not None and fs.opens == 1


def test_a_listing_loads_records_as_it_goes(tmp_path: Path) -> None:
    """Each resumed listing loads only the records its entries need."""
    root = tmp_path / "wide.parq"
    write_set(root, {"a/.zarray": zarray([10**7], [1])}, record_size=1000)
    for record in range(50):
        write_record(root / "a" / f"refs.{record}.parq", ["f"] * 3, [0, 1, 2], [1] * 3)
    rs = ParquetRefSet.open(LocalFileSystem(), str(root), resolve=str, mtime=0)
    first = listing(rs, "a", limit=4)
    assert [c.name for c in first[:4]] == [".zarray", "0", "1", "2"]
    assert rs.record_reads == 1
    more = listing(rs, "a", first[3].cursor, limit=6)
    assert [c.name for c in more[:6]] == ["1000", "1001", "1002", "2000", "2001", "2002"]
    assert rs.record_reads == 3
    assert len(listing(rs, "a")) == 1 + 150 and rs.record_reads == 50
