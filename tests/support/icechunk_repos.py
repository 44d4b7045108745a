"""Icechunk repositories for tests, built the way users build them: netCDF4 files written
by the netCDF library, referenced by VirtualiZarr into an Icechunk repository, beside a
native array written by zarr through icechunk's own store.

History of :func:`build_repository`'s repository:

* commit 1 on ``main`` (tagged ``v1``): virtual ``temp`` and ``time`` (from ``a.nc``),
  native ``native`` (zstd, 4x2 chunks of 24x30; the constant chunks compress under the
  inline threshold and live in the manifest), native ``sparse`` whose chunks were only
  partly written; a group ``forecast`` holding ``wind``;
* commit 2 on ``main``: ``native`` rewritten (``NATIVE_V2``);
* branch ``dev`` from commit 1 with ``native`` rewritten (``NATIVE_DEV``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import icechunk
import netCDF4
import numpy as np
import zarr
from obspec_utils.registry import ObjectStoreRegistry
from obstore.store import LocalStore
from virtualizarr import open_virtual_dataset
from virtualizarr.parsers import HDFParser

icechunk.set_logs_filter("error")

FILL = -999.0
NATIVE_SHAPE, NATIVE_CHUNKS = (96, 60), (24, 30)


@dataclass
class Built:
    root: Path
    data: Path  # the directory of the netCDF files (a virtual chunk container)
    netcdf: Path
    first: str  # snapshot ids
    second: str
    dev: str


def native_values(version: int) -> np.ndarray:
    """``native`` at each version: random rows (compressible to more than the inline
    threshold) and constant rows (whose chunks go inline)."""
    rng = np.random.default_rng(100 + version)
    values = rng.integers(0, 1 << 30, NATIVE_SHAPE).astype("i4")
    values[48:] = version
    return values


def write_netcdf(path: Path) -> Path:
    """``temp`` (time, y, x) float32, zlib + shuffle, CF attributes, a _FillValue that
    some values take; ``time`` coordinate."""
    rng = np.random.default_rng(7)
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.title = "icechunk test"
        ds.Conventions = "CF-1.8"
        ds.createDimension("time", 6)
        ds.createDimension("y", 20)
        ds.createDimension("x", 30)
        time = ds.createVariable("time", "f8", ("time",))
        time.units = "days since 2001-01-01 00:00:00"
        time.standard_name = "time"
        time[:] = np.arange(6.0)
        temp = ds.createVariable(
            "temp", "f4", ("time", "y", "x"), zlib=True, shuffle=True, complevel=4,
            chunksizes=(2, 10, 15), fill_value=np.float32(FILL),
        )  # fmt: skip
        temp.units = "K"
        temp.standard_name = "air_temperature"
        temp.long_name = "air temperature"
        values = np.round(rng.normal(280.0, 5.0, (6, 20, 30)), 2).astype("f4")
        values[0, :3, :4] = FILL
        temp[:] = values
    return path


def container_config(data: Path) -> Any:
    config = icechunk.RepositoryConfig.default()
    prefix = data.as_uri() + "/"
    config.set_virtual_chunk_container(
        icechunk.VirtualChunkContainer(prefix, icechunk.local_filesystem_store(str(data)))
    )
    return config


def open_local(root: Path, data: Path | None = None) -> icechunk.Repository:
    """The repository at ``root``, authorised to read virtual chunks under ``data``."""
    credentials = None
    if data is not None:
        prefix = data.as_uri() + "/"
        credentials = {prefix: icechunk.credentials.LocalFileSystemAccess}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return icechunk.Repository.open(
            icechunk.local_filesystem_storage(str(root)),
            authorize_virtual_chunk_access=credentials,
        )


def write_native(store: Any, version: int) -> None:
    group = zarr.open_group(store)
    group["native"][:] = native_values(version)


def virtual_and_native(store: Any, vds: Any, last_updated_at: Any = None) -> zarr.Group:
    """The first commit's common part: the virtual dataset (its references carrying the
    checksum ``last_updated_at``, a datetime, when given), and the native zstd array at
    version 1; the root group, for more."""
    vds.vz.to_icechunk(store, last_updated_at=last_updated_at)
    group = zarr.open_group(store)
    group.create_array(
        "native", shape=NATIVE_SHAPE, chunks=NATIVE_CHUNKS, dtype="i4",
        compressors=zarr.codecs.ZstdCodec(), fill_value=0, dimension_names=("row", "column"),
    )  # fmt: skip
    group["native"][:] = native_values(1)
    return group


def build_repository(directory: Path) -> Built:
    data = directory / "data"
    data.mkdir(parents=True)
    netcdf = write_netcdf(data / "a.nc")
    root = directory / "repo"
    repo = icechunk.Repository.create(
        icechunk.local_filesystem_storage(str(root)), container_config(data)
    )
    registry = ObjectStoreRegistry({"file://": LocalStore()})
    vds = open_virtual_dataset(netcdf.as_uri(), registry=registry, parser=HDFParser())
    session = repo.writable_session("main")
    group = virtual_and_native(session.store, vds)
    sparse = group.create_array(
        "sparse", shape=(10, 10), chunks=(5, 5), dtype="f8", fill_value=-1,
        dimension_names=("a", "b"),
    )  # fmt: skip
    sparse[:5, :5] = 1.5  # only chunk (0, 0) exists
    wind = group.create_group("forecast").create_array(
        "wind", shape=(4,), chunks=(2,), dtype="f4", dimension_names=("step",)
    )
    wind[:] = np.arange(4, dtype="f4")
    first = session.commit("first")
    repo.create_tag("v1", first)
    repo.create_branch("dev", first)
    session = repo.writable_session("main")
    write_native(session.store, 2)
    second = session.commit("second")
    session = repo.writable_session("dev")
    write_native(session.store, 3)
    dev = session.commit("dev")
    return Built(root, data, netcdf, first, second, dev)


def read_in_process(root: Path, data: Path, **version: str) -> dict[str, np.ndarray]:
    """Every array of the repository as icechunk reads it in this process."""
    repo = open_local(root, data)
    if not version:
        version = {"branch": "main"}
    session = repo.readonly_session(**version)
    group = zarr.open_group(session.store, mode="r")
    return {name: array[:] for name, array in group.arrays()}


def s3_options(endpoint: str) -> dict[str, Any]:
    """What refmount takes (``--refs-options``, and ``--remote-options`` under ``s3``)."""
    from tests.support.servers import S3_KEY, S3_REGION

    return {
        "endpoint_url": endpoint,
        "key": S3_KEY,
        "secret": S3_KEY,
        "client_kwargs": {"region_name": S3_REGION},
    }


def s3_storage(endpoint: str, bucket: str, prefix: str) -> Any:
    from tests.support.servers import S3_KEY, S3_REGION

    return icechunk.s3_storage(
        bucket=bucket, prefix=prefix, region=S3_REGION, endpoint_url=endpoint, allow_http=True,
        force_path_style=True, access_key_id=S3_KEY, secret_access_key=S3_KEY,
    )  # fmt: skip


def s3_credentials() -> Any:
    from tests.support.servers import S3_KEY

    return icechunk.s3_credentials(access_key_id=S3_KEY, secret_access_key=S3_KEY)


def build_s3_repository(endpoint: str, bucket: str, netcdf: Path) -> str:
    """A repository at ``s3://BUCKET/repo`` whose virtual chunks are in ``netcdf``, put
    at ``s3://BUCKET/data/a.nc`` (referenced by VirtualiZarr through S3), and a native
    array; one commit.  Returns the repository's URL."""
    from obstore.store import S3Store

    from tests.support.servers import S3_KEY, S3_REGION

    store = S3Store(
        bucket, endpoint=endpoint, access_key_id=S3_KEY, secret_access_key=S3_KEY,
        region=S3_REGION, client_options={"allow_http": True}, virtual_hosted_style_request=False,
    )  # fmt: skip
    store.put("data/a.nc", netcdf.read_bytes())
    config = icechunk.RepositoryConfig.default()
    store_config = icechunk.s3_store(
        region=S3_REGION, endpoint_url=endpoint, allow_http=True, force_path_style=True
    )
    prefix = f"s3://{bucket}/data/"
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(prefix, store_config))
    repo = icechunk.Repository.create(s3_storage(endpoint, bucket, "repo"), config)
    registry = ObjectStoreRegistry({f"s3://{bucket}": store})
    vds = open_virtual_dataset(f"{prefix}a.nc", registry=registry, parser=HDFParser())
    session = repo.writable_session("main")
    virtual_and_native(session.store, vds)
    session.commit("first")
    return f"s3://{bucket}/repo"


