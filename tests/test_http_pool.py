"""The HTTP client's connection pool against a set naming many hosts, through a real
mount: one key on each of 1,100 spellings of 127.0.0.1 (``127.00.0.01`` ...: each a host
of its own to refmount, all one raw socket server of this file's), read once under a
lowered descriptor limit (``prlimit``, as systemd's 1,024 but lower).  Every read gets its
bytes, the daemon's descriptors stay within the pool's bound while it reads and return
to what they were once the idle connections expire (a timer, whether or not their host
is asked again), and its resident memory stays bounded.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from refmount.fetch.http import pool as pool_module
from refmount.fetch.http.connection import Connection
from refmount.fetch.http.pool import IDLE_SECONDS, ConnectionPool
from tests.conftest import Mounted
from tests.support.rawserver import RawServer, asked_range, partial
from tests.support.remote_files import write_refs

DATA = bytes((i * 29 + (i >> 8)) % 241 for i in range(1 << 16))
HOSTS = int(os.environ.get("HOSTS", 1_100))
LIMIT = 256  # the daemon's RLIMIT_NOFILE while it reads
LENGTH = 512

#: A child process that reads each file named on its command line and prints, as JSON,
#: the names whose bytes were not the expected ones (or failed).
READER = """
import json, sys, hashlib
bad = {}
for path in sys.argv[2:]:
    try:
        with open(path, "rb") as f:
            got = f.read()
    except OSError as exc:
        bad[path] = str(exc)
        continue
    if hashlib.sha256(got).hexdigest() != sys.argv[1]:
        bad[path] = f"{len(got)} wrong bytes"
