"""The bytes between the daemon and a fetch worker, and failures that keep their meaning
across the process boundary.

A worker that has started says :data:`READY`.  A request is :data:`REQUEST` (magic, kind,
id, length) and a pickled tuple of that length: :data:`SCOPE` ``(protocol, options,
choice, deadline, threads)`` names the settings of a scope (its id is the scope's, sent
once per worker before the scope's first request; options may hold secrets, so they go
through the pipe only), :data:`READ` ``(scope, url, start, end, checksum)``,
:data:`SIZE` and :data:`VERSION` ``(scope, url)``, :data:`PREPARE` ``(scope,)``, and
:data:`CANCEL` (no body) asks the worker to give up request ``id``.

A reply is :data:`REPLY` (magic, status, id, length) and a body of that length: the bytes
read (:data:`DATA`), a size, :class:`~refmount.fetch.backend.Version` or None as JSON
(:data:`VALUE`, see :func:`encode_value`), an :func:`encoded <encode_error>` failure
(:data:`FAILED`), or nothing (:data:`CANCELLED`).  Every request but a scope or a cancel
gets exactly one reply, in the order the worker finishes them.  Requests are pickled:
the daemon is the worker's parent.  Replies are JSON and bytes, never pickles: a worker
reads what remote stores send, and whatever such bytes might do to it must not reach
the daemon as code.
"""

from __future__ import annotations

import datetime
import errno
import functools
import json
import pickle
import struct

from refmount.errors import FetchError
from refmount.fetch.backend import Version, WrongAnswer
from refmount.fetch.checksums import ChangedObject
from refmount.fetch.redirects import Redirected

READY = b"RMF1"
REQUEST = struct.Struct("<4sBQI")
REQUEST_MAGIC = b"RMQ1"
REPLY = struct.Struct("<4sBQQ")
REPLY_MAGIC = b"RMA1"

SCOPE, READ, SIZE, VERSION, PREPARE, CANCEL = range(6)
DATA, VALUE, FAILED, CANCELLED = range(4)

#: The largest request body, and reply body other than data (a value, a failure).
MAX_REQUEST = 1 << 20
MAX_VALUE = 1 << 16
#: The longest failure message sent.
MAX_MESSAGE = 4096


def request(kind: int, ident: int, body: object = None) -> bytes:
    """One request frame."""
    payload = b"" if body is None else pickle.dumps(body, protocol=pickle.HIGHEST_PROTOCOL)
    return REQUEST.pack(REQUEST_MAGIC, kind, ident, len(payload)) + payload


def reply_head(status: int, ident: int, length: int) -> bytes:
    return REPLY.pack(REPLY_MAGIC, status, ident, length)


class WorkerLost(Exception):
    """A request's worker died or broke the protocol before it answered: transient, so
    the fetcher's retry goes to a live worker."""


class RemoteFailure(Exception):
    """An exception raised in a worker that the fetcher has no class of its own for.  Its
    subclasses carry the original class's name (:func:`classify
    <refmount.fetch.fetcher.classify>` looks at it, e.g. for credentials) and its HTTP
    ``status``, so the fetcher decides the same as for the original."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@functools.lru_cache(maxsize=256)
def _failure_class(name: str) -> type[RemoteFailure]:
    return type(name, (RemoteFailure,), {"__module__": __name__})


def encode_error(exc: BaseException) -> bytes:
    """What a worker sends for a failed request."""
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    message = str(exc)[:MAX_MESSAGE]
    fields: tuple[object, ...]
    if isinstance(exc, Redirected):  # the daemon's fetcher follows it
        fields = ("redirected", exc.url, exc.status, exc.location)
    elif isinstance(exc, ChangedObject):
        fields = ("changed", message, exc.errno)
    elif isinstance(exc, FetchError):
        fields = ("fetch", message, exc.errno)
    elif isinstance(exc, WrongAnswer):
        fields = ("wrong", message)
    elif isinstance(exc, FileNotFoundError):
        fields = ("not-found", message)
    elif isinstance(exc, PermissionError):
        fields = ("permission", message)
    else:
        status = status if isinstance(status, int) and not isinstance(status, bool) else None
        fields = ("other", type(exc).__name__, message, status)
    return json.dumps(fields).encode()


def decode_error(body: bytes | bytearray) -> Exception:
    """The exception the daemon raises for a failure a worker sent."""
    try:
        kind, *fields = json.loads(body)
        return _rebuilt(kind, fields)
    except Exception as exc:
        return WorkerLost(f"a failure it could not say ({type(exc).__name__})")


def _rebuilt(kind: str, fields: list[object]) -> Exception:
    if kind in ("changed", "fetch"):
        message, err = fields
        made = (
            ChangedObject.__new__(ChangedObject)
            if kind == "changed"
            else FetchError.__new__(FetchError)
        )
        FetchError.__init__(made, message, err if isinstance(err, int) else errno.EIO)
        return made
    if kind == "redirected":
        url, status, location = fields
        return Redirected(str(url), int(status), None if location is None else str(location))  # type: ignore[call-overload]
    if kind == "wrong":
        return WrongAnswer(str(fields[0]))
    if kind == "not-found":
        return FileNotFoundError(str(fields[0]))
    if kind == "permission":
        return PermissionError(str(fields[0]))
    if kind != "other":
        raise ValueError(f"no failure kind {kind!r}")
    name, message, status = fields
    status = status if isinstance(status, int) and not isinstance(status, bool) else None
    return _failure_class(str(name))(str(message), status)


def encode_value(value: int | Version | None) -> bytes:
    """A size, a version (its modification time as ISO text when it is a datetime) or
    None, as JSON."""
    if not isinstance(value, Version):
        return json.dumps(value).encode()
    modified = value.modified
    if isinstance(modified, datetime.datetime):
        modified = {"iso": modified.isoformat()}
    return json.dumps({"version": [value.validator, value.size, value.etag, modified]}).encode()


def decode_value(body: bytes | bytearray) -> int | Version | None:
    """What :func:`encode_value` wrote; anything else is a broken worker."""
    try:
        value = json.loads(body)
    except ValueError:
        raise WorkerLost("a value that is not JSON") from None
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, dict) and list(value) == ["version"] and len(value["version"]) == 4:
        validator, size, etag, modified = value["version"]
        if isinstance(modified, dict):
            modified = datetime.datetime.fromisoformat(str(modified["iso"]))
        return Version(validator, size, etag, modified)
    raise WorkerLost(f"a value it cannot have sent: {str(value)[:80]}")
