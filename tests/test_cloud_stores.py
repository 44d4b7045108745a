"""Google Cloud Storage and Azure Blob Storage through real mounts: fake-gcs-server for
``gs://``, Azurite for ``az://`` and ``abfs://``, both on 127.0.0.1, credentials in
``--remote-options`` / ``--refs-options`` as gcsfs and adlfs spell them.

Targets of JSON reference sets and Icechunk repositories are read through the kernel on
both fetch backends; faults (503, 404) come from nginx put in front of the emulator
(:mod:`tests.support.fault_proxy`); a changed object is refused where the reference
carries a checksum, as an Icechunk virtual chunk does.
"""

from __future__ import annotations

import datetime
import errno
import itertools
import json
import os
import random
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import pytest
import zarr

from refmount.fetch.obstore_options import translate
from tests.conftest import Mounted
from tests.data_builders import dump_refs
from tests.support.azurite import ACCOUNT, Azurite, connection_string
from tests.support.fault_proxy import FaultProxy
from tests.support.gcs import FakeGcsServer
from tests.support.icechunk_repos import build_virtual_repository, native_values, write_netcdf
from tests.test_checksums_mount import mount_checksummed
from tests.test_protocols import assert_reads, payload, relative_refs

_names = itertools.count()


@dataclass
class Cloud:
    """One emulator, as the tests use it: a fresh bucket (container), objects, options."""

    kind: str  # "gcs" or "azure"
    server: FakeGcsServer | Azurite

    @property
    def scheme(self) -> str:
        return "gs" if self.kind == "gcs" else "az"

    def space(self) -> str:
        """A new, empty bucket (GCS) or container (Azure)."""
        name = f"refmount-{os.getpid()}-{next(_names)}"
        if isinstance(self.server, FakeGcsServer):
            self.server.make_bucket(name)
        else:
            self.server.make_container(name)
        return name

    def put(self, space: str, key: str, data: bytes) -> None:
        self.server.put(space, key, data)

    def upload_tree(self, root: Path, space: str, prefix: str) -> None:
        """Every file under ``root`` as ``prefix/<its relative path>``."""
        for path in sorted(root.rglob("*")):
            if path.is_file():
                self.put(space, f"{prefix}/{path.relative_to(root)}", path.read_bytes())

    def mount_stored(self, mount: Callable[..., Mounted], url: str) -> Mounted:
        """``url`` (on this store) mounted, the store's options for it and its targets."""
        options = self.options()
        return mount(
            url,
            "--refs-options", json.dumps(options),
            "--remote-options", json.dumps({self.scheme: options}),
        )  # fmt: skip

    def etag(self, space: str, key: str) -> str:
        """The object's ETag as the store's ranged GETs answer it."""
        from obstore import head

        config = translate(self.scheme, self.options())
        store = self.obstore(space, config)
        return str(head(store, key)["e_tag"])

    def obstore(self, space: str, config: Any) -> Any:
        from obstore.store import AzureStore, GCSStore

        options = {"client_options": {"allow_http": True}}
        if self.kind == "gcs":
            return GCSStore(space, config=config.config, **options)
        return AzureStore(space, config=config.config, **options)

    def options(self, base_url: str | None = None) -> dict[str, Any]:
        """gcsfs's or adlfs's options for this emulator, or for ``base_url`` in front of it."""
        url = base_url or self.server.url
        if self.kind == "gcs":
            return {"endpoint_url": url, "token": "anon"}
        return {"connection_string": connection_string(f"{url}/devstoreaccount1")}


def cloud_of(request: pytest.FixtureRequest, kind: str) -> Cloud:
    """The emulator for ``kind``, started once per session."""
    return Cloud(kind, request.getfixturevalue("gcs_server" if kind == "gcs" else "azurite"))


@pytest.fixture(params=["gcs", "azure"])
def cloud(request: pytest.FixtureRequest) -> Cloud:
    return cloud_of(request, request.param)


def cat(path: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["cat", str(path)], capture_output=True, timeout=120)


# -- targets of a JSON reference set ----------------------------------------------------------


@pytest.mark.parametrize("backend", ["obstore", "fsspec"])
@pytest.mark.parametrize("form", ["gs", "az", "abfs", "abfs-account"])
def test_targets_read_through_a_mount(
    mount: Callable[..., Mounted],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    backend: str,
    form: str,
) -> None:
    """``abfs-account``: ``abfs://container@account.dfs.core.windows.net/path``."""
    cloud = cloud_of(request, "gcs" if form == "gs" else "azure")
    space = cloud.space()
    data = payload(250_000, 21)
    cloud.put(space, "dir/data.bin", data)
    cloud.put(space, "whole.bin", data[:777])
    protocol = form.split("-")[0]
    where = f"{space}@{ACCOUNT}.dfs.core.windows.net" if form == "abfs-account" else space
    target = f"{protocol}://{where}/dir/data.bin"
    refs = {
        "x/first": [target, 0, 1000],
        "x/middle": [target, 100_000, 65_536],
        "x/last": [target, 249_999, 1],
        "whole": [f"{protocol}://{where}/whole.bin"],
    }
    options = json.dumps({protocol: cloud.options()})
    m = mount(
        dump_refs(refs, tmp_path / "refs.json"),
        "--remote-options", options, "--fetch-backend", backend,
    )  # fmt: skip
    assert_reads(
        m.mountpoint,
        {
            "x/first": data[:1000],
            "x/middle": data[100_000:165_536],
            "x/last": data[249_999:],
            "whole": data[:777],
        },
    )
    through_obstore = f"{protocol}://{where}: byte ranges through obstore" in m.log()
    assert through_obstore == (backend == "obstore")


