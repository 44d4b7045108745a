"""JSON metadata as readers outside Python accept it.

Python writes float NaN and infinities into JSON as bare ``NaN``/``Infinity``, which is
not JSON: strict parsers (JavaScript's, Rust's serde_json used by zarrs) refuse the whole
file.  And it writes non-ASCII text as ``\\u`` escapes, which netCDF-C 4.9 prints as
``u00e9``.  The decoded view rewrites every JSON metadata file (``.zarray``, ``.zattrs``,
``.zgroup``, ``.zmetadata``) with UTF-8 text and no bare NaN:

``fill_value``
    The Zarr v2 spec's strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.

Attributes
    Tried against Debian 12's readers: netCDF-C 4.9.0 and GDAL 3.6 both accept bare
    ``NaN``, but netCDF-C takes ``null`` as a type error that fails the whole file, a list
    whose first value is a string while others are numbers as an "internal library
    error", also fatal.  What both read is the spec's string form: a scalar ``"NaN"`` is a
    text attribute to netCDF-C and a string to GDAL (the value survives, as text), and in
    a list after a number (``[0.0, "NaN"]``) netCDF-C reads the whole list as doubles,
    NaN included.  So a non-finite value becomes its string, except in a list whose first
    value is not a finite number: that attribute is left out (logged once per file), as
    netCDF-C would fail on any spelling of it that a strict parser accepts.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

log = logging.getLogger(__name__)

_SPELLING = {math.inf: "Infinity", -math.inf: "-Infinity"}


def non_finite_text(value: float) -> str:
    return "NaN" if math.isnan(value) else _SPELLING[value]


def _finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def repair_fill_value(value: Any) -> Any:
    """A ``fill_value`` as the Zarr v2 spec writes it."""
    if isinstance(value, float) and not math.isfinite(value):
        return non_finite_text(value)
    return value


def repair_value(value: Any, dropped: list[str], where: str) -> tuple[bool, Any]:
    """``(keep, value)`` for one JSON value: non-finite floats as strings, recursively;
    ``keep`` is False for a list that netCDF-C could not read once repaired."""
    if isinstance(value, float) and not math.isfinite(value):
        return True, non_finite_text(value)
    if isinstance(value, list):
        out = []
        for item in value:
            keep, repaired = repair_value(item, dropped, where)
            if not keep:
                return False, None
            out.append(repaired)
        changed = any(isinstance(v, float) and not math.isfinite(v) for v in value)
        if changed and value and not _finite_number(value[0]):
            dropped.append(where)
            return False, None
        return True, out
    if isinstance(value, dict):
        kept = {}
        for key, item in value.items():
            keep, repaired = repair_value(item, dropped, f"{where}/{key}" if where else key)
            if keep:
                kept[key] = repaired
        return True, kept
    return True, value


def repair_document(document: Any, name: str) -> Any:
    """A parsed metadata document with its non-finite values repaired; what had to be
    left out is logged, naming ``name`` (the key)."""
    dropped: list[str] = []
    _, repaired = repair_value(document, dropped, "")
    if dropped:
        log.warning(
            "%s: attributes left out of the decoded view (a list starting with NaN or an "
            "infinity, which netCDF-C cannot read in any strict JSON spelling): %s",
            name,
            ", ".join(dropped),
        )
    return repaired


def dump_json(document: Any) -> bytes:
    """Strict JSON, UTF-8, no ``\\u`` escapes."""
    return json.dumps(document, ensure_ascii=False, allow_nan=False, indent=2).encode("utf-8")
