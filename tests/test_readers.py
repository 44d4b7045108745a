"""Today's readers through the mount, compared with reading the original files directly.

Files written by the netCDF library (tests/data_builders.py) are referenced the ways users
reference them: kerchunk to JSON and to Parquet, VirtualiZarr's ``.vz.to_kerchunk`` to JSON
and to Parquet, single files and a combined 4-file series.  Each set is mounted and read by
zarr 3 and xarray (every variable, attribute, dimension and decoded coordinate equal to
xarray reading the original), and every file's ``sha256sum`` (the real command) is compared
with the bytes fsspec's ReferenceFileSystem serves for its key.

The matrix is kept small: every maker and every transport appears, not every combination.
Transport only changes where bytes come from (tests/test_protocols.py covers it); the
makers change what the tree holds.  So each row below pairs one maker with one transport:

============================  ======================  =========
set                           made by                 targets
============================  ======================  =========
netCDF4, JSON                 kerchunk                local
netCDF4, JSON                 kerchunk                HTTP
netCDF4, Parquet              kerchunk                S3
netCDF4, JSON                 VirtualiZarr (scans     HTTP
                              over HTTP)
netCDF4, Parquet              VirtualiZarr            local
netCDF3, JSON                 kerchunk                local
netCDF3, JSON                 VirtualiZarr (S3 scan)  S3
4-file series, JSON           kerchunk MultiZarr      HTTP
4-file series, Parquet        VirtualiZarr concat     local
============================  ======================  =========

Readers that are not Python (GDAL, netCDF-C) read the local kerchunk sets: see
tests/test_readers_gdal.py.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import shutil
import subprocess
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import kerchunk.combine
import kerchunk.df
import kerchunk.hdf
import kerchunk.netCDF3
import numpy as np
import pytest
import xarray as xr
import zarr
from obspec_utils.registry import ObjectStoreRegistry
from obstore.store import HTTPStore, LocalStore, S3Store
from virtualizarr import open_virtual_dataset
from virtualizarr.parsers import HDFParser, NetCDF3Parser

from tests.conftest import Mounted
from tests.data_builders import (
    READERS_LONG_NAME,
    READERS_TITLE,
    netcdf_arrays,
    ref_map,
    write_readers_netcdf3,
    write_readers_netcdf4,
    write_series,
)
from tests.support.nginx import NginxServer
from tests.support.servers import S3_KEY, S3_REGION, MotoServer

BUCKET = "readers"
RECORD_SIZE = 10  # small records: Parquet sets span several record files

#: What VirtualiZarr 2.5 cannot describe, dropped when it scans (docs/sources.md, "Reference sets
#: made by VirtualiZarr"): a variable-length string variable (its HDF5 parser fails on the
#: bytes fill value) and a rank-0 variable (it writes the chunk key ``scalar/`` instead of
#: ``scalar/0``, which no Zarr reader asks for, so the value would read as the fill value).
VIRTUALIZARR_DROPS = ("station_name", "scalar")


@dataclass
class Sources:
    """The original files, where each transport serves them."""

    nc4: Path
    nc3: Path
    series: list[Path]
    http: str  # base URL of nginx's copy
    s3: str  # s3://bucket prefix of moto's copy


@dataclass
class RefSet:
    """A mountable reference set and what reading it must give."""

    path: Path  # JSON file or Parquet directory
    json_path: Path  # the set as JSON (for a Parquet set: the JSON set it was made from)
    expected: xr.Dataset  # xarray reading the original file(s)
    raw: dict[str, np.ndarray]  # every variable's stored values (no decoding)
    mount_args: list[str] = field(default_factory=list)
    remote_options: dict[str, Any] = field(default_factory=dict)  # fsspec's, for targets

    @property
    def parquet(self) -> bool:
        return self.path.is_dir()

    @property
    def keys(self) -> dict[str, Any]:
        return ref_map(json.loads(self.json_path.read_text()))


@pytest.fixture(scope="module")
def sources(
    tmp_path_factory: pytest.TempPathFactory, nginx: NginxServer, s3_server: MotoServer
) -> Sources:
    local = tmp_path_factory.mktemp("readers-data")
    nc4 = write_readers_netcdf4(local / "data4.nc")
    nc3 = write_readers_netcdf3(local / "data3.nc")
    series = write_series(local / "series")
    files = [nc4, nc3, *series]
    served = nginx.root / "readers"
    s3_server.make_bucket(BUCKET)
    for path in files:
        relative = path.relative_to(local).as_posix()
        (served / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, served / relative)
        s3_server.put(BUCKET, f"data/{relative}", path.read_bytes())
    return Sources(nc4, nc3, series, f"{nginx.url}/readers", f"s3://{BUCKET}/data")


def s3_options(s3_server: MotoServer) -> list[str]:
    return ["--remote-options", json.dumps({"s3": s3_server.storage_options})]


def s3_store(s3_server: MotoServer) -> S3Store:
    return S3Store(
        BUCKET,
        endpoint=s3_server.endpoint,
        access_key_id=S3_KEY,
        secret_access_key=S3_KEY,
        region=S3_REGION,
        client_options={"allow_http": True},
    )


def dump_json(refs: dict, path: Path) -> Path:
    path.write_text(json.dumps(refs))
    return path


def to_parquet(refs: dict, path: Path) -> Path:
    kerchunk.df.refs_to_dataframe(refs, str(path), record_size=RECORD_SIZE)
    return path


def virtual_refs(vds: xr.Dataset, directory: Path, fmt: str) -> tuple[Path, Path]:
    """VirtualiZarr's set in ``fmt``, and the same set as JSON."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numcodecs codecs "not in the Zarr 3 spec"
        vds.vz.to_kerchunk(str(directory / "refs.json"), format="json")
        if fmt == "json":
            return directory / "refs.json", directory / "refs.json"
        vds.vz.to_kerchunk(str(directory / "refs.parq"), format="parquet")
    return directory / "refs.parq", directory / "refs.json"


