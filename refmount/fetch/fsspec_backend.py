"""Byte ranges through an fsspec filesystem: the path for every protocol no other
backend takes.

fsspec's asynchronous filesystems (HTTP, S3, GCS ...) run on fsspec's own asyncio loop
thread.  A request is submitted to that loop and its completion is handed back to trio
through the trio token, so no thread is spent per request and a trio cancel scope (the
fetcher's deadline) cancels the asyncio task.  Synchronous filesystems run in trio's
worker threads.

HTTP and S3 ranges are read by :mod:`refmount.fetch.bounded`, which holds no more of a
body than was asked.  Other filesystems are read through fsspec's ``cat_file``: their
libraries return whole bodies, so there the bound on memory is only the library's (most
ask the store for the exact range; a store that ignores it costs what it sends).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import fsspec
import fsspec.asyn
import trio

from refmount.errors import FetchError
from refmount.fetch import bounded
from refmount.fetch.backend import Version, sized, version_of
from refmount.redaction import redact_url
from refmount.refs.model import Checksum


class FsspecBackend:
    """One scope's fsspec filesystem, made once, in a worker thread: the imports behind
    it must not stall the requests the serving loop answers meanwhile."""

    def __init__(self, protocol: str, options: Mapping[str, Any]) -> None:
        self.protocol = protocol
        self.options = dict(options)
        self._fs: Any = None
        self._making: trio.Event | None = None

    async def read(self, url: str, start: int, end: int, checksum: Checksum | None = None) -> bytes:
        fs = await self._filesystem()
        if _is_http(fs):
            return await on_fsspec_loop(bounded.http_range(fs, url, start, end, checksum))
        path = fs._strip_protocol(url)
        if _is_s3(fs):
            return await on_fsspec_loop(bounded.s3_range(fs, path, start, end, checksum))
        if checksum is not None:
            # No way to ask these libraries for one version, nor to see which one answered.
            raise FetchError(
                f"{redact_url(url)}: a reference with a checksum, over {self.protocol}, "
                "which cannot tell the version it reads"
            )
        if fs.async_impl:
            return await on_fsspec_loop(fs._cat_file(path, start=start, end=end))
        return await trio.to_thread.run_sync(fs.cat_file, path, start, end, abandon_on_cancel=True)

    async def size(self, url: str) -> int:
        fs = await self._filesystem()
        if _is_http(fs):
            return await on_fsspec_loop(bounded.http_size(fs, url))
        path = fs._strip_protocol(url)
        if fs.async_impl:
            info = await on_fsspec_loop(fs._info(path))
        else:
            info = await trio.to_thread.run_sync(fs.info, path, abandon_on_cancel=True)
        if info.get("type") == "directory":
            raise FetchError(f"{path} is a directory, not a file")
        size = info.get("size")
        if not isinstance(size, int):
            raise FetchError(f"the store gives no size for {path}")
        return size

    async def version(self, url: str) -> Version:
        fs = await self._filesystem()
        path = url if _is_http(fs) else fs._strip_protocol(url)
        if fs.async_impl:
            info = await on_fsspec_loop(fs._info(path))
        else:
            info = await trio.to_thread.run_sync(fs.info, path, abandon_on_cancel=True)
        return Version(
            version_of_info(info),
            sized(info.get("size")),
            _first(info, *_ETAG_KEYS),
            _first(info, *_MODIFIED_KEYS),
        )

    async def prepare(self) -> None:
        fs = await self._filesystem()
        if fs.async_impl and hasattr(fs, "set_session"):
            await on_fsspec_loop(fs.set_session())

    def close(self) -> None:
        pass

    async def _filesystem(self) -> Any:
        while self._fs is None:
            if self._making is not None:
                await self._making.wait()
                continue
            self._making = trio.Event()
            try:
                # Abandoned on cancel: a constructor that connects (ftp, sftp) to a host
                # that does not answer must not hold the read past its deadline.
                self._fs = await trio.to_thread.run_sync(self._make, abandon_on_cancel=True)
            finally:
                self._making.set()
                self._making = None
        return self._fs

    def _make(self) -> Any:
        """The filesystem; any failure (an unknown protocol, options it cannot take, a
        protocol such as ``reference`` or ``tar`` that cannot be made from options
        alone) is a :class:`FetchError` for the read that needed it."""
        try:
            return fsspec.filesystem(self.protocol, **self.options)
        except Exception as exc:
            raise FetchError(
                f"no filesystem for protocol {self.protocol!r}: {type(exc).__name__}: {exc}"
            ) from exc


def version_of_info(info: Mapping[str, Any]) -> str | None:
    """The validator in an fsspec ``info`` dict, whose keys differ by filesystem (HTTP
    headers, S3's, GCS's)."""

    return version_of(
        etag=_first(info, *_ETAG_KEYS),
        generation=_first(info, "generation", "VersionId", "version_id"),
        size=info.get("size"),
        modified=_first(info, *_MODIFIED_KEYS),
    )


_ETAG_KEYS = ("ETag", "etag", "e_tag")
_MODIFIED_KEYS = ("Last-Modified", "LastModified", "last_modified", "updated", "mtime")


def _first(info: Mapping[str, Any], *names: str) -> Any:
    """The first of these keys ``info`` has a value for."""
    return next((info[n] for n in names if info.get(n) not in (None, "")), None)


def _is_http(fs: Any) -> bool:
    """fsspec's HTTPFileSystem or a subclass (without importing aiohttp to ask)."""
    return any(
        cls.__name__ == "HTTPFileSystem" and cls.__module__ == "fsspec.implementations.http"
        for cls in type(fs).__mro__
    )


def _is_s3(fs: Any) -> bool:
    return fs.async_impl and callable(getattr(fs, "_call_s3", None))


#: Told, when set, the ``perf_counter_ns`` at which each fetch completed on the asyncio
#: loop, once its trio task runs again (:mod:`refmount.request_timing`).
bridge_observer: Callable[[int], None] | None = None


async def on_fsspec_loop(coro: Any) -> Any:
    """Await a coroutine on fsspec's asyncio loop; cancelling this cancels it there."""
    future = asyncio.run_coroutine_threadsafe(coro, fsspec.asyn.get_loop())
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    completed_ns = 0

    def wake(_: object) -> None:
        nonlocal completed_ns
        completed_ns = time.perf_counter_ns()
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    future.add_done_callback(wake)
    try:
        await done.wait()
    except BaseException:
        future.cancel()
        raise
    if bridge_observer is not None:
        bridge_observer(completed_ns)
    return future.result()
