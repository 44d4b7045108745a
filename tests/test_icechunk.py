"""Icechunk repositories mounted for real: read through the mount with zarr 3 and xarray,
compared with netCDF4 reading the original file and icechunk reading the repository."""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import pytest
import xarray as xr
import zarr

from tests.conftest import REFMOUNT
from tests.data_builders import kerchunk_refs
from tests.support.icechunk_repos import (
    FILL,
    Built,
    build_repository,
    native_values,
    open_local,
    read_in_process,
    write_native,
)
from tests.support.mounting import child_env
from tests.support.v3_2026 import rewrite_manifest

ARRAYS = ("native", "sparse", "temp", "time")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_repository(tmp_path_factory.mktemp("icechunk"))


@pytest.fixture
def copy(built: Built, tmp_path: Path) -> Built:
    """A copy of the repository a test may change (the netCDF file stays shared)."""
    root = tmp_path / "repo"
    shutil.copytree(built.root, root)
    return Built(root, built.data, built.netcdf, built.first, built.second, built.dev)


def read_mount(path: Path) -> dict[str, np.ndarray]:
    group = zarr.open_group(path, mode="r")
    return {name: array[:] for name, array in group.arrays()}


def test_mount_reads_what_icechunk_and_netcdf_read(built: Built, mount) -> None:
    m = mount(built.root)
    through_mount = read_mount(m.mountpoint)
    in_process = read_in_process(built.root, built.data)
    assert sorted(through_mount) == sorted(in_process) == list(ARRAYS)
    for name in ARRAYS:
        np.testing.assert_array_equal(through_mount[name], in_process[name], err_msg=name)
    np.testing.assert_array_equal(through_mount["native"], native_values(2))
    with netCDF4.Dataset(built.netcdf) as ds:
        ds.set_auto_mask(False)
        np.testing.assert_array_equal(through_mount["temp"], ds["temp"][:])
        np.testing.assert_array_equal(through_mount["time"], ds["time"][:])
    assert int((through_mount["temp"] == FILL).sum()) == 12
    # xarray applies the CF attributes the repository keeps: the fill value is masked
    with xr.open_zarr(m.mountpoint, consolidated=False) as ds, xr.open_dataset(built.netcdf) as nc:
        xr.testing.assert_identical(ds["temp"].load(), nc["temp"].load())
        assert int(np.isnan(ds["temp"].values).sum()) == 12
        assert ds["temp"].attrs["units"] == "K"


def test_zarr_json_is_what_the_store_holds(built: Built, mount) -> None:
    m = mount(built.root)
    repo = open_local(built.root)
    store = repo.readonly_session("main").store
    for key in ("zarr.json", "temp/zarr.json", "native/zarr.json"):
        held = zarr.core.sync.sync(store.get(key, zarr.core.buffer.default_buffer_prototype()))
        assert (m.mountpoint / key).read_bytes() == held.to_bytes()
    document = json.loads((m.mountpoint / "temp/zarr.json").read_bytes())
    assert document["codecs"][-1]["name"] == "numcodecs.zlib"


def test_listing_sizes_and_missing_chunks(built: Built, mount) -> None:
    m = mount(built.root)
    root = m.mountpoint
    assert sorted(os.listdir(root)) == [
        "forecast", "native", "sparse", "temp", "time", "zarr.json"
    ]  # fmt: skip
    assert sorted(os.listdir(root / "forecast")) == ["wind", "zarr.json"]
    assert os.stat(root / "forecast").st_nlink == 3
    wind = zarr.open_array(root / "forecast/wind", mode="r")[:]
    np.testing.assert_array_equal(wind, np.arange(4, dtype="f4"))
    assert sorted(os.listdir(root / "native")) == ["c", "zarr.json"]
    assert sorted(os.listdir(root / "native/c")) == ["0", "1", "2", "3"]
    assert sorted(os.listdir(root / "native/c/3")) == ["0", "1"]
    assert sorted(os.listdir(root / "time/c")) == ["0"]
    # the manifest holds only the written chunk of "sparse": the others do not exist
    assert os.listdir(root / "sparse/c/0") == ["0"]
    assert os.listdir(root / "sparse/c/1") == []
    with pytest.raises(FileNotFoundError):
        os.stat(root / "sparse/c/1/1")
    with pytest.raises(FileNotFoundError):
        os.stat(root / "native/c/9/0")  # outside the grid
    expected = np.full((10, 10), -1.0)
    expected[:5, :5] = 1.5
    np.testing.assert_array_equal(zarr.open_array(root / "sparse", mode="r")[:], expected)
    # sizes come from the manifest, before any read; they are the bytes a read gives
    repo = open_local(built.root, built.data)
    store = repo.readonly_session("main").store
    prototype = zarr.core.buffer.default_buffer_prototype()
    for key in ("native/c/0/0", "native/c/3/1", "temp/c/1/1/0", "time/c/0"):
        held = zarr.core.sync.sync(store.get(key, prototype)).to_bytes()
        assert os.stat(root / key).st_size == len(held), key
        assert (root / key).read_bytes() == held, key


