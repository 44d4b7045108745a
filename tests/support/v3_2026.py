"""What 2026's writers make that the decoded view once failed on (issue 29), written by
them at test time:

* :func:`codec_store`: a v3 store zarr 3.4 writes: ``float16``, ``scale_offset`` +
  ``cast_value`` (zarr's own codecs, as ESA's EOPF products use them),
  ``numcodecs.jenkins_lookup3``, ``transpose`` of order (0, 2, 1), ``complex64``, and
  three ``rectilinear`` chunk grids (chunks all alike; irregular; a shorter last one);
* :func:`relative_repository`: an Icechunk repository whose virtual chunks are relative
  ``vcc://NAME/...`` locations of a named container, one naming no container at all,
  beside a native array on a rectilinear grid.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import icechunk
import numpy as np
import zarr
from zarr.codecs import CastValue, ScaleOffset, TransposeCodec, ZstdCodec

#: What the decoded view leaves out of :func:`codec_store` (named by ``check``).
LEFT_OUT = {"complex", "irregular", "short_last"}
CONTAINER = "data"


def codec_store(store: Path, seed: int = 29) -> dict[str, np.ndarray]:
    """The store, and the values zarr 3 wrote to each array."""
    from zarr.codecs.numcodecs import JenkinsLookup3

    rng = np.random.default_rng(seed)
    group = zarr.open_group(store, mode="w", attributes={"title": "2026 writers"})
    values = {
        "half": rng.normal(0.0, 100.0, (5, 6)).astype("f2"),
        "packed": np.round(rng.normal(280.0, 5.0, (6, 7)), 2),
        "jenkins": rng.integers(-1000, 1000, (10,), dtype="i4"),
        "transposed": rng.integers(-300, 300, (3, 4, 5), dtype="i2"),
        "complex": (rng.normal(size=4) + 1j * rng.normal(size=4)).astype("c8"),
        "regular_edges": rng.integers(0, 100, (10, 6), dtype="i4"),
        "irregular": rng.integers(0, 100, (10,), dtype="i4"),
        "short_last": rng.integers(0, 100, (10, 6), dtype="i4"),
    }
    arrays = {
        "half": {"chunks": (2, 4)},
        "packed": {
            "chunks": (3, 4),
            "filters": [ScaleOffset(offset=280, scale=100), CastValue(data_type="int16")],
            "compressors": [ZstdCodec()],
        },
        "jenkins": {"chunks": (4,), "compressors": [JenkinsLookup3()]},
        "transposed": {"chunks": (2, 3, 4), "filters": [TransposeCodec(order=(0, 2, 1))]},
        "complex": {"chunks": (2,)},
        "regular_edges": {"chunks": [[5, 5], [3, 3]]},
        "irregular": {"chunks": [[2, 5, 3]]},
        "short_last": {"chunks": [[4, 4, 2], [3, 3]]},
    }
    with warnings.catch_warnings(), zarr.config.set({"array.rectilinear_chunks": True}):
        warnings.simplefilter("ignore")
        for name, data in values.items():
            array = group.create_array(
                name, shape=data.shape, dtype=data.dtype, fill_value=0,
                dimension_names=[f"{name}_{axis}" for axis in range(data.ndim)],
                **arrays[name],
            )  # fmt: skip
            array[...] = data
    return values


def relative_repository(root: Path, data: Path) -> dict[str, np.ndarray]:
    """A repository at ``root`` whose virtual chunks lie in ``data`` (a container named
    :data:`CONTAINER`), written as ``vcc://`` locations; the values icechunk reads."""
    icechunk.set_logs_filter("error")
    data.mkdir(parents=True, exist_ok=True)
    blob = np.arange(40, dtype="<i4")
    (data / "blob.bin").write_bytes(blob.tobytes())
    prefix = data.as_uri() + "/"
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(
        icechunk.VirtualChunkContainer(
            prefix, icechunk.local_filesystem_store(str(data)), name=CONTAINER
        )
    )
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root)), config)
    session = repo.writable_session("main")
    store = session.store
    group = zarr.open_group(store)
    group.create_array("relative", shape=(40,), chunks=(10,), dtype="i4", fill_value=-1,
                       dimension_names=["x"], compressors=None)  # fmt: skip
    for i in range(4):
        store.set_virtual_ref(
            f"relative/c/{i}", f"vcc://{CONTAINER}/blob.bin", offset=40 * i, length=40
        )
    group.create_array("unnamed", shape=(10,), chunks=(10,), dtype="i4", fill_value=-1,
                       dimension_names=["y"], compressors=None)  # fmt: skip
    store.set_virtual_ref(
        "unnamed/c/0", "vcc://nosuch/blob.bin", offset=0, length=40, validate_container=False
    )
    grid = np.arange(60, dtype="i4").reshape(10, 6)
    with warnings.catch_warnings(), zarr.config.set({"array.rectilinear_chunks": True}):
        warnings.simplefilter("ignore")
        group.create_array("rectilinear", shape=(10, 6), chunks=[[2, 5, 3], [6]], dtype="i4",
                           dimension_names=["a", "b"])[...] = grid  # fmt: skip
    session.commit("relative virtual chunks")
    return {"relative": blob, "rectilinear": grid}


def open_authorized(root: Path, data: Path) -> icechunk.Repository:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return icechunk.Repository.open(
            icechunk.local_filesystem_storage(str(root)),
            authorize_virtual_chunk_access={
                data.as_uri() + "/": icechunk.credentials.LocalFileSystemAccess
            },
        )