def open_virtual(url: str, registry: ObjectStoreRegistry, parser: Any) -> xr.Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return open_virtual_dataset(url, registry=registry, parser=parser)


def original(paths: list[Path], drop: tuple[str, ...] = ()) -> xr.Dataset:
    """xarray reading the original file(s), decoded, in memory."""
    if len(paths) == 1:
        with xr.open_dataset(paths[0]) as ds:
            return ds.drop_vars(list(drop), errors="ignore").load()
    parts = [xr.open_dataset(p) for p in paths]
    try:
        combined = xr.concat(parts, dim="time", data_vars="minimal", coords="minimal")
        return combined.drop_vars(list(drop), errors="ignore").load()
    finally:
        for part in parts:
            part.close()


def raw_series(paths: list[Path]) -> dict[str, np.ndarray]:
    parts = [netcdf_arrays(p) for p in paths]
    return {
        name: np.concatenate([p[name] for p in parts]) if name in {"time", "temp", "packed"}
        else parts[0][name]
        for name in parts[0]
    }  # fmt: skip


# -- the sets ---------------------------------------------------------------------------------


def kerchunk_nc4(src: Sources, tmp: Path, s3: MotoServer, transport: str, fmt: str) -> RefSet:
    url = {
        "local": src.nc4.as_uri(),
        "http": f"{src.http}/data4.nc",
        "s3": f"{src.s3}/data4.nc",
    }[transport]
    with open(src.nc4, "rb") as f:
        refs = kerchunk.hdf.SingleHdf5ToZarr(f, url, inline_threshold=100).translate()
    json_path = dump_json(refs, tmp / "refs.json")
    path = json_path if fmt == "json" else to_parquet(refs, tmp / "refs.parq")
    args = s3_options(s3) if transport == "s3" else []
    options = s3.storage_options if transport == "s3" else {}
    return RefSet(path, json_path, original([src.nc4]), netcdf_arrays(src.nc4), args, options)