def test_versions(built: Built, mount) -> None:
    tagged = mount(built.root, "--tag", "v1")
    np.testing.assert_array_equal(read_mount(tagged.mountpoint)["native"], native_values(1))
    by_id = mount(built.root, "-o", f"snapshot={built.second}")
    np.testing.assert_array_equal(read_mount(by_id.mountpoint)["native"], native_values(2))
    dev = mount(built.root, "--branch", "dev")
    values = read_mount(dev.mountpoint)
    np.testing.assert_array_equal(values["native"], native_values(3))
    np.testing.assert_array_equal(values["temp"], read_in_process(built.root, built.data)["temp"])


def test_unknown_version_is_a_clear_failed_start(built: Built, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run(
        [*REFMOUNT, str(built.root), str(mnt), "--branch", "nope"],
        capture_output=True, text=True, timeout=60, env=child_env(),
    )  # fmt: skip
    assert done.returncode == 1
    assert "cannot open the repository" in done.stderr
    assert "nope" in done.stderr


def test_a_new_commit_appears_while_open_files_keep_their_snapshot(copy: Built, mount) -> None:
    m = mount(copy.root, "--reload-interval", "0.2")
    chunk = m.mountpoint / "native/c/0/0"
    before = chunk.read_bytes()
    with open(chunk, "rb") as opened:
        repo = open_local(copy.root)
        session = repo.writable_session("main")
        write_native(session.store, 4)
        session.commit("third")
        deadline = time.monotonic() + 60
        while chunk.read_bytes() == before:
            assert time.monotonic() < deadline, m.log()
            time.sleep(0.1)
        np.testing.assert_array_equal(read_mount(m.mountpoint)["native"], native_values(4))
        assert opened.read() == before
    assert m.process.poll() is None


def test_sighup_checks_the_branch_at_once(copy: Built, mount) -> None:
    m = mount(copy.root)
    before = read_mount(m.mountpoint)["native"]
    session = open_local(copy.root).writable_session("main")
    write_native(session.store, 5)
    session.commit("fifth")
    assert (read_mount(m.mountpoint)["native"] == before).all()  # no polling: still served
    m.process.send_signal(1)
    deadline = time.monotonic() + 60
    while not (read_mount(m.mountpoint)["native"] == native_values(5)).all():
        assert time.monotonic() < deadline, m.log()
        time.sleep(0.1)


def test_reference_outside_containers_is_refused(copy: Built, mount, tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret bytes" * 10)
    session = open_local(copy.root).writable_session("main")
    store = session.store
    zarr.open_group(store).create_array("stolen", shape=(10,), chunks=(10,), dtype="u1")
    store.set_virtual_ref(
        "stolen/c/0", outside.as_uri(), offset=0, length=10, validate_container=False
    )
    session.commit("a reference outside the containers", allow_empty=True)
    m = mount(copy.root)
    assert os.listdir(m.mountpoint / "stolen/c") == ["0"]
    with pytest.raises(OSError) as raised:
        (m.mountpoint / "stolen/c/0").read_bytes()
    assert raised.value.errno == errno.EIO
    assert "outside every virtual chunk container" in m.log()
    assert "secret" not in m.log()
    np.testing.assert_array_equal(read_mount_array(m.mountpoint, "temp").shape, (6, 20, 30))
    assert m.process.poll() is None


def read_mount_array(path: Path, name: str) -> np.ndarray:
    return zarr.open_array(path / name, mode="r")[:]


def test_huge_claimed_size_is_refused(copy: Built, mount) -> None:
    session = open_local(copy.root).writable_session("main")
    store = session.store
    zarr.open_group(store).create_array("huge", shape=(10,), chunks=(10,), dtype="u1")
    url = copy.netcdf.as_uri()
    store.set_virtual_ref("huge/c/0", url, offset=0, length=1 << 50)
    session.commit("a chunk claiming a petabyte")
    m = mount(copy.root)
    # a key of the set: it exists (ENOENT would read as fill values), and reads as EIO
    assert os.stat(m.mountpoint / "huge/c/0").st_size == 1 << 50
    with pytest.raises(OSError) as raised, open(m.mountpoint / "huge/c/0", "rb") as chunk:
        chunk.read(10)
    assert raised.value.errno == errno.EIO
    assert "huge/c/0" in m.log() and "refused" in m.log()
    np.testing.assert_array_equal(read_mount_array(m.mountpoint, "native"), native_values(2))
    assert m.process.poll() is None


@pytest.mark.parametrize(
    "claim",
    [{"offset": (1 << 62) + 1}, {"offset": 0, "checksum": "etag\nwith a line break"}],
    ids=["offset-out-of-bounds", "etag-not-a-header"],
)
def test_a_refused_chunk_claiming_no_bytes_is_eio_not_empty(
    copy: Built, mount, claim: dict[str, Any]
) -> None:
    """A refused reference of length 0 is not an empty chunk: a file of size 0 the kernel
    reads without asking the daemon, so its size is 1 and its read the refusal's EIO.
    Icechunk writes no reference of length 0 (it refuses one): the manifest is edited."""
    session = open_local(copy.root).writable_session("main")
    store = session.store
    zarr.open_group(store).create_array("empty", shape=(10,), chunks=(10,), dtype="u1")
    marker = 0x5A17_5A17
    store.set_virtual_ref("empty/c/0", copy.netcdf.as_uri(), length=marker, **claim)
    session.commit("a refused chunk")
    rewrite_manifest(copy.root, struct.pack("<Q", marker), struct.pack("<Q", 0))
    m = mount(copy.root)
    assert os.listdir(m.mountpoint / "empty/c") == ["0"]
    assert os.stat(m.mountpoint / "empty/c/0").st_size == 1
    with pytest.raises(OSError) as raised, open(m.mountpoint / "empty/c/0", "rb") as chunk:
        chunk.read()
    assert raised.value.errno == errno.EIO
    assert "empty/c/0" in m.log() and "refused" in m.log()
    assert m.process.poll() is None


def test_corrupt_manifest_fails_its_array_only(copy: Built, mount) -> None:
    repo = open_local(copy.root)
    info = repo.inspect_snapshot(copy.second)
    native = next(n for n in info["nodes"] if n["path"] == "/native")
    manifest = copy.root / "manifests" / native["manifest_refs"][0]["id"]
    data = bytearray(manifest.read_bytes())
    data[60:] = bytes(len(data) - 60)
    manifest.write_bytes(bytes(data))
    m = mount(copy.root)
    with pytest.raises(OSError) as raised:
        os.listdir(m.mountpoint / "native/c/0")
    assert raised.value.errno == errno.EIO
    manifest_id = native["manifest_refs"][0]["id"]
    assert f"native: its manifest is unusable: manifest {manifest_id}: corrupt" in m.log()
    with netCDF4.Dataset(copy.netcdf) as ds:
        ds.set_auto_mask(False)
        np.testing.assert_array_equal(read_mount_array(m.mountpoint, "temp"), ds["temp"][:])
    assert m.process.poll() is None


def test_without_the_package_one_clear_line(built: Built, tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    (hidden / "icechunk").mkdir(parents=True)
    (hidden / "icechunk/__init__.py").write_text("raise ImportError('icechunk is not installed')\n")
    env = child_env()
    env["PYTHONPATH"] = f"{hidden}{os.pathsep}{env.get('PYTHONPATH', '')}"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "refmount", str(built.root), str(mnt)],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "pip install 'refmount[icechunk]'" in lines[0]


def test_check_reports_versions_kinds_and_refused_references(copy: Built, tmp_path: Path) -> None:
    session = open_local(copy.root).writable_session("main")
    store = session.store
    zarr.open_group(store).create_array("stolen", shape=(10,), chunks=(10,), dtype="u1")
    store.set_virtual_ref(
        "stolen/c/0", (tmp_path / "x").as_uri(), offset=0, length=10, validate_container=False
    )
    session.commit("a reference outside the containers")
    done = subprocess.run(
        [*REFMOUNT, "check", str(copy.root), "--json"],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["format"] == "Icechunk"
    summary = report["icechunk"]
    assert summary["branches"]["dev"] == copy.dev
    assert summary["tags"] == {"v1": copy.first}
    assert summary["containers"] == [copy.data.as_uri() + "/"]
    assert summary["arrays"]["native"] == {"native": 4, "virtual": 0, "inline": 4}
    assert summary["arrays"]["temp"] == {"native": 0, "virtual": 12, "inline": 0}
    assert [p["kind"] for p in report["problems"]] == ["refused"]
    assert "stolen/c/0" in report["problems"][0]["message"]
    tagged = subprocess.run(
        [*REFMOUNT, "check", str(copy.root), "--tag", "v1", "--json"],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    assert tagged.returncode == 0, tagged.stdout
    assert json.loads(tagged.stdout)["icechunk"]["snapshot"] == copy.first


def test_status_shows_the_snapshot_and_the_last_check(built: Built, mount) -> None:
    m = mount(built.root, "--reload-interval", "0.2")
    deadline = time.monotonic() + 60
    while True:
        done = subprocess.run(
            [*REFMOUNT, "status", str(m.mountpoint), "--json"],
            capture_output=True, text=True, timeout=60, env=child_env(),
        )  # fmt: skip
        status = json.loads(done.stdout)
        if status["last_check"] is not None or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status["version"]["snapshot"] == built.second
    assert status["version"]["version"] == "branch main"
    assert status["last_check"] is not None
    shown = subprocess.run(
        [*REFMOUNT, "status", str(m.mountpoint)],
        capture_output=True, text=True, timeout=60, env=child_env(),
    )  # fmt: skip
    assert f"{built.second} (branch main" in shown.stdout


def test_catalog_mounts_repositories_beside_reference_files(copy: Built, mount, tmp_path) -> None:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    shutil.move(copy.root, catalog / "archive")
    refs = kerchunk_refs(copy.netcdf, str(copy.netcdf))
    (catalog / "plain.json").write_text(json.dumps(refs))
    m = mount(catalog)
    assert sorted(os.listdir(m.mountpoint)) == ["archive", "plain"]
    in_repo = read_mount(m.mountpoint / "archive")
    np.testing.assert_array_equal(in_repo["native"], native_values(2))
    plain = zarr.open_group(m.mountpoint / "plain", mode="r", zarr_format=2)
    np.testing.assert_array_equal(plain["temp"][:], in_repo["temp"])
    session = open_local(catalog / "archive").writable_session("main")
    write_native(session.store, 6)
    session.commit("sixth")
    m.process.send_signal(1)  # SIGHUP refreshes the catalog
    deadline = time.monotonic() + 60
    while not (read_mount(m.mountpoint / "archive")["native"] == native_values(6)).all():
        assert time.monotonic() < deadline, m.log()
        time.sleep(0.1)


def test_a_touched_source_file_makes_its_virtual_chunks_eio(mount, tmp_path: Path) -> None:
    """VirtualiZarr records when each virtual chunk's file was seen unchanged: a file
    modified since (a new mtime, the same bytes) is refused, not read; native and inline
    chunks still read."""
    own = build_repository(tmp_path / "own")
    m = mount(own.root)
    expected = read_in_process(own.root, own.data)
    assert os.stat(m.mountpoint / "temp/c/1/1/1").st_size > 0  # listed, not yet read
    later = time.time() + 10
    os.utime(own.netcdf, (later, later))
    for key in ("temp/c/1/1/1", "temp/c/2/0/0"):
        with pytest.raises(OSError) as raised:
            (m.mountpoint / key).read_bytes()
        assert raised.value.errno == errno.EIO, key
    np.testing.assert_array_equal(read_mount_array(m.mountpoint, "native"), native_values(2))
    np.testing.assert_array_equal(read_mount_array(m.mountpoint, "time"), expected["time"])
    assert "a.nc" in m.log()
    assert m.process.poll() is None


def test_versions_as_directories(copy: Built, mount) -> None:
    m = mount(copy.root, "--versions")
    root = m.mountpoint
    assert sorted(os.listdir(root)) == ["branches", "snapshots", "tags"]
    assert sorted(os.listdir(root / "branches")) == ["dev", "main"]
    assert os.listdir(root / "tags") == ["v1"]
    snapshots = set(os.listdir(root / "snapshots"))
    assert {copy.first, copy.second, copy.dev} <= snapshots
    np.testing.assert_array_equal(read_mount(root / "tags/v1")["native"], native_values(1))
    np.testing.assert_array_equal(read_mount(root / "branches/dev")["native"], native_values(3))
    by_id = read_mount(root / "snapshots" / copy.second)["native"]
    np.testing.assert_array_equal(by_id, native_values(2))
    np.testing.assert_array_equal(read_mount(root / "branches/main")["native"], native_values(2))
    session = open_local(copy.root).writable_session("main")
    write_native(session.store, 7)
    third = session.commit("seventh")
    m.process.send_signal(1)  # SIGHUP refreshes the listing: main's head moved
    deadline = time.monotonic() + 60
    while not (read_mount(root / "branches/main")["native"] == native_values(7)).all():
        assert time.monotonic() < deadline, m.log()
        time.sleep(0.1)
    assert third in os.listdir(root / "snapshots")
    np.testing.assert_array_equal(read_mount(root / "tags/v1")["native"], native_values(1))
