"""Reference sets holding Zarr v3 trees, for the decoded view's v3 tests.

* :func:`store_refs`: a v3 store zarr 3 wrote to a directory, as a JSON reference set
  (every ``zarr.json`` inline, every chunk a reference to its file): the keys and bytes
  of the store, served by refmount.
* :func:`icechunk_refs`: a netCDF/HDF5 file scanned by VirtualiZarr and written to an
  Icechunk repository (``vds.vz.to_icechunk``), as a JSON reference set: every node's
  ``zarr.json`` exactly as the repository returns it, every chunk the virtual reference
  (or inline bytes) VirtualiZarr wrote, under its v3 key (``c/0/1``).
* :func:`native_arrays`: arrays written by zarr 3 with its default codecs, sharding (index
  at the end; at the start, big-endian gzip inner chunks, edge shards and an inner chunk
  not written), ``transpose``, ``crc32c``, gzip and blosc, and the values they hold.
"""

from __future__ import annotations

import asyncio
import base64
import json
import warnings
from pathlib import Path

import icechunk
import numpy as np
import zarr
from obspec_utils.registry import ObjectStoreRegistry
from obstore.store import LocalStore
from virtualizarr import open_virtual_dataset
from virtualizarr.parsers import HDFParser, NetCDF3Parser
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)
from zarr.core.buffer import default_buffer_prototype

from tests.support.reader_datasets import Dataset


def store_refs(store: Path) -> dict:
    """The JSON reference set of the v3 store in directory ``store``."""
    refs: dict[str, object] = {}
    for path in sorted(store.rglob("*")):
        if path.is_file():
            key = path.relative_to(store).as_posix()
            if path.name == "zarr.json":
                refs[key] = path.read_text()
            else:
                refs[key] = [path.as_uri(), 0, path.stat().st_size]
    return {"version": 1, "refs": refs}


def _chunk_key(name: str, index: str) -> str:
    """The v3 default-encoded key of a manifest entry (``0.1`` -> ``c/0/1``; rank 0 ``c``)."""
    return f"{name}/c/{index.replace('.', '/')}" if index else f"{name}/c"


def icechunk_refs(dataset: Dataset, repository: Path) -> dict:
    """``dataset`` through VirtualiZarr and an Icechunk repository at ``repository``."""
    icechunk.set_logs_filter("error")  # a local repository warns on every open
    registry = ObjectStoreRegistry({"file://": LocalStore()})
    parser = NetCDF3Parser() if dataset.kind == "netcdf3" else HDFParser()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vds = open_virtual_dataset(
            dataset.path.as_uri(), registry=registry, parser=parser, loadable_variables=[]
        )
    folder = dataset.path.parent.as_uri() + "/"
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(
        icechunk.VirtualChunkContainer(folder, icechunk.local_filesystem_store(folder[7:]))
    )
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(repository)), config)
    session = repo.writable_session("main")
    vds.vz.to_icechunk(session.store)
    session.commit("VirtualiZarr")
    refs: dict[str, object] = {
        key: text for key, text in asyncio.run(_node_texts(repo.readonly_session("main").store))
    }
    for name, variable in vds.variables.items():
        for index, entry in variable.data.manifest.dict().items():
            if "data" in entry:
                refs[_chunk_key(name, index)] = "base64:" + base64.b64encode(
                    bytes(entry["data"])
                ).decode("ascii")
            else:
                refs[_chunk_key(name, index)] = [entry["path"], entry["offset"], entry["length"]]
    return {"version": 1, "refs": refs}


async def _node_texts(store: icechunk.IcechunkStore) -> list[tuple[str, str]]:
    found = []
    async for key in store.list():
        if key.rpartition("/")[2] == "zarr.json":
            buffer = await store.get(key, default_buffer_prototype())
            assert buffer is not None
            found.append((key, buffer.to_bytes().decode("utf-8")))
    return found


def native_arrays(store: Path, seed: int = 44) -> dict[str, np.ndarray]:
    """A v3 store zarr 3 writes, one array per codec pipeline; the values written."""
    rng = np.random.default_rng(seed)
    group = zarr.open_group(store, mode="w", attributes={"title": "zarr 3 native"})
    values = {
        "default": rng.normal(0.0, 1.0, (9, 10)).astype("f4"),
        "transposed": rng.integers(-500, 500, (6, 8), dtype="i4"),
        "checksummed": rng.integers(0, 60000, (7, 5), dtype="u2"),
        "zstd_crc32c": np.round(rng.normal(0.0, 10.0, (12, 6)), 1).astype("f8"),
        "gzip": rng.integers(-100, 100, (20,), dtype="i2"),
        "blosc": np.round(rng.normal(0.0, 3.0, (8, 8)), 2).astype("f4"),
        "bigendian": rng.normal(0.0, 1e6, (5, 4)).astype(">f8"),
        "sharded": np.arange(64, dtype="i4").reshape(8, 8),
        "sharded_edge": _with_an_unwritten_chunk(np.arange(70, dtype="i2").reshape(10, 7)),
    }
    codecs: dict[str, dict] = {
        "default": {},
        "transposed": {
            "filters": [TransposeCodec(order=(1, 0))],
            "compressors": [ZstdCodec(level=3)],
        },
        "checksummed": {"compressors": [Crc32cCodec()]},
        "zstd_crc32c": {"compressors": [ZstdCodec(level=1), Crc32cCodec()]},
        "gzip": {"compressors": [GzipCodec(level=5)]},
        "blosc": {"compressors": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")]},
        "bigendian": {"compressors": None, "serializer": BytesCodec(endian="big")},
        "sharded": {"shards": (8, 8)},
        "sharded_edge": {
            "serializer": ShardingCodec(
                chunk_shape=(2, 2),
                codecs=[BytesCodec(endian="big"), GzipCodec()],
                index_location="start",
            ),
            "compressors": None,
            "fill_value": -1,
        },
    }
    for name, data in values.items():
        # chunks that do not divide the shape (edge chunks are padded); shards of 2 x 2
        chunks = (
            (4, 4) if name.startswith("sharded") else tuple(max(1, n // 2 - 1) for n in data.shape)
        )
        array = group.create_array(
            name, shape=data.shape, dtype=data.dtype, chunks=chunks,
            dimension_names=[f"{name}_{axis}" for axis in range(data.ndim)],
            **codecs[name],
        )  # fmt: skip
        array[...] = data
    return {name: data.astype(data.dtype.newbyteorder("=")) for name, data in values.items()}


def _with_an_unwritten_chunk(values: np.ndarray) -> np.ndarray:
    """``values`` with inner chunk (2, 0) all fill values (-1): zarr does not write it."""
    values[4:6, 0:2] = -1
    return values


def fill_values(store: Path) -> dict[str, object]:
    """Each array's fill value in the v3 store ``store`` (what ncdump prints as ``_``)."""
    group = zarr.open_group(store, mode="r")
    return {name: array.fill_value.item() for name, array in group.arrays()}


def write_refs(refs: dict, path: Path) -> Path:
    path.write_text(json.dumps(refs))
    return path