def test_refs_file_on_the_store_with_relative_targets(
    mount: Callable[..., Mounted], cloud: Cloud
) -> None:
    refs, files, expected = relative_refs()
    space = cloud.space()
    for path, data in files.items():
        cloud.put(space, f"set/{path}", data)
    cloud.put(space, "set/refs.json", json.dumps(refs).encode())
    m = cloud.mount_stored(mount, f"{cloud.scheme}://{space}/set/refs.json")
    assert_reads(m.mountpoint, expected)
    assert "azure.core" not in m.log()  # azure-core's line per request, headers and all


def test_a_gcs_access_token_is_sent_as_a_bearer_token(
    mount: Callable[..., Mounted], gcs_server: FakeGcsServer, tmp_path: Path
) -> None:
    """gcsfs's ``token`` given as an access token reaches the store (obstore) as
    ``Authorization: Bearer``; fake-gcs-server ignores it, the proxy's gate sees it."""
    cloud = Cloud("gcs", gcs_server)
    space = cloud.space()
    data = payload(20_000, 26)
    cloud.put(space, "data.bin", data)
    with FaultProxy(gcs_server.port) as proxy:
        options = {"endpoint_url": proxy.url, "token": "ya29.test-access-token"}
        refs = {"k": [f"gs://{space}/data.bin", 100, 5000]}
        m = mount(dump_refs(refs, tmp_path / "refs.json"), "--remote-options", json.dumps(options))
        proxy.reset()
        assert cat(m.mountpoint / "k").stdout == data[100:5100]
        sent = [h.get("authorization") for h in proxy.gate.stats()["headers"]]
        assert sent == ["Bearer ya29.test-access-token"], sent


# -- faults -------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["obstore", "fsspec"])
def test_a_passing_503_is_retried(
    mount: Callable[..., Mounted], cloud: Cloud, tmp_path: Path, backend: str
) -> None:
    space = cloud.space()
    data = payload(100_000, 22)
    cloud.put(space, "flaky.bin", data)
    with FaultProxy(cloud.server.port) as proxy:
        refs = {"k": [f"{cloud.scheme}://{space}/flaky.bin", 10, 50_000]}
        options = json.dumps({cloud.scheme: cloud.options(proxy.url)})
        m = mount(
            dump_refs(refs, tmp_path / "refs.json"),
            "--remote-options", options, "--fetch-backend", backend, "--retries", "3",
        )  # fmt: skip
        proxy.reset()
        proxy.fault("*", "503", count=2)
        got = cat(m.mountpoint / "k")
        assert got.returncode == 0, got.stderr
        assert got.stdout == data[10:50_010]
        if backend == "obstore":
            assert proxy.attempts() == 3  # two 503s, then the bytes
        else:  # gcsfs and azure-core also retry on their own
            assert proxy.attempts() >= 3


def test_a_lasting_503_and_a_404_are_eio(
    mount: Callable[..., Mounted], cloud: Cloud, tmp_path: Path
) -> None:
    space = cloud.space()
    data = payload(50_000, 23)
    cloud.put(space, "here.bin", data)
    with FaultProxy(cloud.server.port) as proxy:
        refs = {
            "down": [f"{cloud.scheme}://{space}/here.bin", 0, 1000],
            "gone": [f"{cloud.scheme}://{space}/gone.bin", 0, 1000],
            "fine": [f"{cloud.scheme}://{space}/here.bin", 1000, 1000],
        }
        options = json.dumps({cloud.scheme: cloud.options(proxy.url)})
        m = mount(
            dump_refs(refs, tmp_path / "refs.json"),
            "--remote-options", options, "--retries", "2", "--timeout", "5",
        )  # fmt: skip
        proxy.reset()
        proxy.fault("*", "503", count=-1)
        got = cat(m.mountpoint / "down")
        assert got.returncode != 0 and got.stdout == b""
        assert b"Input/output error" in got.stderr
        attempts = proxy.attempts()  # 1 + 2 retries per READ (the kernel may READ again)
        assert attempts >= 3 and attempts % 3 == 0, attempts

        proxy.reset()
        got = cat(m.mountpoint / "gone")
        assert got.returncode != 0 and got.stdout == b""
        assert b"Input/output error" in got.stderr  # never ENOENT: zarr reads that as fill
        assert 1 <= proxy.attempts() <= 2  # a 404 is final: one request per READ
        assert "HTTP 404" in m.log()

        assert cat(m.mountpoint / "fine").stdout == data[1000:2000]  # still serving
        assert m.process.poll() is None


