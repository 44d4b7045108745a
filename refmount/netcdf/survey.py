"""What the netCDF view makes of a set, for ``refmount check --netcdf``: its files (name,
format, variables), the arrays and groups left out of them, each with why, and the
variables whose rows meet so many chunks that reading them in file order decodes each
chunk more than once (:mod:`refmount.netcdf.stretches`), with the cost."""

from __future__ import annotations

import math
from typing import Any

from refmount.decode.view import DecodedRefSet
from refmount.errors import FetchError
from refmount.netcdf.model import Files, build
from refmount.netcdf.stretches import STRETCH_BYTES, Stretches
from refmount.options import Config, human_size
from refmount.refs.model import RefSet

_VERSIONS = {1: "classic", 2: "64bit-offset", 5: "cdf5"}


async def survey(raw: RefSet, name: str, choice: str) -> dict[str, Any]:
    """``{"files": [...], "strings": [...], "left_out": {array: why}, "costly": {array:
    cost}, "error": ...}``."""
    view = DecodedRefSet(raw, serial=0, fixed_strings=True)
    try:
        files = await build(view, name, choice)
    except FetchError as exc:
        return {"files": [], "strings": [], "left_out": {}, "costly": {}, "error": str(exc)}
    strings = sorted(path for path in files.left_out if view.string_array(path))
    return {
        "files": [
            {
                "name": made.key,
                "format": _VERSIONS[made.header.version],
                "variables": [v.name for v in made.header.variables],
            }
            for made in files.files
        ],
        "strings": strings,
        "left_out": {
            p: why
            for p, why in sorted({**files.left_out, **files.left_out_groups}.items())
            if p not in strings
        },
        "costly": costly(files),
        "error": None,
    }


def costly(files: Files) -> dict[str, str]:
    """The variables a read in file order (``cp``, ``ncdump``) decodes each chunk of more
    than once, even by stretches, each with what it decodes."""
    stretches = Stretches(Config.cache_size)
    out = {}
    for made in files.files:
        for source in made.sources:
            if len(source.shape) < 2 or stretches.row_bytes(source) > STRETCH_BYTES:
                continue
            passes = stretches.passes(source)
            if passes == 1:
                continue
            pairs = zip(source.shape, source.chunks, strict=True)
            total = math.prod(-(-n // c) for n, c in pairs) * source.chunk_bytes
            across = human_size(stretches.row_chunk_bytes(source))
            out[source.path] = (
                f"each row in the file meets {across} of chunks: once more than a quarter "
                f"of --cache-size, reading it in file order decodes each chunk {passes:,} "
                f"times ({human_size(passes * total)})"
            )
    return out