def virtualizarr_nc4(src: Sources, tmp: Path, s3: MotoServer, transport: str, fmt: str) -> RefSet:
    if transport == "http":
        base = src.http.rsplit("/", 1)[0]
        store = HTTPStore.from_url(base, client_options={"allow_http": True})
        registry = ObjectStoreRegistry({base: store})
        url = f"{src.http}/data4.nc"
    else:
        registry = ObjectStoreRegistry({"file://": LocalStore()})
        url = src.nc4.as_uri()
    vds = open_virtual(url, registry, HDFParser(drop_variables=VIRTUALIZARR_DROPS))
    path, json_path = virtual_refs(vds, tmp, fmt)
    raw = {k: v for k, v in netcdf_arrays(src.nc4).items() if k not in VIRTUALIZARR_DROPS}
    return RefSet(path, json_path, original([src.nc4], VIRTUALIZARR_DROPS), raw)


def kerchunk_nc3(src: Sources, tmp: Path, s3: MotoServer, transport: str, fmt: str) -> RefSet:
    refs = kerchunk.netCDF3.NetCDF3ToZarr(str(src.nc3), inline_threshold=100).translate()
    return RefSet(
        path := dump_json(refs, tmp / "refs.json"), path, original([src.nc3]),
        netcdf_arrays(src.nc3),
    )  # fmt: skip


def virtualizarr_nc3(src: Sources, tmp: Path, s3: MotoServer, transport: str, fmt: str) -> RefSet:
    registry = ObjectStoreRegistry({f"s3://{BUCKET}": s3_store(s3)})
    # VirtualiZarr >= 2.6 parses the header itself, through the registry's store; 2.5 (the
    # newest for Python 3.11) read through kerchunk and fsspec, given fsspec's options.
    if "reader_options" in inspect.signature(NetCDF3Parser).parameters:
        parser = NetCDF3Parser(reader_options={"storage_options": s3.storage_options})
    else:
        parser = NetCDF3Parser()
    vds = open_virtual(f"{src.s3}/data3.nc", registry, parser)
    path, json_path = virtual_refs(vds, tmp, fmt)
    raw = netcdf_arrays(src.nc3)
    # VirtualiZarr writes "fill_value": 0 for an integer variable that has no _FillValue
    # (kerchunk writes null), so xarray masks its stored zeros: docs/sources.md, "Reference
    # sets made by VirtualiZarr".  fsspec reads the same set the same way (the sha256 test).
    assert (
        json.loads(ref_map(json.loads(json_path.read_text()))["packed/.zarray"])["fill_value"] == 0
    )
    expected = original([src.nc3])
    assert np.count_nonzero(raw["packed"] == 0) > 0, "no stored zero: nothing tested"
    expected["packed"] = expected["packed"].where(raw["packed"] != 0)
    return RefSet(path, json_path, expected, raw, s3_options(s3), s3.storage_options)


def kerchunk_series(src: Sources, tmp: Path, s3: MotoServer, transport: str, fmt: str) -> RefSet:
    singles = []
    for path in src.series:
        url = f"{src.http}/series/{path.name}"
        with open(path, "rb") as f:
            singles.append(kerchunk.hdf.SingleHdf5ToZarr(f, url, inline_threshold=100).translate())
    refs = kerchunk.combine.MultiZarrToZarr(
        singles, concat_dims=["time"], identical_dims=["y", "x"]
    ).translate()
    return RefSet(
        path := dump_json(refs, tmp / "refs.json"), path, original(src.series),
        raw_series(src.series),
    )  # fmt: skip


def virtualizarr_series(
    src: Sources, tmp: Path, s3: MotoServer, transport: str, fmt: str
) -> RefSet:
    registry = ObjectStoreRegistry({"file://": LocalStore()})
    parts = [open_virtual(p.as_uri(), registry, HDFParser()) for p in src.series]
    vds = xr.concat(parts, dim="time", data_vars="minimal", coords="minimal", compat="override")
    path, json_path = virtual_refs(vds, tmp, fmt)
    return RefSet(path, json_path, original(src.series), raw_series(src.series))


CASES: dict[str, tuple[Callable[..., RefSet], str, str]] = {
    "kerchunk-nc4-json-local": (kerchunk_nc4, "local", "json"),
    "kerchunk-nc4-json-http": (kerchunk_nc4, "http", "json"),
    "kerchunk-nc4-parquet-s3": (kerchunk_nc4, "s3", "parquet"),
    "virtualizarr-nc4-json-http": (virtualizarr_nc4, "http", "json"),
    "virtualizarr-nc4-parquet-local": (virtualizarr_nc4, "local", "parquet"),
    "kerchunk-nc3-json-local": (kerchunk_nc3, "local", "json"),
    "virtualizarr-nc3-json-s3": (virtualizarr_nc3, "s3", "json"),
    "kerchunk-series-json-http": (kerchunk_series, "http", "json"),
    "virtualizarr-series-parquet-local": (virtualizarr_series, "local", "parquet"),
}


