"""Block cache with read-ahead (placeholder: passes reads straight to the fetcher)."""

from __future__ import annotations

from collections.abc import Callable

import trio

from refmount.fetch import Fetcher


class BlockCache:
    def __init__(
        self,
        fetcher: Fetcher,
        *,
        budget: int = 512 << 20,
        extent: Callable[[str], int | None] = lambda url: None,
    ) -> None:
        self.fetcher = fetcher
        self.budget = budget
        self.extent = extent

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def read(self, url: str, start: int, end: int) -> bytes:
        return await self.fetcher.fetch(url, start, end)

    def stats(self) -> dict[str, int]:
        return {}
