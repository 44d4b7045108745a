"""The daemon's side of its fetch workers: :class:`FetchWorkers` keeps ``N`` worker
processes alive, and :class:`ProcessBackend` is a :class:`~refmount.fetch.backend.Backend`
whose calls they run.

The :class:`~refmount.fetch.fetcher.Fetcher` keeps all its policy (deadlines, retries,
request limits, length checks, checksums, errnos): only the backend's call crosses to a
worker.  Each worker has one task here reading its replies into one buffer per reply,
sized by the reply's header, and waking the request that waits for it.  A request whose
waiter was cancelled (the fetcher's deadline) asks its worker to give it up; its late
reply is read and dropped.  A worker that dies or breaks the protocol fails every
request it had with :class:`~refmount.workers.fetching.protocol.WorkerLost` (transient:
the fetcher's retry goes to a live worker), and is reaped and replaced, after a pause
that grows while new workers keep dying.

Bytes come back through the worker's reply pipe (1 MiB), read with ``readv`` straight
into the reply's one buffer, not through shared memory.  Measured with
``bench/fetch_handover.py`` (2,000 distinct 256 KiB ranges from nginx on 127.0.0.1, 16
in flight, CPU of both processes, medians of 3 rounds, 2026-11-26 11:53 UTC, load 0.1):
in the daemon with obstore 0.35 ms per chunk; through one worker 0.13 ms in the daemon
and 0.44 ms in the worker, 0.58 ms in all.  The hand-over costs about 0.2 ms per chunk, most of it
per message (the framing, a trio task and a wake-up on each side), not per byte:
the pipe's two copies (a 256 KiB ``write`` into a 1 MiB pipe and its ``readv`` into a
new buffer, in one process) cost 0.05 ms, and shared memory would save only one of them
(the worker still copies obstore's bytes into the segment), while
adding slots that the daemon must hand out and take back, and could serve from only
once no worker can write into them again (a worker killed mid-write, a request
abandoned at its deadline whose worker still writes).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from refmount.fetch.backend import Version
from refmount.refs.model import Checksum
from refmount.workers.fetching.protocol import (
    CANCEL,
    CANCELLED,
    DATA,
    FAILED,
    MAX_VALUE,
    PREPARE,
    READ,
    READY,
    REPLY,
    REPLY_MAGIC,
    SCOPE,
    SIZE,
    VALUE,
    VERSION,
    WorkerLost,
    decode_error,
    decode_value,
    request,
)
from refmount.workers.process import how_it_ended, spawn

log = logging.getLogger(__name__)

#: Seconds a new worker may take to say it is ready.
START_DEADLINE = 60.0
#: A worker that lived this long before it died is replaced at once; one that died
#: sooner waits :data:`FIRST_PAUSE`, doubled for each such death in a row, at most
#: :data:`LONGEST_PAUSE`.
HEALTHY_SECONDS = 10.0
FIRST_PAUSE = 0.1
LONGEST_PAUSE = 30.0
#: Seconds a killed worker is waited for before it is left to be reaped at close.
REAP_WAIT = 5.0


class _Broken(Exception):
    """The worker died or broke the protocol."""


@dataclass
class _Call:
    """One request sent to a worker, until its reply is read."""

    limit: int  # the longest body its reply may have
    done: trio.Event = field(default_factory=trio.Event)
    status: int = FAILED
    body: bytearray | None = None
    error: Exception | None = None
    abandoned: bool = False


class _Worker:
    """One worker process, the daemon's ends of its pipes, and its requests in flight."""

    def __init__(self) -> None:
        self.process, self.requests, self.replies = spawn("refmount.workers.fetching.child")
        os.set_blocking(self.requests, False)
        os.set_blocking(self.replies, False)
        self.pending: dict[int, _Call] = {}
        self.scopes: set[int] = set()  # the scopes it has been told of
        self.sending = trio.Lock()
        self.closed = False

    @property
    def pid(self) -> int:
        return self.process.pid

    async def receive_into(self, view: memoryview) -> None:
        done = 0
        while done < len(view):
            try:
                n = os.readv(self.replies, [view[done:]])
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.replies)
                continue
            if n == 0:
                raise _Broken("its end of the pipe closed")
            done += n

    async def send(self, frame: bytes) -> None:
        """Write one request frame, whole.  Cancelled before any of it is written, the
        worker never sees it; cut off after part of it, the worker is killed (the next
        frame could not be told from the rest of this one)."""
        async with self.sending:
            view = memoryview(frame)
            try:
                while view:
                    if self.closed:  # its descriptor may be another file's by now
                        raise trio.ClosedResourceError("the worker is gone")
                    try:
                        view = view[os.write(self.requests, view) :]
                    except BlockingIOError:
                        await trio.lowlevel.wait_writable(self.requests)
            except BaseException:
                if 0 < len(view) < len(frame):
                    self.break_off()
                raise

    def cancel(self, ident: int) -> None:
        """Ask the worker to give request ``ident`` up, if that can be said without
        waiting (the reply comes anyway; the request's slot is freed by it)."""
        if self.sending.locked() or self.closed:
            return  # another frame is halfway through the pipe
        frame = request(CANCEL, ident)
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self.requests, frame)  # shorter than PIPE_BUF: whole or not at all

    def break_off(self) -> None:
        """Kill the process: its reader sees the end of the pipe and fails its requests."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)

    def fail_all(self, reason: str) -> None:
        for call in self.pending.values():
            call.error = WorkerLost(f"its fetch worker {self.pid} {reason}")
            call.done.set()
        self.pending.clear()

    async def reap(self) -> None:
        """Kill the process by its own pid and wait for it, in trio's way."""
        self.break_off()
        self.close_pipes()
        with trio.CancelScope(shield=True), trio.move_on_after(REAP_WAIT):
            while self.process.poll() is None:
                await trio.sleep(0.005)

    def close_pipes(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fd in (self.requests, self.replies):
            with contextlib.suppress(RuntimeError):  # outside trio: nobody waits on it
                trio.lowlevel.notify_closing(fd)
            os.close(fd)

    def ended(self) -> str:
        return how_it_ended(self.process)


class FetchWorkers:
    """``workers`` fetch worker processes, each with at most ``per_worker`` requests in
    flight (the fetcher's per-host limit), kept alive by :meth:`run`."""

    def __init__(self, workers: int, per_worker: int) -> None:
        self.workers = workers
        self.per_worker = per_worker
        self._live: list[_Worker] = []
        self._dying: set[_Worker] = set()
        self._changed = trio.Event()
        self._ids = itertools.count(1)
        self._scopes: dict[int, tuple[Any, ...]] = {}
        self._closed = False
        self._counters = dict.fromkeys(("fetch_worker_starts", "fetch_worker_deaths"), 0)

    # -- what the fetcher sees ------------------------------------------------------------

    def backend(
        self,
        protocol: str,
        options: Mapping[str, Any],
        choice: str = "auto",
        *,
        deadline: float | None = None,
        threads: int,
        buffers: object = None,
    ) -> ProcessBackend:
        """A backend for one scope, made in the workers by ``make_backend`` with these
        arguments (the same signature; ``buffers`` stays here: a worker's bodies arrive
        through its pipe into buffers of the reply's own)."""
        scope = len(self._scopes) + 1
        self._scopes[scope] = (protocol, dict(options), choice, deadline, threads)
        return ProcessBackend(self, scope)

    def stats(self) -> dict[str, Any]:
        return {
            "fetch_workers": len(self._live),
            "fetch_worker_pids": self.pids(),
            **self._counters,
            "fetch_worker_requests": sum(len(w.pending) for w in self._live),
        }

    def pids(self) -> list[int]:
        return sorted(worker.pid for worker in self._live)

    async def call(
        self,
        scope: int,
        kind: int,
        args: tuple[Any, ...],
        limit: int,
        worker: _Worker | None = None,
    ) -> Any:
        """Run one request in ``worker`` or else the least busy one: the bytes read (a
        bytearray), the value, or the failure raised as the worker saw it."""
        if worker is None:
            worker = await self._least_busy()
        elif worker.closed:  # it died since it was chosen
            raise WorkerLost(f"its fetch worker {worker.pid} is gone")
        ident = next(self._ids)
        call = worker.pending[ident] = _Call(limit)
        sent = False
        try:
            try:
                if scope not in worker.scopes:
                    await worker.send(request(SCOPE, scope, self._scopes[scope]))
                    worker.scopes.add(scope)
                await worker.send(request(kind, ident, args))
                sent = True
            except (OSError, trio.ClosedResourceError) as exc:  # the worker is gone
                raise WorkerLost(f"its fetch worker {worker.pid} is gone: {exc}") from None
            await call.done.wait()
        except BaseException:
            if not call.done.is_set():
                if sent:  # its reply comes anyway, and is dropped
                    call.abandoned = True
                    worker.cancel(ident)
                else:  # the worker never saw it: no reply will come
                    worker.pending.pop(ident, None)
                    self._notify()
            raise
        if call.error is not None:
            raise call.error
        if call.status == FAILED:
            raise decode_error(call.body or b"")
        if call.status == VALUE:
            return decode_value(call.body or b"")
        return call.body

    async def prepare(self, scope: int) -> None:
        """Prepare a scope's backend in every worker now running (in the first one to
        run, while they start); a failure is left for the first read to report."""
        workers = list(self._live) or [await self._least_busy()]
        async with trio.open_nursery() as nursery:
            for worker in workers:
                nursery.start_soon(self.call, scope, PREPARE, (scope,), 0, worker)

    async def started(self) -> None:
        """Wait until every worker has started, at most :data:`START_DEADLINE` (one that
        fails to start is replaced in the background; requests use those running)."""
        with trio.move_on_after(START_DEADLINE):
            while len(self._live) < self.workers and not self._closed:
                await self._changed.wait()

    async def _least_busy(self) -> _Worker:
        while True:
            if self._closed:
                raise WorkerLost("the fetch workers are stopped")
            open_ = [w for w in self._live if len(w.pending) < self.per_worker]
            if open_:
                return min(open_, key=lambda w: len(w.pending))
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- life cycle -----------------------------------------------------------------------

    async def run(self) -> None:
        """Start the workers and keep them alive until cancelled; then kill and reap
        them."""
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(self.workers):
                    nursery.start_soon(self._keep_one)
        finally:
            self.close()

    async def _keep_one(self) -> None:
        """One worker slot: start a worker, serve its replies until it dies, replace it
        (after a pause that grows while replacements keep dying soon)."""
        quick_deaths = 0
        while not self._closed:
            started = trio.current_time()
            await self._serve_one()
            if trio.current_time() - started >= HEALTHY_SECONDS:
                quick_deaths = 0
            else:
                quick_deaths += 1
                await trio.sleep(min(LONGEST_PAUSE, FIRST_PAUSE * 2 ** (quick_deaths - 1)))

    async def _serve_one(self) -> None:
        try:
            worker = _Worker()
        except OSError as exc:  # no process to be had now (EAGAIN, EMFILE): try later
            log.warning("cannot start a fetch worker: %s", exc)
            return
        self._counters["fetch_worker_starts"] += 1
        reason = "was stopped"
        try:
            with trio.fail_after(START_DEADLINE):
                ready = bytearray(len(READY))
                await worker.receive_into(memoryview(ready))
            if ready != READY:
                raise _Broken("it did not start")
            self._live.append(worker)
            self._notify()
            log.debug("fetch worker %d started", worker.pid)
            await self._read_replies(worker)
        except (_Broken, trio.TooSlowError, trio.ClosedResourceError, OSError) as exc:
            reason = f"failed ({exc or type(exc).__name__})"
        finally:
            if worker in self._live:
                self._live.remove(worker)
            self._dying.add(worker)
            worker.fail_all(reason)
            self._notify()
            await worker.reap()
            self._dying = {w for w in self._dying if w.process.poll() is None}
        self._counters["fetch_worker_deaths"] += 1
        log.warning(
            "fetch worker %d %s: %s; a new one replaces it", worker.pid, worker.ended(), reason
        )

    async def _read_replies(self, worker: _Worker) -> None:
        head = bytearray(REPLY.size)
        head_view = memoryview(head)
        while True:
            await worker.receive_into(head_view)
            magic, status, ident, length = REPLY.unpack(head)
            call = worker.pending.get(ident)
            if magic != REPLY_MAGIC or call is None:
                raise _Broken("a reply it does not understand")
            limit = call.limit if status == DATA else MAX_VALUE
            if status not in (DATA, VALUE, FAILED, CANCELLED) or length > limit:
                raise _Broken(f"a reply of {length} bytes where at most {limit} may come")
            body = bytearray(length)
            if length:
                await worker.receive_into(memoryview(body))
            del worker.pending[ident]
            if not call.abandoned:
                if status == CANCELLED:
                    call.error = WorkerLost(f"its fetch worker {worker.pid} gave the request up")
                call.status, call.body = status, body
                call.done.set()
            self._notify()
            await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """Kill every worker and reap it (at unmount).  Requests made later fail."""
        self._closed = True
        workers = [*self._live, *self._dying]
        for worker in workers:
            worker.break_off()
        for worker in workers:
            try:
                worker.process.wait(REAP_WAIT)
            except subprocess.TimeoutExpired:
                log.warning("fetch worker %d did not end after SIGKILL", worker.pid)
            worker.close_pipes()
        self._live.clear()
        self._dying.clear()


class ProcessBackend:
    """One scope's backend, run in the fetch workers (see :class:`FetchWorkers`)."""

    def __init__(self, workers: FetchWorkers, scope: int) -> None:
        self.workers = workers
        self.scope = scope

    async def read(
        self, url: str, start: int, end: int, checksum: Checksum | None = None
    ) -> bytearray:
        # The worker's backend holds at most one byte more than asked: so may its reply.
        args = (self.scope, url, start, end, checksum)
        return await self.workers.call(self.scope, READ, args, limit=end - start + 1)

    async def size(self, url: str) -> int:
        return await self.workers.call(self.scope, SIZE, (self.scope, url), limit=0)

    async def version(self, url: str) -> Version:
        return await self.workers.call(self.scope, VERSION, (self.scope, url), limit=0)

    async def prepare(self) -> None:
        """Prepare the scope's backend in the workers (see :meth:`FetchWorkers.prepare`)."""
        await self.workers.prepare(self.scope)

    def close(self) -> None:
        """Nothing to release here: the backend lives in the workers, which end at
        unmount."""
