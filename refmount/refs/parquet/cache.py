"""Keeping and loading Parquet records: an LRU bounded by cost, and single-flight loads
in worker threads.

A load runs in one of a few daemon worker threads, never on the serving (trio) thread.
It belongs to its key, not to the task that started it: every task that needs the key
while it runs waits for the same outcome (one read and one decode however many wait),
each under its own deadline.  A worker stalled on a store keeps its key's flight open, so
later waiters join it instead of starting more workers, and the pool stays small; the
daemon threads never hold up the process's exit.
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import trio

from refmount.errors import FetchError

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class CostLRU(Generic[K, V]):
    """Values kept by recency of use, their total ``cost`` at most ``capacity``; a value
    costing more than the whole capacity is not kept.  Used from one thread."""

    def __init__(self, capacity: int, cost: Callable[[V], int]) -> None:
        self.capacity = capacity
        self.bytes = 0
        self._cost = cost
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= self._cost(old)
        cost = self._cost(value)
        if cost > self.capacity:
            return
        while self._items and self.bytes + cost > self.capacity:
            _, evicted = self._items.popitem(last=False)
            self.bytes -= self._cost(evicted)
        self._items[key] = value
        self.bytes += cost

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0


@dataclass
class _Flight:
    """One load in progress, shared by every task that waits for its key."""

    done: trio.Event = field(default_factory=trio.Event)
    result: Any = None
    error: BaseException | None = None


class SingleFlight(Generic[K]):
    """Runs ``work`` for a key in a worker thread, once for all concurrent waiters."""

    def __init__(self, workers: int) -> None:
        self._workers = workers
        self._started = 0
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._flights: dict[K, _Flight] = {}
        self._lock = threading.Lock()

    async def run(
        self,
        key: K,
        work: Callable[[], V],
        *,
        timeout: float,
        what: str,
        keep: Callable[[V], None] | None = None,
    ) -> V:
        """``work()``'s result (``keep``-ed once, on the serving thread, when it comes),
        or its exception; FetchError naming ``what`` when not done within ``timeout``."""
        flight = self._flights.get(key)
        if flight is None:
            flight = self._flights[key] = _Flight()
            self._submit(key, flight, work, keep, trio.lowlevel.current_trio_token())
        with trio.move_on_after(timeout):
            await flight.done.wait()
        if not flight.done.is_set():
            raise FetchError(f"{what}: not loaded within {timeout:g} s")
        if flight.error is not None:
            raise flight.error
        return flight.result  # type: ignore[no-any-return]

    def _submit(
        self,
        key: K,
        flight: _Flight,
        work: Callable[[], V],
        keep: Callable[[V], None] | None,
        token: trio.lowlevel.TrioToken,
    ) -> None:
        def finish() -> None:  # on the serving thread
            self._flights.pop(key, None)
            if flight.error is None and keep is not None:
                keep(flight.result)
            flight.done.set()

        def job() -> None:  # in a worker
            try:
                flight.result = work()
            except BaseException as exc:  # handed to the waiters, raised there
                flight.error = exc
            try:
                token.run_sync_soon(finish)
            except trio.RunFinishedError:
                self._flights.pop(key, None)

        self._jobs.put(job)
        with self._lock:
            if self._started < self._workers:
                self._started += 1
                threading.Thread(target=self._serve, name="refmount-records", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._jobs.get()()
