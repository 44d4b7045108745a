"""How the netCDF view writes 64-bit integers, CF times among them: decided from their
values, read when the files are made.

A CDF-1/2 file has no 64-bit integer type: such a variable is written as ``double``,
exact only for values a double holds (every integer up to 2**53 in magnitude).

- A CF time (a 64-bit integer with ``units = "<unit> since <epoch>"``: a datetime array
  as the decoded view serves it, or integers so described) is written in the coarsest
  CF unit (days, hours, minutes, seconds, milliseconds, microseconds, nanoseconds) of
  which every value is a whole number: the values decide, so the choice is the same
  whenever the same values are read.  Times at millisecond resolution stored in
  nanoseconds (as zarr and VirtualiZarr write ``<M8[ns]``) become milliseconds, which
  doubles hold exactly for ±285,000 years.
- In a CDF-1/2 file a time is written as ``int`` when every value (so divided) is one
  (hours, minutes, days; seconds until 2038), its fill value (NaT) as ``int``'s
  default fill: xarray decodes integers exactly.  Otherwise (a resolution finer than
  a second, as most ``<M8[ns]`` coordinates) ``--netcdf-format auto`` makes the file
  CDF-5, the time ``int64``: as a ``double`` it would be exact in the file, but xarray
  multiplies doubles by the unit's nanoseconds in floating point, and its datetimes
  would be off by up to a microsecond.
- :func:`plan` also says whether every other 64-bit integer has an exact double.  With
  ``auto`` one that has not is left out of a CDF-2 file, named (``--netcdf-format
  cdf5`` keeps it): the file stays readable by GDAL 3.6, R's ncdf4, scipy and
  netCDF-Java, which read no CDF-5.
- A variable of more than :data:`CHECK_LIMIT` bytes is not read: it counts as one
  whose values a double may not hold.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: Variables of more than this many bytes are not read to decide.
CHECK_LIMIT = 64 << 20
#: Every integer up to this in magnitude has an exact double.
MAX_EXACT = 1 << 53
#: ``int``'s range, and netCDF's default fill of ``int``: the fill value of a time
#: written as ``int``.
INT32 = (-(1 << 31), (1 << 31) - 1)
INT_FILL = -2147483647
NANOSECONDS = {
    "days": 86_400 * 10**9,
    "hours": 3_600 * 10**9,
    "minutes": 60 * 10**9,
    "seconds": 10**9,
    "milliseconds": 10**6,
    "microseconds": 10**3,
    "nanoseconds": 1,
}
#: UDUNITS spellings of those units.
_ALIASES = {
    "day": "days", "d": "days", "hour": "hours", "hr": "hours", "hrs": "hours",
    "h": "hours", "minute": "minutes", "min": "minutes", "mins": "minutes",
    "second": "seconds", "sec": "seconds", "secs": "seconds", "s": "seconds",
    "millisecond": "milliseconds", "msec": "milliseconds", "msecs": "milliseconds",
    "ms": "milliseconds", "microsecond": "microseconds", "usec": "microseconds",
    "usecs": "microseconds", "us": "microseconds", "nanosecond": "nanoseconds",
    "nsec": "nanoseconds", "nsecs": "nanoseconds", "ns": "nanoseconds",
}  # fmt: skip
_TIME_UNITS = re.compile(r"\s*([A-Za-z]+)\s+since\s+(\S.*)", re.DOTALL)

#: Reads a variable's every value (served dtype, C order), or ``None`` when it cannot.
ReadValues = Callable[[], Awaitable[np.ndarray | None]]


@dataclass(frozen=True)
class Wide:
    """How one 64-bit integer variable is written: its values divided by ``divisor``
    (but ``keep``, its fill value), ``units`` its new ``units`` (a CF time written in a
    coarser unit, else ``None``); ``exact`` whether every value has an exact double
    (``why`` says why not), ``checked`` whether its values were read to know it;
    ``time`` whether it is a CF time, ``narrow`` whether it is one whose every value
    (so divided) is an ``int`` (32-bit), :data:`INT_FILL` standing for ``keep``."""

    divisor: int = 1
    keep: int | None = None
    units: str | None = None
    exact: bool = True
    time: bool = False
    why: str = ""
    checked: bool = False
    narrow: bool = False


def time_unit(document: dict[str, Any]) -> tuple[str, str] | None:
    """``(unit, epoch)`` of a CF time's ``units`` (the unit by its CF name), or ``None``."""
    units = document.get("units")
    if not isinstance(units, str):
        return None
    found = _TIME_UNITS.fullmatch(units)
    if found is None:
        return None
    unit = found.group(1).lower()
    unit = _ALIASES.get(unit, unit)
    if unit not in NANOSECONDS:
        return None
    return unit, found.group(2).strip()


async def plan(
    path: str,
    document: dict[str, Any],
    size: int,
    keep: int | None,
    read: ReadValues | None,
) -> Wide:
    """How to write the 64-bit integer variable ``path`` (``size`` its bytes, ``keep``
    its fill value, ``read`` its values: ``None`` where nothing can be read, as in
    ``refmount check``, when every value is taken to have an exact double)."""
    time = time_unit(document)
    if read is None:
        return Wide(time=time is not None, keep=keep)
    if size > CHECK_LIMIT:
        why = f"its {size:,} bytes are more than the {CHECK_LIMIT >> 20} MiB read to check"
        return Wide(exact=False, time=time is not None, keep=keep, why=why)
    values = await read()
    if values is None:
        why = "its values could not be read to check them"
        return Wide(exact=False, time=time is not None, keep=keep, why=why)
    counted = values[values != keep] if keep is not None else values
    divisor, units = 1, None
    if time is not None:
        unit, epoch = time
        divisor, coarser = _coarsest(counted, unit)
        if coarser != unit:
            units = f"{coarser} since {epoch}"
            log.info("%s: times written in %s (every value a whole number of them)", path, units)
    counted = counted // counted.dtype.type(divisor) if divisor != 1 else counted
    exact = _exact(counted) and (keep is None or _exact_one(keep))
    why = ""
    if not exact:
        why = "a value has no exact double" + (" in any CF time unit" if time else "")
    narrow = time is not None and _narrow(counted)
    return Wide(divisor, keep, units, exact, time is not None, why, checked=True, narrow=narrow)


def _coarsest(values: np.ndarray, unit: str) -> tuple[int, str]:
    """The divisor to the coarsest CF unit of which every value is a whole number."""
    step = int(np.gcd.reduce(values.astype(np.uint64) if values.dtype.kind == "u" else values))
    step = abs(step)
    here = NANOSECONDS[unit]
    for coarser, nanoseconds in NANOSECONDS.items():
        if nanoseconds < here or nanoseconds % here:
            continue
        divisor = nanoseconds // here
        if step % divisor == 0:
            return divisor, coarser
    return 1, unit


def _narrow(values: np.ndarray) -> bool:
    """Whether every value is an ``int`` other than its fill value."""
    low, high = INT32
    return bool(((values >= low) & (values <= high) & (values != INT_FILL)).all())


def _exact(values: np.ndarray) -> bool:
    if values.dtype.kind == "u":
        return bool((values <= MAX_EXACT).all()) or all(map(_exact_one, values.tolist()))
    inside = (values <= MAX_EXACT) & (values >= -MAX_EXACT)
    return bool(inside.all()) or all(map(_exact_one, values[~inside].tolist()))


def _exact_one(value: int) -> bool:
    return int(float(value)) == value and abs(float(value)) < 2.0**64


__all__ = ["CHECK_LIMIT", "Wide", "plan", "time_unit"]
