"""The daemon's worker processes: bounded in number, started on first use, each job
with a deadline, each worker with a memory limit; a worker that dies, hangs or breaks
the protocol is killed and its job fails, and the next job starts a new one.

Workers are started as :mod:`refmount.workers.process` says.  All waiting on a worker
is trio's (non-blocking pipes), so the serving thread never blocks on one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio

from refmount.workers.jobs import Buffer, JobFailed
from refmount.workers.process import how_it_ended, spawn
from refmount.workers.protocol import (
    FAILED,
    MAX_MESSAGE,
    OK,
    READY,
    REPLY,
    REPLY_MAGIC,
    REQUEST,
    REQUEST_MAGIC,
    consume,
)

log = logging.getLogger(__name__)

#: Seconds a new worker may take to start (an interpreter and its job's libraries).
_START_DEADLINE = 60.0
#: Seconds a killed worker is waited for before it is left to be reaped later.
_REAP_WAIT = 5.0


@dataclass(frozen=True)
class PoolConfig:
    #: Worker processes at most (jobs beyond wait for one).
    workers: int
    #: Seconds a job may take, its payload sent and its reply read, before its worker
    #: is killed.
    deadline: float = 120.0
    #: Address space of a worker (``RLIMIT_AS``), bytes; 0: no limit.
    memory_limit: int = 6 << 30


class _Worker:
    """One worker process and the daemon's ends of its pipes."""

    def __init__(self, memory_limit: int) -> None:
        self.process, requests, replies = spawn("refmount.workers.child", str(memory_limit))
        self.requests = trio.lowlevel.FdStream(requests)
        self.replies = trio.lowlevel.FdStream(replies)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def started(self) -> None:
        """Wait for the worker to say it is ready (its imports done)."""
        said = bytearray(len(READY))
        await self._receive([memoryview(said)], len(said))
        if said != READY:
            raise _Broken("it did not start")

    async def call(self, header: bytes, payload: Buffer, into: list[memoryview]) -> bytes | None:
        """Send one request, read its reply into ``into``: ``None``, or the job's failure
        message.

        The request goes in one gathered write, and the reply is read straight into the
        buffers ``into`` (the job's output, in order across them), its head with it (the
        daemon's ends of the pipes are non-blocking: it waits only on a full or empty
        pipe).  A chunk costs the serving thread a few system calls each way and no copy
        of its own."""
        size = sum(len(view) for view in into)
        request = REQUEST.pack(REQUEST_MAGIC, len(header), len(payload), size)
        await self._send([request, header, payload])
        head = bytearray(REPLY.size)
        got = await self._receive([memoryview(head), *into], REPLY.size)
        magic, status, length = REPLY.unpack(head)
        if magic != REPLY_MAGIC or status not in (OK, FAILED):
            raise _Broken("a reply it does not understand")
        if status == OK and length != size:
            raise _Broken(f"{length} bytes where the job promised {size}")
        if status == FAILED and length > MAX_MESSAGE:
            raise _Broken(f"a failure message of {length} bytes")
        done = got - REPLY.size
        if done > length:
            raise _Broken("more bytes than its reply holds")
        if status == OK:
            rest = list(into)
            consume(rest, done)
            await self._receive(rest, length - done)
            return None
        message = bytearray(length)  # what came of it landed in ``into``: moved here
        message[:done] = b"".join(into)[:done]
        await self._receive([memoryview(message)[done:]], length - done)
        return bytes(message)

    async def _send(self, pieces: list[Buffer]) -> None:
        """Write ``pieces`` whole, in as few writes as the pipe takes."""
        fd = self.requests.fileno()
        views = [memoryview(piece).cast("B") for piece in pieces if len(piece)]
        while views:
            try:
                written = os.writev(fd, views)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(fd)
                continue
            consume(views, written)

    async def _receive(self, views: list[memoryview], least: int) -> int:
        """Read into ``views``, in order, until at least ``least`` bytes have come;
        returns how many came."""
        fd, done = self.replies.fileno(), 0
        views = [view for view in views if len(view)]
        while done < least:
            try:
                n = os.readv(fd, views)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
                continue
            if n == 0:
                raise _Broken("its end of the pipe closed")
            done += n
            consume(views, n)
        return done

    async def kill(self) -> None:
        """Kill the process (by its own pid) and reap it, waiting in trio's way."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.requests.close()
        self.replies.close()
        with trio.CancelScope(shield=True), trio.move_on_after(_REAP_WAIT):
            while self.process.poll() is None:
                await trio.sleep(0.005)

    def ended(self) -> str:
        return how_it_ended(self.process)


class _Broken(Exception):
    """The worker died or broke the protocol mid-job."""


class WorkerPool:
    """At most ``config.workers`` worker processes, started by :meth:`warm_up` or when
    jobs need them."""

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self._slots = trio.Semaphore(config.workers)
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        #: Killed, not yet reaped.
        self._dying: set[_Worker] = set()
        self._closed = False
        self._counters = dict.fromkeys(
            (
                "worker_starts",
                "worker_deaths",
                "worker_jobs",
                "worker_job_errors",
                "workers_busy",
            ),
            0,
        )

    @property
    def capacity(self) -> int:
        """Jobs run at once at most."""
        return self.config.workers

    def stats(self) -> dict[str, int]:
        return {"workers": len(self._all), **self._counters}

    def pids(self) -> list[int]:
        return sorted(worker.pid for worker in self._all)

    async def submit(
        self, kind: str, params: Mapping[str, Any], payload: Buffer, size: int
    ) -> Buffer:
        body = bytearray(size)
        await self.submit_into(kind, params, payload, [memoryview(body)])
        return body

    async def submit_into(
        self, kind: str, params: Mapping[str, Any], payload: Buffer, into: list[memoryview]
    ) -> None:
        if self._closed:
            raise JobFailed("the worker pool is closed")
        header = json.dumps({"kind": kind, "params": params}).encode()
        async with self._slots:
            self._reap()
            worker = await self._idle_worker() or await self._start()
            self._counters["worker_jobs"] += 1
            self._counters["workers_busy"] += 1
            try:
                failure = await self._call(worker, kind, header, payload, into)
            finally:
                self._counters["workers_busy"] -= 1
        if failure is not None:
            self._counters["worker_job_errors"] += 1
            raise JobFailed(failure.decode(errors="replace"))

    async def _call(
        self, worker: _Worker, kind: str, header: bytes, payload: Buffer, into: list[memoryview]
    ) -> bytes | None:
        """The job's failure message, if any, its output read into ``into``; a worker
        that dies, hangs past the deadline or breaks the protocol (or a job cancelled
        mid-way) is killed and the job fails."""
        failure = "was cancelled"
        try:
            with trio.move_on_after(self.config.deadline):
                reply = await worker.call(header, payload, into)
                if not self._closed:
                    self._idle.append(worker)
                return reply
            failure = f"did not finish within {self.config.deadline:g} s"
        except (_Broken, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            failure = f"lost its worker: {exc}"
        finally:
            if worker not in self._idle:
                await self._discard(worker)
        raise JobFailed(f"a {kind} job {failure} (worker {worker.pid} {worker.ended()})")

    async def warm_up(self) -> None:
        """Start every worker now (the daemon does at mount), so that the first reads do
        not wait for interpreters to start.  Jobs meanwhile take the first one ready."""

        async def start_one() -> None:
            async with self._slots:
                if len(self._all) < self.config.workers and not self._closed:
                    with contextlib.suppress(JobFailed):  # the next job starts another
                        self._idle.append(await self._start())

        async with trio.open_nursery() as nursery:
            for _ in range(self.config.workers):
                nursery.start_soon(start_one)

    async def _idle_worker(self) -> _Worker | None:
        """An idle worker still alive (one killed while idle, say by the OOM killer, is
        replaced rather than failing a job)."""
        while self._idle:
            worker = self._idle.pop()
            if worker.process.poll() is None:
                return worker
            await self._discard(worker, failed_job=False)
        return None

    async def _start(self) -> _Worker:
        worker = _Worker(self.config.memory_limit)
        self._all.add(worker)
        self._counters["worker_starts"] += 1
        try:
            with trio.fail_after(_START_DEADLINE):
                await worker.started()
        except (trio.TooSlowError, _Broken, trio.BrokenResourceError, OSError) as exc:
            await self._discard(worker)
            raise JobFailed(f"a worker did not start ({worker.ended()}): {exc!r}") from None
        except BaseException:
            await self._discard(worker)
            raise
        log.debug("started worker %d", worker.pid)
        return worker

    async def _discard(self, worker: _Worker, *, failed_job: bool = True) -> None:
        self._all.discard(worker)
        self._dying.add(worker)
        await worker.kill()
        self._reap()
        self._counters["worker_deaths"] += 1
        self._counters["worker_job_errors"] += failed_job
        log.warning("worker %d %s; a new one replaces it", worker.pid, worker.ended())

    def _reap(self) -> None:
        """Forget killed workers that have been reaped."""
        self._dying = {worker for worker in self._dying if worker.process.poll() is None}

    def close(self) -> None:
        """Kill every worker and reap it (at unmount).  Jobs submitted later fail."""
        self._closed = True
        for worker in [*self._all, *self._dying]:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGKILL)
        for worker in [*self._all, *self._dying]:
            worker.process.wait()
        # Dropping the last reference closes the pipes (FdStream.close needs trio).
        self._all.clear()
        self._dying.clear()
        self._idle.clear()
