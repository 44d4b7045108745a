"""Catalogs: one mount for every reference set under a directory or URL prefix.

Each set is a directory of the mount, loaded the first time something looks inside it,
unloaded when idle past ``--max-loaded-sets``, and reloaded when its refs file changes.
With ``--netcdf`` each set is also a file beside its directory (``run01.nc``), listed
without loading the set.  Layers: ``names`` (what each set is called, and its file),
``source`` (listing the source), ``inodes`` (disjoint inode ranges per set), ``lru`` and
``ttl`` (what to unload, how old a listing may be), ``sets`` (one set's loading),
``catalog`` (all of them, refreshed), ``view`` (the tree-shaped interface the filesystem
operations use), ``serving`` (wired with the daemon's options) and ``check``
(``refmount check`` of every set).
"""

from refmount.catalog.source import is_catalog

__all__ = ["is_catalog"]
