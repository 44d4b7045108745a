"""Background work owned by a nursery it is given: the block cache's fetches, the netCDF
view's read-ahead.  Such a part is given its nursery (:meth:`Owned.start`) or keeps one
for as long as :meth:`Owned.run` runs (the daemon's life); cancelling it stops every task
the part started.  A part without one (tests, tools) does its work in its readers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio


class Owned:
    """A part whose background tasks run in ``self._nursery``, when it has one."""

    _nursery: trio.Nursery | None = None

    def start(self, nursery: trio.Nursery) -> None:
        """Run the tasks in ``nursery`` from now on; cancelling it stops all of them."""
        if self._nursery is not None:
            raise RuntimeError(f"{type(self).__name__} already has a nursery")
        self._nursery = nursery

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open a nursery for the tasks and keep it until cancelled."""
        async with trio.open_nursery() as nursery:
            self.start(nursery)
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:
                self._nursery = None
                self._stopped()

    def spawn(self, task: Callable[..., Awaitable[None]], *args: object) -> bool:
        """Run ``task(*args)`` in the nursery, if there is one (False if not): work of a
        layer above (the decoded view's shard read-ahead), which catches its own failures."""
        if self._nursery is None:
            return False
        self._nursery.start_soon(task, *args)
        return True

    def _stopped(self) -> None:
        """What to let go of once the nursery has ended (nothing, unless overridden)."""
