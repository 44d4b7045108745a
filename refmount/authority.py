"""Where a remote URL goes, read by one parse: which options it gets (its *scope*) and
where its request is sent both come from :func:`place_of`.

A URL's authority (the text between ``://`` and the path) can be read differently by
different parsers: ``http://a?@b/x`` is host ``a`` to Python's ``urlsplit`` and to
WHATWG parsers, but a string split at the first ``/`` and the last ``@`` reads ``b``;
``http://a\\@b/`` is ``a`` to a browser (``\\`` is ``/``) and ``b`` to others;
``http://b@a/`` sends to ``a`` what a reader of the text may take for ``b``;
percent-encoded or non-ASCII host characters decode to names that other layers spell
otherwise.  Reference sets and Icechunk manifests are untrusted input, so a remote URL
whose authority holds any of these is refused (:func:`authority_problem`) rather than
guessed at: when a reference set loads (naming the key), when a virtual chunk is read,
and when a redirect names one.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple
from urllib.parse import urlsplit

import fsspec.core

from refmount.protocols import LOCAL_PROTOCOLS

#: URLs whose place is remembered: a read asks for it several times.
MEMO = 4096
DEFAULT_PORTS = {"http": 80, "https": 443}
WEB_PROTOCOLS = frozenset(DEFAULT_PORTS)
#: Azure's ``abfs://container@account.dfs.core.windows.net/path`` names a container
#: before an ``@``: the one remote form where ``@`` in the authority is not user
#: information.
_CONTAINER_AT_ACCOUNT = frozenset({"az", "abfs", "abfss"})
#: What an authority may hold: a name (letters, digits, ``.-_~``), an IPv6 literal in
#: brackets, a port.
_AUTHORITY = re.compile(r"[A-Za-z0-9._~-]*(?:\[[0-9A-Fa-f:.]+\])?(?::[0-9]*)?")
#: A login (``user:password``) as RFC 3986 allows it, percent-encoding included.
_LOGIN = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:%-]*")


class Place(NamedTuple):
    """Where a URL's requests go: its protocol, its host (lower-cased; the bucket or
    container for object stores) and, for ``http``/``https``, its port (explicit even
    where the URL leaves it to the scheme)."""

    protocol: str
    host: str
    port: int | None

    @property
    def scope(self) -> str:
        """``protocol://host[:port]``, the port shown only where it is not the scheme's:
        the key options and request limits are kept under."""
        if self.port is None or self.port == DEFAULT_PORTS.get(self.protocol):
            return f"{self.protocol}://{self.host}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.protocol}://{host}:{self.port}"


def authority_of(url: str) -> tuple[str, str]:
    """``(protocol, authority)``: the text between ``://`` and the first ``/``."""
    protocol, _, rest = url.partition("://")
    return protocol.lower(), rest.partition("/")[0]


@functools.lru_cache(maxsize=MEMO)
def authority_problem(url: str, *, userinfo: bool = False) -> str | None:
    """Why the authority of remote ``url`` could be read as another host by another
    parser; None when it cannot (local paths and URLs without ``://`` have none).  Each
    part of a chained URL (``zip://a::https://h/x``) is looked at.

    ``userinfo``: a login before the host (one ``@``, nothing else odd) is allowed, for
    URLs of the user's own making (a relative target of a REFS URL that holds one); a
    URL written in a reference set or a manifest, or a redirect's, may hold none."""
    if "::" in url:
        found = (authority_problem(part, userinfo=userinfo) for part in url.split("::"))
        return next((problem for problem in found if problem is not None), None)
    if "://" not in url:
        return None
    protocol, authority = authority_of(url)
    if protocol in LOCAL_PROTOCOLS:
        return None
    if protocol in _CONTAINER_AT_ACCOUNT and authority.count("@") == 1:
        authority = authority.replace("@", ".", 1)
    elif userinfo and authority.count("@") == 1:
        login, _, authority = authority.partition("@")
        if _LOGIN.fullmatch(login) is None:
            return "has a login before its host that parsers read differently"
    for mark, what in (
        ("@", "user information ('@')"),
        ("\\", "a backslash"),
        ("?", "a '?' before the path"),
        ("#", "a '#' before the path"),
        ("%", "a percent-encoded character"),
    ):
        if mark in authority:
            return f"has {what} in its host part, which parsers read as different hosts"
    if not authority.isascii() or _AUTHORITY.fullmatch(authority) is None:
        return "has characters in its host part that parsers read as different hosts"
    if protocol in WEB_PROTOCOLS:
        host = authority.rpartition(":")[0] if authority.count(":") == 1 else authority
        if not host.strip("[]"):
            return "has no host"
        if host.endswith("."):
            return "has a host ending in '.', which parsers read as different hosts"
        if ":" in authority and not authority.endswith("]"):
            port = authority.rpartition(":")[2]
            if not port.isdigit() or not 0 < int(port) < 65536:
                return "has a port that is not a number from 1 to 65535"
    return None


@functools.lru_cache(maxsize=MEMO)
def place_of(url: str) -> Place:
    """Where ``url`` goes.  ``http``/``https`` by :func:`urllib.parse.urlsplit`, as
    refmount's HTTP client connects (host lower-cased, port explicit); other remote
    protocols by the authority as written, lower-cased (the bucket or container); a
    local path is ``file://``.  ValueError for a URL whose authority
    :func:`authority_problem` refuses (a login before the host allowed): such a URL has
    no one place."""
    problem = authority_problem(url, userinfo=True)
    if problem is not None:
        raise ValueError(f"the URL {problem}")
    protocol, rest = fsspec.core.split_protocol(url)
    protocol = (protocol or "file").lower()
    if protocol in LOCAL_PROTOCOLS:
        return Place("file", "", None)
    if protocol in WEB_PROTOCOLS:
        parts = urlsplit(url)
        return Place(
            protocol, (parts.hostname or "").lower(), parts.port or DEFAULT_PORTS[protocol]
        )
    return Place(protocol, rest.partition("/")[0].lower(), None)
