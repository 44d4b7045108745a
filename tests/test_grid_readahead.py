"""Read-ahead along a chunk grid across files, through a real mount over nginx.

An array ``v`` of shape (T, 64, 64) float32, chunk (1, 64, 64): chunk ``t`` is the whole
object ``g/t.bin`` (a combined reference set: one granule per time step).  Readers read
through the mount with real processes; nginx's access log counts the requests.  What is
asserted does not depend on timing: every byte, and how many requests reached the
server (each chunk once, whether a reader or the read-ahead asked first).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from refmount.cache.grid import INITIAL_WINDOW
from tests.conftest import Mounted
from tests.support.nginx import NginxServer, nginx_available
from tests.support.remote_files import write_refs

T = 120
SIDE = 64
CHUNK = SIDE * SIDE * 4  # 16 KiB

pytestmark = pytest.mark.skipif(nginx_available() is not None, reason=str(nginx_available()))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[NginxServer, Path]]:
    """nginx with an access log of its own, serving a fresh directory."""
    root = tmp_path / "www"
    (root / "g").mkdir(parents=True)
    log = tmp_path / "access.log"
    with NginxServer(root, wire_log=log) as server:
        yield server, log


def requests(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def granules(server: NginxServer, tmp_path: Path, t: int = T) -> tuple[Path, dict[str, bytes]]:
    """The array's chunks, one object each, and the reference set over them."""
    rng = random.Random(39)
    meta = {
        "zarr_format": 2,
        "shape": [t, SIDE, SIDE],
        "chunks": [1, SIDE, SIDE],
        "dtype": "<f4",
        "compressor": None,
        "filters": None,
        "fill_value": 0.0,
        "order": "C",
    }
    refs: dict[str, object] = {".zgroup": '{"zarr_format": 2}', "v/.zarray": json.dumps(meta)}
    expected = {}
    for n in range(t):
        data = rng.randbytes(CHUNK)
        (server.root / "g" / f"{n}.bin").write_bytes(data)
        refs[f"v/{n}.0.0"] = [f"{server.url}/g/{n}.bin", 0, CHUNK]
        expected[f"v/{n}.0.0"] = data
    return write_refs(tmp_path, refs), expected


def stats(m: Mounted) -> dict[str, int]:
    return json.loads(os.getxattr(m.mountpoint, "user.refmount.stats"))


