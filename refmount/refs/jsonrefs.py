"""Parsing JSON reference sets (version 0 and version 1) into compact columns.

Range references (``[url, offset, length]``), nearly all of a large set, are converted in
bulk into Arrow arrays by C loops, not a Python loop per key; anything else, and any batch
with something wrong in it, goes through a per-key path that names the offending key.  URLs
are interned: a million references into a few dozen files hold a few dozen URL strings.
"""

from __future__ import annotations

import itertools
import json
import logging
import operator
from array import array
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from refmount.errors import RefsError
from refmount.refs.templates import Templates
from refmount.refs.values import inline_bytes

log = logging.getLogger(__name__)

MAX_INT = (1 << 63) - 1
MAX_GEN_KEYS = 50_000_000  # keys all `gen` entries together may produce
WHOLE_FILE = -1  # length column value of a [url] reference


class Columns:
    """Rows of a reference set, in the order the file gives them (later rows win)."""

    def __init__(self, resolve: Callable[[str], str]) -> None:
        self.urls: list[str] = []
        self._resolve = resolve
        self._url_ids: dict[str, int] = {}  # as written -> index in self.urls
        self._resolved_ids: dict[str, int] = {}
        self._batches: list[pa.Table] = []
        self._keys: list[str] = []
        self._url_index = array("i")  # -1 for inline data
        self._offsets = array("q")
        self._lengths = array("q")
        self._inline: list[bytes | None] = []

    def add_inline(self, key: str, data: bytes) -> None:
        self._add(key, -1, 0, len(data), data)

    def add_url(self, key: str, url: str, offset: int, length: int) -> None:
        url_id = self._url_ids.get(url)
        if url_id is None:
            url_id = self._intern(url, key)
        self._add(key, url_id, offset, length, None)

    def _add(self, key: str, url_id: int, offset: int, length: int, data: bytes | None) -> None:
        self._keys.append(key)
        self._url_index.append(url_id)
        self._offsets.append(offset)
        self._lengths.append(length)
        self._inline.append(data)

    def add_ranges(
        self, keys: list[str], urls: list[str], offsets: pa.Array, lengths: pa.Array,
        render: Callable[[str, str], str],
    ) -> None:  # fmt: skip
        """Append checked range rows in bulk; ``render(url, key)`` renders a URL template."""
        ids: dict[str, int] = dict.fromkeys(urls, -1)  # the few distinct URLs, in order
        for url in ids:
            url_id = self._url_ids.get(url)
            if url_id is None:
                key = keys[urls.index(url)]
                url_id = self._intern(render(url, key), key)
            ids[url] = url_id
        self._flush()
        self._batches.append(
            _batch(
                keys,
                _from_array(array("i", map(ids.__getitem__, urls)), pa.int32()),
                offsets,
                lengths,
                pa.nulls(len(keys), pa.large_binary()),
            )
        )

    def _intern(self, url: str, key: str) -> int:
        try:
            resolved = self._resolve(url)
        except RefsError as exc:
            raise RefsError(f"key {key!r}: {exc}") from None
        url_id = self._resolved_ids.get(resolved)
        if url_id is None:
            url_id = self._resolved_ids[resolved] = len(self.urls)
            self.urls.append(resolved)
        self._url_ids[url] = url_id
        return url_id

    def _flush(self) -> None:
        if self._keys:
            self._batches.append(
                _batch(
                    self._keys,
                    _from_array(self._url_index, pa.int32()),
                    _from_array(self._offsets, pa.int64()),
                    _from_array(self._lengths, pa.int64()),
                    pa.array(self._inline, pa.large_binary()),
                )
            )
            self.__init_rows()

    def __init_rows(self) -> None:
        self._keys, self._inline = [], []
        self._url_index, self._offsets, self._lengths = array("i"), array("q"), array("q")

    def table(self) -> pa.Table:
        """Every row so far, in order, as one table (key, url, offset, length, inline)."""
        self._flush()
        if not self._batches:
            return _batch([], pa.array([], pa.int32()), pa.array([], pa.int64()),
                          pa.array([], pa.int64()), pa.array([], pa.large_binary()))  # fmt: skip
        table = pa.concat_tables(self._batches)
        self._batches = []
        return table


def _batch(keys: list[str], url: pa.Array, offset: pa.Array, length: pa.Array, inline: pa.Array):
    return pa.table(
        {"key": _strings(keys), "url": url, "offset": offset, "length": length, "inline": inline}
    )


