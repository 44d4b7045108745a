"""The netCDF files of a decoded view: which groups become files, and each file's header
and variables, from the metadata alone (no chunk is read).

A group's arrays are its file's variables, in CF's order (:mod:`refmount.netcdf.order`).
Dimensions come from ``_ARRAY_DIMENSIONS`` (a Zarr v3 array's ``dimension_names`` are
presented so by the decoded view); an array without names gets ``<array>_dim<i>``; a
name met again with another length is a new dimension ``<name>_<length>`` (logged). A
rank-0 array is a scalar variable. ``|S<n>`` arrays take a last dimension ``strlen<n>``,
and those holding text (``<U<n>``, ``vlen-utf8``) ``_Encoding = "utf-8"``; an ``|S1``
array is a char array already (a netCDF file's ``char name(station, strlen)`` as
kerchunk and VirtualiZarr reference it), served as it is. Attributes are the decoded
view's ``.zattrs`` (CF time units of datetimes included) without ``_ARRAY_DIMENSIONS``,
in the types CF gives them (:mod:`refmount.netcdf.attributes`). The values start
:data:`HEADER_BLOCKS` blocks into the file, past what reading the header brings in. What
the decoded view leaves out, and arrays whose type netCDF classic has no place for, are
left out of the file, logged and listed by ``refmount check --netcdf``.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refmount.decode.arrays import Array, ArrayRefused, ChunkDecoder
from refmount.decode.dtypes import NAT
from refmount.decode.scalars import DIMENSIONS_ATTRIBUTE
from refmount.decode.strings import vlen_codecs
from refmount.decode.v3.tree import V3AsV2
from refmount.decode.view import DecodedRefSet
from refmount.errors import FetchError
from refmount.netcdf.attributes import FILL, variable_attributes, zarr_fill
from refmount.netcdf.header import (
    FORMATS,
    TYPES,
    Attribute,
    Dimension,
    Header,
    LayoutError,
    Variable,
    fits,
    lay_out,
)
from refmount.netcdf.names import file_keys
from refmount.netcdf.options import NO_RECORD_DIM
from refmount.netcdf.order import cf_order
from refmount.netcdf.types import FileType, TypeRefused, attribute, file_type
from refmount.netcdf.wide import Wide, plan, time_unit
from refmount.refs.model import BLOCK_SIZE

log = logging.getLogger(__name__)

ZARRAY, ZATTRS = ".zarray", ".zattrs"
#: The attribute that says a char variable holds text in this encoding (netCDF-C's and
#: CF's: netCDF4-python reads such a variable as strings).
ENCODING = "_Encoding"
#: netCDF-C reads in blocks of ``st_blksize``, never less than this.
MIN_BLOCK_SIZE = 8 << 10
#: The first variable's values start this many header blocks into the file.  The
#: kernel's first read of a file brings in at most 4 times the read it serves (its
#: initial read-ahead), so a reader of the header alone (netCDF-C reads one block:
#: ``ncdump -h``) reads no value: no chunk is fetched or decoded for it.
HEADER_BLOCKS = 4
#: A variable whose reads may fail (64-bit integers as doubles, not checked exact) has
#: blocks of this size to itself: netCDF-C 4.10 (pip's netCDF4, xarray's default engine)
#: reads a classic file in blocks of 4 MiB from its start, the header's included (an
#: open fails if any of its first 4 MiB fails); Debian's 4.9.0 in blocks of
#: ``st_blksize``.  A block that fails with another variable's bytes in it would fail
#: that variable's reads too (or, read short, give netCDF-C zeros for them).
ISOLATION_BLOCK = 4 << 20


def header_block(length: int) -> int:
    """The block size ``stat`` reports for a file whose header is ``length`` bytes: the
    header's length rounded up to a power of two, from netCDF-C's floor (8 KiB) to 1 MiB.
    netCDF-C reads its first block whole to read the header: a block of 1 MiB would have
    ``ncdump -h`` of a set of small chunks decode thousands of them (4,096 of 256 B)."""
    return min(BLOCK_SIZE, max(MIN_BLOCK_SIZE, 1 << (length - 1).bit_length()))


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


@dataclass(frozen=True)
class Source:
    """Where one variable's values come from: a decoded array, whose chunks hold
    ``served`` values in C order (``shape`` and ``chunks`` as served: a rank-0 array's
    are ``(1,)``), and ``fill`` the bytes of one value for a chunk the set has not."""

    path: str
    kind: FileType
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    separator: str
    fill: bytes

    def chunk_key(self, index: tuple[int, ...]) -> str:
        return _join(self.path, self.separator.join(map(str, index)))

    @property
    def chunk_bytes(self) -> int:
        count = 1
        for n in self.chunks:
            count *= n
        return count * self.kind.served.itemsize


@dataclass
class NcFile:
    """One synthesized file: its header's bytes, its variables and where their values
    come from (``sources[i]`` is ``header.variables[i]``'s)."""

    key: str
    header: Header
    text: bytes
    sources: list[Source]

    @property
    def size(self) -> int:
        return self.header.size

    @property
    def block_size(self) -> int:
        """The block size ``stat`` reports (:func:`header_block`)."""
        return header_block(len(self.text))

    @functools.cached_property
    def fixed(self) -> list[int]:
        """The fixed variables (their indices), in header order: file order."""
        return [i for i, variable in enumerate(self.header.variables) if not variable.record]

    @functools.cached_property
    def records(self) -> list[int]:
        """The record variables, in header order: their order in each record."""
        return [i for i, variable in enumerate(self.header.variables) if variable.record]

    @functools.cached_property
    def begins(self) -> list[int]:
        """The fixed variables' ``begin``s, increasing."""
        return [self.header.variables[i].begin for i in self.fixed]


@dataclass
class Files:
    """Every file of a view, what was left out of them (array path -> why; group path
    -> why, :mod:`refmount.netcdf.names`), and the arrays whose values were not read to
    decide how to write them."""

    files: list[NcFile]
    left_out: dict[str, str] = field(default_factory=dict)
    left_out_groups: dict[str, str] = field(default_factory=dict)
    #: 64-bit integer arrays written as their values say, not read (``refmount check``).
    unread: list[str] = field(default_factory=list)


async def groups(view: DecodedRefSet) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The view's groups with their arrays, in listing order, and the arrays left out
    (path -> why)."""
    found: dict[str, list[str]] = {}
    left_out: dict[str, str] = {}
    pending = [""]
    while pending:
        group = pending.pop(0)
        await view.ensure(group)
        arrays = found.setdefault(group, [])
        for child in list(view.children(group)):
            if child.file_id is not None:
                continue
            path = _join(group, child.name)
            await view.find_file(_join(path, ZARRAY))
            array = view.array_at(path)
            if isinstance(array, Array):
                arrays.append(path)
            elif array is None:
                pending.append(path)
    for path, array in view.arrays().items():
        if isinstance(array, ArrayRefused):
            left_out[path] = str(array)
    return found, left_out


#: Reads every value of a variable (served dtype, C order); :class:`FetchError` if one
#: of its chunks fails.
ReadSource = Callable[[Source], Awaitable[np.ndarray]]


async def build(
    view: DecodedRefSet,
    name: str,
    choice: str,
    read: ReadSource | None = None,
    record_dim: str | None = None,
) -> Files:
    """The files of ``view`` (``name`` the root file's name, ``choice`` the format); the
    root group's is always the first (:data:`refmount.netcdf.options.ROOT_FILE_ID`).
    ``read`` reads the values of 64-bit integer variables to decide how they are written
    (:mod:`refmount.netcdf.wide`; without it every value is taken to have an exact
    double); ``record_dim`` is ``--netcdf-record-dim``."""
    found, left_out = await groups(view)
    files = Files([], left_out)
    described: dict[str, tuple[dict[str, Any], list[tuple[str, Array, dict[str, Any]]]]] = {}
    for group, arrays in found.items():
        if group and not arrays:
            continue
        documents = []
        for path in arrays:
            array = view.array_at(path)
            assert isinstance(array, Array)
            documents.append((path, array, await _document(view, path)))
        described[group] = (await _document(view, group), cf_order(documents))
    fills = zarr_fills_mean_fill_values(view, described.values())
    keys, files.left_out_groups = file_keys(name, list(described))
    for group, (global_attributes, arrays) in described.items():
        if group not in keys:
            continue
        wide: dict[str, Wide] = {}
        for path, array, document in arrays:
            found_plan = await _wide(path, array, document, read)
            if found_plan is not None:
                wide[path] = found_plan
        made, refused = _file(
            keys[group], global_attributes, arrays, choice, fills, wide, record_dim
        )
        files.files.append(made)
        files.left_out.update(refused)
        files.unread += [path for path, how in wide.items() if not how.checked]
    return files


def zarr_fills_mean_fill_values(
    view: DecodedRefSet,
    groups: Iterable[tuple[dict[str, Any], list[tuple[str, Array, dict[str, Any]]]]],
) -> bool:
    """Whether the arrays' Zarr ``fill_value`` stand for their ``_FillValue``: in Zarr v2
    sets none of whose arrays has the attribute (kerchunk moves each there; VirtualiZarr
    and xarray keep it, and give arrays without one a ``fill_value`` all the same).  A
    Zarr v3 ``fill_value`` never does (xarray's reading too)."""
    if isinstance(view.raw, V3AsV2):
        return False
    return not any(FILL in document for _, arrays in groups for _, _, document in arrays)


async def _wide(
    path: str, array: Array, document: dict[str, Any], read: ReadSource | None
) -> Wide | None:
    """How a 64-bit integer array is written (``None`` for other arrays)."""
    meta = json.loads(array.rewritten())
    if not isinstance(meta["dtype"], str):
        return None
    served = np.dtype(meta["dtype"])
    if served.kind not in "iu" or served.itemsize != 8:
        return None
    stored = array.meta.get("dtype")
    if isinstance(stored, str) and stored[1:2] in ("M", "m"):
        keep: int | None = NAT  # a datetime's missing value, whatever its fill value
    else:
        keep = _integer_fill(served, meta.get("fill_value"), document.get("_FillValue"))
    fill = np.array([keep or 0], dtype=served).tobytes()
    shape = (1,) if array.scalar else tuple(meta["shape"])
    size = served.itemsize
    for n in shape:
        size *= n
    reader = None
    if read is not None:
        source = Source(
            path, FileType(served, 0), shape, tuple(meta["chunks"]), array.separator, fill
        )

        async def reader() -> np.ndarray | None:
            try:
                return await read(source)
            except FetchError as exc:
                log.warning("%s: its values could not be read to check them: %s", path, exc)
                return None

    return await plan(path, document, size, keep, reader)


async def _document(view: DecodedRefSet, path: str) -> dict[str, Any]:
    """The ``.zattrs`` of ``path`` as the decoded view serves it, or ``{}``."""
    file_id = await view.find_file(_join(path, ZATTRS))
    if file_id is None:
        return {}
    ref = await view.file_ref(file_id)
    if ref.data is None:
        log.warning("%s: attributes not held inline are left out", _join(path, ZATTRS))
        return {}
    try:
        document = json.loads(ref.data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        document = None
    if not isinstance(document, dict):
        log.warning("%s: not a JSON object, left out", _join(path, ZATTRS))
        return {}
    return document


def _file(
    key: str,
    global_attributes: dict[str, Any],
    arrays: list[tuple[str, Array, dict[str, Any]]],
    choice: str,
    zarr_fills: bool = False,
    wide: dict[str, Wide] | None = None,
    record_dim: str | None = None,
) -> tuple[NcFile, dict[str, str]]:
    """The file of one group, and its arrays netCDF classic has no place for;
    ``zarr_fills``: whether Zarr fill values stand for ``_FillValue``
    (:func:`zarr_fills_mean_fill_values`)."""
    wide = wide or {}
    versions = [2, 5] if choice == "auto" else [FORMATS[choice]]
    wide_times = [p for p, how in wide.items() if how.time and how.checked and not how.narrow]
    if choice == "auto" and wide_times:
        log.warning(
            "%s: CF times %s: no CF unit in which every value is an int (as CDF-2 holds "
            "integers): the file is CDF-5, the times int64 (--netcdf-format)",
            key,
            ", ".join(wide_times),
        )
        versions = [5]
    for version in versions:
        builder = _Builder(
            version == 5,
            wide,
            refuse_inexact=choice == "auto",
            record=record_dim,
            zarr_fills=zarr_fills,
        )
        header = builder.header(version, global_attributes, arrays)
        if version != versions[-1] and not fits(header):
            continue
        try:
            block = header_block(len(header.encoded()))
            isolation = max(block, ISOLATION_BLOCK)
            text = lay_out(header, data_at=HEADER_BLOCKS * block, block=isolation)
        except LayoutError as exc:
            raise FetchError(f"{key}: {exc} (--netcdf-format)") from None
        return NcFile(key, header, text, builder.sources), builder.left_out
    raise AssertionError("unreachable")


class _Builder:
    """``wide`` says how 64-bit integer arrays are written; ``refuse_inexact`` leaves out
    of a CDF-1/2 file those whose values are not all exact doubles; ``record`` is
    ``--netcdf-record-dim``; ``zarr_fills``: whether Zarr fill values stand for
    ``_FillValue``."""

    def __init__(
        self,
        cdf5: bool,
        wide: dict[str, Wide],
        *,
        refuse_inexact: bool,
        record: str | None = None,
        zarr_fills: bool = False,
    ) -> None:
        self.cdf5 = cdf5
        self.record = record
        self.zarr_fills = zarr_fills
        self.documents: list[dict[str, Any]] = []
        self.wide = wide
        self.refuse_inexact = refuse_inexact
        self.dimensions: list[Dimension] = []
        self._ids: dict[str, int] = {}
        self.sources: list[Source] = []
        self.left_out: dict[str, str] = {}
        self.record_dimension: int | None = None

    def header(
        self,
        version: int,
        global_attributes: dict[str, Any],
        arrays: list[tuple[str, Array, dict[str, Any]]],
    ) -> Header:
        variables = []
        for path, array, document in arrays:
            try:
                variables.append(self._variable(path, array, document))
            except TypeRefused as exc:
                self.left_out[path] = str(exc)
                log.warning("array %r is left out of the netCDF file: %s", path, exc)
        numrecs = self._records(variables)
        attributes = self._attributes(global_attributes)
        return Header(version, self.dimensions, attributes, variables, numrecs=numrecs)

    def _records(self, variables: list[Variable]) -> int:
        """Make the record dimension, if there is one (a 0-length dimension is already),
        and return its length.  It is ``--netcdf-record-dim``'s, or the first dimension
        that is a CF time axis (its coordinate variable's ``units`` "... since ...",
        ``axis`` T or ``standard_name`` time), if every variable using it has it first
        and none may fail its reads (its records would share blocks with the others')."""
        if self.record_dimension is not None or self.record == NO_RECORD_DIM:
            return 0
        chosen = self._ids.get(self.record) if self.record else self._time_axis(variables)
        if chosen is None:
            return 0
        dimension = self.dimensions[chosen]
        users = [v for v in variables if chosen in v.dimids]
        not_first = [v.name for v in users if v.dimids[0] != chosen]
        failing = [v.name for v in users if v.isolated]
        if not_first or failing:
            log.info(
                "dimension %r is not made the record dimension: %s",
                dimension.name,
                f"not the first of {not_first}" if not_first else f"{failing} may fail",
            )
            return 0
        for variable in users:
            variable.record = True
        self.dimensions[chosen] = Dimension(dimension.name, dimension.length, unlimited=True)
        self.record_dimension = chosen
        return dimension.length

    def _time_axis(self, variables: list[Variable]) -> int | None:
        """The first dimension whose coordinate variable is a CF time axis."""
        axes = {
            variable.dimids[0]
            for variable, document in zip(variables, self.documents, strict=True)
            if len(variable.dimids) == 1
            and self.dimensions[variable.dimids[0]].name == variable.name
            and _time_axis(document)
        }
        return min(axes, default=None)

    def _resolve(self, name: str, length: int) -> tuple[str, int | None]:
        """The name dimension ``name`` of ``length`` takes, and its id if it exists."""
        wanted = name
        n = 0
        while True:
            found = self._ids.get(name)
            if found is None or self.dimensions[found].length == length:
                return name, found
            n += 1
            name = f"{wanted}_{length}" if n == 1 else f"{wanted}_{length}_{n}"

    def _dimension(self, name: str, length: int, where: str) -> int:
        resolved, found = self._resolve(name, length)
        if found is not None:
            return found
        self._ids[resolved] = len(self.dimensions)
        self.dimensions.append(Dimension(resolved, length))
        if resolved != name:
            log.warning(
                "%s: dimension %r has another length elsewhere; here it is %r",
                where,
                name,
                resolved,
            )
        return self._ids[resolved]

    def _empty(self, names: list[str], shape: tuple[int, ...]) -> bool:
        """Whether a variable is a record variable of no records (its first dimension,
        of length 0, the file's record dimension), or :class:`TypeRefused` for a
        dimension of length 0 netCDF classic cannot hold: a dimension of length 0 is
        the record dimension, a file has one, and it is a variable's first."""
        zeros = [i for i, n in enumerate(shape) if n == 0]
        if not zeros:
            return False
        if zeros != [0]:
            raise TypeRefused(
                f"shape {shape}: a dimension of length 0 other than the first (netCDF "
                "classic's only dimension of length 0 is the record dimension, first)"
            )
        resolved, found = self._resolve(names[0], 0)
        if self.record_dimension is not None and found != self.record_dimension:
            record = self.dimensions[self.record_dimension].name
            raise TypeRefused(
                f"a second dimension of length 0, {resolved!r} (netCDF classic has one "
                f"record dimension, here {record!r})"
            )
        return True

    def _variable(self, path: str, array: Array, document: dict[str, Any]) -> Variable:
        meta = json.loads(array.rewritten())
        if not isinstance(meta["dtype"], str):
            raise TypeRefused("records have no netCDF classic type")
        served = np.dtype(meta["dtype"])
        boolean = array.meta.get("dtype") == "|b1"  # v3 arrays are presented with theirs
        wide = self.wide.get(path, Wide())
        if self.refuse_inexact and not self.cdf5 and not wide.exact:
            raise TypeRefused(
                f"64-bit integers ({wide.why}) in a CDF-2 file: --netcdf-format cdf5 keeps "
                "them as such, 64bit-offset as doubles (a value without one fails its read)"
            )
        kind = file_type(
            served,
            boolean=boolean,
            cdf5=self.cdf5,
            divisor=wide.divisor,
            keep=wide.keep,
            narrow=wide.narrow,
        )
        name = path.rpartition("/")[2]
        shape = () if array.scalar else tuple(meta["shape"])
        names = document.get(DIMENSIONS_ATTRIBUTE)
        if array.scalar:
            names = []
        elif not (isinstance(names, list) and len(names) == len(shape)):
            names = [f"{name}_dim{i}" for i in range(len(shape))]
        names = [str(n) or f"{name}_dim{i}" for i, n in enumerate(names)]
        record = self._empty(names, shape)
        dimids = [self._dimension(n, length, path) for n, length in zip(names, shape, strict=True)]
        if record:
            self.record_dimension = dimids[0]
        file_shape = shape
        if kind.width is not None and not (kind.width == 1 and shape):
            dimids.append(self._dimension(f"strlen{kind.width}", kind.width, path))
            file_shape = (*shape, kind.width)
        if wide.units is not None:
            document = {**document, "units": wide.units}
        self.documents.append(document)
        if wide.time and wide.keep is not None and "_FillValue" not in document:
            # a time's fill value (NaT), in the variable's type (int's default fill for
            # a time written as int): xarray masks only what _FillValue names
            document = {**document, "_FillValue": wide.keep}
        fill = zarr_fill(meta, scalar=array.scalar, kind=kind) if self.zarr_fills else None
        attributes = variable_attributes(path, document, kind, cdf5=self.cdf5, fill=fill)
        if kind.width is not None and _text(array) and ENCODING not in document:
            attributes.append(attribute(ENCODING, "utf-8", cdf5=self.cdf5))
        variable = Variable(
            name,
            tuple(dimids),
            kind.nc_type,
            file_shape,
            attributes,
            record=record,
            isolated=kind.as_double and not (wide.checked and wide.exact),
        )
        fill = _absent_fill(meta.get("fill_value"), document.get("_FillValue"), kind)
        self.sources.append(
            Source(path, kind, tuple(meta["shape"]), tuple(meta["chunks"]), array.separator, fill)
        )
        return variable

    def _attributes(self, document: dict[str, Any]) -> list[Attribute]:
        """Global attributes."""
        return [
            attribute(name, value, cdf5=self.cdf5)
            for name, value in document.items()
            if name and name != DIMENSIONS_ATTRIBUTE
        ]


def _time_axis(document: dict[str, Any]) -> bool:
    """Whether a coordinate variable's attributes say it is a CF time axis."""
    return (
        time_unit(document) is not None
        or document.get("axis") == "T"
        or document.get("standard_name") == "time"
    )


def _text(array: Array) -> bool:
    """Whether a string array's values are text (``<U<n>`` or ``vlen-utf8``, served as
    UTF-8), not bytes (``|S<n>``, ``vlen-bytes``)."""
    decoder = array.decoder
    if isinstance(decoder, ChunkDecoder):
        return decoder.utf8_chars is not None
    codecs = vlen_codecs(array.meta)
    return codecs is not None and codecs[0] == "vlen-utf8"


def _integer_fill(served: np.dtype, *values: Any) -> int | None:
    """The first of ``values`` that is a value of the integer type ``served``."""
    info = np.iinfo(served)
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and info.min <= value <= info.max:
            return value
    return None


def _absent_fill(zarr_fill: Any, attribute_fill: Any, kind: FileType) -> bytes:
    """One value, as served, for the elements of a chunk the set does not have: the
    ``.zarray``'s fill value, else ``_FillValue``, else netCDF's default fill of the
    type (zero where the served type cannot hold it)."""
    served = kind.served
    if served.kind == "S":
        return b"\0" * served.itemsize
    for value in (zarr_fill, attribute_fill, TYPES[kind.nc_type][1]):
        if isinstance(value, str):
            value = {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}.get(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        try:
            with np.errstate(all="ignore"):
                one = np.array([value]).astype(served)
        except (OverflowError, ValueError):
            continue
        if one[0] == value or (served.kind == "f" and np.isnan(value)):
            return one.tobytes()
    return bytes(served.itemsize)


__all__ = ["Files", "NcFile", "Source", "build", "groups"]
