"""A catalog wired for the daemon: its listing, loader and trees use the mount's options."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import fsspec.core

from refmount.catalog import source, versions
from refmount.catalog.catalog import Catalog
from refmount.catalog.names import SetFile
from refmount.catalog.sets import TreeFactory
from refmount.catalog.view import CatalogTree
from refmount.errors import RefsError
from refmount.fetch import Fetcher
from refmount.icechunk import is_repository
from refmount.options import Config
from refmount.redaction import shown
from refmount.refs import RefSet
from refmount.tree import Owner, Tree


def open_catalog(
    config: Config,
    fetcher: Fetcher,
    owner: Owner,
    load_refset: Callable[[Config, str], RefSet],
    make_tree: TreeFactory | None = None,
) -> tuple[Catalog, CatalogTree]:
    """List REFS (a failure is a failed start) and make the catalog and its view.  Each
    set is read by ``load_refset(config, name)`` with the mount's options and bounds,
    REFS replaced by the set's URL (``name``: the set's name in the mount); ``make_tree``
    makes a view of a loaded set (a plain Tree by default).  With ``--netcdf`` each
    set's root-group file is listed next to it (:func:`beside`).
    With ``--versions`` REFS is an Icechunk repository and its sets are its versions
    (:mod:`refmount.catalog.versions`)."""

    def list_sets() -> list[source.Found]:
        if config.versions:
            return versions.list_versions(config.refs, config.refs_options)
        return source.list_sets(config.refs, config.refs_options, timeout=config.timeout)

    def load(url: str, name: str) -> RefSet:
        if config.versions:
            repository, version = versions.version_of(url)
            one = dataclasses.replace(config, refs=repository, icechunk=True, **version)
            return load_refset(one, name)
        icechunk = is_repository(url, config.refs_options)
        return load_refset(dataclasses.replace(config, refs=url, icechunk=icechunk), name)

    def tree(refset: RefSet, generation: int, directories: dict[int, str] | None) -> Tree:
        return Tree(
            refset,
            owner,
            fetcher.size,
            fetcher.known_size,
            generation=generation,
            dir_paths=directories,
        )

    def signature(url: str) -> tuple[str, ...]:
        fs, path = fsspec.core.url_to_fs(url, **config.refs_options)
        if is_repository(url, config.refs_options):  # its repo object changes per commit
            path = f"{path.rstrip('/')}/repo"
        info = fs.info(path)
        return tuple(f"{k}={info[k]}" for k in source.SIGNATURE_FIELDS if info.get(k) is not None)

    catalog = Catalog(
        shown(config.refs),
        list_sets,
        load,
        make_tree or tree,
        ttl=config.catalog_ttl,
        max_loaded=config.max_loaded_sets,
        max_loaded_bytes=config.catalog_memory,
        signature=signature,
        prepare=fetcher.prepare,
        beside=beside(config.netcdf),
    )
    catalog.start()
    if not catalog.plan.sets and not config.catalog:
        raise RefsError(
            f"{shown(config.refs)}: a directory without .zmetadata and without reference "
            "sets below it: neither a Parquet reference set nor a catalog of sets "
            "(--catalog mounts it anyway, empty until sets arrive)"
        )
    return catalog, CatalogTree(catalog, owner, fetcher.size)


def beside(netcdf: bool) -> SetFile | None:
    """The file of each set a catalog lists beside the set: with ``--netcdf`` the root
    group's (``run01.nc`` next to ``run01/``, the view's file named after the set)."""
    if not netcdf:
        return None
    from refmount.netcdf.options import ROOT_FILE_ID, SUFFIX

    return SetFile(SUFFIX, ROOT_FILE_ID)
