"""The netCDF classic header (CDF-1, CDF-2, CDF-5) and the layout of the data after it.

What Unidata's "NetCDF File Format Specification" says, for files without record
variables: the magic ``CDF`` and a version byte, ``numrecs`` (0), the dimension list, the
global attribute list, the variable list; each variable's ``begin`` is its data's offset,
in header order, each variable's data padded to 4 bytes (``vsize``).  Everything is
big-endian.  In CDF-5 counts, lengths and dimension ids are 64-bit; in CDF-1 ``begin`` is
32-bit.  netCDF-C refuses a layout whose ``begin``s are not increasing and disjoint in
header order (``NC_check_voffs``): :func:`lay_out` gives each variable the bytes right
after the previous one's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

NC_BYTE, NC_CHAR, NC_SHORT, NC_INT, NC_FLOAT, NC_DOUBLE = 1, 2, 3, 4, 5, 6
NC_UBYTE, NC_USHORT, NC_UINT, NC_INT64, NC_UINT64 = 7, 8, 9, 10, 11
_DIMENSION, _VARIABLE, _ATTRIBUTE = 0x0A, 0x0B, 0x0C

#: Each type's values in the file (big-endian), and its default fill value.
TYPES: dict[int, tuple[np.dtype, object]] = {
    NC_BYTE: (np.dtype("i1"), -127),
    NC_CHAR: (np.dtype("S1"), b"\0"),
    NC_SHORT: (np.dtype(">i2"), -32767),
    NC_INT: (np.dtype(">i4"), -2147483647),
    NC_FLOAT: (np.dtype(">f4"), 9.9692099683868690e36),
    NC_DOUBLE: (np.dtype(">f8"), 9.9692099683868690e36),
    NC_UBYTE: (np.dtype("u1"), 255),
    NC_USHORT: (np.dtype(">u2"), 65535),
    NC_UINT: (np.dtype(">u4"), 4294967295),
    NC_INT64: (np.dtype(">i8"), -9223372036854775806),
    NC_UINT64: (np.dtype(">u8"), 18446744073709551614),
}
CDF5_TYPES = frozenset((NC_UBYTE, NC_USHORT, NC_UINT, NC_INT64, NC_UINT64))

#: The versions by their option names, and each one's limits.
FORMATS = {"classic": 1, "64bit-offset": 2, "cdf5": 5}
#: The largest ``begin`` CDF-1 holds, and the largest ``vsize`` and dimension length
#: CDF-1 and CDF-2 hold (signed 32-bit; 2**32 - 4 for ``vsize`` per the specification).
MAX_CDF1_BEGIN = (1 << 31) - 1
MAX_CDF2_VSIZE = (1 << 32) - 4
MAX_CDF2_LENGTH = (1 << 31) - 1


class LayoutError(Exception):
    """A dataset the asked-for version cannot hold; the message names the variable."""


@dataclass(frozen=True)
class Attribute:
    """An attribute: ``values`` a 1-d array of its type's values (bytes for NC_CHAR)."""

    name: str
    nc_type: int
    values: np.ndarray | bytes

    @property
    def count(self) -> int:
        return len(self.values)

    def encoded(self) -> bytes:
        if self.nc_type == NC_CHAR:
            assert isinstance(self.values, bytes)
            return self.values
        assert isinstance(self.values, np.ndarray)
        return self.values.astype(TYPES[self.nc_type][0], copy=False).tobytes()


@dataclass(frozen=True)
class Dimension:
    """A dimension; the ``unlimited`` one (or one of length 0, with no records) is the
    record dimension, written with length 0, its length the header's ``numrecs``."""

    name: str
    length: int
    unlimited: bool = False


