"""Opening a repository at one version: its hierarchy, metadata and chunk references.

Everything icechunk is asked goes through here.  Plain calls (``Repository.open``,
sessions, ``inspect_snapshot``, ``lookup_branch``) run in the caller's thread; the
store's asynchronous calls (``zarr.json`` bytes, ``array_chunk_iterator``) run on the
set's own :class:`~refmount.icechunk.loop.LoopThread`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import fsspec.core
import numpy as np

from refmount.errors import RefsError
from refmount.icechunk.index import VIRTUAL, ArrayIndex, IndexBuilder
from refmount.icechunk.location import Location, storage
from refmount.icechunk.loop import LoopThread
from refmount.icechunk.manifest import ManifestError, parse_manifest

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'refmount[icechunk]'"
#: references asked of icechunk per batch while an array is enumerated
BATCH = 100_000
#: the largest manifest file read for its checksums
MAX_MANIFEST_BYTES = 1 << 30


@dataclass(frozen=True)
class Version:
    """Which version a mount serves: a branch's head (followed), a tag, or a snapshot."""

    branch: str | None = None
    tag: str | None = None
    snapshot: str | None = None

    def __post_init__(self) -> None:
        if sum(v is not None for v in (self.branch, self.tag, self.snapshot)) > 1:
            raise RefsError("give one of --branch, --tag and --snapshot")

    @property
    def followed_branch(self) -> str | None:
        """The branch whose new commits a reload picks up, if any."""
        if self.tag is None and self.snapshot is None:
            return self.branch or "main"
        return None

    def describe(self) -> str:
        if self.tag is not None:
            return f"tag {self.tag}"
        if self.snapshot is not None:
            return f"snapshot {self.snapshot}"
        return f"branch {self.followed_branch}"


@dataclass
class Node:
    """A group or array of the snapshot: ``path`` without the leading slash."""

    path: str
    node_id: str
    is_array: bool
    metadata: bytes
    manifest_ids: tuple[str, ...] = ()
    document: dict[str, Any] = field(default_factory=dict)


def import_icechunk(name: str) -> Any:
    """The icechunk module; RefsError saying what to install when it is missing."""
    try:
        import icechunk
    except ImportError:
        raise RefsError(
            f"{name} is an Icechunk repository; reading one needs the icechunk package: "
            f"{INSTALL_HINT}"
        ) from None
    icechunk.set_logs_filter("error")  # a local repository warns on every open
    return icechunk


