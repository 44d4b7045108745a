"""The decoded view through a real mount, read by real readers: Debian's ncdump and GDAL
3.6, zarr, and plain ``cat``/``stat`` for sizes, errors and hostile chunks."""

from __future__ import annotations

import base64
import errno
import json
import os
import re
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import zarr

from tests.support.mounting import REPO, Mounted

AIR = REPO / "examples" / "air"
CHUNK_BYTES = 31 * 25 * 53 * 4  # the air example's chunks of float32


def air_values() -> np.ndarray:
    with netCDF4.Dataset(AIR / "air.nc") as ds:
        ds.set_auto_maskandscale(False)
        return ds["air"][:]


def ncdump_values(mountpoint: Path, variable: str) -> np.ndarray:
    """``variable``'s values as Debian's ncdump prints them, to float32 precision."""
    out = subprocess.run(
        ["ncdump", "-p", "9,17", "-v", variable, f"file://{mountpoint}#mode=zarr,file"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    data = out.split("data:", 1)[1]
    body = re.search(rf"\b{variable} =(.*?);", data, re.S)
    assert body is not None, out[-2000:]
    values = body.group(1).replace("\n", " ").split(",")
    return np.array([float(v.strip().rstrip("f")) for v in values], "<f4")


def test_ncdump_reads_air_through_the_decoded_mount_as_netcdf4_python_does(
    mount: Callable[..., Mounted],
) -> None:
    expected = air_values()
    decoded = mount(AIR / "refs.json", "--decode", "--allow-local")
    assert np.array_equal(ncdump_values(decoded.mountpoint, "air"), expected.ravel())
    # The raw view prints compressed bytes as numbers: what --decode is for.
    raw = mount(AIR / "refs.json", "--allow-local")
    assert not np.array_equal(ncdump_values(raw.mountpoint, "air"), expected.ravel())


def test_debian_gdal_translates_air_through_the_decoded_mount(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    decoded = mount(AIR / "refs.json", "--decode", "--allow-local")
    expected = air_values()
    for index in (0, 77):
        out = tmp_path / f"air{index}.img"
        source = f'ZARR:"{decoded.mountpoint}":/air:{index}'
        subprocess.run(
            ["gdal_translate", "-q", "-of", "ENVI", source, str(out)], check=True, timeout=120
        )
        assert np.array_equal(np.fromfile(out, "<f4"), expected[index].ravel())


def test_zarr_reads_the_decoded_mount_as_it_reads_the_raw_one(
    mount: Callable[..., Mounted],
) -> None:
    raw = zarr.open_group(mount(AIR / "refs.json", "--allow-local").mountpoint, mode="r")
    decoded_mount = mount(AIR / "refs.json", "-o", "decode,allow_local")
    decoded = zarr.open_group(decoded_mount.mountpoint, mode="r", zarr_format=2)
    names = sorted(name for name, _ in raw.arrays())
    assert names == sorted(name for name, _ in decoded.arrays()) == ["air", "lat", "lon", "time"]
    for name in names:
        assert decoded[name].dtype == raw[name].dtype
        assert np.array_equal(decoded[name][...], raw[name][...])
        assert dict(decoded[name].attrs) == dict(raw[name].attrs)
    meta = json.loads((decoded_mount.mountpoint / "air" / ".zarray").read_text())
    assert (meta["compressor"], meta["filters"], meta["dtype"]) == (None, None, "<f4")


def test_chunk_sizes_are_answered_without_fetching(mount: Callable[..., Mounted]) -> None:
    decoded = mount(AIR / "refs.json", "--decode", "--allow-local", "--xattrs")
    listing = subprocess.run(
        ["ls", "-l", str(decoded.mountpoint / "air")], capture_output=True, text=True, check=True
    ).stdout
    sizes = {line.split()[-1]: int(line.split()[4]) for line in listing.splitlines()[1:]}
    assert {name: sizes[name] for name in ("0.0.0", "1.0.0", "2.0.0", "3.0.0")} == dict.fromkeys(
        ("0.0.0", "1.0.0", "2.0.0", "3.0.0"), CHUNK_BYTES
    )
    assert os.stat(decoded.mountpoint / "air" / "3.0.0").st_size == CHUNK_BYTES
    stats = json.loads(os.getxattr(decoded.mountpoint, "user.refmount.stats"))
    assert stats["demand_requests"] == 0 and stats["decoded_chunks"] == 0
    data = (decoded.mountpoint / "air" / "1.0.0").read_bytes()
    assert data == air_values()[31:62].astype("<f4").tobytes()
    stats = json.loads(os.getxattr(decoded.mountpoint, "user.refmount.stats"))
    assert stats["decoded_chunks"] == 1


def inline(data: bytes) -> str:
    return "base64:" + base64.b64encode(data).decode()


def zarray(**fields: object) -> str:
    meta = {
        "zarr_format": 2,
        "shape": [8],
        "chunks": [4],
        "dtype": ">i4",
        "fill_value": 0,
        "order": "C",
        "compressor": {"id": "zlib", "level": 1},
        "filters": None,
    }
    meta.update(fields)
    return json.dumps(meta)


def test_bad_chunks_and_unknown_codecs_are_eio_and_the_daemon_lives(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    good = np.arange(4, dtype=">i4")
    refs = {
        ".zgroup": '{"zarr_format":2}',
        "good/.zarray": zarray(),
        "good/0": inline(zlib.compress(good.tobytes())),
        "long/.zarray": zarray(),
        "long/0": inline(zlib.compress(np.arange(400, dtype=">i4").tobytes())),
        "short/.zarray": zarray(),
        "short/0": inline(zlib.compress(good.tobytes()[:-1])),
        "plain/.zarray": zarray(compressor=None),
        "plain/0": inline(good.tobytes() + b"\0"),
        "odd/.zarray": zarray(compressor={"id": "imagecodecs_jpegxl", "level": 90}),
        "odd/0": inline(b"not decoded"),
        "odd/1": inline(b"not decoded either"),
        "pickled/.zarray": zarray(compressor=None, filters=[{"id": "pickle"}]),
        "pickled/0": inline(b"\x80\x04K\x01."),
        "text/.zarray": zarray(dtype="|O", compressor=None, filters=[{"id": "vlen-utf8"}]),
        "text/0": inline(b"\x01\0\0\0\x01\0\0\0a"),
    }
    path = tmp_path / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    mounted = mount(path, "--decode")
    root = mounted.mountpoint
    assert sorted(os.listdir(root)) == [
        ".zgroup", "good", "long", "odd", "pickled", "plain", "short",
    ]  # fmt: skip
    for key in ("long/0", "short/0", "plain/0", "odd/0", "odd/1", "pickled/0", "odd/0"):
        with pytest.raises(OSError) as failed:
            (root / key).read_bytes()
        assert failed.value.errno == errno.EIO, key
        assert os.stat(root / key).st_size == 16
    assert (root / "good" / "0").read_bytes() == good.astype("<i4").tobytes()
    assert not (root / "text").exists()
    assert mounted.process.poll() is None
    log = mounted.log()
    assert len([line for line in log.splitlines() if "imagecodecs_jpegxl" in line]) == 1
    assert re.search(r"'odd'.*'imagecodecs_jpegxl'", log)
    assert re.search(r"array 'text' is left out of the decoded view: variable-length", log)


def test_a_rank0_chunk_written_as_name_slash_is_served_as_name_0_in_both_views(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    """And rank-0 arrays are one element along ``_scalar_``, with a ``.zattrs`` made
    where the set has none: zarr, GDAL and ncdump read them."""
    refs = {
        ".zgroup": '{"zarr_format":2}',
        "crs/.zarray": zarray(shape=[], chunks=[]),
        "crs/.zattrs": json.dumps(
            {"_ARRAY_DIMENSIONS": [], "grid_mapping_name": "latitude_longitude"}
        ),
        "crs/": inline(zlib.compress(np.array(7, ">i4").tobytes())),
        # rank 0 without a .zattrs: the decoded view makes one naming "_scalar_"
        "level/.zarray": zarray(shape=[], chunks=[], dtype="<f8", compressor=None),
        "level/0": inline(np.array(2.5, "<f8").tobytes()),
    }
    path = tmp_path / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    decoded = mount(path, "--decode").mountpoint
    assert sorted(os.listdir(decoded / "crs")) == [".zarray", ".zattrs", "0"]
    assert sorted(os.listdir(decoded / "level")) == [".zarray", ".zattrs", "0"]
    made = (decoded / "level" / ".zattrs").read_bytes()
    assert json.loads(made) == {"_ARRAY_DIMENSIONS": ["_scalar_"]}
    assert os.stat(decoded / "level" / ".zattrs").st_size == len(made)
    assert json.loads((decoded / "crs" / ".zattrs").read_bytes()) == {
        "_ARRAY_DIMENSIONS": ["_scalar_"],
        "grid_mapping_name": "latitude_longitude",
    }
    dump = subprocess.run(
        ["ncdump", f"file://{decoded}#mode=zarr,file"], capture_output=True, text=True, timeout=120
    )
    assert dump.returncode == 0, dump.stderr
    assert "int crs(_scalar_) ;" in dump.stdout and "double level(_scalar_) ;" in dump.stdout
    assert " crs = 7 ;" in dump.stdout and " level = 2.5 ;" in dump.stdout
    assert (decoded / "crs" / "0").read_bytes() == np.array(7, "<i4").tobytes()
    # presented as one element along _scalar_ (tests/test_decode.py has the rewrite)
    crs = zarr.open_group(decoded, mode="r", zarr_format=2)["crs"]
    assert crs.shape == (1,) and crs[:].tolist() == [7]
    info = subprocess.run(
        ["gdalmdiminfo", "-detailed", str(decoded)], capture_output=True, text=True, check=True
    )
    assert json.loads(info.stdout)["arrays"]["crs"]["values"] == [7]
    # the raw view serves `crs/` as `crs/0` too, rank 0 kept: zarr reads 7, not the fill 0
    raw = mount(path).mountpoint
    assert sorted(os.listdir(raw / "crs")) == [".zarray", ".zattrs", "0"]
    assert sorted(os.listdir(raw / "level")) == [".zarray", "0"]
    group = zarr.open_group(raw, mode="r", zarr_format=2)
    assert group["crs"].shape == () and group["crs"][()] == 7
    assert group["level"].shape == () and group["level"][()] == 2.5


def test_leaving_out_a_string_array_lets_ncdump_read_the_rest(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    values = (np.arange(8) / 4).astype(">f8")
    strings = [b"alpha", b"b", b"", b"delta"]
    vlen = np.array(strings, dtype=object)
    refs = {
        ".zgroup": '{"zarr_format":2}',
        "v/.zarray": zarray(dtype=">f8", shape=[8], chunks=[8]),
        "v/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["x"]}),
        "v/0": inline(zlib.compress(values.tobytes())),
        "names/.zarray": zarray(
            dtype="|O", shape=[4], chunks=[4], compressor=None, filters=[{"id": "vlen-bytes"}]
        ),
        "names/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["n"]}),
        "names/0": inline(bytes(__import__("numcodecs").VLenBytes().encode(vlen))),
    }
    path = tmp_path / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    raw = mount(path).mountpoint
    crashed = subprocess.run(
        ["ncdump", "-h", f"file://{raw}#mode=zarr,file"], capture_output=True, timeout=120
    )
    assert crashed.returncode != 0  # netCDF-C 4.9.0 and a |O array, raw
    decoded = mount(path, "--decode").mountpoint
    assert np.array_equal(ncdump_values(decoded, "v"), values.astype("<f4"))
    info = subprocess.run(
        ["gdalmdiminfo", "-detailed", str(decoded)], capture_output=True, text=True, check=True
    )
    assert list(json.loads(info.stdout)["arrays"]) == ["v"]


def test_a_parquet_set_is_decoded_too(mount: Callable[..., Mounted], tmp_path: Path) -> None:
    from tests.support.parquet_sets import refs_to_parquet

    (tmp_path / "air.nc").write_bytes((AIR / "air.nc").read_bytes())
    refs_to_parquet(json.loads((AIR / "refs.json").read_text()), tmp_path / "refs.parq", 2)
    decoded = mount(tmp_path / "refs.parq", "--decode", "--allow-local").mountpoint
    assert np.array_equal(ncdump_values(decoded, "air"), air_values().ravel())
    consolidated = json.loads((decoded / ".zmetadata").read_text())["metadata"]
    assert consolidated["air/.zarray"]["filters"] is None
    group = zarr.open_group(decoded, mode="r", zarr_format=2, use_consolidated=True)
    assert np.array_equal(group["air"][...], air_values())


def test_remote_chunks_decode_once_for_keys_sharing_a_reference(
    mount: Callable[..., Mounted], http, tmp_path: Path
) -> None:
    import numcodecs

    values = np.linspace(0, 1, 16000, dtype="<f4")
    codec = numcodecs.Blosc(cname="zstd", shuffle=numcodecs.Blosc.SHUFFLE)
    chunk = bytes(codec.encode(values))
    whole = bytes(numcodecs.Zstd().encode(values))
    name = "decode-shared.bin"
    (http.root / name).write_bytes(b"x" * 100 + chunk)
    (http.root / "decode-whole.bin").write_bytes(whole)
    meta = zarray(dtype="<f4", shape=[16000], chunks=[16000], compressor=codec.get_config())
    refs = {
        ".zgroup": '{"zarr_format":2}',
        "a/.zarray": meta,
        "a/0": [f"{http.url}/{name}", 100, len(chunk)],
        "b/.zarray": meta,
        "b/0": [f"{http.url}/{name}", 100, len(chunk)],
        "c/.zarray": zarray(dtype="<f4", shape=[16000], chunks=[16000], compressor={"id": "zstd"}),
        "c/0": [f"{http.url}/decode-whole.bin"],
        "gone/.zarray": meta,
        "gone/0": [f"{http.url}/decode-no-such-file.bin", 0, len(chunk)],
    }
    path = tmp_path / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    root = mount(path, "--decode", "--xattrs").mountpoint
    for key in ("a/0", "b/0", "c/0"):
        assert (root / key).read_bytes() == values.tobytes(), key
    stats = json.loads(os.getxattr(root, "user.refmount.stats"))
    assert stats["decoded_chunks"] == 2  # a/0 and b/0 share one; c/0
    with pytest.raises(OSError) as failed:
        (root / "gone" / "0").read_bytes()
    assert failed.value.errno == errno.EIO
    assert os.stat(root / "gone" / "0").st_size == 64000


def test_a_reload_keeps_the_decoded_view(mount: Callable[..., Mounted], tmp_path: Path) -> None:
    import signal
    import time

    for name in ("air.nc", "refs.json"):
        (tmp_path / name).write_bytes((AIR / name).read_bytes())
    mounted = mount(tmp_path / "refs.json", "--decode", "--allow-local")
    root = mounted.mountpoint
    first = (root / "air" / "1.0.0").read_bytes()
    document = json.loads((tmp_path / "refs.json").read_text())
    document["refs"]["copy/.zarray"] = document["refs"]["air/.zarray"]
    document["refs"]["copy/0.0.0"] = document["refs"]["air/1.0.0"]
    (tmp_path / "refs.json").write_text(json.dumps(document))
    mounted.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 60
    while not (root / "copy").exists():
        assert time.monotonic() < deadline, mounted.log()
        time.sleep(0.05)
    assert (root / "copy" / "0.0.0").read_bytes() == first
    assert (root / "air" / "1.0.0").read_bytes() == first
    assert json.loads((root / "copy" / ".zarray").read_text())["filters"] is None


def test_a_chunk_bigger_than_the_budget_is_decoded_once_for_its_reader(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    values = np.arange(1 << 20, dtype="<f4")  # 4 MiB decoded, a 1 MiB budget
    refs = {
        ".zgroup": '{"zarr_format":2}',
        "big/.zarray": zarray(dtype="<f4", shape=[1 << 20], chunks=[1 << 20]),
        "big/0": inline(zlib.compress(values.tobytes())),
    }
    path = tmp_path / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    root = mount(path, "--decode", "--xattrs", "--cache-size", "1M").mountpoint
    pieces = []
    with open(root / "big" / "0", "rb", buffering=0) as chunk:  # READs one after another
        os.posix_fadvise(chunk.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
        while piece := chunk.read(256 << 10):
            pieces.append(piece)
    assert len(pieces) > 1 and b"".join(pieces) == values.tobytes()
    stats = json.loads(os.getxattr(root, "user.refmount.stats"))
    assert stats["decoded_chunks"] == 1


def test_ncdump_reads_a_big_endian_netcdf3_set_with_non_ascii_text(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    from kerchunk.netCDF3 import NetCDF3ToZarr

    source = tmp_path / "classic.nc"
    with netCDF4.Dataset(source, "w", format="NETCDF3_CLASSIC") as ds:
        ds.createDimension("time", None)
        ds.createDimension("x", 6)
        v = ds.createVariable("v", "f4", ("time", "x"))
        v.long_name = "température"
        w = ds.createVariable("w", "i2", ("time",))
        v[:] = np.arange(30).reshape(5, 6) / 3
        w[:] = np.arange(5) * -7
    refs = NetCDF3ToZarr(str(source), inline_threshold=0).translate()
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    assert ">f4" in refs["refs"]["v/.zarray"]  # netCDF3 data is big-endian
    decoded = mount(tmp_path / "refs.json", "--decode").mountpoint
    with netCDF4.Dataset(source) as ds:
        for name in ("v", "w"):
            expected = ds[name][:].ravel().astype("<f4")
            assert np.array_equal(ncdump_values(decoded, name), expected), name
    header = subprocess.run(
        ["ncdump", "-h", f"file://{decoded}#mode=zarr,file"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert 'v:long_name = "température" ;' in header


def test_ncdump_prints_a_netcdf4_set_with_scalar_variables_whole(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    """netCDF-C 4.9.0 dies reading a rank-0 array's data; the decoded view serves it as one
    element along ``_scalar_``, so ``ncdump`` of the whole set prints every variable."""
    from kerchunk.hdf import SingleHdf5ToZarr

    source = tmp_path / "scalars.nc"
    temp = (np.arange(24, dtype="f4") / 8 + 270).reshape(4, 6)
    with netCDF4.Dataset(source, "w", format="NETCDF4") as ds:
        ds.createDimension("y", 4)
        ds.createDimension("x", 6)
        crs = ds.createVariable("crs", "i4")
        crs.grid_mapping_name = "lambert_conformal_conic"
        crs.assignValue(-424242)
        level = ds.createVariable("level", "f8")
        level.assignValue(1013.25)
        t = ds.createVariable("temp", "f4", ("y", "x"), zlib=True, shuffle=True)
        t.grid_mapping = "crs"
        t[:] = temp
    with open(source, "rb") as f:
        refs = SingleHdf5ToZarr(f, source.as_uri(), inline_threshold=0).translate()
    assert json.loads(refs["refs"]["crs/.zarray"])["shape"] == []  # rank 0 in the set
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    decoded = mount(tmp_path / "refs.json", "--decode").mountpoint

    done = subprocess.run(
        ["ncdump", "-p", "9,17", f"file://{decoded}#mode=zarr,file"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "_scalar_ = 1 ;" in out
    assert "int crs(_scalar_) ;" in out and "double level(_scalar_) ;" in out
    assert 'crs:grid_mapping_name = "lambert_conformal_conic" ;' in out
    data = out.split("data:", 1)[1]
    assert re.search(r"\bcrs = -424242 ;", data), data
    assert re.search(r"\blevel = 1013.25 ;", data), data
    assert np.array_equal(ncdump_values(decoded, "temp"), temp.ravel())
    for name, value in (("crs", np.int32(-424242)), ("level", np.float64(1013.25))):
        assert (decoded / name / "0").read_bytes() == value.tobytes()
        assert os.stat(decoded / name / "0").st_size == value.itemsize
