"""The netCDF files of a decoded view: which groups become files, and each file's header
and variables, from the metadata alone (no chunk is read).

A group's arrays are its file's variables, in the view's listing order.  Dimensions come
from ``_ARRAY_DIMENSIONS`` (a Zarr v3 array's ``dimension_names`` are presented so by
the decoded view); an array without names gets ``<array>_dim<i>``; a name met again with
another length is a new dimension ``<name>_<length>`` (logged).  A rank-0 array is a
scalar variable.  ``|S<n>`` arrays take a last dimension ``strlen<n>``, and those
holding text (``<U<n>``, ``vlen-utf8``) ``_Encoding = "utf-8"``; an ``|S1`` array is a
char array already (a netCDF file's ``char name(station, strlen)`` as kerchunk and
VirtualiZarr reference it), served as it is.  Attributes are the decoded view's
``.zattrs`` (CF time units of datetimes included) without ``_ARRAY_DIMENSIONS``, in the
types CF gives them (:mod:`refmount.netcdf.attributes`).  The values start
:data:`HEADER_BLOCKS` blocks into the file, past what reading the header brings in.
What the decoded view leaves out, and arrays whose type netCDF classic has no place
for, are left out of the file, logged and listed by ``refmount check --netcdf``.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refmount.decode.arrays import Array, ArrayRefused, ChunkDecoder
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
from refmount.netcdf.types import FileType, TypeRefused, attribute, file_type
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
    def begins(self) -> list[int]:
        return [variable.begin for variable in self.header.variables]


@dataclass
class Files:
    """Every file of a view, and what was left out of them (array path -> why; group
    path -> why, :mod:`refmount.netcdf.names`)."""

    files: list[NcFile]
    left_out: dict[str, str] = field(default_factory=dict)
    left_out_groups: dict[str, str] = field(default_factory=dict)


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


async def build(view: DecodedRefSet, name: str, choice: str) -> Files:
    """The files of ``view`` (``name`` the root file's name, ``choice`` the format); the
    root group's is always the first (:data:`refmount.netcdf.options.ROOT_FILE_ID`)."""
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
        described[group] = (await _document(view, group), documents)
    fills = zarr_fills_mean_fill_values(view, described.values())
    keys, files.left_out_groups = file_keys(name, list(described))
    for group, (global_attributes, arrays) in described.items():
        if group not in keys:
            continue
        made, refused = _file(keys[group], global_attributes, arrays, choice, fills)
        files.files.append(made)
        files.left_out.update(refused)
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
) -> tuple[NcFile, dict[str, str]]:
    """The file of one group, and its arrays netCDF classic has no type for;
    ``zarr_fills``: whether Zarr fill values stand for ``_FillValue``
    (:func:`zarr_fills_mean_fill_values`)."""
    versions = [2, 5] if choice == "auto" else [FORMATS[choice]]
    for version in versions:
        builder = _Builder(version == 5, zarr_fills)
        header = builder.header(version, global_attributes, arrays)
        if version != versions[-1] and not fits(header):
            continue
        try:
            block = header_block(len(header.encoded()))
            text = lay_out(header, data_at=HEADER_BLOCKS * block)
        except LayoutError as exc:
            raise FetchError(f"{key}: {exc} (--netcdf-format)") from None
        return NcFile(key, header, text, builder.sources), builder.left_out
    raise AssertionError("unreachable")


class _Builder:
    def __init__(self, cdf5: bool, zarr_fills: bool = False) -> None:
        self.cdf5 = cdf5
        self.zarr_fills = zarr_fills
        self.dimensions: list[Dimension] = []
        self._ids: dict[str, int] = {}
        self.sources: list[Source] = []
        self.left_out: dict[str, str] = {}

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
        return Header(version, self.dimensions, self._attributes(global_attributes), variables)

    def _dimension(self, name: str, length: int, where: str) -> int:
        wanted = name
        n = 0
        while True:
            found = self._ids.get(name)
            if found is None:
                self._ids[name] = len(self.dimensions)
                self.dimensions.append(Dimension(name, length))
                if name != wanted:
                    log.warning(
                        "%s: dimension %r has another length elsewhere; here it is %r",
                        where,
                        wanted,
                        name,
                    )
                return self._ids[name]
            if self.dimensions[found].length == length:
                return found
            n += 1
            name = f"{wanted}_{length}" if n == 1 else f"{wanted}_{length}_{n}"

    def _variable(self, path: str, array: Array, document: dict[str, Any]) -> Variable:
        meta = json.loads(array.rewritten())
        if not isinstance(meta["dtype"], str):
            raise TypeRefused("records have no netCDF classic type")
        served = np.dtype(meta["dtype"])
        boolean = array.meta.get("dtype") == "|b1"  # v3 arrays are presented with theirs
        kind = file_type(served, boolean=boolean, cdf5=self.cdf5)
        name = path.rpartition("/")[2]
        shape = () if array.scalar else tuple(meta["shape"])
        names = document.get(DIMENSIONS_ATTRIBUTE)
        if array.scalar:
            names = []
        elif not (isinstance(names, list) and len(names) == len(shape)):
            names = [f"{name}_dim{i}" for i in range(len(shape))]
        dimids = [
            self._dimension(str(n) or f"{name}_dim{i}", length, path)
            for i, (n, length) in enumerate(zip(names, shape, strict=True))
        ]
        file_shape = shape
        if kind.width is not None and not (kind.width == 1 and shape):
            dimids.append(self._dimension(f"strlen{kind.width}", kind.width, path))
            file_shape = (*shape, kind.width)
        fill = zarr_fill(meta, scalar=array.scalar, kind=kind) if self.zarr_fills else None
        attributes = variable_attributes(path, document, kind, cdf5=self.cdf5, fill=fill)
        if kind.unsigned and "_Unsigned" not in document:
            attributes.append(attribute("_Unsigned", "true", cdf5=self.cdf5))
        if kind.width is not None and _text(array) and ENCODING not in document:
            attributes.append(attribute(ENCODING, "utf-8", cdf5=self.cdf5))
        variable = Variable(name, tuple(dimids), kind.nc_type, file_shape, attributes)
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


def _text(array: Array) -> bool:
    """Whether a string array's values are text (``<U<n>`` or ``vlen-utf8``, served as
    UTF-8), not bytes (``|S<n>``, ``vlen-bytes``)."""
    decoder = array.decoder
    if isinstance(decoder, ChunkDecoder):
        return decoder.utf8_chars is not None
    codecs = vlen_codecs(array.meta)
    return codecs is not None and codecs[0] == "vlen-utf8"


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