def unknown_grid_repository(
    root: Path, name: str = "Regular", *, extents: bool = True
) -> np.ndarray:
    """A repository whose array ``odd`` (10 x 6 int32 in 3 inline chunks of 4 x 6) has a
    chunk grid named ``name`` (beside a regular ``plain``: 100..104 in chunks of 2), and
    unless ``extents`` a manifest the snapshot gives no extents.  Icechunk 2.3 writes
    only regular and rectilinear grids, and every icechunk that writes format 1 or 2
    gives each manifest the extents of its chunks (the spec: one range per dimension),
    so its snapshot is rewritten: ``"regular"`` (same length), and the extents vector's
    length (0 for 2) before its ranges ``[0, 3), [0, 1)``.  The stored chunks, as zarr
    wrote them (the last padded with the fill value -1)."""
    import struct

    icechunk.set_logs_filter("error")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root)))
    session = repo.writable_session("main")
    group = zarr.open_group(session.store)
    group.create_array(
        "odd", shape=(10, 6), chunks=(4, 6), dtype="<i4", fill_value=-1, compressors=None
    )[...] = np.arange(60, dtype="<i4").reshape(10, 6)
    group.create_array("plain", shape=(5,), chunks=(2,), dtype="<i4", compressors=None)[...] = (
        np.arange(5, dtype="<i4") + 100
    )
    snapshot = session.commit("an unknown chunk grid")
    grid = b'"regular",\n    "configuration": {\n      "chunk_shape": [\n        4,'  # odd's
    _rewrite_snapshot(root, snapshot, grid, grid.replace(b"regular", name.encode()))
    if not extents:
        ranges = struct.pack("<4I", 0, 3, 0, 1)
        _rewrite_snapshot(root, snapshot, struct.pack("<I", 2) + ranges,
                          struct.pack("<I", 0) + ranges)  # fmt: skip
    stored = np.full((12, 6), -1, dtype="<i4")
    stored[:10] = np.arange(60).reshape(10, 6)
    return stored


def _rewrite_snapshot(root: Path, snapshot_id: str, old: bytes, new: bytes) -> None:
    """Replace the one occurrence of ``old`` in a snapshot's body by ``new`` (as long)."""
    assert _rewrite(root / "snapshots" / snapshot_id, old, new)


def rewrite_manifest(root: Path, old: bytes, new: bytes) -> None:
    """Replace the one occurrence of ``old`` in the one manifest of the repository at
    ``root`` that holds it by ``new`` (as long): what no icechunk writes."""
    rewritten = [path for path in (root / "manifests").iterdir() if _rewrite(path, old, new)]
    assert len(rewritten) == 1, rewritten


def _rewrite(path: Path, old: bytes, new: bytes) -> bool:
    """Replace ``old`` in the body of an Icechunk file (its header, then zstd) by ``new``
    (as long), if the body holds it once; whether it did."""
    import zstandard

    from refmount.icechunk.manifest import HEADER_SIZE

    data = path.read_bytes()
    body = zstandard.ZstdDecompressor().decompressobj().decompress(data[HEADER_SIZE:])
    assert len(old) == len(new) and body.count(old) <= 1
    if old not in body:
        return False
    body = body.replace(old, new)
    path.write_bytes(data[:HEADER_SIZE] + zstandard.ZstdCompressor().compress(body))
    return True


def unserved_keys_repository(root: Path) -> dict[str, np.ndarray]:
    """A repository whose arrays' chunks a mount cannot give file ids: ``big`` (2**20 x
    2**20 uint8 in chunks of 1: 2**40 keys, over a mount's 2**39) holding chunks
    ``c/0/0`` (3) and ``c/5/9`` (4), fill 7; ``odd`` (4 x 4 uint8, chunks of 2) whose
    ``chunk_key_encoding`` is one refmount does not know (``"Default"``: the snapshot
    rewritten, as icechunk 2.3 writes only what zarr accepts); beside them ``plain``,
    served.  The values of ``odd`` and ``plain``."""
    icechunk.set_logs_filter("error")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root)))
    session = repo.writable_session("main")
    group = zarr.open_group(session.store)
    big = group.create_array("big", shape=(1 << 20, 1 << 20), chunks=(1, 1), dtype="u1",
                             fill_value=7, compressors=None)  # fmt: skip
    big[0, 0], big[5, 9] = 3, 4
    values = {"odd": np.arange(16, dtype="u1").reshape(4, 4), "plain": np.arange(5, dtype="u1")}
    group.create_array("odd", shape=(4, 4), chunks=(2, 2), dtype="u1", fill_value=7,
                       compressors=None)[...] = values["odd"]  # fmt: skip
    group.create_array("plain", shape=(5,), chunks=(2,), dtype="u1", fill_value=7,
                       compressors=None)[...] = values["plain"]  # fmt: skip
    snapshot = session.commit("arrays whose keys a mount cannot serve")
    encoding = b'2,\n        2\n      ]\n    }\n  },\n  "chunk_key_encoding": {\n'  # odd's
    encoding += b'    "name": "default"'
    _rewrite_snapshot(root, snapshot, encoding, encoding.replace(b"default", b"Default"))
    return values


def manifest_ids(root: Path) -> dict[str, str]:
    """The manifest of each array of ``main``'s snapshot (one each), by path."""
    repo = icechunk.Repository.open(icechunk.local_filesystem_storage(str(root)))
    nodes = repo.inspect_snapshot(repo.lookup_branch("main"))["nodes"]
    found = {n["path"].strip("/"): n.get("manifest_refs") or () for n in nodes}
    return {path: refs[0]["id"] for path, refs in found.items() if len(refs) == 1}
