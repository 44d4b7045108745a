"""The reader matrix of the decoded view over Zarr v3 trees (issue 21): readers of Zarr v2
only (Debian's netCDF-C 4.9.0 and GDAL 3.6) read v3 data through ``--decode``.

The sets (tests/support/v3_sets.py):

* ``icechunk-cf``, ``icechunk-classic``, ``icechunk-plugins``: the matrix's netCDF4 (zlib +
  shuffle with CF attributes, packed int16, NaN fill, a scalar, fletcher32), netCDF3
  classic (big-endian) and HDF5 (blosc-lz4, zstd) files scanned by VirtualiZarr and written
  to an Icechunk repository; each node's ``zarr.json`` as the repository returns it, each
  chunk VirtualiZarr's reference under its v3 key, in a JSON reference set;
* ``repo-cf``, ``repo-classic``, ``repo-plugins``: those Icechunk repositories themselves,
  mounted (refmount's Icechunk source) with ``--decode``;
* ``zarr3-native``: arrays zarr 3 wrote with its default codecs (zstd), ``transpose``,
  ``crc32c`` alone and after zstd, gzip, blosc, big-endian bytes, and sharding (each inner
  chunk a v2 chunk; the shard index at the end, and at the start with big-endian gzip
  inner chunks, edge shards and an inner chunk never written, read as the fill value).

Each variable is read by ``ncdump``, ``gdalmdiminfo -detailed``, ``gdal_translate``, the
rasterio wheel's GDAL 3.12 and zarr, and must equal what netCDF4-python reads from the
original file (or what zarr 3 wrote), except what the decoded view leaves out, which
``refmount check --decode`` names: a variable-length string array.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.support import reader_runs
from tests.support.mounting import Mounted
from tests.support.reader_datasets import fill_values, stored_values, write_datasets
from tests.support.reader_runs import EQUAL, Outcome
from tests.support.v3_sets import fill_values as v3_fill_values
from tests.support.v3_sets import icechunk_refs, native_arrays, store_refs, write_refs

FILES = ("cf", "classic", "plugins")
SETS = [
    *(f"icechunk-{name}" for name in FILES),
    *(f"repo-{name}" for name in FILES),
    "zarr3-native",
]
#: What the decoded view leaves out (named by ``refmount check --decode``).
LEFT_OUT = {"icechunk-cf": {"station_name"}, "repo-cf": {"station_name"}}
ABSENT = Outcome("absent")


@dataclass
class V3Set:
    name: str
    path: Path  # the JSON reference set, or the Icechunk repository
    expected: dict[str, np.ndarray]
    fills: dict[str, object]  # what ncdump's "_" stands for


@pytest.fixture(scope="module")
def v3set(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> V3Set:
    directory = tmp_path_factory.mktemp(request.param)
    if request.param == "zarr3-native":
        expected = native_arrays(directory / "store.zarr")
        refs = store_refs(directory / "store.zarr")
        fills = v3_fill_values(directory / "store.zarr")
    else:
        name = request.param.split("-")[1]
        dataset = {d.name: d for d in write_datasets(directory / "data")}[name]
        refs = icechunk_refs(dataset, directory / "repo")
        expected, fills = stored_values(dataset.path), fill_values(dataset.path)
        if request.param.startswith("repo-"):  # the repository itself, mounted
            return V3Set(request.param, directory / "repo", expected, fills)
    return V3Set(request.param, write_refs(refs, directory / "refs.json"), expected, fills)


@pytest.fixture(scope="module")
def mounted(v3set: V3Set, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("mnt-v3")
    (directory / "mnt").mkdir()
    m = Mounted(v3set.path, directory / "mnt", ["--decode"], directory / "refmount.log")
    try:
        yield m.mountpoint
    finally:
        m.stop()


pytestmark = pytest.mark.parametrize("v3set", SETS, indirect=True)


def each(
    v3set: V3Set, mounted: Path, read: Callable[[str, np.ndarray], Outcome]
) -> dict[str, Outcome]:
    present = set(os.listdir(mounted))
    return {
        name: read(name, values) if name in present else ABSENT
        for name, values in v3set.expected.items()
    }


def check(reader: str, v3set: V3Set, outcomes: dict[str, Outcome]) -> None:
    """Every variable equal, but those left out, which are absent."""
    left_out = LEFT_OUT.get(v3set.name, set())
    want = {name: ABSENT if name in left_out else EQUAL for name in v3set.expected}
    report = f"{reader} {v3set.name}: " + json.dumps(
        {name: str(o) for name, o in sorted(outcomes.items())}, ensure_ascii=False
    )
    assert outcomes == want, report


def test_ncdump(v3set: V3Set, mounted: Path) -> None:
    outcomes = each(
        v3set, mounted, lambda n, v: reader_runs.ncdump(mounted, n, v, v3set.fills.get(n))
    )
    check("ncdump", v3set, outcomes)
    failure, printed = reader_runs.ncdump_whole(mounted)  # the whole tree at once
    assert failure is None, failure
    data = printed.split("\ndata:\n", 1)[1]
    present = {name for name, got in outcomes.items() if got.kind != "absent"}
    assert {n for n in present if re.search(rf"^ {n} =", data, re.M)} == present


def test_gdal_debian_mdim(v3set: V3Set, mounted: Path) -> None:
    outcomes = each(v3set, mounted, lambda n, v: reader_runs.gdalmdiminfo(mounted, n, v))
    check("gdalmdiminfo", v3set, outcomes)


def test_gdal_debian_translate(v3set: V3Set, mounted: Path, tmp_path: Path) -> None:
    outcomes = each(
        v3set, mounted, lambda n, v: reader_runs.gdal_translate(mounted, n, v, tmp_path)
    )
    check("gdal_translate", v3set, outcomes)


def test_gdal_rasterio_wheel(v3set: V3Set, mounted: Path, tmp_path: Path) -> None:
    present = set(os.listdir(mounted))
    expected = {k: v for k, v in v3set.expected.items() if k in present}
    outcomes = reader_runs.rasterio_gdal(mounted, expected, tmp_path)
    outcomes |= dict.fromkeys(set(v3set.expected) - present, ABSENT)
    check("rasterio", v3set, outcomes)


def test_zarr3(v3set: V3Set, mounted: Path) -> None:
    check("zarr", v3set, each(v3set, mounted, lambda n, v: reader_runs.zarr3(mounted, n, v)))


def test_check_names_what_decode_leaves_out(v3set: V3Set, mounted: Path) -> None:
    missing = set(v3set.expected) - set(os.listdir(mounted))
    assert missing == LEFT_OUT.get(v3set.name, set())
    reader_runs.assert_check_names(v3set.path, missing)
