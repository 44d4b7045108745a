"""How the netCDF view's files are read (``--netcdf``), through real mounts: the block
size ``stat`` reports, a header read that decodes no chunk, read-ahead earned by a
sequential reader and stopped with the mount, text read back as strings (``_Encoding``);
and the read-ahead's scheduler in process.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path

import netCDF4
import numcodecs
import numpy as np
import trio
import trio.testing

from refmount.netcdf.ahead import ReadAhead
from tests.support.mounting import Mounted
from tests.support.nginx import NginxServer

WIDTH = 64  # values per chunk: 256 B decoded


def small_chunks(directory: Path, url: str, count: int) -> tuple[Path, np.ndarray]:
    """A set of ``count`` chunks of 256 B (float32, zlib) back to back in ``data.bin``
    under ``url``, and the array they hold."""
    values = np.arange(count * WIDTH, dtype="<f4").reshape(count, WIDTH)
    extents, offset = [], 0
    with open(directory / "data.bin", "wb") as out:
        for row in values:
            compressed = zlib.compress(row.tobytes(), 1)
            out.write(compressed)
            extents.append((offset, len(compressed)))
            offset += len(compressed)
    zarray = {
        "zarr_format": 2, "shape": [count, WIDTH], "chunks": [1, WIDTH], "dtype": "<f4",
        "compressor": {"id": "zlib", "level": 1}, "filters": None, "order": "C",
        "fill_value": "NaN",
    }  # fmt: skip
    refs = {
        ".zgroup": '{"zarr_format": 2}',
        "field/.zarray": json.dumps(zarray),
        "field/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["time", "x"]}),
    }
    for k, (start, length) in enumerate(extents):
        refs[f"field/{k}.0"] = [f"{url}/data.bin", start, length]  # type: ignore[assignment]
    path = directory / "small.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path, values


def counters(mountpoint: Path) -> dict[str, int]:
    return json.loads(os.getxattr(mountpoint, "user.refmount.stats"))


def test_the_header_is_read_without_decoding_a_chunk_and_stat_reports_its_block(
    mount: Callable[..., Mounted], nginx: NginxServer, tmp_path: Path
) -> None:
    root = nginx.root / "header"
    root.mkdir()
    refs, values = small_chunks(root, f"{nginx.url}/header", 20000)
    mounted = mount(refs, "--netcdf", "--netcdf-name", "x", "--xattrs")
    path = mounted.mountpoint / "x.nc"
    # A listing's entries (ls -l lists with READDIRPLUS: the kernel keeps their
    # attributes, which stat then shows) and stat say the header's block.
    subprocess.run(["ls", "-l", str(mounted.mountpoint)], capture_output=True, check=True)
    listed = subprocess.run(
        ["stat", "-c", "%n %o", *[str(p) for p in mounted.mountpoint.iterdir()]],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert listed == f"{path} 8192\n"
    assert os.stat(path).st_blksize == 8192
    header = subprocess.run(
        ["ncdump", "-h", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert "float field(time, x) ;" in header and "time = 20000 ;" in header
    # The header, and what the kernel brings in with it, hold no value: nothing decoded.
    with open(path, "rb") as f:
        head = f.read(4 * 8192)
    assert head[:4] == b"CDF\x02" and len(head) == 4 * 8192
    stats = counters(mounted.mountpoint)
    assert stats["decoded_chunks"] == 0 and stats["netcdf_read_ahead"] == 0
    # A sequential reader earns read-ahead, and every chunk is decoded once.
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
    stats = counters(mounted.mountpoint)
    assert stats["netcdf_read_ahead"] > 0
    assert stats["decoded_chunks"] == 20000
    with netCDF4.Dataset(path) as served:
        assert np.array_equal(served["field"][:], values)
    # A raw view's files keep 1 MiB.
    raw = mount(refs, "--xattrs")
    assert os.stat(raw.mountpoint / "field" / "0.0").st_blksize == 1 << 20


def test_read_ahead_in_flight_ends_with_the_mount(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    root = tmp_path / "slow"
    root.mkdir()
    with NginxServer(root, delay=0.3) as slow:
        refs, values = small_chunks(root, slow.url, 20000)
        mounted = mount(refs, "--netcdf", "--netcdf-name", "x", "--xattrs")
        path = mounted.mountpoint / "x.nc"
        begin = 4 * os.stat(path).st_blksize
        with open(path, "rb", buffering=0) as f:
            f.seek(begin)
            for _ in range(8):  # 2 MiB in order: the stream earns read-ahead
                data = f.read(256 << 10)
                assert len(data) == 256 << 10
        first = np.frombuffer(bytes(data[-WIDTH * 4 :]), ">f4")
        assert np.array_equal(first, values[8 * 1024 - 1])
        assert counters(mounted.mountpoint)["netcdf_read_ahead"] > 0
        assert mounted.stop() == 0  # decodes in flight are cancelled, not waited for
    log = mounted.log()
    for bad in ("Traceback", "ERROR", "never awaited", "leak"):
        assert bad not in log, log


def test_a_closed_view_drops_its_stretches_and_cancels_its_decodes() -> None:
    class View:
        def __init__(self, serial: int) -> None:
            self.serial, self.closed = serial, False

    class Source:
        def chunk_key(self, index: tuple[int, ...]) -> str:
            return f"v/{index[0]}"

    async def main() -> None:
        started: list[tuple[int, int]] = []
        finished: list[tuple[int, int]] = []
        release = trio.Event()

        async def decode(view: View, source: Source, index: tuple[int, ...]) -> None:
            started.append((view.serial, index[0]))
            await release.wait()
            finished.append((view.serial, index[0]))

        ahead = ReadAhead(decode, tasks=4)  # type: ignore[arg-type]
        old, new = View(1), View(2)
        async with trio.open_nursery() as nursery:
            await nursery.start(ahead.run)
            ahead.want(old, iter([(Source(), (i,)) for i in range(100)]))  # type: ignore[arg-type]
            ahead.want(new, iter([(Source(), (i,)) for i in range(3)]))  # type: ignore[arg-type]
            await trio.testing.wait_all_tasks_blocked()
            assert started == [(1, 0), (1, 1), (1, 2), (1, 3)] and ahead.working == 4
            ahead.forget(old)  # old's four decodes cancelled, its 96 others never started
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(started[4:]) == [(2, 0), (2, 1), (2, 2)] and not finished
            release.set()
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(finished) == [(2, 0), (2, 1), (2, 2)] and ahead.working == 0
            assert ahead.counters == {"netcdf_read_ahead": 7, "netcdf_read_ahead_cancelled": 4}
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_text_is_read_back_as_strings_and_bytes_as_chars(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    def zarray(dtype: str, filters: list[dict[str, str]] | None = None) -> str:
        meta = {
            "zarr_format": 2, "shape": [3], "chunks": [3], "dtype": dtype,
            "compressor": None, "filters": filters, "order": "C", "fill_value": None,
        }  # fmt: skip
        return json.dumps(meta)

    def inline(data: bytes) -> str:
        return "base64:" + base64.b64encode(data).decode()

    words = ["añb", "日本", ""]
    dims = json.dumps({"_ARRAY_DIMENSIONS": ["n"]})
    refs = {
        ".zgroup": '{"zarr_format": 2}',
        "fixed/.zarray": zarray("<U3"),
        "fixed/.zattrs": dims,
        "fixed/0": inline(np.array(words, "<U3").tobytes()),
        "vlen/.zarray": zarray("|O", [{"id": "vlen-utf8"}]),
        "vlen/.zattrs": dims,
        "vlen/0": inline(numcodecs.VLenUTF8().encode(np.array(words, dtype=object))),
        "raw/.zarray": zarray("|S2"),
        "raw/.zattrs": dims,
        "raw/0": inline(np.array([b"ab", b"\xff", b""], "|S2").tobytes()),
    }
    path = tmp_path / "text.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    served = mount(path, "--netcdf").mountpoint / "text.nc"
    header = subprocess.run(
        ["ncdump", "-h", str(served)], capture_output=True, text=True, check=True
    ).stdout
    assert header.count('_Encoding = "utf-8" ;') == 2 and "raw:_Encoding" not in header
    with netCDF4.Dataset(served) as ds:  # _Encoding: netCDF4 joins the chars into strings
        for name in ("fixed", "vlen"):
            assert ds[name].getncattr("_Encoding") == "utf-8"
            assert ds[name][...].tolist() == words, name
        assert "_Encoding" not in ds["raw"].ncattrs()
        raw = np.asarray(ds["raw"][...])
        assert raw.shape == (3, 2) and raw.dtype == "S1"
        assert raw.tobytes() == b"ab\xff\x00\x00\x00"