print(json.dumps(bad))
"""


def spellings(count: int) -> list[str]:
    """``count`` spellings of 127.0.0.1 (leading zeros in its last three numbers)."""
    zeros = range(11)
    found = [
        f"127.{'0' * a}0.{'0' * b}0.{'0' * c}1"
        for a, b, c in itertools.product(zeros, zeros, zeros)
    ]
    assert len(found) >= count
    return found[:count]


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def resident(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert match, status
    return int(match[1]) << 10


def test_one_key_on_each_of_many_hosts_keeps_descriptors_and_memory_bounded(
    mount: Callable[..., Mounted], tmp_path: Path, raw_server: Callable[..., RawServer]
) -> None:
    server = raw_server(lambda head: (partial(*asked_range(head), DATA), True))
    hosts = spellings(HOSTS + 1)
    refs = {f"k{i:04d}": [server.url("/d.bin", host), 1000, LENGTH] for i, host in enumerate(hosts)}
    m = mount(write_refs(tmp_path, refs), "--timeout", "10", "--retries", "1")
    pid = m.process.pid
    subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={LIMIT}:{LIMIT}"], check=True)
    before, rss_before = descriptors(pid), resident(pid)
    print(f"before: {before} descriptors, {rss_before >> 20} MiB")

    # Read every key but the last, sampling the daemon's descriptors meanwhile.
    expected = hashlib.sha256(DATA[1000 : 1000 + LENGTH]).hexdigest()
    paths = [str(m.mountpoint / key) for key in sorted(refs)]
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, expected, *paths[:-1]], stdout=subprocess.PIPE, text=True
    )
    most, deadline = before, time.monotonic() + 300
    while reader.poll() is None:
        most = max(most, descriptors(pid))
        if time.monotonic() > deadline:
            reader.kill()
            raise AssertionError(f"the reads took over 300 s: {m.log()[-3000:]}")
        time.sleep(0.05)
    bad = json.loads(reader.stdout.read())  # type: ignore[union-attr]
    assert bad == {}, (len(bad), list(bad.items())[:5], m.log()[-3000:])
    assert len({head.split(b"\r\n")[1] for head in server.requests}) == HOSTS  # one Host each
    # Idle connections: a quarter of the limit at most; a few in flight besides.
    assert most <= before + LIMIT // 4 + 8, most
    held = descriptors(pid)
    assert held <= before + LIMIT // 4 + 2, held
    rss = resident(pid)
    assert rss < rss_before + (48 << 20), f"{rss_before >> 20} -> {rss >> 20} MiB"

    # A new host's key still reads; then every idle connection expires by itself.
    last = subprocess.run([sys.executable, "-c", READER, expected, paths[-1]],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert json.loads(last.stdout) == {}
    deadline = time.monotonic() + IDLE_SECONDS + 15
    while descriptors(pid) > before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert descriptors(pid) <= before, (before, os.listdir(f"/proc/{pid}/fd"))
    print(f"most {most}, held {held}, after expiry {descriptors(pid)} descriptors; "
          f"RSS {rss_before >> 20} -> {rss >> 20} MiB")  # fmt: skip


#: Reads one key on each host named, through a Fetcher (refmount's own client), once
#: with a pool of idle connections filled and the process then left with no free
#: descriptor, once with a few: prints the pool's idle count after each, as JSON.
NEAR_THE_LIMIT = """
import json, os, resource, sys, trio
from refmount.fetch import Fetcher, FetchPolicy
limit, port, hosts = int(sys.argv[1]), sys.argv[2], sys.argv[4:]
expected = bytes.fromhex(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
fetcher = Fetcher(policy=FetchPolicy(timeout=5, retries=0))
seen = []

async def read(host):
    got = await fetcher.fetch(f"http://{host}:{port}/d.bin", 1000, 1000 + len(expected))
    assert got == expected, host

async def main():
    pool = fetcher._backend(f"http://{hosts[0]}:{port}/").pool
    for host in hosts[:20]:
        await read(host)
    seen.append(pool.idle)
    for free in (0, 3):
        held = []
        while True:
            try:
                held.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        for fd in held[len(held) - free:]:
            os.close(fd)
        await read(hosts[20 + free])
        seen.append(pool.idle)
        for fd in held[: len(held) - free]:
            os.close(fd)
        for host in hosts[:20]:
            await read(host)

trio.run(main)
print(json.dumps(seen))
"""


def test_near_the_descriptor_limit_idle_connections_close_first(
    raw_server: Callable[..., RawServer],
) -> None:
    server = raw_server(lambda head: (partial(*asked_range(head), DATA), True))
    expected = DATA[1000 : 1000 + LENGTH]
    argv = [sys.executable, "-c", NEAR_THE_LIMIT, "128", str(server.port), expected.hex()]
    done = subprocess.run([*argv, *spellings(30)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    filled, out_of_descriptors, near = json.loads(done.stdout)
    assert filled == 20
    # No descriptor free: the new host's connect closed every idle connection, then read
    # (its own connection is the one idle after).
    assert out_of_descriptors == 1
    # Three free: the new connection's descriptor, numbered past three quarters of the
    # limit, made the pool close idle ones until a quarter of the limit was free.
    assert near < 20, near
    print(f"idle connections: {filled} filled, {out_of_descriptors} and {near} after")


def test_idle_connections_expire_by_a_task_in_the_nursery_the_owner_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In process: no nursery, no background task (an expired connection is closed when
    taken); given one, the expiry is a task there, ends when nothing is idle, and
    cancelling that nursery ends it."""
    monkeypatch.setattr(pool_module, "IDLE_SECONDS", 0.2)

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        pool = ConnectionPool()

        async def idle_one() -> Connection:
            connection = await pool.take("127.0.0.1", port)
            pool.give_back("127.0.0.1", port, connection)
            return connection

        first = await idle_one()
        await trio.sleep(0.4)
        assert pool.idle == 1 and not first.closed  # nobody expires it
        async with trio.open_nursery() as nursery:
            pool.start(nursery)
            names = [task.name for task in nursery.child_tasks]
            assert names == ["http idle reaper"]
            with trio.fail_after(5):
                while pool.idle:
                    await trio.sleep(0.05)
            assert first.closed
            await trio.sleep(0.05)
            assert not nursery.child_tasks  # ended with nothing idle
            second = await idle_one()
            assert [task.name for task in nursery.child_tasks] == ["http idle reaper"]
            nursery.cancel_scope.cancel()
        assert pool.idle == 1 and not second.closed  # its owner stopped it
        pool.close()
        for listener in listeners:
            await listener.aclose()

    trio.run(main)
