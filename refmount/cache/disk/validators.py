"""Which version of each remote object is current: asked at most once per interval.

One HEAD (or stat) per object, not per chunk: every read of an object within the
interval uses the answer, and reads that arrive while it is being asked wait for that one
question.  A question that fails is not an answer: the object is *not* taken for gone or
changed (its entries stay on disk); reads just bypass the disk cache until a later
question succeeds, a few seconds on.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from refmount.errors import FetchError
from refmount.fetch import Version

log = logging.getLogger(__name__)

#: The validator of an object without one, when the user says such data never changes.
IMMUTABLE = "immutable"
RETRY_AFTER_FAILURE = 5.0  # seconds before a failed question is asked again
REMEMBERED = 100_000  # objects whose answers are kept (least recently asked go first)


NO_VERSION = Version(None, None)


@dataclass
class _Answer:
    version: Version
    asked: float
    failed: bool = False
    asking: trio.Event | None = None


class Validators:
    """The current version of each object, asked through ``check`` (the fetcher's
    :meth:`~refmount.fetch.Fetcher.version`)."""

    def __init__(
        self,
        check: Callable[[str], Awaitable[Version]],
        *,
        interval: float,
        immutable: bool,
        counters: dict[str, int],
    ) -> None:
        self.check = check
        self.interval = interval
        self.immutable = immutable
        self.counters = counters
        self._answers: OrderedDict[str, _Answer] = OrderedDict()

    async def current(self, url: str) -> Version:
        """The validator to key ``url``'s entries by now, and the object's size; a
        validator of None: do not use the disk for it (the store names no version and
        the data is not declared immutable, or the question failed)."""
        now = trio.current_time()
        answer = self._answers.get(url)
        if answer is not None:
            self._answers.move_to_end(url)
            if answer.asking is not None:
                await answer.asking.wait()
                return answer.version
            wait = RETRY_AFTER_FAILURE if answer.failed else self.interval
            if now - answer.asked < wait:
                return answer.version
        return await self._ask(url, now)

    async def _ask(self, url: str, now: float) -> Version:
        answer = _Answer(NO_VERSION, now, failed=True, asking=trio.Event())
        self._answers[url] = answer
        self._answers.move_to_end(url)
        while len(self._answers) > REMEMBERED:
            self._answers.popitem(last=False)
        self.counters["disk_validations"] += 1
        try:
            version = await self.check(url)
            if version.validator is None and self.immutable:
                version = Version(IMMUTABLE, version.size)
            answer.version, answer.failed = version, False
        except Exception as exc:  # a failed question (cancelled: failed too, as set)
            self.counters["disk_validation_failures"] += 1
            if not isinstance(exc, FetchError):
                log.warning("disk cache: asking the version of an object failed: %r", exc)
        finally:
            answer.asked = trio.current_time()
            event, answer.asking = answer.asking, None
            assert event is not None
            event.set()
        return answer.version