# -- a changed object ---------------------------------------------------------------------------


def test_a_changed_object_is_refused_where_a_checksum_was_recorded(
    cloud: Cloud, tmp_path: Path
) -> None:
    space = cloud.space()
    size = 300_000
    before = random.Random(24).randbytes(size)
    cloud.put(space, "data.bin", before)
    url = f"{cloud.scheme}://{space}/data.bin"
    checksum = {"etag": cloud.etag(space, "data.bin")}
    refs = {
        "before": [url, 1000, 4000],
        "after": [url, 200_000, 4000],
        "unchecked": [url, 200_000, 4000],
    }
    checksums = {"before": checksum, "after": checksum}
    options = json.dumps({cloud.scheme: cloud.options()})
    with mount_checksummed(tmp_path, cloud.kind, refs, checksums, "--remote-options", options) as m:
        got = cat(m.mountpoint / "before")
        assert got.returncode == 0, got.stderr
        assert got.stdout == before[1000:5000]
        after = random.Random(25).randbytes(size)
        cloud.put(space, "data.bin", after)
        for _ in range(2):  # refused again: a refusal is never cached as data
            got = cat(m.mountpoint / "after")
            assert got.returncode != 0 and got.stdout == b""
            assert b"Input/output error" in got.stderr
        assert cat(m.mountpoint / "unchecked").stdout == after[200_000:204_000]
        lines = [line for line in m.log().splitlines() if "changed since it was referenced" in line]
        assert len(lines) == 1 and "after" in lines[0] and url in lines[0], lines
        assert m.process.poll() is None


# -- Icechunk -----------------------------------------------------------------------------------


def repository_on(
    cloud: Cloud, tmp_path: Path, mount: Callable[..., Mounted], *, checksums: bool = False
) -> tuple[str, Path, Mounted]:
    """A repository in a new bucket (container) whose virtual chunks are a netCDF file
    beside it, referenced through the store (``checksums``: recording when the file was
    last updated, as VirtualiZarr's ``last_updated_at`` does); built locally, uploaded,
    mounted.  Returns the bucket, the netCDF file and the mount."""
    space = cloud.space()
    netcdf = write_netcdf(tmp_path / "a.nc")
    cloud.put(space, "data/a.nc", netcdf.read_bytes())
    last_updated_at = datetime.datetime.now(datetime.UTC) if checksums else None
    prefix = f"{cloud.scheme}://{space}/data/"
    store = cloud.obstore(space, translate(cloud.scheme, cloud.options()))
    root = build_virtual_repository(tmp_path / "built", prefix, store, "data/a.nc", last_updated_at)
    cloud.upload_tree(root, space, "repo")
    return space, netcdf, cloud.mount_stored(mount, f"{cloud.scheme}://{space}/repo")


def test_icechunk_repository_on_the_store(
    mount: Callable[..., Mounted], cloud: Cloud, tmp_path: Path
) -> None:
    """Metadata, native chunks and virtual chunks all from the store."""
    space, netcdf, m = repository_on(cloud, tmp_path, mount)
    group = zarr.open_group(m.mountpoint, mode="r")
    assert sorted(name for name, _ in group.arrays()) == ["native", "temp", "time"]
    np.testing.assert_array_equal(group["native"][:], native_values(1))
    with netCDF4.Dataset(netcdf) as ds:
        ds.set_auto_mask(False)
        np.testing.assert_array_equal(group["temp"][:], ds["temp"][:])
        np.testing.assert_array_equal(group["time"][:], ds["time"][:])
    assert f"{cloud.scheme}://{space}: byte ranges through obstore" in m.log()


def test_icechunk_virtual_chunks_of_a_changed_object_are_eio(
    mount: Callable[..., Mounted], cloud: Cloud, tmp_path: Path
) -> None:
    """The repository recorded when its source was last updated; the same bytes written
    again later are a changed object: its virtual chunks are EIO, the rest reads."""
    space, netcdf, m = repository_on(cloud, tmp_path, mount, checksums=True)
    with netCDF4.Dataset(netcdf) as ds:
        ds.set_auto_mask(False)
        expected = ds["temp"][:]
    np.testing.assert_array_equal(
        zarr.open_array(m.mountpoint / "temp", mode="r")[0:2, 0:10, 0:15],
        expected[0:2, 0:10, 0:15],
    )
    time.sleep(1.1)  # a Last-Modified of a later second than the one recorded
    cloud.put(space, "data/a.nc", netcdf.read_bytes())
    with pytest.raises(OSError) as raised:
        (m.mountpoint / "temp/c/2/1/1").read_bytes()
    assert raised.value.errno == errno.EIO
    assert "a.nc: changed since it was referenced" in m.log()
    native = zarr.open_array(m.mountpoint / "native", mode="r")[:]  # no checksum: reads
    np.testing.assert_array_equal(native, native_values(1))
    assert m.process.poll() is None
