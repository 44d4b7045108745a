"""Parsing JSON reference sets (version 0 and version 1) into compact columns.

A large set is parsed in two processes at once when it can be (:mod:`.jsonsplit`), else in
one.  Range references (``[url, offset, length]``), nearly all of a large set, become
columns in bulk (:mod:`.rows`); anything else, and any mapping with something wrong in its
range values, goes through a per-key path that names the offending key.  URLs are interned:
a million references into a few dozen files hold a few dozen URL strings.
"""

from __future__ import annotations

import itertools
import json
import logging
from array import array
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from refmount.errors import RefsError
from refmount.refs import arrays, jsonsplit
from refmount.refs.rows import MAX_INT, Rows, rows_of
from refmount.refs.templates import Templates
from refmount.refs.values import inline_bytes

log = logging.getLogger(__name__)

#: Keys all ``gen`` entries of a set may produce together (their rendered text also counts
#: against :data:`.templates.MAX_RENDERED`).
MAX_GEN_KEYS = 10_000_000
WHOLE_FILE = -1  # length column value of a [url] reference
SCHEMA = pa.schema(
    [
        ("key", pa.large_string()),
        ("url", pa.int32()),  # index in Columns.urls; -1 for inline data
        ("offset", pa.int64()),
        ("length", pa.int64()),  # of the range, or of the inline data; WHOLE_FILE
        ("inline", pa.large_binary()),
    ]
)


class Columns:
    """Rows of a reference set, in the order the file gives them (later rows win)."""

    def __init__(self, resolve: Callable[[str], str]) -> None:
        self.urls: list[str] = []
        self._resolve = resolve
        self._url_ids: dict[str, int] = {}  # as given (rendered) -> index in self.urls
        self._resolved_ids: dict[str, int] = {}
        self._batches: list[pa.Table] = []
        self.__init_rows()

    def __init_rows(self) -> None:
        self._keys: list[str] = []
        self._inline: list[bytes | None] = []
        self._url_index, self._offsets, self._lengths = array("i"), array("q"), array("q")

    def add_inline(self, key: str, data: bytes) -> None:
        self._add(key, -1, 0, len(data), data)

    def add_url(self, key: str, url: str, offset: int, length: int) -> None:
        self._add(key, self._url_id(url, key), offset, length, None)

    def _add(self, key: str, url_id: int, offset: int, length: int, data: bytes | None) -> None:
        self._keys.append(key)
        self._url_index.append(url_id)
        self._offsets.append(offset)
        self._lengths.append(length)
        self._inline.append(data)

    def add_rows(self, rows: Rows, templates: Templates | None) -> None:
        """Append one mapping's rows: its range columns in bulk, then the rest key by key."""
        if len(rows):
            ids = array(
                "i", [self._range_url_id(rows, n, templates) for n in range(len(rows.urls))]
            )
            self._flush()
            self._batches.append(
                _batch(
                    arrays.from_texts(rows.keys),
                    pc.take(
                        arrays.numbers(ids, pa.int32()),
                        arrays.numbers(rows.url_ids, pa.int32()),
                        memory_pool=arrays.POOL,
                    ),
                    arrays.numbers(rows.offsets, pa.int64()),
                    arrays.numbers(rows.lengths, pa.int64()),
                    pa.nulls(len(rows), pa.large_binary(), memory_pool=arrays.POOL),
                )
            )
        for key, value in rows.others:
            _add_value(self, key, value, templates)

    def _range_url_id(self, rows: Rows, number: int, templates: Templates | None) -> int:
        """The id of ``rows.urls[number]``, rendered; an error names the first key using
        it, looked for only then."""
        url = rows.urls[number]
        try:
            return self._url_id(_render(url, templates, "a reference URL"))
        except RefsError:
            key = rows.key(rows.url_ids.index(number))
        return self._url_id(_render(url, templates, f"key {key!r}"), key)

    def _url_id(self, url: str, key: str | None = None) -> int:
        url_id = self._url_ids.get(url)
        if url_id is not None:
            return url_id
        try:
            resolved = self._resolve(url)
        except RefsError as exc:
            if key is None:
                raise
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
                    arrays.strings(self._keys),
                    arrays.numbers(self._url_index, pa.int32()),
                    arrays.numbers(self._offsets, pa.int64()),
                    arrays.numbers(self._lengths, pa.int64()),
                    arrays.binaries(self._inline),
                )
            )
            self.__init_rows()

    def table(self) -> pa.Table:
        """Every row so far, in order, as one table of :data:`SCHEMA`."""
        self._flush()
        if not self._batches:
            return SCHEMA.empty_table()
        table = pa.concat_tables(self._batches, memory_pool=arrays.POOL)
        self._batches = []
        return table


