"""The netCDF view of Icechunk repositories, their versions and catalogs, through real
mounts: one ``.nc`` per group with arrays, per set of a catalog, per version; a commit
swaps the file as it swaps the tree."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import netCDF4
import numpy as np

from tests.data_builders import kerchunk_refs
from tests.support.icechunk_repos import (
    Built,
    native_values,
    open_local,
    read_in_process,
    write_native,
)
from tests.test_icechunk import built, copy  # noqa: F401 - fixtures


def values(path: Path) -> dict[str, np.ndarray]:
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return {name: ds[name][:] for name in ds.variables}


def native_in(path: Path) -> np.ndarray:
    with netCDF4.Dataset(path) as ds:
        return ds["native"][:]


def test_a_repository_is_a_file_per_group_with_arrays(built: Built, mount) -> None:  # noqa: F811
    m = mount(built.root, "--netcdf")
    assert sorted(os.listdir(m.mountpoint)) == ["repo.forecast.nc", "repo.nc"]
    served = values(m.mountpoint / "repo.nc")
    expected = read_in_process(built.root, built.data)
    assert sorted(served) == ["native", "sparse", "temp", "time"]
    for name, array in served.items():
        np.testing.assert_array_equal(array, expected[name], err_msg=name)
    with netCDF4.Dataset(m.mountpoint / "repo.nc") as ds:
        assert ds["temp"].dimensions == ("time", "y", "x")
        assert ds["temp"].units == "K" and ds["temp"]._FillValue == np.float32(-999)
    assert list(values(m.mountpoint / "repo.forecast.nc")["wind"]) == [0, 1, 2, 3]


def test_versions_are_files_and_a_commit_swaps_main(copy: Built, mount) -> None:  # noqa: F811
    m = mount(copy.root, "--versions", "--netcdf")
    root = m.mountpoint
    assert sorted(os.listdir(root / "branches")) == ["dev", "dev.nc", "main", "main.nc"]
    assert sorted(os.listdir(root / "branches/main")) == ["main.forecast.nc", "main.nc"]
    np.testing.assert_array_equal(native_in(root / "tags/v1.nc"), native_values(1))
    np.testing.assert_array_equal(native_in(root / "tags/v1/v1.nc"), native_values(1))
    np.testing.assert_array_equal(native_in(root / "branches/dev.nc"), native_values(3))
    second = root / "snapshots" / f"{copy.second}.nc"
    np.testing.assert_array_equal(native_in(second), native_values(2))
    np.testing.assert_array_equal(native_in(root / "branches/main.nc"), native_values(2))
    session = open_local(copy.root).writable_session("main")
    write_native(session.store, 7)
    session.commit("seventh")
    m.process.send_signal(1)  # SIGHUP: main's head moved, its file is the new snapshot's
    deadline = time.monotonic() + 60
    while not (native_in(root / "branches/main.nc") == native_values(7)).all():
        assert time.monotonic() < deadline, m.log()
        time.sleep(0.1)
    np.testing.assert_array_equal(native_in(root / "branches/main/main.nc"), native_values(7))
    np.testing.assert_array_equal(native_in(root / "tags/v1.nc"), native_values(1))


def test_a_catalog_holds_one_file_per_set(copy: Built, mount, tmp_path: Path) -> None:  # noqa: F811
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    shutil.move(copy.root, catalog / "archive")
    (catalog / "plain.json").write_text(json.dumps(kerchunk_refs(copy.netcdf, str(copy.netcdf))))
    m = mount(catalog, "--netcdf", "--allow-local")
    assert sorted(os.listdir(m.mountpoint)) == ["archive", "archive.nc", "plain", "plain.nc"]
    assert os.listdir(m.mountpoint / "plain") == ["plain.nc"]
    assert sorted(os.listdir(m.mountpoint / "archive")) == ["archive.forecast.nc", "archive.nc"]
    archive = values(m.mountpoint / "archive.nc")
    plain = values(m.mountpoint / "plain.nc")
    np.testing.assert_array_equal(plain["temp"], archive["temp"])
    with netCDF4.Dataset(copy.netcdf) as original:
        original.set_auto_maskandscale(False)
        np.testing.assert_array_equal(plain["temp"], original["temp"][:])
