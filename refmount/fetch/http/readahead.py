"""OpenSSL's read-ahead on refmount's TLS connections, which Python's ``ssl`` does not expose.

Without it OpenSSL reads every TLS record with two ``read()`` calls, its 5-byte header
and then its body: a 256 KiB chunk is 32 system calls, and over https the daemon made
140,000 ``read()`` calls a GB against 12,000 over http (``bench/README.md``).  With
read-ahead OpenSSL reads what its buffer holds in one call, and the next record's header
comes with the body before it.

Read-ahead hides bytes from the socket: what OpenSSL has read but not yet decrypted is
no longer in the kernel's buffer, where the connection's ``quiet`` check looks for bytes
a server sent that nobody asked for.  :func:`has_pending` (``SSL_has_pending``) tells
about them, and a connection with read-ahead is pooled only when it says none.

The ``SSL`` and ``SSL_CTX`` pointers are read from CPython's ``_ssl`` objects (each the
first field after the object's head and, for a connection, its socket), through the very
libssl ``_ssl`` is linked with.  No word is read unless the interpreter is one whose
layout of those objects was checked (:data:`CHECKED_VERSIONS`, with the GIL) and the
objects are exactly ``_ssl``'s types, large enough to hold the field; the pointers are
then checked before anything is set: the context's options as OpenSSL reports them must
be the ``SSLContext``'s, and the connection's context must be that one.  Where anything
differs read-ahead stays off and the connection works as without it.  A
:class:`ReadAhead` holds the ``_ssl`` connection object, so that its ``SSL`` lives as
long as the pointer is used, and forgets the pointer when its connection closes.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import ssl
import sys
import sysconfig

log = logging.getLogger(__name__)

#: ``SSL_ctrl`` commands (OpenSSL's ``ssl.h``).
_SET_READ_AHEAD = 41
_GET_READ_AHEAD = 40
#: Where CPython keeps the pointers: after ``PyObject_HEAD`` (``SSL_CTX *ctx``), and after
#: that and the weak reference to the socket (``SSL *ssl``).  The head's size is the
#: running interpreter's (``object``'s own size: larger in a free-threaded build).
_HEAD = object.__basicsize__
_CTX_AT = _HEAD
_SSL_AT = _HEAD + ctypes.sizeof(ctypes.c_void_p)
_WORD = ctypes.sizeof(ctypes.c_void_p)
#: The CPython versions whose ``PySSLContext`` (``ctx`` first) and ``PySSLSocket``
#: (``Socket``, then ``ssl``) were read in ``Modules/_ssl.c`` for this layout.
CHECKED_VERSIONS = frozenset({(3, 11), (3, 12), (3, 13), (3, 14)})


def _layout_checked() -> bool:
    """Whether this interpreter is one whose ``_ssl`` layout was read (a CPython of
    :data:`CHECKED_VERSIONS` with the GIL: a free-threaded build's objects differ)."""
    if sys.implementation.name != "cpython" or sys.version_info[:2] not in CHECKED_VERSIONS:
        return False
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return False
    native = ssl._ssl  # type: ignore[attr-defined]
    return (
        native._SSLContext.__basicsize__ >= _CTX_AT + _WORD
        and native._SSLSocket.__basicsize__ >= _SSL_AT + _WORD
    )


@functools.cache
def _libssl() -> ctypes.CDLL | None:
    if not _layout_checked():
        log.info("OpenSSL's read-ahead is not used: CPython %s's _ssl layout is not checked",
                 sys.version.split()[0])  # fmt: skip
        return None
    try:
        lib = ctypes.CDLL(ssl._ssl.__file__)  # type: ignore[attr-defined]
        lib.SSL_CTX_get_options.argtypes = [ctypes.c_void_p]
        lib.SSL_CTX_get_options.restype = ctypes.c_uint64
        lib.SSL_get_SSL_CTX.argtypes = [ctypes.c_void_p]
        lib.SSL_get_SSL_CTX.restype = ctypes.c_void_p
        lib.SSL_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
        lib.SSL_ctrl.restype = ctypes.c_long
        lib.SSL_has_pending.argtypes = [ctypes.c_void_p]
        lib.SSL_has_pending.restype = ctypes.c_int
    except (OSError, AttributeError) as exc:
        log.info("OpenSSL's read-ahead is not used: %s", exc)
        return None
    return lib


class ReadAhead:
    """Read-ahead turned on for one connection: its ``SSL`` pointer, valid while the
    connection's ``_ssl`` object (held here) lives, until :meth:`release`."""

    def __init__(self, lib: ctypes.CDLL, sslobj: object, pointer: int) -> None:
        self._lib = lib
        self._sslobj: object | None = sslobj  # keeps the SSL the pointer names alive
        self._pointer: int | None = pointer

    def has_pending(self) -> bool:
        """Whether OpenSSL holds bytes of the connection not yet read by the caller,
        decrypted or not (``SSL_has_pending``); False once released."""
        if self._pointer is None:
            return False
        return bool(self._lib.SSL_has_pending(self._pointer))

    def release(self) -> None:
        """Forget the pointer and let the ``_ssl`` object go (the connection closes)."""
        self._pointer = self._sslobj = None


def enable(tls: ssl.SSLSocket) -> ReadAhead | None:
    """Turn read-ahead on for ``tls``; its :class:`ReadAhead`, or None when it could not
    be (then read-ahead is off)."""
    lib = _libssl()
    sslobj = getattr(tls, "_sslobj", None)
    context = tls.context
    native = ssl._ssl  # type: ignore[attr-defined]
    if lib is None or type(sslobj) is not native._SSLSocket:
        return None
    if type(context) is not ssl.SSLContext:  # exactly: a subclass may add fields first
        return None
    ctx = ctypes.c_void_p.from_address(id(context) + _CTX_AT).value
    if not ctx or lib.SSL_CTX_get_options(ctx) != int(context.options):
        return None
    pointer = ctypes.c_void_p.from_address(id(sslobj) + _SSL_AT).value
    if not pointer or lib.SSL_get_SSL_CTX(pointer) != ctx:
        return None
    lib.SSL_ctrl(pointer, _SET_READ_AHEAD, 1, None)
    if lib.SSL_ctrl(pointer, _GET_READ_AHEAD, 0, None) != 1:
        return None
    return ReadAhead(lib, sslobj, pointer)