def pread_each(m: Mounted, keys: list[str], offset: int, size: int) -> list[bytes]:
    """One process reads ``size`` bytes at ``offset`` of each file, in order."""
    script = (
        "import os, sys\n"
        "for name in sys.argv[3:]:\n"
        "    fd = os.open(name, os.O_RDONLY)\n"
        "    sys.stdout.buffer.write(os.pread(fd, int(sys.argv[2]), int(sys.argv[1])))\n"
        "    os.close(fd)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(offset), str(size), *keys],
        cwd=m.mountpoint,
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    return [out[n * size : (n + 1) * size] for n in range(len(keys))]


def test_cat_in_key_order_reads_every_chunk_once_and_ahead(
    mount: Callable[..., Mounted], served: tuple[NginxServer, Path], tmp_path: Path
) -> None:
    server, log = served
    refs, expected = granules(server, tmp_path)
    m = mount(refs, "--xattrs")
    keys = [f"v/{t}.0.0" for t in range(T)]
    before = requests(log)
    out = subprocess.run(["cat", *keys], cwd=m.mountpoint, capture_output=True, timeout=120)
    assert out.returncode == 0
    assert out.stdout == b"".join(expected[k] for k in keys)
    counters = stats(m)
    assert requests(log) - before == T  # each chunk once: read ahead or by the reader
    assert counters["grid_readahead_requests"] > 0
    assert counters["grid_readahead_unused"] == 0  # the walk ended at the grid's end


def test_a_time_series_at_one_point_reads_right_and_each_chunk_once(
    mount: Callable[..., Mounted], served: tuple[NginxServer, Path], tmp_path: Path
) -> None:
    server, log = served
    refs, expected = granules(server, tmp_path)
    m = mount(refs, "--xattrs")
    keys = [f"v/{t}.0.0" for t in range(T)]
    before = requests(log)
    got = pread_each(m, keys, 8192, 16)
    assert got == [expected[k][8192 : 8192 + 16] for k in keys]
    assert requests(log) - before == T
    assert stats(m)["grid_readahead_requests"] > 0


def test_a_random_reader_causes_no_request_beyond_the_chunks_it_reads(
    mount: Callable[..., Mounted], served: tuple[NginxServer, Path], tmp_path: Path
) -> None:
    server, log = served
    refs, expected = granules(server, tmp_path)
    m = mount(refs, "--xattrs")
    order = list(range(T))
    random.Random(5).shuffle(order)
    keys = [f"v/{t}.0.0" for t in order[: T // 2]]
    before = requests(log)
    out = subprocess.run(["cat", *keys], cwd=m.mountpoint, capture_output=True, timeout=120)
    assert out.stdout == b"".join(expected[k] for k in keys)
    assert requests(log) - before == len(keys)
    assert stats(m)["grid_readahead_requests"] == 0


def test_a_walk_that_breaks_leaves_at_most_its_window_unread(
    mount: Callable[..., Mounted], served: tuple[NginxServer, Path], tmp_path: Path
) -> None:
    server, log = served
    refs, expected = granules(server, tmp_path)
    m = mount(refs, "--xattrs")
    walked = 20
    keys = [f"v/{t}.0.0" for t in range(walked)]
    before = requests(log)
    out = subprocess.run(["cat", *keys], cwd=m.mountpoint, capture_output=True, timeout=120)
    assert out.stdout == b"".join(expected[k] for k in keys)
    # Counted when issued: fetched ahead, not read by anyone.
    counters = stats(m)
    unused = counters["grid_readahead_unused"]
    assert unused % CHUNK == 0 and unused > 0
    # At most the window: it starts at INITIAL_WINDOW and doubles only when the reader
    # got through half of it, so it never exceeds twice what was walked.
    assert unused <= max(INITIAL_WINDOW, 2 * walked * CHUNK)
    ahead_chunks = unused // CHUNK
    # Then the reader jumps back: what it reads again is cached, nothing more is asked.
    again = subprocess.run(["cat", keys[0]], cwd=m.mountpoint, capture_output=True, timeout=60)
    assert again.stdout == expected[keys[0]]
    issued = counters["grid_readahead_requests"]
    assert issued <= walked + ahead_chunks
    assert requests(log) - before <= walked + ahead_chunks


def test_no_grid_read_ahead_turns_it_off(
    mount: Callable[..., Mounted], served: tuple[NginxServer, Path], tmp_path: Path
) -> None:
    server, _ = served
    refs, expected = granules(server, tmp_path, 40)
    m = mount(refs, "--xattrs", "--no-grid-read-ahead")
    keys = [f"v/{t}.0.0" for t in range(40)]
    out = subprocess.run(["cat", *keys], cwd=m.mountpoint, capture_output=True, timeout=120)
    assert out.stdout == b"".join(expected[k] for k in keys)
    assert stats(m)["grid_readahead_requests"] == 0


def test_decoded_view_decodes_ahead_and_reads_every_chunk_once(
    mount: Callable[..., Mounted], served: tuple[NginxServer, Path], tmp_path: Path
) -> None:
    server, log = served
    refs, expected = granules(server, tmp_path)
    m = mount(refs, "--xattrs", "--decode")
    keys = [f"v/{t}.0.0" for t in range(T)]
    before = requests(log)
    out = subprocess.run(["cat", *keys], cwd=m.mountpoint, capture_output=True, timeout=120)
    assert out.returncode == 0
    # Little-endian float32 without codecs: the decoded bytes are the stored ones.
    assert out.stdout == b"".join(expected[k] for k in keys)
    assert requests(log) - before == T
    counters = stats(m)
    assert counters["decoded_ahead"] > 0
    assert counters["decoded_ahead_used"] == counters["decoded_ahead"]


def test_a_parquet_set_is_walked_ahead_too(
    mount: Callable[..., Mounted], served: tuple[NginxServer, Path], tmp_path: Path
) -> None:
    from tests.support.parquet_sets import refs_to_parquet

    server, log = served
    refs, expected = granules(server, tmp_path)
    parquet = tmp_path / "refs.parq"
    # Records of 16 keys: predicted keys lie in records not loaded yet.
    refs_to_parquet(json.loads(refs.read_text()), parquet, record_size=16)
    m = mount(parquet, "--xattrs")
    keys = [f"v/{t}.0.0" for t in range(T)]
    before = requests(log)
    got = pread_each(m, keys, 100, 1000)
    assert got == [expected[k][100:1100] for k in keys]
    assert requests(log) - before == T
    assert stats(m)["grid_readahead_requests"] > 0


def test_an_icechunk_array_is_walked_ahead_too(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    import icechunk
    import numpy as np
    import zarr

    root = tmp_path / "repo"
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root)))
    session = repo.writable_session("main")
    values = np.random.default_rng(39).random((48, 16, 16)).astype("f4")
    group = zarr.open_group(session.store)
    group.create_array("v", shape=values.shape, chunks=(1, 16, 16), dtype="f4")[...] = values
    session.commit("grid")
    keys = [f"v/c/{t}/0/0" for t in range(values.shape[0])]
    plain = mount(root, "--no-grid-read-ahead")
    expected = subprocess.run(["cat", *keys], cwd=plain.mountpoint, capture_output=True)
    plain.stop()
    m = mount(root, "--xattrs")
    out = subprocess.run(["cat", *keys], cwd=m.mountpoint, capture_output=True, timeout=120)
    assert out.returncode == expected.returncode == 0
    assert out.stdout == expected.stdout and len(out.stdout) > 0
    counters = stats(m)
    assert counters["grid_readahead_requests"] > 0
    assert counters["demand_requests"] + counters["grid_readahead_requests"] == len(keys)


def test_concurrent_walkers_stay_within_a_small_budget(
    mount: Callable[..., Mounted], served: tuple[NginxServer, Path], tmp_path: Path
) -> None:
    server, _ = served
    refs, expected = granules(server, tmp_path)
    m = mount(refs, "--xattrs", "--cache-size", "1M")
    walkers = 4
    regions = [[f"v/{t}.0.0" for t in range(w * 30, w * 30 + 30)] for w in range(walkers)]
    # Into files, not pipes: a pipe nobody drains yet would hold its reader back.
    outs = [tmp_path / f"walker{w}.out" for w in range(walkers)]
    readers = []
    for keys, out in zip(regions, outs, strict=True):
        with out.open("wb") as sink:
            readers.append(subprocess.Popen(["cat", *keys], cwd=m.mountpoint, stdout=sink))
    assert all(reader.wait(timeout=120) == 0 for reader in readers)
    for keys, out in zip(regions, outs, strict=True):
        assert out.read_bytes() == b"".join(expected[k] for k in keys)
    counters = stats(m)
    assert counters["grid_readahead_requests"] > 0
    assert counters["peak_bytes"] <= counters["budget"]
    assert m.process.poll() is None


@pytest.mark.parametrize(
    "zarray",
    [
        "not json",
        '{"shape": [120, 64, 64], "chunks": [0, 64, 64]}',
        '{"shape": "x", "chunks": [1, 64, 64]}',
        '{"shape": [120, 64], "chunks": [1, 64, 64]}',
        '{"shape": [120, 64, 64], "chunks": [1, 64, 64], "dimension_separator": "/"}',
    ],
)
def test_bad_metadata_costs_the_read_ahead_only(
    mount: Callable[..., Mounted], served: tuple[NginxServer, Path], tmp_path: Path, zarray: str
) -> None:
    server, _ = served
    refs, expected = granules(server, tmp_path, 12)
    document = json.loads(refs.read_text())
    document["refs"]["v/.zarray"] = zarray
    refs.write_text(json.dumps(document))
    m = mount(refs, "--xattrs")
    keys = [f"v/{t}.0.0" for t in range(12)]
    out = subprocess.run(["cat", *keys], cwd=m.mountpoint, capture_output=True, timeout=120)
    assert out.stdout == b"".join(expected[k] for k in keys)
    assert stats(m)["grid_readahead_requests"] == 0
    assert m.process.poll() is None


def test_chunks_back_to_back_in_one_object_are_left_to_its_stream(
    mount: Callable[..., Mounted], served: tuple[NginxServer, Path], tmp_path: Path
) -> None:
    server, _ = served
    refs, expected = granules(server, tmp_path)
    document = json.loads(refs.read_text())
    keys = [f"v/{t}.0.0" for t in range(T)]
    (server.root / "all.bin").write_bytes(b"".join(expected[k] for k in keys))
    for n, key in enumerate(keys):
        document["refs"][key] = [f"{server.url}/all.bin", n * CHUNK, CHUNK]
    refs.write_text(json.dumps(document))
    m = mount(refs, "--xattrs")
    out = subprocess.run(["cat", *keys], cwd=m.mountpoint, capture_output=True, timeout=120)
    assert out.stdout == b"".join(expected[k] for k in keys)
    counters = stats(m)
    assert counters["grid_readahead_requests"] == 0
    # No byte fetched twice: the stream's blocks and nothing else.
    fetched = counters["demand_bytes"] + counters["readahead_bytes"]
    assert fetched <= T * CHUNK + counters["block_size"]


def test_the_sets_of_a_catalog_are_walked_ahead(
    mount: Callable[..., Mounted], served: tuple[NginxServer, Path], tmp_path: Path
) -> None:
    server, log = served
    refs, expected = granules(server, tmp_path, 60)
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "run0.json").write_text(refs.read_text())
    # run1: the same chunks in objects of their own.
    (server.root / "g1").mkdir()
    for n in range(60):
        (server.root / "g1" / f"{n}.bin").write_bytes(expected[f"v/{n}.0.0"])
    (catalog / "run1.json").write_text(refs.read_text().replace("/g/", "/g1/"))
    m = mount(catalog, "--xattrs")
    before = requests(log)
    ahead = [0]
    for name in ("run0", "run1"):
        keys = [f"{name}/v/{t}.0.0" for t in range(60)]
        out = subprocess.run(["cat", *keys], cwd=m.mountpoint, capture_output=True, timeout=120)
        assert out.stdout == b"".join(expected[f"v/{t}.0.0"] for t in range(60))
        ahead.append(stats(m)["grid_readahead_requests"])
    assert ahead[0] < ahead[1] < ahead[2]  # each set was walked ahead
    assert requests(log) - before == 120
    assert stats(m)["grid_readahead_unused"] == 0
