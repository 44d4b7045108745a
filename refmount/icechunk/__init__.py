"""Icechunk repositories as a source: a repository at one version, served as a reference
set whose chunks are read by refmount's own fetcher and cache.

Layers: ``location`` (recognising a repository, its icechunk storage), ``loop`` (the
one asyncio loop icechunk's calls need), ``repository`` (what icechunk is asked),
``keys`` (chunk keys by encoding), ``index`` (one array's references, compact),
``manifest`` (an array's chunk references and their checksums, read from the manifest
files by refmount itself),
``containers`` (which virtual URLs a mount may read) and ``view`` (the reference set).
The ``icechunk`` package is imported only when a repository is opened.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from refmount.icechunk.location import Location, is_repository
from refmount.refs.source import within_deadline

__all__ = ["history", "is_repository", "open_configured", "open_repository", "signature"]


class RepositoryOptions(Protocol):
    """The options a mount and ``refmount check`` open a repository with."""

    refs: str
    refs_options: Mapping[str, Any]
    branch: str | None
    tag: str | None
    snapshot: str | None
    containers: Sequence[str] | None
    allow_local: bool
    timeout: float


def open_configured(options: RepositoryOptions) -> Any:
    """:func:`open_repository` with a mount's or a check's options."""
    return open_repository(
        options.refs,
        options=options.refs_options,
        branch=options.branch,
        tag=options.tag,
        snapshot=options.snapshot,
        containers=options.containers,
        allow_local=options.allow_local,
        timeout=options.timeout,
    )


def open_repository(
    url: str,
    *,
    options: Mapping[str, Any],
    branch: str | None = None,
    tag: str | None = None,
    snapshot: str | None = None,
    containers: Sequence[str] | None = None,
    allow_local: bool = False,
    timeout: float = 60.0,
) -> Any:
    """The repository at ``url`` at one version, as an :class:`IcechunkRefSet`
    (RefsError with the reason when it cannot be opened)."""
    from refmount.icechunk.containers import Containers
    from refmount.icechunk.repository import Repository, Version
    from refmount.icechunk.view import IcechunkRefSet

    location = Location.of(url)
    version = Version(branch, tag, snapshot)

    def open_set(progress: Callable[[], None]) -> Any:
        repository = Repository(location, options, version, timeout)
        try:
            allowed = Containers(
                repository.containers(),
                names=repository.container_names(),
                narrowed=containers,
                local_allowed=location.local or allow_local,
            )
            return IcechunkRefSet.open(repository, allowed)
        except BaseException:
            repository.close()
            raise

    # icechunk's plain calls (open, session, snapshot) block: bounded like a refs file's read
    return within_deadline(open_set, timeout, location.name)


def history(url: str, options: Mapping[str, Any]) -> Any:
    """Branches, tags and snapshots of the repository at ``url`` (a ``History``)."""
    from refmount.icechunk.repository import history as read_history

    return read_history(Location.of(url), options)


def signature(
    url: str,
    options: Mapping[str, Any],
    *,
    branch: str | None = None,
    tag: str | None = None,
    snapshot: str | None = None,
) -> tuple[str, ...]:
    """What changes when the version a mount serves changes: the head of the branch it
    follows (one read of the repository's ``repo`` object); nothing for a tag or a
    snapshot, which never change."""
    from refmount.icechunk.repository import Version, branch_head

    followed = Version(branch, tag, snapshot).followed_branch
    if followed is None:
        return ()
    return (branch_head(Location.of(url), options, followed),)