@dataclass
class Variable:
    """A variable of the header; ``begin`` is set by :func:`lay_out`.  A ``record``
    variable's first dimension is the record dimension (its ``shape[0]`` the number of
    records); an ``isolated`` one may fail its reads (its values are converted and one
    may have no place in its type), so :func:`lay_out` gives it blocks of its own."""

    name: str
    dimids: tuple[int, ...]
    nc_type: int
    shape: tuple[int, ...]
    attributes: list[Attribute] = field(default_factory=list)
    begin: int = 0
    record: bool = False
    isolated: bool = False

    @property
    def itemsize(self) -> int:
        return TYPES[self.nc_type][0].itemsize

    @property
    def data_size(self) -> int:
        """The bytes of the values (of one record for a record variable), before
        padding."""
        count = 1
        for n in self.shape[1:] if self.record else self.shape:
            count *= n
        return count * self.itemsize

    @property
    def vsize(self) -> int:
        """The bytes the variable takes (per record for a record variable): its values
        padded to 4 bytes."""
        return -(-self.data_size // 4) * 4


@dataclass
class Header:
    """``numrecs`` is the record dimension's length (0: none, or no records); ``end``,
    set by :func:`lay_out`, where the file's data ends."""

    version: int
    dimensions: list[Dimension]
    attributes: list[Attribute]
    variables: list[Variable]
    numrecs: int = 0
    end: int = 0

    def encoded(self) -> bytes:
        out = _Writer(self.version)
        out.raw(b"CDF" + bytes([self.version]))
        out.count(self.numrecs)
        out.list(
            _DIMENSION,
            self.dimensions,
            lambda d: (out.name(d.name), out.count(0 if d.unlimited else d.length)),
        )
        out.attributes(self.attributes)
        out.list(_VARIABLE, self.variables, out.variable)
        return out.bytes()

    @property
    def size(self) -> int:
        """The whole file's size."""
        return self.end or len(self.encoded())


class _Writer:
    def __init__(self, version: int) -> None:
        self.version = version
        self._parts: list[bytes] = []
        self._count = struct.Struct(">q" if version == 5 else ">i")

    def raw(self, data: bytes) -> None:
        self._parts.append(data)

    def count(self, n: int) -> None:
        self._parts.append(self._count.pack(n))

    def tag(self, n: int) -> None:
        self._parts.append(struct.pack(">i", n))

    def name(self, name: str) -> None:
        encoded = name.encode("utf-8")
        self.count(len(encoded))
        self.raw(encoded + b"\0" * (-len(encoded) % 4))

    def list(self, tag: int, items: list, write: object) -> None:
        if not items:
            self.tag(0)
            self.count(0)
            return
        self.tag(tag)
        self.count(len(items))
        for item in items:
            write(item)  # type: ignore[operator]

    def attributes(self, attributes: list[Attribute]) -> None:
        self.list(_ATTRIBUTE, attributes, self.attribute)

    def attribute(self, attribute: Attribute) -> None:
        self.name(attribute.name)
        self.tag(attribute.nc_type)
        self.count(attribute.count)
        data = attribute.encoded()
        self.raw(data + b"\0" * (-len(data) % 4))

    def variable(self, variable: Variable) -> None:
        self.name(variable.name)
        self.count(len(variable.dimids))
        for dimid in variable.dimids:
            self.count(dimid)
        self.attributes(variable.attributes)
        self.tag(variable.nc_type)
        vsize = variable.vsize
        if self.version != 5 and vsize > MAX_CDF2_VSIZE:
            vsize = (1 << 32) - 1  # the specification's value for "too large"
        self._parts.append(struct.pack(">q" if self.version == 5 else ">I", vsize))
        self._parts.append(struct.pack(">i" if self.version == 1 else ">q", variable.begin))

    def bytes(self) -> bytes:
        return b"".join(self._parts)


def lay_out(header: Header, data_at: int = 0, block: int = 4) -> bytes:
    """Set each variable's ``begin`` and return the header's bytes; :class:`LayoutError`
    when the header's version cannot hold the layout.

    Fixed variables come in header order, each right after the header and the variable
    before, the first at ``data_at`` at least, a multiple of 4 (the space between is the
    header's free space, as netCDF-C's ``nc__enddef`` reserves it).  An ``isolated``
    variable starts at a multiple of ``block`` and the next one at the next multiple
    after it: no block (the kernel's pages, netCDF-C's reads of ``st_blksize``) holds
    another variable's bytes and one of its own, so a read of it that fails fails no
    other variable's read (a page the kernel read ahead with it is read again alone).
    Record variables (anywhere in the header) follow the fixed ones' values, in header
    order, their records interleaved: record ``r`` of a variable at
    ``begin + r * recsize``."""
    _check(header)
    # Begins are fixed-width: the header's size does not depend on them.
    at = max(len(header.encoded()), data_at)
    isolate_next = False
    for variable in header.variables:
        if variable.record:
            continue
        if variable.isolated or isolate_next:
            at = -(-at // block) * block
        variable.begin = at
        at += variable.vsize
        isolate_next = variable.isolated
    if not header.variables:
        at = len(header.encoded())
    if isolate_next and header.numrecs:
        at = -(-at // block) * block
    records_at = at
    for variable in header.variables:
        if variable.record:
            variable.begin = at
            at += variable.vsize
    header.end = records_at + header.numrecs * record_size(header)
    if header.version == 1:
        for variable in header.variables:
            if variable.begin > MAX_CDF1_BEGIN:
                raise LayoutError(
                    f"variable {variable.name!r} starts at byte {variable.begin}, past what "
                    "netCDF classic (CDF-1) offsets hold"
                )
    return header.encoded()


def record_size(header: Header) -> int:
    """The bytes of one record: every record variable's share, padded to 4 bytes unless
    there is a single record variable (netCDF's special case)."""
    shares = [v for v in header.variables if v.record]
    if len(shares) == 1:
        return shares[0].data_size
    return sum(v.vsize for v in shares)


def _check(header: Header) -> None:
    if header.version == 5:
        return
    for variable in header.variables:
        if variable.nc_type in CDF5_TYPES:
            raise LayoutError(f"variable {variable.name!r}: its type needs CDF-5")
    for dimension in header.dimensions:
        if dimension.length > MAX_CDF2_LENGTH:
            raise LayoutError(
                f"dimension {dimension.name!r} of length {dimension.length} needs CDF-5"
            )
    for variable in header.variables[:-1]:
        if variable.vsize > MAX_CDF2_VSIZE:
            raise LayoutError(
                f"variable {variable.name!r} of {variable.vsize} bytes needs CDF-5 (only the "
                "last variable of a CDF-1 or CDF-2 file may take 4 GiB or more)"
            )


def fits(header: Header) -> bool:
    """Whether ``header``'s version holds it."""
    try:
        _check(header)
    except LayoutError:
        return False
    return True
