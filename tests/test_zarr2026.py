"""What 2026's writers make reads exactly through both views (issue 29): zarr 3.4's
``float16``, ``scale_offset``/``cast_value``, ``jenkins_lookup3``, ``transpose`` of any
order, ``complex64`` and rectilinear chunk grids; Icechunk's relative ``vcc://``
locations; VirtualiZarr's NaN fill value.  Each read through a real mount by zarr 3 (the
raw view) and by zarr, Debian's ncdump and GDAL 3.6 (``--decode``).

A chunk refmount cannot serve is EIO when read, never an absent key: zarr and GDAL read
an absent key as fill values, and a reader would print them with exit status 0.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec

from refmount.decode.v3.shards import GROUP
from tests.support import reader_runs
from tests.support.reader_datasets import write_datasets
from tests.support.reader_runs import EQUAL
from tests.support.servers import RangeServer
from tests.support.v3_2026 import (
    LEFT_OUT,
    codec_store,
    manifest_ids,
    open_authorized,
    relative_repository,
    unknown_grid_repository,
    unserved_keys_repository,
)
from tests.support.v3_sets import icechunk_refs, store_refs, write_refs

RECTILINEAR = {"array.rectilinear_chunks": True}


@pytest.fixture(scope="module")
def codecs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    directory = tmp_path_factory.mktemp("codecs2026")
    values = codec_store(directory / "store.zarr")
    return write_refs(store_refs(directory / "store.zarr"), directory / "refs.json"), values


@pytest.fixture(scope="module")
def relative(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    directory = tmp_path_factory.mktemp("vcc")
    values = relative_repository(directory / "repo", directory / "data")
    return directory / "repo", directory / "data", values


def zarr3_raw(mnt: Path, name: str) -> np.ndarray:
    with warnings.catch_warnings(), zarr.config.set(RECTILINEAR):
        warnings.simplefilter("ignore")
        return zarr.open_array(mnt / name, mode="r", zarr_format=3)[...]


# -- the raw view ---------------------------------------------------------------------------


def test_raw_view_reads_every_array_zarr3_wrote(codecs, mount) -> None:
    refs, values = codecs
    m = mount(refs)
    for name, expected in values.items():
        np.testing.assert_array_equal(zarr3_raw(m.mountpoint, name), expected, err_msg=name)


def test_relative_locations_and_rectilinear_grid_read_as_icechunk_reads(relative, mount) -> None:
    root, data, values = relative
    m = mount(root)
    with zarr.config.set(RECTILINEAR):
        session = open_authorized(root, data).readonly_session("main")
        group = zarr.open_group(session.store, mode="r")
        for name, expected in values.items():
            np.testing.assert_array_equal(group[name][...], expected, err_msg=name)
            np.testing.assert_array_equal(zarr3_raw(m.mountpoint, name), expected, err_msg=name)
    assert sorted(os.listdir(m.mountpoint / "rectilinear/c")) == ["0", "1", "2"]
    assert (m.mountpoint / "relative/c/3").read_bytes() == values["relative"][30:].tobytes()


def test_a_chunk_that_cannot_be_served_is_eio_at_read_never_absent(relative, mount) -> None:
    """``unnamed/c/0`` is a key of the repository whose location names no container:
    it exists (stat, listing), and reading it is EIO, in both views; readers fail."""
    root, _, _ = relative
    raw, decoded = mount(root), mount(root, "--decode")
    for m, key in ((raw, "unnamed/c/0"), (decoded, "unnamed/0")):
        chunk = m.mountpoint / key
        assert chunk.stat().st_size == 40, key
        assert chunk.name in os.listdir(chunk.parent)
        with pytest.raises(OSError) as raised:
            chunk.read_bytes()
        assert raised.value.errno == errno.EIO, key
    assert "names no virtual chunk container" in raw.log()
    with pytest.raises(OSError) as raised:
        zarr3_raw(raw.mountpoint, "unnamed")
    assert raised.value.errno == errno.EIO
    expected = np.full(10, -1, dtype="i4")  # what a silent fill would read
    for reader in (reader_runs.gdalmdiminfo, reader_runs.zarr3):
        outcome = reader(decoded.mountpoint, "unnamed", expected)
        assert outcome.kind == "refused", (reader.__name__, outcome)
    outcome = reader_runs.ncdump(decoded.mountpoint, "unnamed", expected, -1)
    assert outcome.kind == "refused", outcome


def test_a_grid_refmount_cannot_read_serves_the_manifests_keys(tmp_path: Path, mount) -> None:
    """A chunk grid neither regular nor rectilinear (a name icechunk 2.3 does not write):
    the raw view serves every key the manifest holds, exact bytes (the reader knows its
    grid; zarr 3 refuses the name rather than reading fill values); ``--decode`` leaves
    the array out and names it."""
    stored = unknown_grid_repository(tmp_path / "repo")
    m = mount(tmp_path / "repo")
    odd = m.mountpoint / "odd"
    assert sorted(os.listdir(odd / "c")) == ["0", "1", "2"]
    for i in range(3):
        chunk = odd / "c" / str(i) / "0"
        assert os.listdir(chunk.parent) == ["0"]
        assert chunk.stat().st_size == 96
        assert chunk.read_bytes() == stored[4 * i : 4 * i + 4].tobytes(), i
    assert json.loads((odd / "zarr.json").read_bytes())["chunk_grid"]["name"] == "Regular"
    with pytest.raises(ValueError, match="chunk grid"):
        zarr3_raw(m.mountpoint, "odd")
    decoded = mount(tmp_path / "repo", "--decode")
    assert "odd" not in os.listdir(decoded.mountpoint)
    assert "'Regular'" in decoded.log()


def lookup_errno(path: Path) -> int | None:
    """The errno a ``stat`` of ``path`` answers (None: it exists)."""
    try:
        path.stat()
    except OSError as exc:
        return exc.errno
    return None


def icechunk_chunk(root: Path, key: str) -> bytes | None:
    """What icechunk 2.3 itself reads at ``key`` on ``main`` (None: absent)."""
    import asyncio

    from zarr.core.buffer import default_buffer_prototype

    store = open_authorized(root, root).readonly_session("main").store
    found = asyncio.run(store.get(key, default_buffer_prototype()))
    return None if found is None else found.to_bytes()


def test_manifests_without_extents_serve_the_chunks_they_hold(tmp_path: Path, mount) -> None:
    """An unknown grid whose manifest gives no extents (a snapshot no icechunk writes:
    rewritten): its keys are the chunks the manifest holds, read on the first lookup
    under the array, not at the mount's start; the bytes icechunk reads; a key beyond
    them is absent, as icechunk says."""
    root = tmp_path / "repo"
    stored = unknown_grid_repository(root, extents=False)
    m = mount(root, "--log-level", "INFO")
    odd = m.mountpoint / "odd"
    assert sorted(os.listdir(odd)) == ["c", "zarr.json"]
    assert json.loads((odd / "zarr.json").read_bytes())["chunk_grid"]["name"] == "Regular"
    assert "chunk references" not in m.log()  # not read yet
    assert sorted(os.listdir(odd / "c")) == ["0", "1", "2"]
    assert "odd: 3 chunk references" in m.log() and "on a grid of [3, 1]" in m.log()
    for i in range(3):
        chunk = odd / "c" / str(i) / "0"
        assert os.listdir(chunk.parent) == ["0"]
        assert chunk.stat().st_size == 96
        expected = stored[4 * i : 4 * i + 4].tobytes()
        assert icechunk_chunk(root, f"odd/c/{i}/0") == expected
        printed = subprocess.run(["cat", str(chunk)], capture_output=True, check=True).stdout
        assert printed == expected, i
    for i, values in enumerate(([100, 101], [102, 103], [104, 0])):  # ids beside odd's
        assert (m.mountpoint / f"plain/c/{i}").read_bytes() == np.array(values, "<i4").tobytes()
    for absent in ("c/3", "c/0/1", "c/3/0", "c/x", "c.0.0", ".zattrs"):
        assert lookup_errno(odd / absent) == errno.ENOENT, absent
        if absent.count("/") == 2:
            assert icechunk_chunk(root, f"odd/{absent}") is None, absent
    decoded = mount(root, "--decode")
    listed = os.listdir(decoded.mountpoint)
    assert "plain" in listed and "odd" not in listed, listed


def test_unreadable_manifests_without_extents_are_eio_never_absent(tmp_path: Path, mount) -> None:
    """The same array whose manifest is gone: its ``zarr.json`` is served, every key it
    might have (what zarr's default key encoding makes of its rank) is EIO, the listing
    of its keys too; only what cannot be one of its keys is absent."""
    root = tmp_path / "repo"
    unknown_grid_repository(root, extents=False)
    for manifest in (root / "manifests").iterdir():
        manifest.unlink()
    m = mount(root)
    odd = m.mountpoint / "odd"
    assert json.loads((odd / "zarr.json").read_bytes())["shape"] == [10, 6]
    assert sorted(os.listdir(odd)) == ["c", "zarr.json"]
    with pytest.raises(OSError) as raised:
        os.listdir(odd / "c")
    assert raised.value.errno == errno.EIO
    for key in ("c/0", "c/0/0", "c/2/0", "c/7/9", "c/99/0", "c/0/0/0"):  # c/...: EIO
        assert lookup_errno(odd / key) == errno.EIO, key
    for key in ("c.0.0", ".zattrs", "0.0", "d"):
        assert lookup_errno(odd / key) == errno.ENOENT, key
    assert "odd: cannot read its manifest" in m.log()
    done = subprocess.run(["cat", str(odd / "c/1/0")], capture_output=True, text=True)
    assert done.returncode and "Input/output error" in done.stderr, done


def test_an_array_whose_keys_cannot_be_served_is_eio_never_absent(tmp_path: Path, mount) -> None:
    """An array over the mount's file ids (``big``: 2**40 keys) and one whose key
    encoding refmount does not know (``odd``): their ``zarr.json`` is served, every key
    they might have is EIO (zarr fails, where it read ``big`` as fill values), what
    cannot be one of their keys absent; one warning each at mount, one at the first
    failed lookup, none per lookup after; the decoded view the same."""
    root = tmp_path / "repo"
    values = unserved_keys_repository(root)
    m = mount(root)
    big, odd = m.mountpoint / "big", m.mountpoint / "odd"
    assert json.loads((big / "zarr.json").read_bytes())["shape"] == [1 << 20, 1 << 20]
    assert json.loads((odd / "zarr.json").read_bytes())["shape"] == [4, 4]
    eio = ["big/c/0/0", "big/c/5/9", "big/c/1/1", "big/c/0", "odd/c/0/0", "odd/c/1/1", "odd/c/9/9"]
    absent = ["big/.zattrs", "big/c/x", "big/c.0.0", "big/c/1048576/0", "odd/.zarray", "odd/c/x"]
    for key in eio:
        assert lookup_errno(m.mountpoint / key) == errno.EIO, key
    for key in absent:
        assert lookup_errno(m.mountpoint / key) == errno.ENOENT, key
    warned = {name: m.log().count(f"{name}: ") for name in ("big", "odd")}
    assert warned == {"big": 2, "odd": 2}, m.log()  # at mount, at the first lookup
    assert "big: too many chunks (1,099,511,627,776)" in m.log()
    assert "odd: its chunk keys cannot be read (unknown chunk_key_encoding 'Default')" in m.log()
    for _ in range(3):
        for key in eio:
            assert lookup_errno(m.mountpoint / key) == errno.EIO, key
    assert {name: m.log().count(f"{name}: ") for name in ("big", "odd")} == warned
    with pytest.raises(OSError) as raised:
        os.listdir(big / "c")
    assert raised.value.errno == errno.EIO
    done = subprocess.run(["cat", str(big / "c/5/9")], capture_output=True, text=True)
    assert done.returncode and "Input/output error" in done.stderr, done
    with pytest.raises(OSError) as raised:
        zarr.open_array(big, mode="r")[0:6, 9]
    assert raised.value.errno == errno.EIO
    np.testing.assert_array_equal(zarr.open_array(m.mountpoint / "plain", mode="r")[...],
                                  values["plain"])  # fmt: skip
    decoded = mount(root, "--decode")
    assert json.loads((decoded.mountpoint / "big/.zarray").read_bytes())["chunks"] == [1, 1]
    for key in ("big/0/0", "big/5/9", "big/1/1"):
        assert lookup_errno(decoded.mountpoint / key) == errno.EIO, key
    assert lookup_errno(decoded.mountpoint / "big/x") == errno.ENOENT
    with pytest.raises(OSError) as raised:
        zarr.open_array(decoded.mountpoint / "big", mode="r", zarr_format=2)[0:6, 9]
    assert raised.value.errno == errno.EIO


def manifest_requests(server: RangeServer, manifest: str) -> int:
    return sum(1 for path, _, _ in server.stats()["ranges"] if path.endswith(manifest))


def test_a_failed_index_is_remembered_not_read_per_lookup(tmp_path: Path, mount) -> None:
    """Over HTTP, ``plain``'s manifest corrupt (a hostile repository) and ``odd``'s
    answering 503 (a store failing): each lookup under either is EIO, its manifest read
    once (counted on the server) and not again within the back-off, however many look."""
    www = tmp_path / "www"
    unknown_grid_repository(www / "repo", extents=False)
    manifests = manifest_ids(www / "repo")
    corrupt = www / "repo/manifests" / manifests["plain"]
    data = bytearray(corrupt.read_bytes())
    data[60:] = bytes(len(data) - 60)
    corrupt.write_bytes(bytes(data))
    with RangeServer(www) as server:
        server.fault(f"/repo/manifests/{manifests['odd']}", "503", count=-1)
        m = mount(f"{server.url}/repo", "--log-level", "INFO")
        keys = ["plain/c/0", "plain/c/2", "odd/c/0/0", "odd/c/2/0"]
        for key in keys:
            assert lookup_errno(m.mountpoint / key) == errno.EIO, key
        assert manifest_requests(server, manifests["plain"]) == 1
        asked = server.stats()["requests"]
        for _ in range(5):
            for key in keys:
                assert lookup_errno(m.mountpoint / key) == errno.EIO, key
            for directory in ("plain/c", "odd/c"):
                with pytest.raises(OSError) as raised:
                    os.listdir(m.mountpoint / directory)
                assert raised.value.errno == errno.EIO
        assert server.stats()["requests"] == asked  # neither manifest asked again
        assert manifest_requests(server, manifests["plain"]) == 1
    log = m.log()
    assert log.count("(tried again after 30 s)") == 2, log
    assert f"plain: its manifest is unusable: manifest {manifests['plain']}" in log
    assert "odd: cannot read its manifest" in log


# -- the decoded view -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def decoded_codecs(codecs, tmp_path_factory: pytest.TempPathFactory):
    from tests.support.mounting import Mounted

    directory = tmp_path_factory.mktemp("mnt2026")
    (directory / "mnt").mkdir()
    m = Mounted(codecs[0], directory / "mnt", ["--decode"], directory / "refmount.log")
    try:
        yield m.mountpoint, codecs[1]
    finally:
        m.stop()


READERS = {
    "zarr": reader_runs.zarr3,
    "gdalmdiminfo": reader_runs.gdalmdiminfo,
    "ncdump": lambda mnt, name, values: reader_runs.ncdump(mnt, name, values, 0),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_decoded_view_reads_exactly_what_it_serves(decoded_codecs, reader: str) -> None:
    mnt, values = decoded_codecs
    present = set(os.listdir(mnt))
    assert present >= set(values) - LEFT_OUT
    assert not present & LEFT_OUT
    outcomes = {name: READERS[reader](mnt, name, values[name]) for name in sorted(present - {
        ".zattrs", ".zgroup", ".zmetadata"})}  # fmt: skip
    assert outcomes == dict.fromkeys(outcomes, EQUAL), outcomes


def test_decoded_metadata_of_new_codecs(decoded_codecs) -> None:
    mnt, _ = decoded_codecs
    half = json.loads((mnt / "half/.zarray").read_text())
    assert (half["dtype"], half["compressor"], half["filters"]) == ("<f4", None, None)
    packed = json.loads((mnt / "packed/.zarray").read_text())
    assert (packed["dtype"], packed["filters"], packed["order"]) == ("<f8", None, "C")
    assert (mnt / "transposed/0/0/0").stat().st_size == 2 * 3 * 4 * 2
    assert (mnt / "half/0/0").stat().st_size == 2 * 4 * 4
    failure, printed = reader_runs.ncdump_whole(mnt)  # a float16 variable hid every other
    assert failure is None, failure
    assert re.search(r"^\tfloat half\(", printed, re.M), printed[:2000]


def test_check_names_what_decode_leaves_out(codecs) -> None:
    reader_runs.assert_check_names(codecs[0], LEFT_OUT)


def test_decoded_repository_leaves_the_irregular_grid_out(relative, mount) -> None:
    root, _, values = relative
    m = mount(root, "--decode")
    assert "rectilinear" not in os.listdir(m.mountpoint)
    assert "rectilinear" in m.log() and "irregular" in m.log()
    for reader in (reader_runs.gdalmdiminfo, reader_runs.zarr3):
        assert reader(m.mountpoint, "relative", values["relative"]) == EQUAL


def test_a_nan_fill_value_is_a_float_fill_value(tmp_path: Path, mount) -> None:
    """VirtualiZarr writes netCDF's NaN ``_FillValue`` into the repository's attributes;
    the decoded view leaves it to ``fill_value`` ("NaN"), as for kerchunk sets, so
    netCDF-C sees no text attribute "NaN" on a float variable."""
    dataset = {d.name: d for d in write_datasets(tmp_path / "data")}["cf"]
    icechunk_refs(dataset, tmp_path / "repo")
    m = mount(tmp_path / "repo", "--decode")
    attributes = json.loads((m.mountpoint / "nanfill/.zattrs").read_text())
    assert "_FillValue" not in attributes
    assert json.loads((m.mountpoint / "nanfill/.zarray").read_text())["fill_value"] == "NaN"
    header = reader_runs.run(["ncdump", "-h", f"file://{m.mountpoint}#mode=zarr,file"])
    assert header.returncode == 0, header.stderr
    assert re.search(r"^\tfloat nanfill\(y, x\) ;", header.stdout, re.M), header.stdout
    assert "nanfill:_FillValue" not in header.stdout  # the text "NaN" was a char attribute


# -- sharded arrays by the inner chunk ------------------------------------------------------


def test_one_inner_chunk_fetches_its_index_and_its_range_only(
    http, http_root: Path, mount, tmp_path: Path
) -> None:
    """A 64 x 64 float64 shard of 64 inner chunks (zstd) over HTTP: one inner chunk read
    cold through ``--decode`` fetches at most 2 x (its bytes + the index), counted by the
    server; its shard's next inner chunks fetch no index again, and come in runs."""
    values = np.random.default_rng(5).normal(size=(64, 64))
    store = http_root / "sharded2026.zarr"
    array = zarr.create_array(
        store, shape=values.shape, dtype="f8", chunks=(8, 8), shards=(64, 64),
        compressors=[ZstdCodec(level=1)], dimension_names=["y", "x"], overwrite=True,
    )  # fmt: skip
    array[...] = values
    refs = store_refs(store)
    for key, ref in refs["refs"].items():
        if isinstance(ref, list):
            refs["refs"][key] = [f"{http.url}/sharded2026.zarr/{key}", *ref[1:]]
    m = mount(write_refs(refs, tmp_path / "refs.json"), "--decode")
    shard = (store / "c/0/0").read_bytes()
    index_size = 64 * 16 + 4
    offsets = np.frombuffer(shard[-index_size:-4], "<u8").reshape(64, 2)
    http.reset_stats()
    chunk = (m.mountpoint / "2.3").read_bytes()
    assert chunk == values[16:24, 24:32].tobytes()
    fetched = sum(end - start for path, start, end in http.stats()["ranges"] if "c/0/0" in path)
    inner = int(offsets[2 * 8 + 3][1])
    assert 0 < fetched <= 2 * (inner + index_size), (fetched, inner, len(shard))
    http.reset_stats()  # a reader going through the shard: its run, no index again
    for i, j in ((2, 4), (2, 5), (3, 4), (3, 5)):
        got = (m.mountpoint / f"{i}.{j}").read_bytes()
        assert got == values[8 * i : 8 * i + 8, 8 * j : 8 * j + 8].tobytes(), (i, j)
    ranges = [(start, end) for path, start, end in http.stats()["ranges"] if "c/0/0" in path]
    assert (len(shard) - index_size, len(shard)) not in ranges
    assert len(ranges) == 1, ranges  # Morton order: the four are neighbours in one run


def sharded_store(
    store: Path, shape: tuple[int, int], seed: int, inner: int = 8, shard: int = 64
) -> np.ndarray:
    """A v3 store of random float64 in shards of ``shard``² holding inner chunks of
    ``inner``² (zstd), written by zarr 3; its values."""
    values = np.random.default_rng(seed).normal(size=shape)
    zarr.create_array(
        store, shape=shape, dtype="f8", chunks=(inner, inner), shards=(shard, shard),
        compressors=[ZstdCodec(level=1)],
    )[...] = values  # fmt: skip
    return values


def test_a_run_decoded_together_fails_for_its_broken_inner_chunk_only(
    mount, tmp_path: Path
) -> None:
    """A reader going through a shard gets its inner chunks decoded together, a few jobs
    for 64 chunks; one inner chunk whose bytes are not zstd is EIO for its reads only,
    every other inner chunk of its run exact, and the mount serves on."""
    store = tmp_path / "broken.zarr"
    values = sharded_store(store, (64, 64), seed=7)
    shard = bytearray((store / "c/0/0").read_bytes())
    offsets = np.frombuffer(bytes(shard[-(64 * 16 + 4) : -4]), "<u8").reshape(64, 2)
    broken = 4 * 8 + 5  # inner chunk (4, 5): the middle of the shard's bytes
    shard[int(offsets[broken][0]) : int(offsets[broken][0]) + 4] = b"\0\0\0\0"  # no frame
    (store / "c/0/0").write_bytes(bytes(shard))
    m = mount(write_refs(store_refs(store), tmp_path / "refs.json"), "--decode", "--xattrs")
    for i in range(8):
        for j in range(8):
            path = m.mountpoint / f"{i}.{j}"
            if (i, j) == (4, 5):
                for _ in range(2):  # decoded alone too: EIO again
                    with pytest.raises(OSError) as failed:
                        path.read_bytes()
                    assert failed.value.errno == errno.EIO
                continue
            assert path.read_bytes() == values[8 * i : 8 * i + 8, 8 * j : 8 * j + 8].tobytes()
    stats = json.loads(os.getxattr(m.mountpoint, "user.refmount.stats"))
    # the first alone, the run's other 63 in jobs of GROUP, the failed job's alone, the
    # broken one's second read: not one job per inner chunk
    assert stats["worker_jobs"] <= 1 + 64 // GROUP + GROUP + 1 < 64, stats
    assert stats["decoded_chunks"] == 63 and stats["requests"] <= 4, stats
    assert "do not decode together" in m.log()
    assert m.process.poll() is None


def test_a_reader_going_through_a_shard_gets_the_next_shards_read_ahead(
    mount, tmp_path: Path
) -> None:
    """2 x 2 shards of 64 inner chunks: once a reader goes through shard (0, 0) (a second
    inner chunk of it read), the next ones in C order, (0, 1), (1, 0) and (1, 1), are
    fetched and decoded in the background, all at once (a reader of whole rows enters
    the row of shards it is in and the next one before it leaves the first shard), each
    shard read ahead in one request (its index with its inner chunks); reading the
    shards read ahead asks the store for nothing more; all exact."""
    store = tmp_path / "four.zarr"
    values = sharded_store(store, (128, 128), seed=13)
    m = mount(write_refs(store_refs(store), tmp_path / "refs.json"), "--decode", "--xattrs")

    def stats() -> dict:
        return json.loads(os.getxattr(m.mountpoint, "user.refmount.stats"))

    def read_ahead(shards: int) -> int:
        """The requests made once ``shards`` shards' 64 are decoded (in the background)."""
        deadline = time.monotonic() + 60
        while stats()["decoded_chunks"] < 64 * shards:
            assert time.monotonic() < deadline, stats()
            time.sleep(0.05)
        return stats()["requests"]

    def read(shard_i: int, shard_j: int) -> None:
        for i in range(8 * shard_i, 8 * shard_i + 8):
            for j in range(8 * shard_j, 8 * shard_j + 8):
                got = (m.mountpoint / f"{i}.{j}").read_bytes()
                assert got == values[8 * i : 8 * i + 8, 8 * j : 8 * j + 8].tobytes(), (i, j)

    for j in (0, 1):
        assert (m.mountpoint / f"0.{j}").read_bytes() == values[:8, 8 * j : 8 * j + 8].tobytes()
    requests = read_ahead(4)
    assert requests == 3 + 3, stats()  # (0, 0)'s index, first inner chunk and run
    for shard in ((0, 1), (1, 0), (1, 1)):
        read(*shard)
    assert stats()["requests"] == requests, stats()
    assert stats()["decoded_chunks"] == 4 * 64, stats()


def test_a_reader_coming_to_a_shard_being_read_ahead_waits_for_it(mount, tmp_path: Path) -> None:
    """Over a server that answers each request after 0.5 s: a reader that comes to an
    inner chunk of shard (0, 1) while that shard is still being read ahead waits for
    the read-ahead's decoded chunks, and fetches neither the shard's index nor its
    chunk nor its run again: the store sees one request per shard read ahead."""
    root = tmp_path / "www"
    values = sharded_store(root / "slow.zarr", (128, 128), seed=17)
    with RangeServer(root, delay=0.5) as server:
        refs = store_refs(root / "slow.zarr")
        for key, ref in refs["refs"].items():
            if isinstance(ref, list):
                refs["refs"][key] = [f"{server.url}/slow.zarr/{key}", *ref[1:]]
        m = mount(write_refs(refs, tmp_path / "refs.json"), "--decode", "--xattrs")
        assert (m.mountpoint / "0.0").read_bytes() == values[:8, :8].tobytes()
        with ThreadPoolExecutor(1) as pool:  # (0, 0)'s run, the next shards read ahead
            second = pool.submit((m.mountpoint / "0.1").read_bytes)
            deadline = time.monotonic() + 60
            while server.stats()["requests"] < 2 + 1 + 3:  # all asked for, none answered
                assert time.monotonic() < deadline, server.stats()
                time.sleep(0.01)
            assert (m.mountpoint / "0.9").read_bytes() == values[:8, 72:80].tobytes()
            assert second.result() == values[:8, 8:16].tobytes()
        for i in range(8):
            for j in range(8, 16):
                got = (m.mountpoint / f"{i}.{j}").read_bytes()
                assert got == values[8 * i : 8 * i + 8, 8 * j : 8 * j + 8].tobytes(), (i, j)
        stats = server.stats()
        assert stats["requests"] == 6, stats
        assert [r for r in stats["ranges"] if "c/0/1" in r[0]] == [
            ["/slow.zarr/c/0/1", 0, (root / "slow.zarr/c/0/1").stat().st_size]
        ], stats["ranges"]


def test_two_readers_entering_a_shard_together_get_it_in_one_request(mount, tmp_path: Path) -> None:
    """Over a server that answers each request after 2 s (time for the second read to
    arrive on a busy machine): two inner chunks of a shard read at once, before its index
    has come: the first its index and its own range, the second (a reader going through)
    the whole shard in one request, not the index and then the run; both exact."""
    root = tmp_path / "www"
    values = sharded_store(root / "both.zarr", (64, 64), seed=19)
    size = (root / "both.zarr/c/0/0").stat().st_size
    with RangeServer(root, delay=2.0) as server:
        refs = store_refs(root / "both.zarr")
        for key, ref in refs["refs"].items():
            if isinstance(ref, list):
                refs["refs"][key] = [f"{server.url}/both.zarr/{key}", *ref[1:]]
        m = mount(write_refs(refs, tmp_path / "refs.json"), "--decode")
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit((m.mountpoint / "0.0").read_bytes)
            deadline = time.monotonic() + 60
            while server.stats()["requests"] < 1:  # the first read's index asked for
                assert time.monotonic() < deadline, server.stats()
                time.sleep(0.01)
            second = pool.submit((m.mountpoint / "0.1").read_bytes)
            assert first.result() == values[:8, :8].tobytes()
            assert second.result() == values[:8, 8:16].tobytes()
        ranges = [(start, end) for _, start, end in server.stats()["ranges"]]
        assert (0, size) in ranges and len(ranges) == 3, ranges  # index, 0.0, the shard


def test_a_run_decoded_together_stays_within_the_memory_budget(mount, tmp_path: Path) -> None:
    """With a 1 MiB cache, a shard's run (about 0.5 MB stored, 0.5 MiB decoded) does not
    fit whole with its decoded chunks (the read-ahead share is half the budget): what has
    no room is decoded when read, with the run's chunks still without, every inner chunk
    exact, and the cache never holds more than its budget."""
    store = tmp_path / "tight.zarr"
    values = sharded_store(store, (256, 256), seed=11, inner=32, shard=256)
    refs = write_refs(store_refs(store), tmp_path / "refs.json")
    m = mount(refs, "--decode", "--xattrs", "--cache-size", "1M")
    for i in range(8):
        for j in range(8):
            got = (m.mountpoint / f"{i}.{j}").read_bytes()
            assert got == values[32 * i : 32 * i + 32, 32 * j : 32 * j + 32].tobytes(), (i, j)
    stats = json.loads(os.getxattr(m.mountpoint, "user.refmount.stats"))
    assert stats["budget"] == 1 << 20 and 0 < stats["peak_bytes"] <= stats["budget"], stats
    assert stats["decoded_chunks"] == 64 and stats["decode_errors"] == 0, stats
    assert stats["worker_jobs"] < 16, stats  # in runs, each as room allows: not one by one
