"""A Parquet reference set's ``.zmetadata``, read and validated: which keys are metadata
files, which are arrays (with their chunk grids) and which paths are directories.

Tree rules (what refmount shows, where fsspec is silent or wrong):

* Every metadata key is a file, plus a synthesized root ``.zmetadata`` (zarr consolidated
  metadata of all metadata keys).  A metadata key named ``.zmetadata`` at the root is
  replaced by the synthesized one.
* Keys with an empty, ``.`` or ``..`` component, a leading ``/``, NUL or a component over
  255 bytes are skipped with a warning.  An array nested inside another array is skipped;
  below an array only direct metadata children whose name does not start with a digit are
  kept (others could collide with chunk keys).  A file key that is also a directory is
  skipped: the directory wins.

Everything a hostile ``.zmetadata`` could make costly is bounded here, before anything is
allocated for it: the file's size, ``record_size``, an array's number of dimensions and
its number of chunks (file ids must fit in inode numbers).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from refmount.errors import RefsError

log = logging.getLogger(__name__)

ZMETADATA = ".zmetadata"
#: Rows per record file: a record is decoded whole, so its rows bound a load's memory
#: (about 40 bytes a row while decoding).  fsspec writes 10,000, kerchunk 100,000.
MAX_RECORD_SIZE = 1 << 21
#: ``.zmetadata`` is parsed whole into Python objects (about ten times its size)
MAX_ZMETADATA_BYTES = 256 << 20
#: dimensions of an array (numpy's own limit)
MAX_NDIM = 64
#: chunks of all arrays together: file ids must fit comfortably in inode numbers
MAX_FILE_IDS = 1 << 48


@dataclass(frozen=True, slots=True)
class ArrayLayout:
    """An array's chunk grid as ``.zarray`` describes it."""

    grid: tuple[int, ...]  # chunks per dimension; (1,) for a scalar
    nested: bool  # dimension_separator "/"


@dataclass
class Layout:
    """What ``.zmetadata`` says: metadata files, arrays and directories."""

    files: dict[str, Any]  # kept metadata key -> value
    arrays: dict[str, ArrayLayout]  # array name -> grid
    dirs: set[str]
    record_size: int


def bad_key_reason(key: str) -> str | None:
    """Why a key cannot be a path in the tree, or None when it can."""
    if not key:
        return "empty key"
    if key.startswith("/"):
        return "leading '/'"
    if "\0" in key:
        return "NUL in key"
    for part in key.split("/"):
        if part in ("", ".", ".."):
            return f"component {part!r}"
        if len(part.encode("utf-8", "surrogatepass")) > 255:
            return "component longer than 255 bytes"
    return None


def ancestors(path: str) -> Iterator[str]:
    """The proper ancestors of a path, nearest first, ending with the root ``""``."""
    while path:
        path = path.rpartition("/")[0]
        yield path


