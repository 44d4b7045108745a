"""An Icechunk repository's history as a catalog (``--versions``): ``branches/NAME``,
``tags/NAME`` and ``snapshots/ID`` (every snapshot in the ancestry of a branch), each a
set of the catalog, loaded on first use and unloaded under its limits.

A version is named by the repository's URL and a fragment (``REPO#branch=NAME``), which
only :func:`version_of` reads.  A branch's listing signature is its head: a new commit
reloads that branch's set at the catalog's next refresh (``--catalog-ttl``, SIGHUP); tags
and snapshots never change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refmount import icechunk
from refmount.catalog.names import Found

KINDS = {"branches": "branch", "tags": "tag", "snapshots": "snapshot"}


def list_versions(url: str, options: Mapping[str, Any]) -> list[Found]:
    history = icechunk.history(url, options)
    found = []
    for name, head in history.branches.items():
        found.append(_found(url, "branches", name, head, history.snapshots.get(head)))
    for name, snapshot in history.tags.items():
        found.append(_found(url, "tags", name, snapshot, history.snapshots.get(snapshot)))
    for snapshot, written in history.snapshots.items():
        found.append(_found(url, "snapshots", snapshot, snapshot, written))
    return found


def _found(url: str, kind: str, name: str, snapshot: str, written: float | None) -> Found:
    return Found(f"{kind}/{name}", f"{url}#{KINDS[kind]}={name}", True, written, (snapshot,))


def version_of(url: str) -> tuple[str, dict[str, str]]:
    """The repository's URL and the version (``{"branch": NAME}``...) of a set's URL."""
    repository, _, fragment = url.rpartition("#")
    kind, _, name = fragment.partition("=")
    return repository, {kind: name}
