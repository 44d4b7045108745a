"""Parsing a large JSON reference set in two processes at once.

The big mapping (the whole object of a version 0 set, ``refs`` of a version 1 set) is cut
at a comma near its middle that looks like one between two of its entries: the first
part, closed with ``}``, is parsed here while a forked child parses the second, opened
with ``{``, and turns it into :class:`~refmount.refs.rows.Rows`.  The input is untrusted
and the guess may be wrong (the comma may sit inside a string or a nested value), but
nothing is assumed: when both parts parse as non-empty objects, the JSON grammar makes
the whole an object whose entries are the first part's followed by the second's (joining
two valid member lists with a comma gives a valid member list, and JSON parses one way
only).  Duplicate keys keep their meaning (the later entry wins) because the second
part's rows follow the first's.  Anything else (a part that does not parse, a top level
this module does not follow, too small an input, a single CPU) returns ``None``, and the
caller parses the whole document in one go, for its exact result or error.

The top level of a version 1 set is followed member by member with the ``json`` module's
own scanner, so its other members parse exactly as ``json.loads`` would parse them.  The
child runs only the ``json`` module and plain Python (no Arrow, no threads, no imports)
and leaves with ``os._exit``.  So it takes no lock that another thread of the parent could
have held at the fork (the daemon loads before it starts threads, but reading a refs file
over HTTP or S3 starts fsspec's loop thread, and trio keeps idle worker threads).
"""

from __future__ import annotations

import codecs
import contextlib
import gc
import json
import json.decoder
import os
import pickle
import re
import select
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from refmount.refs.rows import Rows, rows_of

#: Documents smaller than this are parsed in one go: a fork is not worth it.
MIN_BYTES = 8 << 20
#: How long the child may take past the parent's own part, as a multiple of the time
#: that part took (both parts are about the same size), and at least :data:`CHILD_GRACE`
#: seconds: a child that does not answer by then (stuck at a lock some thread of the
#: parent held at the fork, or starved) is killed, and the document parsed in one go.
CHILD_SLOWER = 10
CHILD_GRACE = 10.0
#: How much of a version 1 document is decoded to find its "refs" (the members before it
#: are expected to be small; if they are not, the document is parsed in one go).
HEAD_BYTES = 16 << 20

_DECODER = json.JSONDecoder()
_WHITESPACE = json.decoder.WHITESPACE.match
_SPACE = re.compile(rb"[ \t\n\r]*").match  # JSON's whitespace, in bytes
# A comma with a string, list or object ending before it and a string (a key) after it.
_CUT = re.compile(rb'[\]"}][ \t\n\r]*(,)[ \t\n\r]*"')
_FAILED = pickle.dumps((False, None))


@dataclass
class Parts:
    """A document parsed in parts: its top-level fields other than the big mapping (for
    version 0, none), and the big mapping's rows, in order."""

    fields: dict[str, Any]
    pieces: list[Rows]


def parse_in_parts(raw: bytes, meanwhile: Callable[[], object] = lambda: None) -> Parts | None:
    """The document in ``raw`` parsed in two processes, or ``None`` (see the module).
    ``meanwhile`` is called once this process has parsed its part, while the child is
    still at its own (with the same share, the child takes longer).

    The parts are cut from the bytes and each is decoded by ``json.loads`` as it decodes
    a whole document (UTF-8, lone surrogates allowed); a cut is at an ASCII comma, so never
    inside a character."""
    if len(raw) < MIN_BYTES or _cpus() < 2:
        return None
    try:
        if json.detect_encoding(raw) != "utf-8":  # also rules out a byte order mark
            return None
        start = _SPACE(raw).end()
        if raw[start : start + 1] != b"{":
            return None
        if raw.startswith(b'"version"', _SPACE(raw, start + 1).end()):
            return _version_1(raw, start, meanwhile)
        return _version_0(raw, start, meanwhile)
    except (ValueError, RecursionError, StopIteration):  # JSONDecodeError is a ValueError
        return None
    except OSError:  # no pipe or no fork: one process will do
        return None


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


def _version_0(raw: bytes, start: int, meanwhile: Callable[[], object]) -> Parts | None:
    """The whole object is the mapping; a ``"version"`` in it must be ``null``."""
    split = _split_object(raw, start, meanwhile, skip_version=True)
    if split is None or _SPACE(raw, split.end).end() != len(raw):
        return None
    if split.version is not None:  # a version 1 set (or a bad one): parsed in one go
        return None
    return Parts({}, split.pieces)