class Repository:
    """One repository, opened at one version, with the loop its store's calls run on."""

    def __init__(
        self, location: Location, options: Mapping[str, Any], version: Version, timeout: float
    ) -> None:
        self.location = location
        self.options = options
        self.version = version
        self.timeout = timeout
        icechunk = import_icechunk(location.name)
        self._loop = LoopThread()
        try:
            self._repo = icechunk.Repository.open(storage(location, options), _config(icechunk))
            self._session = self._open_session()
        except RefsError:
            self._loop.close()
            raise
        except Exception as exc:  # icechunk's own errors: no such branch, unreadable store
            self._loop.close()
            message = f"{location.name}: cannot open the repository: {_first_line(exc)}"
            raise RefsError(message) from None
        self.snapshot_id: str = self._session.snapshot_id
        self._store = self._session.store

    def _open_session(self) -> Any:
        version = self.version
        if version.tag is not None:
            return self._repo.readonly_session(tag=version.tag)
        if version.snapshot is not None:
            return self._repo.readonly_session(snapshot_id=version.snapshot)
        return self._repo.readonly_session(version.followed_branch)

    def containers(self) -> list[str]:
        """The URL prefixes of the virtual chunk containers the repository declares."""
        declared = self._repo.config.virtual_chunk_containers or {}
        return [container.url_prefix for container in declared.values()]

    def versions(self) -> dict[str, dict[str, str]]:
        """Branches and tags, each with the snapshot it points at."""
        repo = self._repo
        return {
            "branches": {name: repo.lookup_branch(name) for name in repo.list_branches()},
            "tags": {name: repo.lookup_tag(name) for name in repo.list_tags()},
        }

    def nodes(self) -> tuple[list[Node], float]:
        """The snapshot's groups and arrays with their ``zarr.json`` bytes, and the time
        it was written (seconds since the epoch)."""
        info = self._repo.inspect_snapshot(self.snapshot_id)
        self._manifest_sizes = {m["id"]: m.get("size_bytes") for m in info.get("manifests", ())}
        nodes = []
        for node in info["nodes"]:
            path = node["path"].strip("/")
            manifests = tuple(ref["id"] for ref in node.get("manifest_refs") or ())
            is_array = node["node_type"] == "array"
            nodes.append(Node(path, node["id"], is_array, b"", manifests))
        keys = [f"{node.path}/zarr.json" if node.path else "zarr.json" for node in nodes]
        documents = self._loop.run(
            lambda: asyncio.gather(*(self._store._store.get(key, None) for key in keys)),
            self.timeout,
            f"{self.location.name}: reading zarr.json documents",
        )
        for node, key, document in zip(nodes, keys, documents, strict=True):
            if document is None:
                raise RefsError(f"{self.location.name}: {key} is missing from the snapshot")
            node.metadata = bytes(document)
            try:
                node.document = json.loads(node.metadata)
            except ValueError as exc:
                raise RefsError(f"{self.location.name}: {key} is not JSON: {exc}") from None
        written = info.get("flushed_at")
        mtime = datetime.fromisoformat(written).timestamp() if written else 0.0
        return nodes, mtime

    def array_index(self, node: Node, grid: tuple[int, ...]) -> ArrayIndex:
        """Every chunk reference of one array (its manifests read by icechunk)."""

        builder = IndexBuilder(grid)

        async def collect() -> None:
            async for batch in self._store.array_chunk_iterator(node.path, batch_size=BATCH):
                builder.add(batch)

        self._loop.run(collect, self.timeout, f"{node.path}: reading its manifest")
        index = builder.finish(node_id=node.node_id, manifest_ids=node.manifest_ids)
        if not (index.kinds == VIRTUAL).any():
            return index
        parts = []
        for manifest_id in node.manifest_ids:
            manifest = parse_manifest(self._manifest_bytes(manifest_id), manifest_id)
            refs = manifest.arrays.get(node.node_id)
            if refs is not None:
                parts.append((refs.coords.astype(np.int64), refs.checksums, manifest.checksums))
        return index.with_checksums(parts)

    def _manifest_bytes(self, manifest_id: str) -> bytes:
        """The file ``manifests/<id>``, as stored (at most the size the snapshot gives)."""
        name = f"manifests/{manifest_id}"
        size = self._manifest_sizes.get(manifest_id)
        limit = MAX_MANIFEST_BYTES if not isinstance(size, int) else min(size, MAX_MANIFEST_BYTES)
        fs, path = fsspec.core.url_to_fs(self.location.child(name), **self.options)
        with fs.open(path, "rb") as file:
            data = file.read(limit + 1)
        if len(data) > limit:
            raise ManifestError(f"manifest {manifest_id}: larger than {limit} bytes")
        return data

    def close(self) -> None:
        self._loop.close()


def _config(icechunk: Any) -> Any:
    """Reading options over the repository's own configuration: no cache of chunk
    references (each array's are read once, into its index; icechunk's cache of a
    million-reference manifest would hold over 100 MB besides)."""
    config = icechunk.RepositoryConfig()
    config.caching = icechunk.CachingConfig(num_chunk_refs=0)
    return config


def branch_head(location: Location, options: Mapping[str, Any], branch: str) -> str:
    """The snapshot id at the head of ``branch`` now (one read of ``repo``)."""
    icechunk = import_icechunk(location.name)
    return icechunk.Repository.open(storage(location, options)).lookup_branch(branch)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
