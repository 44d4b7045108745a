"""Measuring variable-length string arrays: the longest value of each, from every chunk
(``--decode-strings fixed``, :mod:`refmount.decode.strings`).

A walk of the set's directories like ``refmount check --decode``'s (arrays' own
directories are walked only for the chunks of string arrays), each chunk fetched
through ``fetch`` (the block cache) and its values read by ``longest`` (a worker
process's ``measure-strings`` job, :meth:`refmount.decode.reads.DecodedReads.longest`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from refmount.decode.codecs import Buffer, CodecError, DecodeError
from refmount.decode.strings import MAX_VLEN_CHUNK, StringMeasure, string_measure, vlen_codecs
from refmount.decode.v3.tree import V3AsV2
from refmount.errors import FetchError
from refmount.refs.model import Ref, RefSet

log = logging.getLogger(__name__)

Fetch = Callable[[str, Ref, int], Awaitable[bytes | memoryview]]
#: The longest value of one raw chunk (:class:`DecodeError` if it is malformed).
Longest = Callable[[StringMeasure, Buffer], Awaitable[int]]


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


async def _children(raw: RefSet, path: str) -> list[tuple[str, int | None]]:
    found, after = [], -1
    while True:
        await raw.ensure(path, after)
        batch = [(child.name, child.file_id, child.cursor) for child in raw.children(path, after)]
        if not batch:
            return found
        found.extend((name, file_id) for name, file_id, _ in batch)
        after = batch[-1][2]


async def _zarray(raw: RefSet, path: str) -> dict | None:
    key = _join(path, ".zarray")
    await raw.ensure(key)
    file_id = raw.file_id(key)
    if file_id is None:
        return None
    data = raw.ref(file_id).data
    try:
        meta = json.loads(data) if data is not None else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}
    return meta if isinstance(meta, dict) else {}


async def _longest(raw: RefSet, path: str, meta: dict, fetch: Fetch, longest_of: Longest) -> int:
    """The longest value of the string array at ``path`` (bytes)."""
    measure: StringMeasure = string_measure(meta)
    separator = meta.get("dimension_separator", ".")
    longest, pending = 0, [path]
    while pending:
        directory = pending.pop()
        for name, file_id in await _children(raw, directory):
            if file_id is None:
                if separator == "/":
                    pending.append(_join(directory, name))
                continue
            if name.startswith("."):
                continue  # .zarray, .zattrs
            ref = await raw.file_ref(file_id)
            data = await fetch(path, ref, MAX_VLEN_CHUNK)
            longest = max(longest, await longest_of(measure, data))
    return longest


async def measure_widths(raw: RefSet, fetch: Fetch, longest: Longest) -> dict[str, int | str]:
    """Each variable-length string array's path: its longest value (at least 1), or why
    it could not be measured."""
    widths: dict[str, int | str] = {}
    pending = [""]
    while pending:
        path = pending.pop()
        if isinstance(raw, V3AsV2) and raw.refused(path):
            continue
        meta = await _zarray(raw, path)
        if meta is not None:
            if vlen_codecs(meta) is not None:
                try:
                    widths[path] = max(1, await _longest(raw, path, meta, fetch, longest))
                except (DecodeError, CodecError, FetchError) as exc:
                    widths[path] = str(exc)
                    log.warning("string array %r cannot be measured: %s", path or "/", exc)
            continue
        pending.extend(
            _join(path, name) for name, file_id in await _children(raw, path) if file_id is None
        )
    return widths