def build_virtual_repository(
    directory: Path, prefix: str, store: Any, key: str, last_updated_at: Any = None
) -> Path:
    """A local repository, ``directory/repo``, whose virtual chunks are in the netCDF file
    at ``prefix`` + its name (``key`` in obstore's ``store``, whose root is ``prefix``'s
    bucket or container), referenced by VirtualiZarr through that store (with the
    checksum ``last_updated_at``, when given); a native array; one commit.  Uploaded
    beside the file, it is a repository on that store.  Returns ``directory/repo``."""
    scheme, _, rest = prefix.partition("://")
    space = rest.split("/", 1)[0]
    from icechunk.storage import azure_store  # not exported at the top (icechunk 2.3)

    kinds = {"gs": icechunk.gcs_store, "az": lambda: azure_store(account="devstoreaccount1")}
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(prefix, kinds[scheme]()))
    root = directory / "repo"
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root)), config)
    registry = ObjectStoreRegistry({f"{scheme}://{space}": store})
    vds = open_virtual_dataset(f"{scheme}://{space}/{key}", registry=registry, parser=HDFParser())
    session = repo.writable_session("main")
    virtual_and_native(session.store, vds, last_updated_at)
    session.commit("first")
    return root


def read_s3_in_process(endpoint: str, bucket: str) -> dict[str, np.ndarray]:
    repo = icechunk.Repository.open(
        s3_storage(endpoint, bucket, "repo"),
        authorize_virtual_chunk_access=icechunk.containers_credentials(
            {f"s3://{bucket}/data/": s3_credentials()}
        ),
    )
    group = zarr.open_group(repo.readonly_session("main").store, mode="r")
    return {name: array[:] for name, array in group.arrays()}


def build_http_repository(root: Path, base_url: str) -> Path:
    """A repository in ``root/repo`` whose virtual chunks are ``root/data/a.nc`` as served
    at ``base_url/data/a.nc`` (``root`` being what the server serves), referenced by
    VirtualiZarr through HTTP; one commit.  Returns the netCDF file's path."""
    from obstore.store import HTTPStore

    (root / "data").mkdir(parents=True, exist_ok=True)
    netcdf = write_netcdf(root / "data/a.nc")
    config = icechunk.RepositoryConfig.default()
    prefix = f"{base_url}/data/"
    config.set_virtual_chunk_container(
        icechunk.VirtualChunkContainer(prefix, icechunk.http_store())
    )
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root / "repo")), config)
    store = HTTPStore.from_url(base_url, client_options={"allow_http": True})
    registry = ObjectStoreRegistry({base_url: store})
    vds = open_virtual_dataset(f"{prefix}a.nc", registry=registry, parser=HDFParser())
    session = repo.writable_session("main")
    vds.vz.to_icechunk(session.store)
    session.commit("virtual over HTTP")
    return netcdf
