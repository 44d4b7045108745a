"""Opening a repository at one version: its hierarchy, metadata and chunk references.

Everything icechunk is asked goes through here.  Plain calls (``Repository.open``,
sessions, ``inspect_snapshot``, ``lookup_branch``) run in the caller's thread; the
store's asynchronous calls (``zarr.json`` bytes) run on the set's own
:class:`~refmount.icechunk.loop.LoopThread`.  An array's chunk references are read from
its manifest files by refmount itself (:mod:`refmount.icechunk.manifest`): with their
checksums, which icechunk's API does not give, and faster than icechunk's
``array_chunk_iterator`` (bench/README.md).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import fsspec.core

from refmount.errors import RefsError
from refmount.icechunk.index import ArrayIndex, Part, covered_grid
from refmount.icechunk.location import Location, storage
from refmount.icechunk.loop import LoopThread
from refmount.icechunk.manifest import ManifestError, parse_manifest

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'refmount[icechunk]'"
#: the largest manifest file read
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
    """A group or array of the snapshot: ``path`` without the leading slash; an array's
    manifests with the extents of its chunks each holds (``[start, stop)`` per
    dimension), and the rank the snapshot gives it (its ``zarr.json`` may not say)."""

    path: str
    node_id: str
    is_array: bool
    metadata: bytes
    manifests: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    document: dict[str, Any] = field(default_factory=dict)
    rank: int = 0


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

    def container_names(self) -> dict[str, str]:
        """The URL prefix of each named virtual chunk container (``vcc://NAME/...``)."""
        declared = self._repo.config.virtual_chunk_containers or {}
        return {c.name: c.url_prefix for c in declared.values() if getattr(c, "name", None)}

    def nodes(self) -> tuple[list[Node], float]:
        """The snapshot's groups and arrays with their ``zarr.json`` bytes, and the time
        it was written (seconds since the epoch)."""
        info = self._repo.inspect_snapshot(self.snapshot_id)
        self._manifest_sizes = {m["id"]: m.get("size_bytes") for m in info.get("manifests", ())}
        nodes = []
        for node in info["nodes"]:
            path = node["path"].strip("/")
            manifests = tuple(
                (ref["id"], tuple((int(lo), int(hi)) for lo, hi in ref.get("extents") or ()))
                for ref in node.get("manifest_refs") or ()
            )
            is_array = node["node_type"] == "array"
            rank = len(node.get("shape") or ())
            nodes.append(Node(path, node["id"], is_array, b"", manifests, rank=rank))
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

    def array_index(self, node: Node, grid: tuple[int, ...] | None) -> ArrayIndex:
        """Every chunk reference of one array, with the checksums of its virtual chunks,
        read from its manifest files (ManifestError when one is unusable); on the grid
        its chunks cover when ``grid`` is None (see :func:`covered_grid`)."""
        parts: list[Part] = []
        for manifest_id, extents in node.manifests:
            data = self._manifest_bytes(manifest_id)
            manifest = parse_manifest(data, manifest_id, node_ids={node.node_id})
            refs = manifest.arrays.get(node.node_id)
            if refs is not None:
                parts.append((refs, manifest.checksums, extents))
        if grid is None:
            grid = covered_grid(parts, len(node.document["shape"]))
        return ArrayIndex.from_manifests(parts, grid)

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


@dataclass(frozen=True)
class History:
    """A repository's versions: each branch's head, each tag's snapshot, and every
    snapshot in the ancestry of a branch with the time it was written."""

    branches: dict[str, str]
    tags: dict[str, str]
    snapshots: dict[str, float]


def history(location: Location, options: Mapping[str, Any]) -> History:
    """The versions of the repository at ``location`` (plain calls: any thread)."""
    repo = _polled(location.url, json.dumps(options, sort_keys=True))
    branches = {name: repo.lookup_branch(name) for name in sorted(repo.list_branches())}
    tags = {name: repo.lookup_tag(name) for name in sorted(repo.list_tags())}
    snapshots: dict[str, float] = {}
    for branch in branches:
        for info in repo.ancestry(branch=branch):
            if info.id in snapshots:
                break  # the rest of this ancestry is another branch's, already listed
            snapshots[info.id] = info.written_at.timestamp()
    return History(branches, tags, snapshots)


def branch_head(location: Location, options: Mapping[str, Any], branch: str) -> str:
    """The snapshot id at the head of ``branch`` now: one read of ``repo`` by a
    repository handle kept open for the polls (it sees new commits)."""
    return _polled(location.url, json.dumps(options, sort_keys=True)).lookup_branch(branch)


@functools.lru_cache(maxsize=16)
def _polled(url: str, options: str) -> Any:
    location = Location.of(url)
    icechunk = import_icechunk(location.name)
    return icechunk.Repository.open(storage(location, json.loads(options)))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
