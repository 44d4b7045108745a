"""Which virtual chunk URLs a mount may read.

A repository declares its virtual chunk containers (URL prefixes); icechunk refuses a
virtual reference outside all of them, so that a dataset cannot make its reader fetch
arbitrary URLs, and so does refmount.  Within them a reference set's rules apply: local
files only for a local repository or with ``--allow-local``, and ``--containers`` may
narrow the prefixes a mount reads further.

A virtual location may be relative, ``vcc://NAME/PATH``: as icechunk 2.3 does, it is the
URL prefix of the container named ``NAME`` followed by ``PATH``, and that URL is then
authorized like any other (a name no container has is an error, never a guess).
Prefixes are compared with a trailing ``/``, as icechunk adds one.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from urllib.parse import unquote

import fsspec.core

from refmount import header_text
from refmount.authority import authority_problem
from refmount.errors import FetchError
from refmount.protocols import LOCAL_PROTOCOLS
from refmount.redaction import redact_url

#: The scheme of a virtual location relative to a named container.
RELATIVE_SCHEME = "vcc://"


def _directory(prefix: str) -> str:
    return prefix if prefix.endswith("/") else f"{prefix}/"


class Containers:
    def __init__(
        self,
        declared: Iterable[str],
        *,
        names: Mapping[str, str] | None = None,
        narrowed: Iterable[str] | None = None,
        local_allowed: bool,
    ) -> None:
        self.declared = sorted(map(_directory, declared))
        self.names = {name: _directory(prefix) for name, prefix in (names or {}).items()}
        self.narrowed = sorted(narrowed) if narrowed is not None else None
        self.local_allowed = local_allowed

    def expand(self, url: str, key: str) -> str:
        """A ``vcc://NAME/PATH`` location as the URL it names; any other as it is."""
        if not url.startswith(RELATIVE_SCHEME):
            return url
        name, slash, path = url[len(RELATIVE_SCHEME) :].partition("/")
        prefix = self.names.get(name)
        if not slash or prefix is None:
            raise FetchError(
                f"{key}: virtual chunk at {redact_url(url)} names no virtual chunk container "
                "the repository declares: refused"
            )
        return prefix + path

    def target(self, url: str, key: str) -> str:
        """The URL (a plain path for a local file) the fetcher reads virtual chunk
        ``key`` from; FetchError (EIO) when the mount may not read ``url``.  A local
        path is normalised first: ``..`` cannot climb out of a container; a URL holding a
        control character (a CR LF would end a request line) is refused."""
        problem = header_text.url_problem(url)
        if problem is not None:
            shown = header_text.escaped(redact_url(url), 80)
            raise FetchError(f"{key}: virtual chunk URL {shown!r} {problem}: refused")
        url = self.expand(url, key)
        if (problem := authority_problem(url)) is not None:
            raise FetchError(f"{key}: virtual chunk URL {redact_url(url)!r} {problem}: refused")
        protocol, path = fsspec.core.split_protocol(url)
        local = protocol in LOCAL_PROTOCOLS
        if local:
            path = posixpath.normpath(unquote(path))
            url = f"file://{path}"
        if not any(url.startswith(prefix) for prefix in self.declared):
            raise FetchError(
                f"{key}: virtual chunk at {redact_url(url)} lies outside every virtual "
                "chunk container the repository declares: refused"
            )
        if self.narrowed is not None and not any(url.startswith(p) for p in self.narrowed):
            raise FetchError(f"{key}: virtual chunk at {redact_url(url)} is outside --containers")
        if local:
            if not self.local_allowed:
                raise FetchError(
                    f"{key}: virtual chunk at {url} is a local file, but the repository is "
                    "not local; pass --allow-local to permit this"
                )
            return path
        return url

    def allowed(self) -> list[str]:
        """The URL prefixes a mount may read virtual chunks under."""
        return self.narrowed if self.narrowed is not None else self.declared

    def protocols(self) -> set[str]:
        found = set()
        for prefix in self.allowed():
            protocol = fsspec.core.split_protocol(prefix)[0] or "file"
            found.add("file" if protocol in LOCAL_PROTOCOLS else protocol)
        return found
