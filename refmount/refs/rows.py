"""One mapping of a JSON reference set (key -> value) as compact rows, built without Arrow.

The ``[url, offset, length]`` values, nearly all of a large set, become columns in
``array`` buffers, built by C loops (``map``, ``array``), not a Python statement per key;
every other value stays a ``(key, value)`` pair for the per-key path in
:mod:`refmount.refs.jsonrefs`, which checks it and names the key when it is wrong.  Only
plain Python objects are used, so that a forked process can build rows and hand them over
pickled (:mod:`refmount.refs.jsonsplit`); Arrow then takes the buffers without a copy.
"""

from __future__ import annotations

import operator
import sys
from array import array
from dataclasses import dataclass, field
from itertools import accumulate, chain, compress, repeat
from typing import Any

MAX_INT = (1 << 63) - 1

# Bytes below 0x40 as the most significant byte of an int64: a value in [0, 2**62).
_SMALL_HIGH_BYTES = bytes(range(0x40))
_HIGH_BYTE = 7 if sys.byteorder == "little" else 0


@dataclass
class Texts:
    """Strings as one UTF-8 buffer (lone surrogates kept, for Arrow's validation to catch).

    Joined by NUL when none holds one, so that building it takes no Python work per string
    (the reader finds the bounds with NumPy); else joined as they are, with ``bounds``.
    """

    data: bytes = b""
    count: int = 0
    ascii: bool = True  # so ``data`` is valid UTF-8
    bounds: array | None = None  # "q", count + 1 offsets into ``data``, when not NUL-joined

    def items(self) -> list[bytes]:
        if self.bounds is None:
            return self.data.split(b"\0") if self.count else []
        return [self.data[self.bounds[i] : self.bounds[i + 1]] for i in range(self.count)]


def encode_texts(values: list[str]) -> Texts:
    joined = "\0".join(values)
    data = joined.encode("utf-8", "surrogatepass")
    if data.count(b"\0") == max(len(values) - 1, 0):
        return Texts(data, len(values), joined.isascii())
    del joined, data
    encoded = [v.encode("utf-8", "surrogatepass") for v in values]
    bounds = array("q", accumulate(map(len, encoded), initial=0))
    return Texts(b"".join(encoded), len(values), all(map(bytes.isascii, encoded)), bounds)


@dataclass
class Rows:
    """The range entries of one mapping as columns (in the mapping's order), the rest as
    pairs.  ``others`` comes after the range rows; when the range values are not all
    well-formed they are all in ``others`` too (first), and the columns are empty."""

    keys: Texts = field(default_factory=Texts)
    urls: list[str] = field(default_factory=list)  # distinct, as written, by first use
    url_ids: array = field(default_factory=lambda: array("i"))  # index into ``urls``
    offsets: array = field(default_factory=lambda: array("q"))
    lengths: array = field(default_factory=lambda: array("q"))
    others: list[tuple[str, Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.url_ids)

    def key(self, row: int) -> str:
        return self.keys.items()[row].decode("utf-8", "surrogatepass")


def rows_of(mapping: dict[str, Any], *, skip_version: bool = False) -> Rows:
    """The rows of ``mapping``; ``skip_version`` leaves out a ``"version"`` key (the
    ``null`` version of a version 0 set)."""
    keys, values = list(mapping), list(mapping.values())
    if skip_version and "version" in mapping:
        at = keys.index("version")
        del keys[at], values[at]
    # Where the values are not [url, offset, length]: usually a few (metadata), so the
    # range entries are the long runs between them, copied a slice at a time.
    others_at = _non_ranges(values)
    others = [(keys[i], values[i]) for i in others_at]
    runs = list(zip([-1, *others_at], [*others_at, len(keys)], strict=True))
    range_keys = list(chain.from_iterable(keys[a + 1 : b] for a, b in runs))
    range_values = list(chain.from_iterable(values[a + 1 : b] for a, b in runs))
    del keys, values
    columns = _range_columns(range_values)
    if columns is None:  # something is off: the per-key path finds it and names the key
        return Rows(others=[*zip(range_keys, range_values, strict=True), *others])
    return Rows(encode_texts(range_keys), *columns, others)


def _non_ranges(values: list[Any]) -> list[int]:
    """The positions of the values that are not 3-item lists."""
    lists = list(map(operator.is_, map(type, values), repeat(list)))
    if set(map(len, compress(values, lists))) <= {3}:
        return list(compress(range(len(values)), map(operator.not_, lists)))
    return [i for i, v in enumerate(values) if type(v) is not list or len(v) != 3]


def _range_columns(values: list[list[Any]]) -> tuple[list[str], array, array, array] | None:
    """URLs, URL ids, offsets and lengths of ``[url, offset, length]`` values; ``None``
    when any is not a non-empty string and two non-negative integers that add up to at
    most 2**63 - 1 (bool and float are not integers here: ``type`` is exact)."""
    urls = list(map(operator.itemgetter(0), values))
    columns = []
    for position in (1, 2):
        column = list(map(operator.itemgetter(position), values))
        if set(map(type, column)) - {int}:
            return None
        try:
            columns.append(array("q", column))
        except OverflowError:
            return None
    offsets, lengths = columns
    if not (_all_below_2_62(offsets) and _all_below_2_62(lengths)):
        if min(offsets, default=0) < 0 or min(lengths, default=0) < 0:
            return None
        if max(map(operator.add, offsets, lengths), default=0) > MAX_INT:
            return None
    try:
        distinct = dict.fromkeys(urls, 0)
    except TypeError:  # an unhashable URL (a list or an object)
        return None
    if any(type(url) is not str or not url for url in distinct):
        return None
    for number, url in enumerate(distinct):
        distinct[url] = number
    url_ids = array("i", map(distinct.__getitem__, urls))
    return list(distinct), url_ids, offsets, lengths


def _all_below_2_62(values: array) -> bool:
    """Whether every int64 of ``values`` is in [0, 2**62), read from the most significant
    byte of each (one C-speed pass, no int object per value).  Then no value is negative
    and no offset + length can overflow."""
    high = bytes(memoryview(values).cast("B")[_HIGH_BYTE::8])
    return not high.translate(None, _SMALL_HIGH_BYTES)
