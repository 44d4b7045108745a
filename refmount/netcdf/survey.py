"""What the netCDF view makes of a set, for ``refmount check --netcdf``: its files (name,
format, variables) and the arrays left out of them, each with why."""

from __future__ import annotations

from typing import Any

from refmount.decode.view import DecodedRefSet
from refmount.errors import FetchError
from refmount.netcdf.model import NcFile, build
from refmount.refs.model import RefSet

_VERSIONS = {1: "classic", 2: "64bit-offset", 5: "cdf5"}


async def survey(
    raw: RefSet, name: str, choice: str, *, record_dim: str | None = None
) -> dict[str, Any]:
    """``{"files": [...], "strings": [...], "left_out": {array: why}, "by_values":
    [...], "error": ...}``: ``by_values`` the 64-bit integer arrays the mount writes as
    their values say (a CF time's unit; CDF-5 for a time no ``int`` holds; left out of a
    CDF-2 file, with ``auto``, if a value has no exact double), which this does not
    read."""
    view = DecodedRefSet(raw, serial=0, fixed_strings=True)
    try:
        files = await build(view, name, choice, record_dim=record_dim)
    except FetchError as exc:
        return {"files": [], "strings": [], "left_out": {}, "by_values": [], "error": str(exc)}
    strings = sorted(path for path in files.left_out if view.string_array(path))
    return {
        "files": [
            {
                "name": made.key,
                "format": _VERSIONS[made.header.version],
                "variables": [v.name for v in made.header.variables],
                "record_dimension": _record_dimension(made),
            }
            for made in files.files
        ],
        "strings": strings,
        "left_out": {p: why for p, why in sorted(files.left_out.items()) if p not in strings},
        "by_values": sorted(files.unread),
        "error": None,
    }


def _record_dimension(made: NcFile) -> str | None:
    """The name of the file's record dimension (UNLIMITED), if it has one."""
    header = made.header
    records = [variable for variable in header.variables if variable.record]
    return header.dimensions[records[0].dimids[0]].name if records else None
