"""Turning the URLs written in a reference set into full URLs the fetcher can use, and
the URL of a reference set into the URLs of the files beside it (what a URL shows of
itself, without secrets, is :mod:`refmount.redaction`'s)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import fsspec.core

from refmount import header_text
from refmount.authority import authority_problem
from refmount.errors import RefsError
from refmount.protocols import LOCAL_PROTOCOLS
from refmount.redaction import redact_url


@dataclass(frozen=True)
class UrlResolver:
    """Resolves target URLs against the reference set's location.

    * A URL with a protocol (``s3://b/k``, ``https://h/p``) is used as written.
    * Without one, ``remote_protocol`` is prefixed when given (fsspec's behaviour).
    * Otherwise the URL is a path relative to the reference set's own directory (an
      absolute path stays as is), like a relative link in a web page: a reference set
      and its data files can be moved together.

    A reference set read from a non-local location may not point at local files unless
    ``allow_local`` is set: a downloaded refs file must not read the machine's files.
    A URL holding a control character (a CR LF would end a request line) is refused,
    and so is a remote URL whose host parsers read differently (``http://a?@b/``, see
    :mod:`refmount.authority`).
    """

    refs_url: str
    remote_protocol: str | None = None
    allow_local: bool = False

    def __post_init__(self) -> None:
        protocol, path = fsspec.core.split_protocol(self.refs_url)
        object.__setattr__(self, "_refs_protocol", protocol or "file")
        if protocol in (None, *LOCAL_PROTOCOLS):
            base = posixpath.dirname(posixpath.abspath(path))
        else:
            # without the refs URL's query string: it was for that file (a signed URL)
            url = without_query(self.refs_url)
            base = url.rsplit("/", 1)[0] if "/" in path else url
        object.__setattr__(self, "_base", base)

    @property
    def refs_is_local(self) -> bool:
        return self._refs_protocol in LOCAL_PROTOCOLS

    def __call__(self, url: str) -> str:
        problem = header_text.url_problem(url)
        if problem is not None:
            raise RefsError(f"target URL {header_text.escaped(url, 80)!r} {problem}")
        protocol, path = fsspec.core.split_protocol(url)
        if protocol is None:
            if self.remote_protocol and self.remote_protocol not in LOCAL_PROTOCOLS:
                return _one_place(f"{self.remote_protocol}://{url}")
            if not self.refs_is_local and not url.startswith("/"):
                return self._join_remote(url)
            protocol, path = "file", posixpath.join(self._base, url)
        if protocol not in LOCAL_PROTOCOLS:
            return _one_place(url)
        if not (self.refs_is_local or self.allow_local):
            raise RefsError(
                f"target {url!r} is a local file, but the reference set is not local; "
                "pass --allow-local to permit this"
            )
        return posixpath.normpath(path)

    def _join_remote(self, relative: str) -> str:
        """``relative`` against the remote refs directory, with ``.`` and ``..`` resolved
        (object stores take ``a/./b`` literally); it cannot climb above the bucket/host."""
        protocol, _, rest = self._base.partition("://")
        root, _, directory = rest.partition("/")
        path = posixpath.normpath(posixpath.join("/" + directory, relative))
        return f"{protocol}://{root}{path}"


def _one_place(url: str) -> str:
    """``url``, unless its host could be read as another by another parser."""
    if (problem := authority_problem(url)) is not None:
        raise RefsError(f"target URL {redact_url(url)!r} {problem}: refused")
    return url


_WEB_PROTOCOLS = ("http://", "https://")


def without_query(path: str) -> str:
    """An HTTP(S) URL without its query string and fragment (a ``?`` in another store's
    path is part of the name)."""
    if path.startswith(_WEB_PROTOCOLS):
        return urlunsplit(urlsplit(path)._replace(query="", fragment=""))
    return path


def child_url(root: str, name: str) -> str:
    """``root/name``; for an HTTP(S) URL the query string stays at the end
    (``https://h/set?token=t`` gives ``https://h/set/.zmetadata?token=t``)."""
    if root.startswith(_WEB_PROTOCOLS):
        parts = urlsplit(root)
        return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{name}"))
    return f"{root.rstrip('/')}/{name}"
