"""The netCDF view's options (``--netcdf``, ``--netcdf-format``, ``--netcdf-name``) and
the name of a set's root file."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from refmount.options import Config

#: ``--netcdf-format``: ``auto`` is CDF-2 (64-bit offset) unless a variable needs CDF-5.
FORMAT_CHOICES = ("auto", "classic", "64bit-offset", "cdf5")
_NAME = re.compile(r"[^/\x00]{1,200}")
#: A file of the view is ``<name>.nc``; the root group's is the view's file 0, which a
#: catalog lists beside each set before loading it (``run01.nc`` next to ``run01/``).
SUFFIX = ".nc"
ROOT_FILE_ID = 0


def add_netcdf_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("netCDF files (docs/views.md: netCDF view)")
    g.add_argument(
        "--netcdf",
        action="store_true",
        help="serve each reference set or repository as netCDF classic files (NAME.nc for "
        "the root group, NAME.GROUP.nc per group with arrays), for readers that open a .nc "
        "path",
    )
    g.add_argument(
        "--netcdf-format",
        choices=FORMAT_CHOICES,
        help="with --netcdf: 'auto' (the default: 64bit-offset unless a variable of 4 GiB "
        "or more needs cdf5), 'classic', '64bit-offset' or 'cdf5' (64-bit integers and "
        "unsigned types as such)",
    )
    g.add_argument(
        "--netcdf-name",
        type=_file_name,
        metavar="NAME",
        help="with --netcdf, the root group's file is NAME.nc (default: REFS's file or "
        "directory name without its extensions)",
    )


def _file_name(text: str) -> str:
    if not _NAME.fullmatch(text) or text in (".", ".."):
        raise argparse.ArgumentTypeError(f"not a file name: {text!r}")
    return text


def default_name(refs: str) -> str:
    """REFS's last path part without its extensions (``air.json`` -> ``air``)."""
    last = refs.split("?", 1)[0].rstrip("/").rpartition("/")[2]
    stem = last.split(".", 1)[0]
    return stem if _NAME.fullmatch(stem) else "dataset"


def root_name(config: Config) -> str:
    """The name of a single set's root file without ``.nc``: ``--netcdf-name``, else
    REFS's (a catalog names each set's file after the set)."""
    return config.netcdf_name or default_name(config.refs)