def _strings(values: list[str]) -> pa.Array:
    """A large_string array of ``values``, built with C loops.

    ``pa.array`` would do, but it first probes whether the list is a pandas object, which
    imports pandas (a second or so); joining and splitting on NUL is as exact: a NUL in a
    value shows as a wrong count and takes the general path.
    """
    blob = "\0".join(values).encode("utf-8", "surrogatepass")
    if values and blob.count(b"\0") == len(values) - 1:
        try:
            whole = pa.Array.from_buffers(
                pa.large_string(), 1, [None, pa.py_buffer(array("q", [0, len(blob)])),
                                       pa.py_buffer(blob)]
            )  # fmt: skip
            whole.validate(full=True)  # lone surrogates are not UTF-8
            return pc.split_pattern(whole, "\0").flatten()
        except pa.ArrowInvalid:
            pass
    try:
        return pa.array(values, pa.large_string())
    except (pa.ArrowInvalid, UnicodeEncodeError):
        # Lone surrogates (JSON allows "\\ud800") are not UTF-8: make them U+FFFD, which
        # the path check then refuses, naming the key.
        return pa.array(
            [k.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for k in values],
            pa.large_string(),
        )


def _from_array(values: array, kind: pa.DataType) -> pa.Array:
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def loads(raw: bytes, name: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RefsError(
            f"{name}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except (UnicodeDecodeError, RecursionError) as exc:
        raise RefsError(f"{name}: not a JSON reference set: {exc}") from None


def parse(document: Any, name: str, resolve: Callable[[str], str]) -> Columns:
    """Columns of a parsed JSON reference set of either version."""
    if not isinstance(document, dict):
        raise RefsError(f"{name}: a reference set must be a JSON object")
    columns = Columns(resolve)
    version = document.get("version")
    if version is None:
        _add_refs(columns, document, None, skip_version=True)
        return columns
    if version != 1 or isinstance(version, bool):
        raise RefsError(f"{name}: unsupported reference set version {version!r} (0 and 1 are)")
    unknown = set(document) - {"version", "templates", "gen", "refs"}
    if unknown:
        log.warning("%s: ignoring unknown top-level fields %s", name, sorted(unknown))
    templates = Templates(document.get("templates", {}))
    refs = document.get("refs", {})
    if not isinstance(refs, dict):
        raise RefsError(f'{name}: "refs" must be a JSON object')
    _add_refs(columns, refs, templates)
    gen = document.get("gen", [])
    if not isinstance(gen, list):
        raise RefsError(f'{name}: "gen" must be a list')
    produced = 0
    for number, entry in enumerate(gen):
        produced = _add_gen(columns, entry, number, templates, produced)
    return columns


def _add_refs(
    columns: Columns, refs: Mapping[str, Any], templates: Templates | None, *, skip_version=False
) -> None:
    keys, values = list(refs), list(refs.values())
    if skip_version and "version" in refs:  # "version": null in a version 0 file
        at = keys.index("version")
        del keys[at], values[at]
    is_range = [type(v) is list and len(v) == 3 for v in values]
    range_keys = list(itertools.compress(keys, is_range))
    range_values = list(itertools.compress(values, is_range))
    if not _add_ranges_in_bulk(columns, range_keys, range_values, templates):
        for key, value in zip(range_keys, range_values, strict=True):
            _add_list(columns, key, value, templates)
    del range_keys, range_values
    for key, value, ranged in zip(keys, values, is_range, strict=True):
        if ranged:
            continue
        kind = type(value)
        if kind is list:
            _add_list(columns, key, value, templates)
        elif kind is str or kind is dict:
            columns.add_inline(key, inline_bytes(value, key))
        else:
            raise RefsError(
                f"key {key!r}: expected a string, a JSON object or a list, "
                f"got {type(value).__name__}"
            )


def _add_ranges_in_bulk(
    columns: Columns, keys: list[str], values: list[list], templates: Templates | None
) -> bool:
    """Add ``[url, offset, length]`` rows with C loops; ``False`` (nothing added) when
    anything is off, so that the per-key path can name the key."""
    if not values:
        return True
    urls = list(map(operator.itemgetter(0), values))
    if set(map(type, urls)) != {str}:
        return False
    numbers = []
    for position in (1, 2):
        column = list(map(operator.itemgetter(position), values))
        if set(map(type, column)) != {int}:  # bool and float are not int here: type() is exact
            return False
        try:
            numbers.append(array("q", column))
        except OverflowError:
            return False
    offsets, lengths = (_from_array(n, pa.int64()) for n in numbers)
    try:
        pc.add_checked(offsets, lengths)
    except pa.ArrowInvalid:
        return False
    if pc.min(offsets).as_py() < 0 or pc.min(lengths).as_py() < 0 or "" in urls:
        return False

    def render(url: str, key: str) -> str:
        if templates is not None and "{{" in url:
            return templates.render(url, what=f"key {key!r}")
        return url

    columns.add_ranges(keys, urls, offsets, lengths, render)
    return True


def _add_list(columns: Columns, key: str, value: list, templates: Templates | None) -> None:
    if len(value) == 3:
        url, offset, length = value
        if type(offset) is not int or type(length) is not int:
            raise RefsError(f"key {key!r}: offset and length must be integers, got {value[1:]!r}")
        _check_range(key, offset, length)
    elif len(value) == 1:
        url, offset, length = value[0], 0, WHOLE_FILE
    else:
        raise RefsError(
            f"key {key!r}: a reference list is [url] or [url, offset, length], "
            f"got {len(value)} items"
        )
    if not isinstance(url, str) or not url:
        raise RefsError(f"key {key!r}: the URL must be a non-empty string, got {url!r}")
    if templates is not None and "{{" in url:
        url = templates.render(url, what=f"key {key!r}")
    columns.add_url(key, url, offset, length)


def _check_range(key: str, offset: int, length: int) -> None:
    if offset < 0 or length < 0:
        raise RefsError(f"key {key!r}: negative offset or length ({offset}, {length})")
    if offset + length > MAX_INT:
        raise RefsError(f"key {key!r}: offset + length overflows ({offset} + {length})")


def _add_gen(columns: Columns, entry: Any, number: int, templates: Templates, produced: int) -> int:
    where = f"gen[{number}]"
    if not isinstance(entry, dict):
        raise RefsError(f"{where}: must be a JSON object")
    for field in ("key", "url", "dimensions"):
        if field not in entry:
            raise RefsError(f'{where}: missing required field "{field}"')
    if ("offset" in entry) != ("length" in entry):
        raise RefsError(f'{where}: "offset" and "length" go together')
    for field in ("key", "url", "offset", "length"):
        if field in entry and not isinstance(entry[field], str | int):
            raise RefsError(f'{where}: "{field}" must be a string')
    names, ranges = _dimensions(entry["dimensions"], where)
    count = 1
    for values in ranges:
        count *= len(values)
    if produced + count > MAX_GEN_KEYS:
        raise RefsError(f"{where}: generates more than {MAX_GEN_KEYS} keys")
    key_t, url_t = str(entry["key"]), str(entry["url"])
    offset_t, length_t = entry.get("offset"), entry.get("length")
    for combination in itertools.product(*ranges):
        variables = dict(zip(names, combination, strict=True))
        label = f"{where} with {variables}"
        key = templates.render(key_t, variables, what=label)
        url = templates.render(url_t, variables, what=label)
        if not url:
            raise RefsError(f"{label}: the URL renders empty")
        if offset_t is None:
            columns.add_url(key, url, 0, WHOLE_FILE)
            continue
        offset = _render_int(templates, str(offset_t), variables, f"{label}: offset")
        length = _render_int(templates, str(length_t), variables, f"{label}: length")
        _check_range(key, offset, length)
        columns.add_url(key, url, offset, length)
    return produced + count


def _dimensions(spec: Any, where: str) -> tuple[list[str], list[range | list[int]]]:
    if not isinstance(spec, dict) or not spec:
        raise RefsError(f'{where}: "dimensions" must be a non-empty JSON object')
    names, ranges = [], []
    for name, dim in spec.items():
        if isinstance(dim, list):
            if not all(type(v) is int for v in dim):
                raise RefsError(f"{where}: dimension {name!r} must list integers")
            values: range | list[int] = dim
        elif isinstance(dim, dict):
            unknown = set(dim) - {"start", "stop", "step"}
            if unknown or "stop" not in dim:
                raise RefsError(f'{where}: dimension {name!r} needs "stop" (and only start/step)')
            start, stop, step = dim.get("start", 0), dim["stop"], dim.get("step", 1)
            if not all(type(v) is int for v in (start, stop, step)) or step == 0:
                raise RefsError(f"{where}: dimension {name!r}: start/stop/step must be integers")
            values = range(start, stop, step)
        else:
            raise RefsError(f"{where}: dimension {name!r} must be a range object or a list")
        names.append(name)
        ranges.append(values)
    return names, ranges


def _render_int(templates: Templates, source: str, variables: dict, what: str) -> int:
    text = templates.render(source, variables, what=what).strip()
    if not text.isascii() or not text.isdecimal():
        raise RefsError(f"{what}: renders {text[:40]!r}, not a non-negative integer")
    return int(text)
