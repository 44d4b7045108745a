"""The one asyncio event loop icechunk's asynchronous calls run on.

icechunk's store methods need a *running* asyncio loop when they are called; the daemon
serves FUSE under trio, where there is none.  So a repository set owns one loop in a
thread of its own, started when the set opens and stopped when it closes, and callers in
worker threads hand it coroutines and wait for them with a deadline.  The trio thread
never waits on it directly (it goes through ``trio.to_thread``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from refmount.errors import FetchError

T = TypeVar("T")


class LoopThread:
    """An asyncio loop running in a daemon thread until :meth:`close`."""

    def __init__(self, name: str = "refmount-icechunk") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()
        self._loop.close()

    def run(self, make: Callable[[], Awaitable[T]], timeout: float, what: str) -> T:
        """``await make()`` on the loop, from another thread; FetchError (EIO) naming
        ``what`` when it takes longer than ``timeout`` seconds (it is then cancelled)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("LoopThread.run called from its own loop")

        async def call() -> T:
            return await make()

        future = asyncio.run_coroutine_threadsafe(call(), self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise FetchError(f"{what}: no answer within {timeout:g} s (--timeout)") from None

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