def _batch(*columns: pa.Array) -> pa.Table:
    return pa.Table.from_arrays(list(columns), schema=SCHEMA)


def _render(url: str, templates: Templates | None, what: str) -> str:
    if templates is not None and "{{" in url:
        return templates.render(url, what=what)
    return url


def load(
    raw: bytes, name: str, resolve: Callable[[str], str], parts: jsonsplit.Parts | None = None
) -> Columns:
    """Columns of the JSON reference set in ``raw``, from ``parts`` when it could be
    parsed in parts (see :func:`.jsonsplit.parse_in_parts`).

    A parse in parts may meet a problem that one parse would not (a bad value that a
    later duplicate key replaces) or another problem first: on any error it is redone in
    one go, which gives the exact error.
    """
    if parts is not None:
        try:
            return parse(parts.fields, name, resolve, parts.pieces)
        except RefsError:
            pass
    document = loads(raw, name)
    return parse(document, name, resolve)


def loads(raw: bytes, name: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RefsError(
            f"{name}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except (ValueError, RecursionError) as exc:  # bad UTF-8, too deep, too long a number
        raise RefsError(f"{name}: not a JSON reference set: {exc}") from None


def parse(
    document: Any, name: str, resolve: Callable[[str], str], pieces: list[Rows] | None = None
) -> Columns:
    """Columns of a parsed JSON reference set of either version.  ``pieces``, when
    given, are the rows of the key mapping (the whole object of version 0, ``refs`` of
    version 1) parsed in parts; ``document`` then holds the other top-level fields."""
    if not isinstance(document, dict):
        raise RefsError(f"{name}: a reference set must be a JSON object")
    columns = Columns(resolve)
    version = document.get("version")
    if version is None:
        for rows in pieces or [rows_of(document, skip_version=True)]:
            columns.add_rows(rows, None)
        return columns
    if version != 1 or isinstance(version, bool):
        raise RefsError(f"{name}: unsupported reference set version {version!r} (0 and 1 are)")
    templates = Templates(document.get("templates", {}))
    if pieces is None:
        refs = document.get("refs", {})
        if not isinstance(refs, dict):
            raise RefsError(f'{name}: "refs" must be a JSON object')
        pieces = [rows_of(refs)]
    for rows in pieces:
        columns.add_rows(rows, templates)
    gen = document.get("gen", [])
    if not isinstance(gen, list):
        raise RefsError(f'{name}: "gen" must be a list')
    produced = 0
    for number, entry in enumerate(gen):
        produced = _add_gen(columns, entry, number, templates, produced)
    unknown = set(document) - {"version", "templates", "gen", "refs"}
    if unknown:  # once the set is known to be good: a parse in parts may be redone
        log.warning("%s: ignoring unknown top-level fields %s", name, sorted(unknown))
    return columns


def _add_value(columns: Columns, key: str, value: Any, templates: Templates | None) -> None:
    kind = type(value)
    if kind is list:
        _add_list(columns, key, value, templates)
    elif kind is str or kind is dict:
        columns.add_inline(key, inline_bytes(value, key))
    else:
        raise RefsError(
            f"key {key!r}: expected a string, a JSON object or a list, got {kind.__name__}"
        )


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
    columns.add_url(key, _render(url, templates, f"key {key!r}"), offset, length)


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
        count *= _length(values)
    if produced + count > MAX_GEN_KEYS:
        raise RefsError(f"{where}: generates more than {MAX_GEN_KEYS} keys")
    if count == 0:  # an empty dimension: the others, however long, give nothing
        return produced
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


def _length(values: range | list[int]) -> int:
    """How many values, also for a range too long for ``len``."""
    if isinstance(values, list):
        return len(values)
    return max(0, -((values.start - values.stop) // values.step))


def _render_int(templates: Templates, source: str, variables: dict, what: str) -> int:
    text = templates.render(source, variables, what=what).strip()
    if not text.isascii() or not text.isdecimal():
        raise RefsError(f"{what}: renders {text[:40]!r}, not a non-negative integer")
    if len(text) > len(str(MAX_INT)):
        raise RefsError(f"{what}: renders {text[:40]!r}, which exceeds 2**63 - 1")
    return int(text)