@pytest.fixture(scope="module", params=list(CASES))
def refset(
    request: pytest.FixtureRequest,
    sources: Sources,
    s3_server: MotoServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> RefSet:
    make, transport, fmt = CASES[request.param]
    return make(sources, tmp_path_factory.mktemp("set"), s3_server, transport, fmt)


@pytest.fixture(scope="module")
def mounted(refset: RefSet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The set mounted once for every check of it (pytest groups the tests by set)."""
    directory = tmp_path_factory.mktemp("mounted")
    (directory / "mnt").mkdir()
    m = Mounted(refset.path, directory / "mnt", refset.mount_args, directory / "refmount.log")
    try:
        yield m.mountpoint
    finally:
        m.stop()


# -- the checks -------------------------------------------------------------------------------


def sha256sums(root: Path) -> dict[str, str]:
    """``sha256sum`` of every file under ``root``, run as one real command."""
    files = subprocess.run(
        ["find", str(root), "-type", "f", "-printf", "%P\\0"],
        capture_output=True, check=True,
    ).stdout.split(b"\0")[:-1]  # fmt: skip
    out = subprocess.run(
        ["sha256sum", "--", *(f.decode() for f in files)],
        cwd=root, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    sums = {}
    for line in out.splitlines():
        digest, name = line.split(maxsplit=1)
        sums[name.lstrip("*")] = digest
    return sums


def test_every_file_hashes_as_fsspec_serves_it(refset: RefSet, mounted: Path) -> None:
    sums = sha256sums(mounted)
    # refmount serves a Parquet set's .zmetadata as consolidated metadata of every key
    # (tests/test_parquet.py); fsspec serves the stored file, which is another document.
    keys = refset.keys
    assert set(sums) == set(keys) | ({".zmetadata"} if refset.parquet else set())
    # fsspec reads the JSON form: on pandas 3 its Parquet reader takes an inline row's null
    # path for the URL "nan" and fails (shared/notes/reference-semantics.md).
    fs = fsspec.filesystem(
        "reference", fo=str(refset.json_path), remote_options=refset.remote_options or None
    )
    for key in keys:
        assert sums[key] == hashlib.sha256(fs.cat(key)).hexdigest(), key


def test_zarr3_reads_every_variable(refset: RefSet, mounted: Path) -> None:
    group = zarr.open_group(str(mounted), mode="r")
    assert set(group.array_keys()) == set(refset.raw)
    for name, values in refset.raw.items():
        array = group[name]
        assert array.shape == values.shape, name
        if values.dtype == object:  # variable-length strings
            assert [str(v) for v in array[...].ravel()] == list(values.ravel()), name
            continue
        # netCDF3 is big-endian on disk; the netCDF library hands out native order.
        assert array.dtype.newbyteorder("=") == values.dtype.newbyteorder("="), name
        np.testing.assert_array_equal(array[...], values, err_msg=name)
    assert group.attrs["title"] == READERS_TITLE
    assert group["temp"].attrs["long_name"] == READERS_LONG_NAME


def test_xarray_reads_what_xarray_reads_from_the_original(refset: RefSet, mounted: Path) -> None:
    # Parquet mounts serve consolidated metadata; JSON sets have none.
    with xr.open_zarr(str(mounted), consolidated=refset.parquet, zarr_format=2) as ds:
        loaded = ds.load()
    xr.testing.assert_identical(loaded, refset.expected)
    # Decoded, not just equal: times are datetimes, packed values are scaled floats.
    assert loaded["time"].dtype.kind == "M"
    assert loaded["packed"].dtype.kind == "f"
    assert loaded.attrs["title"] == READERS_TITLE
    assert dict(loaded.sizes) == dict(refset.expected.sizes)