def _version_1(raw: bytes, start: int, meanwhile: Callable[[], object]) -> Parts | None:
    """The top-level members, the first ``"refs"`` object split; ``None`` when ``refs``
    is not a large object or appears twice (the later one would replace it)."""
    base = 0  # where ``text`` starts in ``raw``: it is decoded a stretch at a time
    decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")
    text = decoder.decode(raw[:HEAD_BYTES], final=len(raw) <= HEAD_BYTES)
    fields: dict[str, Any] = {}
    pieces: list[Rows] | None = None
    at = _WHITESPACE(text, start + 1).end()  # only whitespace before start: chars = bytes
    while True:
        if not text.startswith('"', at):
            return None
        key, at = json.decoder.scanstring(text, at + 1, True)
        at = _WHITESPACE(text, at).end()
        if not text.startswith(":", at):
            return None
        at = _WHITESPACE(text, at + 1).end()
        if key == "refs":
            if pieces is not None or not text.startswith("{", at):
                return None
            at_bytes = base + len(text[:at].encode("utf-8", "surrogatepass"))
            split = _split_object(raw, at_bytes, meanwhile)
            if split is None:
                return None
            pieces, fields[key] = split.pieces, {}  # {} stands for the pieces
            base, at = split.end, 0
            text = raw[base:].decode("utf-8", "surrogatepass")
        else:
            fields[key], at = _DECODER.scan_once(text, at)
            if key == "version" and (type(fields[key]) is not int or fields[key] != 1):
                return None  # version 0 (or a bad one) after all
        at = _WHITESPACE(text, at).end()
        if text.startswith(",", at):
            at = _WHITESPACE(text, at + 1).end()
        elif text.startswith("}", at):
            break
        else:
            return None
    if pieces is None or _WHITESPACE(text, at + 1).end() != len(text):
        return None
    return Parts(fields, pieces)


@dataclass
class _Split:
    pieces: list[Rows]
    end: int  # just after the object's closing brace
    version: Any  # the object's last "version" value (None when absent)


def _split_object(
    raw: bytes, start: int, meanwhile: Callable[[], object], *, skip_version: bool = False
) -> _Split | None:
    """The object at ``raw[start]`` parsed in two parts, or ``None``."""
    if len(raw) - start < MIN_BYTES:
        return None
    found = _CUT.search(raw, (start + len(raw)) // 2)
    if found is None:
        return None
    cut = found.start(1)
    began = time.monotonic()
    with _Child(lambda: _parse_tail(raw, cut, skip_version)) as child:
        head = json.loads(b"".join((memoryview(raw)[start:cut], b"}")))
        if not isinstance(head, dict) or not head:
            return None
        version = head.get("version")
        head_rows = rows_of(head, skip_version=skip_version)
        del head
        meanwhile()
        took = time.monotonic() - began
        tail = child.result(time.monotonic() + max(CHILD_GRACE, CHILD_SLOWER * took))
    if tail is None:
        return None
    tail_rows, end, has_version, tail_version = tail
    return _Split([head_rows, tail_rows], end, tail_version if has_version else version)


def _parse_tail(raw: bytes, cut: int, skip_version: bool) -> tuple[Rows, int, bool, Any] | None:
    """In the child: the object from ``cut`` (the comma, read as ``{``) to its end."""
    data = b"".join((b"{", memoryview(raw)[cut + 1 :]))
    text = data.decode("utf-8", "surrogatepass")
    value, end = _DECODER.raw_decode(text)
    if not isinstance(value, dict) or not value:
        return None
    # where the object ends in ``raw``: data[i] is raw[cut + i]
    end = cut + len(data) - len(text[end:].encode("utf-8", "surrogatepass"))
    version = value.get("version")
    return rows_of(value, skip_version=skip_version), end, "version" in value, version


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cycle collector: a parse makes millions of lists and no reference
    cycle, and the collector's passes over them cost a third of the parse for nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Child:
    """``work()`` run in a forked child; :meth:`result` is what it returned (pickled
    through a pipe), or ``None`` when it failed or did not answer in time.  Leaving the
    ``with`` block ends the child if it is still running."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self._work = work
        self._pid = 0
        self._fd = -1

    def __enter__(self) -> _Child:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's code
            status = 1
            try:
                os.close(read_end)
                try:
                    payload = pickle.dumps((True, self._work()), protocol=5)
                except BaseException:
                    payload = _FAILED
                view = memoryview(payload)
                while view:
                    view = view[os.write(write_end, view) :]
                status = 0
            finally:
                os._exit(status)
        os.close(write_end)
        self._pid, self._fd = pid, read_end
        return self

    def result(self, deadline: float) -> Any:
        """What the child returned, waiting until ``deadline`` (``time.monotonic``)."""
        payload = self._read_until(deadline)
        if payload is None:
            return None  # the child is killed on leaving the ``with`` block
        self._reap()
        try:
            ok, value = pickle.loads(payload)
        except Exception:  # a child that died before writing it all
            return None
        return value if ok else None

    def _read_until(self, deadline: float) -> bytes | None:
        chunks: list[bytes] = []
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                return None
            chunk = os.read(self._fd, 1 << 22)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    def __exit__(self, *exc_info: object) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            self._reap()

    def _reap(self) -> None:
        if self._pid:
            os.waitpid(self._pid, 0)
            self._pid = 0
