"""Icechunk repositories read from moto's S3 and, read-only, from nginx over HTTP."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import zarr

from tests.support.icechunk_repos import (
    build_repository,
    build_s3_repository,
    native_values,
    read_in_process,
    read_s3_in_process,
    s3_options,
    write_netcdf,
)
from tests.support.nginx import NginxServer, nginx_available
from tests.support.servers import MotoServer


def read_mount(path: Path) -> dict[str, np.ndarray]:
    group = zarr.open_group(path, mode="r")
    return {name: array[:] for name, array in group.arrays()}


def test_s3_repository_with_s3_virtual_chunks(s3_server: MotoServer, mount, tmp_path) -> None:
    s3_server.make_bucket("icechunk-s3")
    netcdf = write_netcdf(tmp_path / "a.nc")
    url = build_s3_repository(s3_server.endpoint, "icechunk-s3", netcdf)
    options = s3_options(s3_server.endpoint)
    m = mount(
        url,
        "--refs-options", json.dumps(options),
        "--remote-options", json.dumps({"s3": options}),
    )  # fmt: skip
    through_mount = read_mount(m.mountpoint)
    in_process = read_s3_in_process(s3_server.endpoint, "icechunk-s3")
    assert sorted(through_mount) == sorted(in_process) == ["native", "temp", "time"]
    for name, values in in_process.items():
        np.testing.assert_array_equal(through_mount[name], values, err_msg=name)
    np.testing.assert_array_equal(through_mount["native"], native_values(1))
    with netCDF4.Dataset(netcdf) as ds:
        ds.set_auto_mask(False)
        np.testing.assert_array_equal(through_mount["temp"], ds["temp"][:])


def test_s3_repository_pointing_at_local_files_is_refused(
    s3_server: MotoServer, mount, tmp_path
) -> None:
    """A repository in a bucket whose virtual chunks are local files (its containers say
    file://): read from S3 they are refused unless --allow-local."""
    built = build_repository(tmp_path / "local")
    s3_server.make_bucket("icechunk-local-refs")
    for path in built.root.rglob("*"):
        if path.is_file():
            key = f"repo/{path.relative_to(built.root)}"
            s3_server.put("icechunk-local-refs", key, path.read_bytes())
    options = json.dumps(s3_options(s3_server.endpoint))
    remote = json.dumps({"s3": s3_options(s3_server.endpoint)})
    url = "s3://icechunk-local-refs/repo"
    m = mount(url, "--refs-options", options, "--remote-options", remote)
    with pytest.raises(OSError) as raised:
        (m.mountpoint / "temp/c/0/0/0").read_bytes()
    assert raised.value.errno == errno.EIO
    assert "pass --allow-local" in m.log()
    native = zarr.open_array(m.mountpoint / "native", mode="r")[:]
    np.testing.assert_array_equal(native, native_values(2))
    assert m.process.poll() is None
    allowed = mount(url, "--refs-options", options, "--remote-options", remote, "--allow-local")
    np.testing.assert_array_equal(
        read_mount(allowed.mountpoint)["temp"], read_in_process(built.root, built.data)["temp"]
    )


@pytest.mark.skipif(nginx_available() is not None, reason=str(nginx_available()))
def test_https_repository_read_only(mount, tmp_path) -> None:
    built = build_repository(tmp_path / "built")
    (tmp_path / "www").mkdir()
    with NginxServer(tmp_path / "www") as server:
        shutil.copytree(built.root, server.root / "repo")
        m = mount(f"{server.url}/repo", "--allow-local")
        through_mount = read_mount(m.mountpoint)
        in_process = read_in_process(built.root, built.data)
        for name, values in in_process.items():
            np.testing.assert_array_equal(through_mount[name], values, err_msg=name)
        assert sorted(os.listdir(m.mountpoint / "native/c/0")) == ["0", "1"]