def consolidated_value(value: Any) -> Any:
    """A value for the synthesized ``.zmetadata``: JSON text becomes the object it holds."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        if isinstance(parsed, dict | list):
            return parsed
    return value


def _as_json(value: Any, key: str) -> Any:
    """A metadata value as a JSON value: strings are parsed (RefsError when not JSON)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise RefsError(f"key {key!r}: invalid JSON ({exc})") from None
    return value


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_zarray(key: str, value: Any) -> ArrayLayout:
    """Validate an array's ``.zarray``: its chunk grid and whether keys nest with ``/``."""
    meta = _as_json(value, key)
    if not isinstance(meta, dict):
        raise RefsError(f"key {key!r}: .zarray must be a JSON object")
    shape, chunks = meta.get("shape"), meta.get("chunks")
    for name, val in (("shape", shape), ("chunks", chunks)):
        if not isinstance(val, list) or not all(_is_count(v) for v in val):
            raise RefsError(f"key {key!r}: {name} must be a list of non-negative integers")
    assert isinstance(shape, list) and isinstance(chunks, list)
    if len(shape) != len(chunks):
        raise RefsError(f"key {key!r}: shape and chunks have different lengths")
    if len(shape) > MAX_NDIM:
        raise RefsError(f"key {key!r}: more than {MAX_NDIM} dimensions")
    if any(c == 0 for c in chunks):
        raise RefsError(f"key {key!r}: chunks must be positive")
    separator = meta.get("dimension_separator")
    if separator not in (None, ".", "/"):
        raise RefsError(f"key {key!r}: dimension_separator must be '.' or '/'")
    # Integer ceiling: shapes may be far beyond a float's precision.
    grid = tuple(-(-s // c) for s, c in zip(shape, chunks, strict=True)) or (1,)
    count = 1
    for size in grid:
        count *= size
        if count > MAX_FILE_IDS:
            raise RefsError(f"key {key!r}: more than {MAX_FILE_IDS} chunks")
    return ArrayLayout(grid, separator == "/")


def load_zmetadata(fs: Any, root: str) -> Layout:
    """Read and validate ``ROOT/.zmetadata`` (RefsError naming the file or key)."""
    path = f"{root}/{ZMETADATA}"
    try:
        with fs.open(path, "rb") as f:
            data = f.read(MAX_ZMETADATA_BYTES + 1)
    except FileNotFoundError:
        raise RefsError(f"{path}: no such file") from None
    except OSError as exc:
        raise RefsError(f"{path}: cannot read ({exc})") from None
    if len(data) > MAX_ZMETADATA_BYTES:
        raise RefsError(f"{path}: larger than {MAX_ZMETADATA_BYTES >> 20} MiB")
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise RefsError(f"{path}: invalid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise RefsError(f"{path}: expected a JSON object")
    metadata, record_size = doc.get("metadata"), doc.get("record_size")
    if not isinstance(metadata, dict):
        raise RefsError(f"{path}: 'metadata' must be a JSON object")
    if not _is_count(record_size) or not 0 < record_size <= MAX_RECORD_SIZE:
        raise RefsError(
            f"{path}: 'record_size' must be an integer from 1 to {MAX_RECORD_SIZE}, "
            f"got {record_size!r}"
        )
    return layout(metadata, record_size)


def layout(metadata: dict[str, Any], record_size: int) -> Layout:
    """Apply the tree rules of the module docstring to the metadata keys."""
    values: dict[str, Any] = {}
    for key, value in metadata.items():
        reason = bad_key_reason(key)
        if reason:
            log.warning("skipping metadata key %r: %s", key, reason)
        elif key == ZMETADATA:
            log.info("replacing the stored root .zmetadata key by the synthesized one")
        else:
            values[key] = value

    grids = {}
    for key, value in values.items():
        name, _, base = key.rpartition("/")
        if base == ".zarray":
            grids[name] = parse_zarray(key, value)
    arrays = {}
    for name, grid in grids.items():
        if any(a in grids for a in ancestors(name)):
            log.warning("skipping array %r: nested inside another array", name)
        else:
            arrays[name] = grid

    files = {}
    for key, value in values.items():
        parent, _, base = key.rpartition("/")
        owner = next(
            (p for p in ((parent, *ancestors(parent)) if parent else ("",)) if p in arrays),
            None,
        )
        if owner is not None and (owner != parent or base[0].isdigit()):
            log.warning("skipping metadata key %r: inside array %r's chunk keys", key, owner)
            continue
        files[key] = value

    dirs = {""}
    for path in (*files, *(f"{a}/x" if a else "x" for a in arrays)):
        for ancestor in ancestors(path):
            if ancestor in dirs:
                break
            dirs.add(ancestor)
    for key in [k for k in files if k in dirs]:
        log.warning("skipping metadata key %r: it is also a directory", key)
        del files[key]
    return Layout(files, arrays, dirs, record_size)
