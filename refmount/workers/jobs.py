"""The jobs workers run, and the interface that asks for them.

A handler is ``handler(params, payload, size) -> bytes-like`` and must return exactly
``size`` bytes or raise; its module may have a ``prepare()`` a worker runs at its start
(loading libraries, so that a job's deadline is the job's alone).  Handlers are named
here, by module path, so a worker imports only the code a job needs, and a job can name
nothing but these.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import trio

Buffer = bytes | bytearray | memoryview
Handler = Callable[[Mapping[str, Any], memoryview, int], Buffer]

#: Job kind -> ``module:function`` of its handler.
JOBS: dict[str, str] = {
    "decode": "refmount.decode.chunkjob:decode_chunk",
    "decode-run": "refmount.decode.chunkjob:decode_run",
    "decode-strings": "refmount.decode.chunkjob:decode_strings",
    "measure-strings": "refmount.decode.chunkjob:measure_strings",
}


class JobFailed(Exception):
    """A job that did not return its bytes: its handler raised, its worker died or hung,
    or its output has the wrong size.  The message says which."""


def handler(kind: str) -> Handler:
    """The handler of a job kind (:class:`JobFailed` for a kind not in :data:`JOBS`)."""
    target = JOBS.get(kind)
    if target is None:
        raise JobFailed(f"no job kind {kind!r}")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def prepare(kind: str) -> None:
    """Import a job kind's handler, and run its module's ``prepare()`` if it has one (a
    worker does this before its first job)."""
    module = importlib.import_module(JOBS[kind].partition(":")[0])
    getattr(module, "prepare", lambda: None)()


class JobRunner(Protocol):
    """What asks a worker for a job: ``submit`` returns exactly ``size`` bytes or raises
    :class:`JobFailed`."""

    @property
    def capacity(self) -> int:
        """Jobs run at once at most."""
        ...  # pragma: no cover

    async def submit(
        self, kind: str, params: Mapping[str, Any], payload: Buffer, size: int
    ) -> Buffer: ...  # pragma: no cover

    async def submit_into(
        self, kind: str, params: Mapping[str, Any], payload: Buffer, into: list[memoryview]
    ) -> None:
        """``submit``, the job's output landed in ``into``, in order across its buffers
        (their sizes add up to the output's)."""
        ...  # pragma: no cover

    def stats(self) -> dict[str, int]: ...  # pragma: no cover


class InProcessRunner:
    """Jobs run in at most ``threads`` threads of this process: the same handlers and
    checks as the worker processes, without their isolation."""

    def __init__(self, threads: int) -> None:
        self.capacity = threads
        self._limiter: trio.CapacityLimiter | None = None
        self._counters = dict.fromkeys(("worker_jobs", "worker_job_errors"), 0)

    async def submit(
        self, kind: str, params: Mapping[str, Any], payload: Buffer, size: int
    ) -> Buffer:
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(self.capacity)
        run = handler(kind)
        self._counters["worker_jobs"] += 1
        try:
            out = await trio.to_thread.run_sync(
                run, params, memoryview(payload), size, limiter=self._limiter
            )
        except JobFailed:
            self._counters["worker_job_errors"] += 1
            raise
        except Exception as exc:
            self._counters["worker_job_errors"] += 1
            raise JobFailed(f"{type(exc).__name__}: {exc}") from None
        if len(out) != size:
            self._counters["worker_job_errors"] += 1
            raise JobFailed(f"{kind} job returned {len(out)} bytes, not {size}")
        return out

    async def submit_into(
        self, kind: str, params: Mapping[str, Any], payload: Buffer, into: list[memoryview]
    ) -> None:
        out = memoryview(await self.submit(kind, params, payload, sum(map(len, into))))
        for view in into:
            view[:], out = out[: len(view)], out[len(view) :]

    def stats(self) -> dict[str, int]:
        return dict(self._counters)
