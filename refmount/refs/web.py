"""A JSON reference set over ``http://`` or ``https://``, read through refmount's own
fetcher: the reference set behind a login (NASA Earthdata's combined references) is read
with the same ``.netrc`` credentials, cookie jar and redirect rules as its chunks
(:mod:`refmount.fetch.logins`, :mod:`refmount.fetch.redirects`), and the session its
reading opens serves the chunks' reads after it.

The loader (:mod:`refmount.refs.source`) asks an fsspec filesystem for ``info`` and a
file to read; :class:`WebRefsFileSystem` answers both through a :class:`Fetcher` made
for each call in a trio run of its own (the loader runs in a thread of its own, before
or beside the daemon's loop), the ``--refs-options`` keyed to the reference set's host.
"""

from __future__ import annotations

import base64
import errno
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

import trio
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from refmount.errors import FetchError
from refmount.fetch.fetcher import Fetcher, FetchPolicy, scope_of
from refmount.fetch.logins import for_process

T = TypeVar("T")
#: Bytes asked at a time while a reference set is read.
BLOCK = 8 << 20


class WebRefsFileSystem(AbstractFileSystem):
    """``info`` and ranged reads of ``http(s)://`` files through refmount's fetcher."""

    protocol = ("http", "https")
    cachable = False

    def __init__(self, url: str, options: Mapping[str, Any], timeout: float = 30.0) -> None:
        super().__init__()
        self._url, self._plain = url, url
        options = dict(options)
        parts = urlsplit(url)
        if parts.username is not None:
            # The user's own URL, given with a login: sent as Basic credentials to that
            # host (as fsspec's HTTP filesystem did), never as part of the URL.
            login = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            basic = "Basic " + base64.b64encode(login.encode()).decode("ascii")
            options["headers"] = {"Authorization": basic, **options.get("headers", {})}
            self._plain = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        self._options = {scope_of(self._plain): options} if options else {}
        self._timeout = timeout
        self._sizes: dict[str, int] = {}

    def _where(self, path: str) -> str:
        return self._plain if path == self._url else path

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return path  # a URL stays whole

    def _run(self, work: Callable[[Fetcher], Awaitable[T]]) -> T:
        async def run() -> T:
            fetcher = Fetcher(
                remote_options=self._options,
                policy=FetchPolicy(self._timeout),
                logins=for_process().beside(),  # the mount's jar; a lock of this run's
            )
            try:
                return await work(fetcher)
            finally:
                fetcher.close()

        try:
            return trio.run(run)
        except FetchError as exc:
            if "HTTP 404" in str(exc):  # the loader says "no such file"
                raise FileNotFoundError(errno.ENOENT, str(exc)) from None
            raise OSError(exc.errno, str(exc)) from None

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        where = self._where(path)
        size = self._sizes[path] = self._run(lambda fetcher: fetcher.size(where))
        return {"name": path, "size": size, "type": "file"}

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, **kwargs: Any) -> Any:
        size = kwargs.get("size") or self._sizes.get(path)
        return _WebFile(self, path, mode, block_size=BLOCK, size=size)

    def fetch_range(self, path: str, start: int, end: int) -> bytes:
        where = self._where(path)
        return self._run(lambda fetcher: fetcher.fetch(where, start, end, allow_short=True))


class _WebFile(AbstractBufferedFile):
    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.fs.fetch_range(self.path, start, end)
