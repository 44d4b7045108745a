"""The daemon's worker pool with real worker processes: jobs return exactly their
bytes, a failing job leaves its worker serving, a killed or hung worker fails its job
and is replaced, limits reach the process, and nothing is left behind."""

from __future__ import annotations

import os
import signal
import zlib
from pathlib import Path

import numpy as np
import pytest
import trio

from refmount.decode.arrays import parse_zarray
from refmount.workers import InProcessRunner, JobFailed, PoolConfig, WorkerPool

VALUES = np.arange(4096, dtype="<f8")
ZARRAY = (
    b'{"zarr_format": 2, "shape": [4096], "chunks": [4096], "dtype": "<f8", '
    b'"compressor": {"id": "zlib", "level": 1}, "filters": null, "fill_value": 0, "order": "C"}'
)
SPEC = parse_zarray(ZARRAY).decoder.spec
RAW = zlib.compress(VALUES.tobytes())
SIZE = VALUES.nbytes


def alive(pid: int) -> bool:
    """Running (not a zombie): what a leftover worker would be."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


async def wait_until(condition, attempts: int = 2000) -> None:
    for _ in range(attempts):
        if condition():
            return
        await trio.sleep(0.01)
    raise AssertionError("the condition never held")


def run_pool(test, **config) -> None:
    pool = WorkerPool(PoolConfig(**{"workers": 2, **config}))
    try:
        trio.run(test, pool)
    finally:
        pids = pool.pids()
        pool.close()
        assert not any(alive(pid) for pid in pids)


def test_a_decode_job_returns_the_chunk_and_its_worker_serves_the_next() -> None:
    async def test(pool: WorkerPool) -> None:
        for _ in range(3):
            out = await pool.submit("decode", SPEC, RAW, SIZE)
            assert bytes(out) == VALUES.tobytes()
        stats = pool.stats()
        assert (stats["workers"], stats["worker_starts"], stats["worker_jobs"]) == (1, 1, 3)

    run_pool(test)


def test_a_failing_job_is_an_error_and_its_worker_stays() -> None:
    async def test(pool: WorkerPool) -> None:
        with pytest.raises(JobFailed, match="zlib"):
            await pool.submit("decode", SPEC, b"not zlib at all", SIZE)
        with pytest.raises(JobFailed, match="no job kind"):
            await pool.submit("pickle", {}, b"", 0)
        assert bytes(await pool.submit("decode", SPEC, RAW, SIZE)) == VALUES.tobytes()
        assert pool.stats()["worker_starts"] == 1
        assert pool.stats()["worker_job_errors"] == 2

    run_pool(test)


def test_a_worker_killed_mid_job_fails_that_job_and_is_replaced() -> None:
    async def test(pool: WorkerPool) -> None:
        await pool.submit("decode", SPEC, RAW, SIZE)
        (pid,) = pool.pids()
        os.kill(pid, signal.SIGSTOP)  # the next job waits in it until it is killed
        failure: list[BaseException] = []

        async def job() -> None:
            try:
                await pool.submit("decode", SPEC, RAW, SIZE)
            except JobFailed as exc:
                failure.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(job)
            await wait_until(lambda: pool.stats()["workers_busy"] == 1)
            os.kill(pid, signal.SIGKILL)
        assert "SIGKILL" in str(failure[0])
        assert bytes(await pool.submit("decode", SPEC, RAW, SIZE)) == VALUES.tobytes()
        assert pid not in pool.pids() and not alive(pid)
        stats = pool.stats()
        assert (stats["worker_starts"], stats["worker_deaths"], stats["workers"]) == (2, 1, 1)

    run_pool(test)


def test_warming_up_starts_every_worker_and_jobs_use_them() -> None:
    async def test(pool: WorkerPool) -> None:
        await pool.warm_up()
        assert len(pool.pids()) == 2
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(pool.submit, "decode", SPEC, RAW, SIZE)
        stats = pool.stats()
        assert (stats["worker_starts"], stats["worker_jobs"], stats["workers"]) == (2, 4, 2)

    run_pool(test)


def test_a_worker_killed_while_idle_is_replaced_without_failing_a_job() -> None:
    async def test(pool: WorkerPool) -> None:
        await pool.submit("decode", SPEC, RAW, SIZE)
        (pid,) = pool.pids()
        os.kill(pid, signal.SIGKILL)
        await wait_until(lambda: not alive(pid))
        assert bytes(await pool.submit("decode", SPEC, RAW, SIZE)) == VALUES.tobytes()
        stats = pool.stats()
        assert (stats["worker_deaths"], stats["worker_job_errors"], stats["workers"]) == (1, 0, 1)

    run_pool(test)


def test_a_hung_worker_is_killed_at_the_deadline_and_replaced() -> None:
    async def test(pool: WorkerPool) -> None:
        await pool.submit("decode", SPEC, RAW, SIZE)
        (pid,) = pool.pids()
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(JobFailed, match="did not finish within 1 s"):
            await pool.submit("decode", SPEC, RAW, SIZE)
        assert not alive(pid)
        assert bytes(await pool.submit("decode", SPEC, RAW, SIZE)) == VALUES.tobytes()

    run_pool(test, deadline=1.0)


def test_workers_are_bounded_in_number_and_limited_in_memory() -> None:
    async def test(pool: WorkerPool) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(pool.submit, "decode", SPEC, RAW, SIZE)
        assert pool.stats()["worker_jobs"] == 8
        assert 1 <= len(pool.pids()) <= 2
        for pid in pool.pids():
            limits = Path(f"/proc/{pid}/limits").read_text()
            line = next(line for line in limits.splitlines() if "address space" in line)
            assert line.split()[3:5] == [str(3 << 30)] * 2

    run_pool(test, memory_limit=3 << 30)


def test_a_job_over_its_workers_memory_limit_fails_and_the_next_job_is_served() -> None:
    """A chunk of 768 MiB (zeros: a small zlib stream) in a worker limited to 512 MiB
    (it starts in about 240 MiB of address space, its decoder libraries loaded)."""
    big = 768 << 20
    zarray = ZARRAY.replace(b"4096", str(big // 8).encode())
    spec = parse_zarray(zarray).decoder.spec
    compressor = zlib.compressobj(1)
    raw = b"".join(compressor.compress(bytes(1 << 20)) for _ in range(big >> 20))
    raw += compressor.flush()

    async def test(pool: WorkerPool) -> None:
        with pytest.raises(JobFailed, match="MemoryError"):
            await pool.submit("decode", spec, raw, big)
        assert bytes(await pool.submit("decode", SPEC, RAW, SIZE)) == VALUES.tobytes()

    run_pool(test, memory_limit=512 << 20)


def test_a_closed_pool_leaves_no_worker_and_takes_no_job() -> None:
    pool = WorkerPool(PoolConfig(workers=2))
    trio.run(pool.submit, "decode", SPEC, RAW, SIZE)
    (pid,) = pool.pids()
    pool.close()
    assert not alive(pid)
    with pytest.raises(JobFailed, match="closed"):
        trio.run(pool.submit, "decode", SPEC, RAW, SIZE)


def test_the_in_process_runner_runs_the_same_jobs() -> None:
    runner = InProcessRunner(1)
    assert bytes(trio.run(runner.submit, "decode", SPEC, RAW, SIZE)) == VALUES.tobytes()
    with pytest.raises(JobFailed, match="zlib"):
        trio.run(runner.submit, "decode", SPEC, b"junk", SIZE)


def test_a_job_lands_its_output_in_the_buffers_given_across_them() -> None:
    """``submit_into``: a run of three chunks decoded by one job lands each chunk in its
    own buffer (the daemon reads the reply straight into them); a failure's message,
    longer than the buffers, is whole; the in-process runner does the same."""
    run = {"decoder": SPEC, "spans": [[i * len(RAW), len(RAW)] for i in range(3)]}

    async def check(runner) -> None:
        chunks = [bytearray(SIZE) for _ in range(3)]
        await runner.submit_into("decode-run", run, RAW * 3, [memoryview(c) for c in chunks])
        assert [bytes(c) for c in chunks] == [VALUES.tobytes()] * 3
        small = [memoryview(bytearray(2)) for _ in range(3)]
        with pytest.raises(JobFailed, match=r"-byte chunks asked for 6 bytes"):
            await runner.submit_into("decode-run", run, RAW * 3, small)
        chunks = [bytearray(SIZE) for _ in range(3)]  # the worker serves on
        await runner.submit_into("decode-run", run, RAW * 3, [memoryview(c) for c in chunks])
        assert [bytes(c) for c in chunks] == [VALUES.tobytes()] * 3

    async def test(pool: WorkerPool) -> None:
        await check(pool)
        assert pool.stats()["worker_starts"] == 1

    run_pool(test)
    trio.run(check, InProcessRunner(1))
