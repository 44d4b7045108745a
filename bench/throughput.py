"""Throughput benchmark: refmount next to named peers, against nginx with 10 ms per request.

    python bench/throughput.py [--quick] [--server nginx|python] [--delay 0.01] [--repeat N]

Runs end to end without manual setup beyond ``bash .ci/setup``: it builds its data (kept
in ``--workdir`` for the next run), starts nginx on 127.0.0.1 (Debian's ``nginx-light``
with ``libnginx-mod-http-echo`` for ``echo_sleep``: the server a user meets; ``--server
python`` uses the fault-injecting RangeServer instead), mounts fusectl when it is missing
(as root; refmount raises the kernel's background request limit there), and at exit,
Ctrl-C and SIGTERM included, unmounts everything and stops the servers it started.

Data: ``big.bin`` (512 MiB) and 4000 x 256 KiB chunks back to back in ``chunks.bin``;
one JSON reference set maps ``big`` to all of ``big.bin`` and ``c/00000`` ... to the
chunks.  ``find`` uses ``bench/scale.py``'s 1,000,000-key set (s3 URLs that are never
read).  ``--quick``: 64 MiB, 400 chunks and 100,000 keys.

Systems (one run, same machine, same bytes):

  limit          fsspec's HTTP filesystem in-process with refmount's parallelism: 8
                 requests of 8 MiB in flight (W1, W2, W4), 16 chunk requests (W3);
                 obstore, refmount's HTTP client, for the cold workloads: one GET of all
                 chunks as one stream (W2c), one ``get_range_async`` per chunk, 16 in
                 flight (W3d)
  fsspec         ``ReferenceFileSystem`` in-process: ``cat_file("big")``, ``cat(keys)``,
                 16 threads of ``cat_file`` (W3), ``find("")``
  fsspec.fuse    fsspec's own FUSE mount (needs libfuse2 + fusepy; skipped without)
  refmount       ``refmount -f --cache-size 512M REFS MNT``
  refmount.1cpu  the same daemon pinned to CPU 0 with ``taskset -c 0`` (readers are not
                 pinned): how throughput scales with the daemon's cores
  refmount.stock the daemon as on a stock pyfuse3 (refmount's patch hidden: OPEN and
                 RELEASE per file, listings always READDIRPLUS): what the patch gains
  refmount.process  the daemon over ``s3://`` only, signing with temporary credentials
                 from an AWS profile's ``credential_process`` (valid an hour) where
                 ``refmount`` signs with static keys: issue 38's ≤ 5 % apart
  tmpfs          the same chunk files (W2, W4) and the same keys (find) as plain files on
                 ``/dev/shm``

Workloads: W1 ``dd bs=1M`` of ``big``; W2 one ``cat`` of all chunk files in key order;
W3 16 ``cat`` processes over random chunk files; W4 W2 again on the same mount (warm);
find ``find MNT -type f | wc -l``.  Issue 22's cold workloads start with the kernel's
page cache dropped (``/proc/sys/vm/drop_caches``, as root; the server's files too):
W2c is W2 so, W3d 16 ``cat`` processes over 2,000 distinct chunk files of the 4,000,
each read once; over every protocol, for the limit as for the mounts; on a VM that
reports its free memory to the host, 3 s after the drop (:func:`drop_caches`).  W3z is
W3d over a Zarr v2 array of zlib chunks (``bench/zarr_chunks.py``: float32, 256 KiB
decoded, 4,000 chunks back to back in ``zarr.bin``), read through the raw view
(``refmount``: the compressed bytes) and the decoded view (``refmount --decode``: each
file the 256 KiB decoded chunk), with issue 22's target decoded ≥ 0.7 x raw; both rates
count decoded bytes (256 KiB per chunk file read), the compressed rate is printed beside.
W1, W2, W2c, W3, W3d and each view of W3z get a fresh mount.  Output: a
markdown table with issue 15's targets (stdout and ``results.md``), a table of each FUSE
daemon's CPU seconds per GB and per chunk file (user + system of all its threads, read
from ``/proc`` before and after each workload: steadier than rates on a shared machine),
``results.csv`` and ``results.json`` in ``--out``; the daemons' peak RSS is checked
against budget + 150 MB.  For the cold rows a third table splits the CPU a chunk file
costs the machine: the client (the limit's process, or the daemon), the reader
processes and nginx (:class:`CpuMeter`); and a ``Wire:`` line per row says what its
requests spoke to nginx (HTTP and TLS versions, cipher, connections: :class:`WireLog`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import logging
import os
import random
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import zarr_chunks  # noqa: E402
from bench.scale import build_json  # noqa: E402
from refmount.tuning import CONNECTIONS_ROOT, mount_fusectl  # noqa: E402
from tests.support.certificates import Certificates, make_certificates  # noqa: E402
from tests.support.mounting import REFMOUNT, STOCK_PYFUSE3, Mounted, RssSampler, unmount  # noqa: E402
from tests.support.nginx import NginxServer  # noqa: E402
from tests.support.servers import RangeServer, stop_process  # noqa: E402

log = logging.getLogger("bench")

MiB = 1 << 20
CHUNK = 256 << 10
PART = 8 << 20  # request size of the limit's sequential reads (refmount's max part)
SEQ_PARALLEL = 8  # 64 MiB window / 8 MiB parts
RANDOM_READERS = 16
SYSTEMS = (
    "limit", "fsspec", "fsspec.fuse", "refmount", "refmount.obstore", "refmount.1cpu",
    "refmount.stock", "refmount.process", "tmpfs",
)  # fmt: skip
FUSE_SYSTEMS = (
    "fsspec.fuse", "refmount", "refmount.obstore", "refmount.1cpu", "refmount.stock",
    "refmount.process",
)  # fmt: skip
#: refmount.process's credential_process: temporary credentials valid for an hour (as
#: NASA's ``/s3credentials`` gives them), a new key each run.
CREDENTIAL_PROCESS = """
import json, secrets, time
expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
print(json.dumps({"Version": 1, "AccessKeyId": "ASIA" + secrets.token_hex(8).upper(),
                  "SecretAccessKey": secrets.token_urlsafe(30),
                  "SessionToken": secrets.token_urlsafe(60), "Expiration": expires}))
"""
#: Protocols the chunks can be read over (issue 28): nginx answers all three, ``s3://`` as
#: path-style GETs whose signature it ignores; ``https://`` and ``s3://`` over TLS.
PROTOCOLS = ("http", "https", "s3")
#: Workloads measured over each protocol other than ``http://``.
PROTOCOL_WORKLOADS = ("W1", "W2c", "W3d")
S3_BUCKET = "bucket"
S3_CREDENTIALS = {
    "key": "bench",
    "secret": "bench-secret",
    "client_kwargs": {"region_name": "us-east-1"},
}
WORKLOADS = ("W1", "W2", "W2c", "W3", "W3d", "W3z", "W4", "find")
#: W3z's second row: the same readers through the decoded view (``--decode``).
DECODED = "W3z+decode"
#: The rows of the report: a workload's own, and W3z's decoded view after it; then
#: ``W@protocol`` for the workloads measured over other protocols.
ROWS = (
    *("W1", "W2", "W2c", "W3", "W3d", "W3z", DECODED, "W4", "find"),
    *(f"{w}@{p}" for p in PROTOCOLS[1:] for w in PROTOCOL_WORKLOADS),
)


def base(row: str) -> str:
    """The workload of a row (``W3d@https`` is W3d)."""
    return row.partition("@")[0]


def protocol(row: str) -> str:
    return row.partition("@")[2] or "http"


#: Rows that start with the kernel's page cache dropped (the server's file included).
COLD = ("W2c", "W3d", "W3z", DECODED)


def cold(row: str) -> bool:
    """Whether a row starts with the page cache dropped: over every protocol alike, for
    the limit as for the mounts (``W2c@https`` read the server's file warm from the http
    row until 2026-11-28, and its limit was the higher for it)."""
    return base(row) in COLD


#: Rows whose readers read W3d's distinct chunks (W3z: the same indices, zlib chunks).
DISTINCT = ("W3d", "W3z", DECODED)
TMPFS_ROOT = Path("/dev/shm")
MOUNT_TIMEOUT = 120.0
RUN_TIMEOUT = 900.0
RSS_ALLOWANCE = 150 * 10**6  # the daemon may use its cache budget plus this


@dataclass
class Sizes:
    big: int
    chunks: int
    random_files: int  # files read by each W3 reader
    find_keys: int
    distinct_files: int = 0  # W3d: distinct chunk files, each read once, over all readers

    @classmethod
    def pick(cls, quick: bool) -> Sizes:
        if quick:
            return cls(big=64 * MiB, chunks=400, random_files=16, find_keys=100_000,
                       distinct_files=200)  # fmt: skip
        return cls(big=512 * MiB, chunks=4000, random_files=64, find_keys=1_000_000,
                   distinct_files=2000)  # fmt: skip


class WireLog:
    """What the requests since the last look spoke to nginx, from its wire log
    (``tests.support.nginx.WIRE_FORMAT``): each row says which HTTP version, TLS version
    and cipher it was measured with and over how many connections, so that the limit
    and refmount are seen to be measured alike (issue 28: one GET per chunk over
    HTTP/1.1 for both, no HTTP/2 multiplexing)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def take(self) -> str:
        """``"2000 requests: HTTP/1.1 TLSv1.2 ECDHE-ECDSA-AES256-GCM-SHA384, 17
        connections"`` for the lines logged since the last call (nginx logs a request
        when it is done with it: the last few of a row may be counted with the next)."""
        with self.path.open("rb") as log_file:
            log_file.seek(self.offset)
            data = log_file.read()
        end = data.rfind(b"\n") + 1  # a line nginx is still writing waits for next time
        self.offset += end
        complete = data[:end].decode("ascii", "replace").splitlines()
        spoken: dict[str, set[str]] = {}
        for line in complete:
            version, tls, cipher, connection = line.split()
            wire = f"{version} {tls} {cipher}" if tls != "-" else f"{version} plain"
            spoken.setdefault(wire, set()).add(connection)
        if not complete:
            return "no requests"
        parts = [f"{wire}, {len(c)} connections" for wire, c in sorted(spoken.items())]
        return f"{len(complete)} requests: " + "; ".join(parts)


class CpuMeter:
    """The CPU a row costs the machine beside its client's own: the readers (``cat``,
    ``dd``: this process's reaped children) and the server (nginx and its workers), and
    this process's own (the in-process limit's client).  On two shared cores these
    compete with the daemon, so a row is compared by all three (issue 28)."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid
        self._start: dict[str, float] | None = None

    def _now(self) -> dict[str, float]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        readers = resource.getrusage(resource.RUSAGE_CHILDREN)
        server = tree_cpu_seconds(self.server_pid) if self.server_pid else 0.0
        return {
            "own": own.ru_utime + own.ru_stime,
            "readers": readers.ru_utime + readers.ru_stime,
            "server": server,
        }

    def start(self) -> None:
        """Begin a row's timed part (after the page cache is dropped: that is no row's)."""
        self._start = self._now()

    def take(self) -> dict[str, float] | None:
        """CPU seconds by side since :meth:`start`; None when no row was started."""
        if self._start is None:
            return None
        now, began = self._now(), self._start
        self._start = None
        return {side: now[side] - began[side] for side in now}


@dataclass
class Setup:
    sizes: Sizes
    data: Path
    refs_path: Path
    refs: dict[str, Any]
    url: str
    keys: list[str]
    random_lists: list[list[str]]
    distinct_lists: list[list[str]]  # W3d: no key in two lists, none twice
    work: Path
    budget: str
    refmount_args: list[str]
    find_refs: Path
    find_files: int
    stock_pyfuse3: str | None = None  # a stock pyfuse3 build for refmount.stock
    zarr_refs: Path | None = None  # W3z: the Zarr array of zlib chunks
    zarr_lists: list[list[str]] = field(default_factory=list)  # W3z: distinct_lists' chunks
    zarr_stored: int = 0  # W3z: compressed bytes of the chunks its readers read
    #: Over other protocols: (reference set, base URL of the data) by protocol.
    protocol_refs: dict[str, tuple[Path, str]] = field(default_factory=dict)
    ca: Path | None = None  # the CA of nginx's TLS certificate
    wire: WireLog | None = None  # nginx's log of what each request spoke
    meter: CpuMeter | None = None  # CPU of the readers and of nginx, row by row


@dataclass
class Result:
    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # the daemon's CPU seconds, FUSE systems
    #: Of ``cpu``, its child processes' (the decode workers).
    child_cpu: list[float] = field(default_factory=list)
    #: What each round spoke to nginx (:class:`WireLog`).
    wire: list[str] = field(default_factory=list)
    #: Each round's CPU seconds on the machine's side of the row (:class:`CpuMeter`).
    machine: list[dict[str, float]] = field(default_factory=list)
    error: str | None = None

    def median(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    def median_cpu(self) -> float | None:
        return statistics.median(self.cpu) if self.cpu else None

    def median_child_cpu(self) -> float | None:
        return statistics.median(self.child_cpu) if self.child_cpu else None


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, every thread) of ``pid`` and its descendants, living
    and reaped: the daemon's CPU, steadier than rates on a shared machine."""
    return sum(tree_cpu_split(pid))


def own_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, every thread) of ``pid`` alone, not its children."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid`` and its descendants, living and reaped."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            text = Path(f"/proc/{entry}/stat").read_text()
            fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
            stats[int(entry)] = fields
            children.setdefault(int(fields[1]), []).append(int(entry))
    user = system = 0
    todo = [pid]
    while todo:
        one = todo.pop()
        fields = stats.get(one)
        if fields is not None:  # utime stime cutime cstime: fields 14-17 of stat(5)
            user += int(fields[11]) + int(fields[13])
            system += int(fields[12]) + int(fields[14])
        todo.extend(children.get(one, ()))
    return user / CLOCK_TICKS, system / CLOCK_TICKS


# -- data -------------------------------------------------------------------------------


def write_random(path: Path, size: int, seed: int) -> None:
    """A file of ``size`` pseudo-random bytes, kept if it already has that size."""
    if path.exists() and path.stat().st_size == size:
        return
    rng = random.Random(seed)
    with open(path, "wb") as out:
        left = size
        while left:
            n = min(left, 8 * MiB)
            out.write(rng.randbytes(n))
            left -= n


def data_dir(work: Path, sizes: Sizes) -> Path:
    data = work / f"data-{sizes.big}-{sizes.chunks}"
    data.mkdir(parents=True, exist_ok=True)
    write_random(data / "big.bin", sizes.big, 1)
    write_random(data / "chunks.bin", sizes.chunks * CHUNK, 2)
    return data


def find_set(work: Path, keys: int) -> tuple[Path, int]:
    """``bench/scale.py``'s JSON set of ``keys`` chunk keys, built once per size."""
    path = work / f"find-{keys}.json"
    marker = path.with_suffix(".files")
    if not (path.exists() and marker.exists()):
        marker.write_text(str(build_json(path, keys)))
    return path, int(marker.read_text())


def write_chunk_refs(path: Path, url: str, sizes: Sizes) -> tuple[dict[str, Any], list[str]]:
    """The workloads' reference set at ``path``: ``big`` (W1's range) and one key per
    chunk of ``chunks.bin``, all served from ``url``; returns the refs and chunk keys."""
    keys = [f"c/{k:05d}" for k in range(sizes.chunks)]
    refs: dict[str, Any] = {"big": [f"{url}/big.bin", 0, sizes.big]}
    for k, key in enumerate(keys):
        refs[key] = [f"{url}/chunks.bin", k * CHUNK, CHUNK]
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return refs, keys


def build(work: Path, sizes: Sizes, data: Path, url: str, args: argparse.Namespace) -> Setup:
    refs_path = work / "refs.json"
    refs, keys = write_chunk_refs(refs_path, url, sizes)
    rng = random.Random(3)
    random_lists = [
        [keys[rng.randrange(len(keys))] for _ in range(sizes.random_files)]
        for _ in range(RANDOM_READERS)
    ]
    picked = rng.sample(keys, sizes.distinct_files)
    share = sizes.distinct_files // RANDOM_READERS
    distinct_lists = [picked[n * share : (n + 1) * share] for n in range(RANDOM_READERS)]
    find_refs, find_files = find_set(work, sizes.find_keys)
    setup = Setup(
        sizes, data, refs_path, refs, url, keys, random_lists, distinct_lists, work,
        args.cache_size, args.refmount_args.split(), find_refs, find_files, args.stock_pyfuse3,
    )  # fmt: skip
    if args.workloads is None or "W3z" in args.workloads:
        extents = zarr_chunks.write_chunks(data, sizes.chunks)
        setup.zarr_refs = work / "zarr-refs.json"
        zarr_keys = zarr_chunks.write_refs(setup.zarr_refs, url, extents)
        indices = [[int(key[2:]) for key in files] for files in distinct_lists]
        setup.zarr_lists = [[zarr_keys[k] for k in files] for files in indices]
        setup.zarr_stored = sum(extents[k][1] for files in indices for k in files)
    return setup


def workload_bytes(setup: Setup, workload: str) -> int:
    return bytes_of(setup.sizes.__dict__, workload)


def chunks_of(sizes: dict[str, int], workload: str) -> int:
    """Chunk files a workload reads (W1 reads one big file: none)."""
    workload = base(workload)
    if workload == "W3":
        return RANDOM_READERS * sizes["random_files"]
    if workload in DISTINCT:
        return sizes["distinct_files"] // RANDOM_READERS * RANDOM_READERS
    return sizes["chunks"] if workload in ("W2", "W2c", "W4") else 0


def bytes_of(sizes: dict[str, int], workload: str) -> int:
    return sizes["big"] if base(workload) == "W1" else chunks_of(sizes, workload) * CHUNK


def cpu_cell(sizes: dict[str, int], workload: str, cpu: float | None) -> str:
    """The daemon's CPU for a workload: seconds per GB, and ms per chunk file."""
    if cpu is None:
        return "-"
    if workload == "find":
        return f"{cpu:.2f} s"
    cell = f"{cpu / (bytes_of(sizes, workload) / 1e9):.2f} s/GB"
    if chunks := chunks_of(sizes, workload):
        cell += f", {cpu / chunks * 1000:.2f} ms/chunk"
    return cell


# -- in-process systems -----------------------------------------------------------------


def start_meter(setup: Setup) -> None:
    if setup.meter is not None:
        setup.meter.start()


#: The kernel reports free memory to a virtio balloon that asks for it after 2 s (its
#: ``PAGE_REPORTING_DELAY``), and the host takes it back: a page touched again then costs
#: a fault on the host too.  Waiting this long after a drop lets every cold row start
#: from the same memory (see :func:`drop_caches`).
REPORTING_SETTLE = 3.0
#: The virtio device id of a memory balloon, and its feature bit of free page reporting.
_BALLOON_DEVICE = "0x0005"
_F_REPORTING = 5
VIRTIO_DEVICES = Path("/sys/bus/virtio/devices")


def page_reporting(devices: Path = VIRTIO_DEVICES) -> bool:
    """Whether this machine's free memory is reported to its host (a virtio balloon with
    ``VIRTIO_BALLOON_F_REPORTING``; sysfs shows a device's features as a string of bits,
    bit 0 first)."""
    for device in devices.glob("*"):
        with contextlib.suppress(OSError):
            if (device / "device").read_text().strip() == _BALLOON_DEVICE:
                features = (device / "features").read_text().strip()
                if len(features) > _F_REPORTING and features[_F_REPORTING] == "1":
                    return True
    return False


def drop_caches() -> None:
    """Empty the kernel's page cache (the server's files too), as after a reboot.

    On a VM whose free memory goes back to the host (:func:`page_reporting`), the pages
    freed here are still the guest's for 2 s: a read that starts at once lands partly
    in them and partly in pages the host took back, and a cold 1 GB read goes at
    0.55-0.95 or at 2.0-2.2 GB/s by the luck of it (``dd`` of the same file, ten drops in
    a row, bench/README.md).  Waiting until the freed pages are reported puts every row,
    of every system, in the slower case alike."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    if page_reporting():
        time.sleep(REPORTING_SETTLE)


def server_files_as_the_row_needs(setup: Setup, row: str) -> None:
    """A cold row starts with the page cache dropped; any other with the file it reads
    from the server in it (read once here), whatever ran before: the limit's W1 read
    ``big.bin`` from the disk in a run's first round (146-152 MB/s, against 1,034-1,282
    in the second) and from memory after, and the mounts' rows as it happened."""
    if cold(row):
        drop_caches()
    elif base(row) != "find":  # a listing reads nothing from the server
        name = "big.bin" if base(row) == "W1" else "chunks.bin"
        with open(setup.data / name, "rb") as file:
            while file.read(PART):
                pass


def run_limit(setup: Setup, workload: str) -> float:
    """fsspec's HTTP filesystem with refmount's parallelism (obstore for the cold
    workloads, and for every workload over another protocol); bytes are counted, dropped."""
    if cold(workload) or protocol(workload) != "http":
        return run_obstore_limit(setup, workload)
    import fsspec
    import fsspec.asyn

    fs = fsspec.filesystem("http", skip_instance_cache=True)
    server_files_as_the_row_needs(setup, workload)
    start_meter(setup)
    if workload == "W3":
        ranges = [
            (f"{setup.url}/chunks.bin", int(key[2:]) * CHUNK)
            for files in setup.random_lists
            for key in files
        ]
        parallel, size = RANDOM_READERS, CHUNK
    else:
        name, total = ("big.bin", setup.sizes.big) if workload == "W1" else ("chunks.bin", 0)
        total = total or setup.sizes.chunks * CHUNK
        ranges = [(f"{setup.url}/{name}", start) for start in range(0, total, PART)]
        parallel, size = SEQ_PARALLEL, PART

    async def fetch_all() -> int:
        gate = asyncio.Semaphore(parallel)

        async def one(url: str, start: int) -> int:
            async with gate:
                return len(await fs._cat_file(url, start=start, end=start + size))

        return sum(await asyncio.gather(*(one(url, start) for url, start in ranges)))

    began = time.perf_counter()
    got = fsspec.asyn.sync(fsspec.asyn.get_loop(), fetch_all)
    elapsed = time.perf_counter() - began
    check(got, workload_bytes(setup, workload))
    return elapsed


def obstore_store(setup: Setup, over: str) -> tuple[Any, str]:
    """An obstore store for the data over one protocol, and the prefix of its paths."""
    from obstore.store import HTTPStore, S3Store

    options: dict[str, Any] = {"allow_http": True}
    if setup.ca is not None:
        options["root_certificate"] = setup.ca.read_text()
    if over == "http":
        return HTTPStore.from_url(setup.url, client_options=options), ""
    base_url = setup.protocol_refs[over][1]
    if over == "https":
        return HTTPStore.from_url(base_url, client_options=options), ""
    config = {"endpoint": base_url, "access_key_id": S3_CREDENTIALS["key"],
              "secret_access_key": S3_CREDENTIALS["secret"], "region": "us-east-1"}  # fmt: skip
    return S3Store(S3_BUCKET, config=config, client_options=options), ""


def run_obstore_limit(setup: Setup, workload: str) -> float:
    """What one GET per range allows with no daemon in between, by obstore over the
    row's protocol: W3d one ``get_range_async`` per chunk, 16 in flight; W2c one GET of
    all chunks as one stream; W1 8 MiB ranges of ``big``, 8 in flight."""
    import obstore

    store, _ = obstore_store(setup, protocol(workload))
    server_files_as_the_row_needs(setup, workload)
    start_meter(setup)
    began = time.perf_counter()
    if base(workload) == "W2c":
        got = sum(len(piece) for piece in obstore.get(store, "chunks.bin").stream())
    else:
        if base(workload) == "W1":
            name, size, parallel = "big.bin", PART, SEQ_PARALLEL
            starts = list(range(0, setup.sizes.big, PART))
        else:
            name, size, parallel = "chunks.bin", CHUNK, RANDOM_READERS
            starts = [int(key[2:]) * CHUNK for files in setup.distinct_lists for key in files]

        async def fetch_all() -> int:
            gate = asyncio.Semaphore(parallel)

            async def one(start: int) -> int:
                async with gate:
                    data = await obstore.get_range_async(store, name, start=start, length=size)
                    return len(data)

            return sum(await asyncio.gather(*(one(start) for start in starts)))

        got = asyncio.run(fetch_all())
    elapsed = time.perf_counter() - began
    check(got, workload_bytes(setup, workload))
    return elapsed


def run_fsspec(setup: Setup, workload: str) -> float:
    """fsspec's ReferenceFileSystem in-process, as a Python reader would use it."""
    import fsspec

    fs = fsspec.filesystem(
        "reference", fo={"version": 1, "refs": setup.refs}, skip_instance_cache=True
    )
    server_files_as_the_row_needs(setup, workload)
    began = time.perf_counter()
    if workload == "W1":
        got = len(fs.cat_file("big"))
    elif workload in ("W3", "W3d"):

        def reader(files: list[str]) -> int:
            return sum(len(fs.cat_file(key)) for key in files)

        lists = setup.random_lists if workload == "W3" else setup.distinct_lists
        with ThreadPoolExecutor(RANDOM_READERS) as pool:
            got = sum(pool.map(reader, lists))
    else:
        got = sum(len(v) for v in fs.cat(setup.keys).values())
    elapsed = time.perf_counter() - began
    check(got, workload_bytes(setup, workload))
    return elapsed


FSSPEC_FIND = """
import json, sys, time
import fsspec
fs = fsspec.filesystem("reference", fo=sys.argv[1], remote_protocol="s3",
                       remote_options={"anon": True}, skip_instance_cache=True)
t = time.perf_counter()
files = len(fs.find(""))
print(json.dumps({"seconds": time.perf_counter() - t, "files": files}))
"""


def run_fsspec_find(setup: Setup) -> float:
    """``fs.find("")`` on the loaded set, in a fresh interpreter (not its load)."""
    done = subprocess.run(
        [sys.executable, "-c", FSSPEC_FIND, str(setup.find_refs)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip()[-500:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    check(result["files"], setup.find_files, "files")
    return float(result["seconds"])


def check(got: int, want: int, unit: str = "bytes") -> None:
    if got != want:
        raise RuntimeError(f"read {got} {unit}, expected {want}")


# -- mounts -----------------------------------------------------------------------------


@contextlib.contextmanager
def refmount_mount(
    setup: Setup, refs: Path, mountpoint: Path, name: str, extra: list[str]
) -> Iterator[int]:
    prefix = ["taskset", "-c", "0"] if name == "refmount.1cpu" else []
    command = STOCK_PYFUSE3 if name == "refmount.stock" else REFMOUNT
    if name == "refmount.obstore":
        extra = [*extra, "--fetch-backend", "obstore"]
    if "s3" in setup.protocol_refs:
        options = {"s3": {"endpoint_url": setup.protocol_refs["s3"][1], **S3_CREDENTIALS}}
        if name == "refmount.process":
            prefix = ["env", f"AWS_CONFIG_FILE={process_profile(setup.work)}"]
            del options["s3"]["key"], options["s3"]["secret"]
            options["s3"]["profile"] = "bench"
        extra = [*extra, "--remote-options", json.dumps(options)]
    if name == "refmount.stock" and setup.stock_pyfuse3:
        # A real stock build first on the daemon's path (what `pip install` gives).
        path = os.pathsep.join([str(Path(setup.stock_pyfuse3).resolve()), str(REPO)])
        prefix = ["env", f"PYTHONPATH={path}"]
    args = ["--cache-size", setup.budget, *setup.refmount_args, *extra]
    log_path = setup.work / f"{name}.log"
    with Mounted(
        refs, mountpoint, args, log_path, prefix=prefix, command=command, timeout=MOUNT_TIMEOUT
    ) as mounted:
        yield mounted.pid


def process_profile(work: Path) -> Path:
    """An AWS config file whose profile ``bench`` gets its credentials from
    :data:`CREDENTIAL_PROCESS` (nginx ignores the signature: the row measures the
    client's side of temporary credentials)."""
    script, config = work / "credential_process.py", work / "aws-config"
    script.write_text(CREDENTIAL_PROCESS)
    command = shlex.join([sys.executable, str(script)])
    config.write_text(f"[profile bench]\ncredential_process = {command}\n")
    return config


# fsspec.fuse prefixes every path with root + "/", and reference keys have no leading "/":
# its root must be "" for keys to be found.
FSSPEC_FUSE = """
import sys, fsspec, fsspec.fuse

class Rootless(fsspec.fuse.FUSEr):
    def __init__(self, fs, path, ready_file=False):
        super().__init__(fs, path, ready_file)
        self.root = ""

fs = fsspec.filesystem("reference", fo=sys.argv[1])
fsspec.fuse.run(fs, "", sys.argv[2], foreground=True, threads=True, ops_class=Rootless)
"""


@contextlib.contextmanager
def fsspec_fuse_mount(setup: Setup, refs: Path, mountpoint: Path) -> Iterator[int]:
    argv = [sys.executable, "-c", FSSPEC_FUSE, str(refs), str(mountpoint)]
    with open(setup.work / "fsspec-fuse.log", "ab") as logfile:
        proc = subprocess.Popen(argv, stdout=logfile, stderr=logfile, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + MOUNT_TIMEOUT
            while not os.path.ismount(mountpoint):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fsspec.fuse did not mount (status {proc.poll()})")
                time.sleep(0.05)
            yield proc.pid
        finally:
            unmount(mountpoint)
            stop_process(proc, grace=10.0)


def fsspec_fuse_available() -> str | None:
    """None if the fsspec.fuse peer can run here, or why not."""
    probe = subprocess.run(
        [sys.executable, "-c", "import fuse, fsspec.fuse"], capture_output=True, timeout=60
    )
    if probe.returncode != 0:
        return "fusepy/libfuse2 missing (pip install fusepy; apt-get install libfuse2)"
    return None


Mounter = Callable[[Path, Path, list[str]], contextlib.AbstractContextManager]


def mounter(name: str, setup: Setup) -> Mounter:
    if name == "fsspec.fuse":
        return lambda refs, mnt, extra: fsspec_fuse_mount(setup, refs, mnt)
    return lambda refs, mnt, extra: refmount_mount(setup, refs, mnt, name, extra)


def wait_idle(pid: int, quiet: float = 0.5, timeout: float = 60.0) -> None:
    """Wait until the daemon's process tree spends no CPU for ``quiet`` seconds: the
    decode workers it starts at mount have loaded their libraries (not the workload's)."""
    deadline = time.monotonic() + timeout
    last = tree_cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = tree_cpu_seconds(pid)
        if now - last < 0.02:
            return
        last = now
    log.warning("the daemon %d was still busy %g s after mounting", pid, timeout)


def run_commands(root: Path, setup: Setup, workload: str) -> float:
    """The shell side of a workload over a directory; returns wall seconds."""
    began = time.perf_counter()
    if base(workload) == "W1":
        argv = ["dd", f"if={root / 'big'}", "of=/dev/null", "bs=1M"]
        done = subprocess.run(argv, capture_output=True, timeout=RUN_TIMEOUT)
        if done.returncode:
            raise RuntimeError(f"dd failed: {done.stderr.decode(errors='replace').strip()}")
    elif base(workload) in ("W3", *DISTINCT):
        procs: list[subprocess.Popen[bytes]] = []
        lists = {"W3": setup.random_lists, "W3d": setup.distinct_lists}.get(
            base(workload), setup.zarr_lists
        )
        try:
            for files in lists:
                procs.append(subprocess.Popen(["cat", *files], cwd=root, stdout=subprocess.DEVNULL))
            codes = [p.wait(RUN_TIMEOUT) for p in procs]
        finally:
            for p in procs:
                stop_process(p)
        if any(codes):
            raise RuntimeError(f"cat exited with {codes}")
    elif workload == "find":
        done = subprocess.run(
            f"find {root} -type f | wc -l", shell=True, capture_output=True, text=True,
            timeout=RUN_TIMEOUT, env={**os.environ, "LC_ALL": "C"},
        )  # fmt: skip
        check(int(done.stdout.strip() or 0), setup.find_files, "files")
    else:
        subprocess.run(
            ["cat", *setup.keys], cwd=root, stdout=subprocess.DEVNULL, check=True,
            timeout=RUN_TIMEOUT,
        )  # fmt: skip
    return time.perf_counter() - began


# -- the run ----------------------------------------------------------------------------

Results = dict[str, dict[str, Result]]


def record(
    results: Results,
    name: str,
    workload: str,
    seconds: float,
    setup: Setup,
    cpu: float | None = None,
    child_cpu: float | None = None,
) -> None:
    results[name][workload].seconds.append(seconds)
    if setup.meter is not None and (machine := setup.meter.take()) is not None:
        if cpu is not None:
            machine["own"] = cpu  # the client is the daemon, not this process
        results[name][workload].machine.append(machine)
    if setup.wire is not None:
        results[name][workload].wire.append(setup.wire.take())
    shown = ""
    if cpu is not None:
        results[name][workload].cpu.append(cpu)
        shown = f", daemon CPU {cpu:.2f} s ({cpu_cell(setup.sizes.__dict__, workload, cpu)})"
    if child_cpu is not None:
        results[name][workload].child_cpu.append(child_cpu)
        if child_cpu >= 0.01:
            shown += f", of which child processes {child_cpu:.2f} s"
    if workload in ("W3z", DECODED):
        stored = setup.zarr_stored / seconds / 1e6
        shown += f"; {stored:.1f} MB/s of compressed bytes"
    if workload == "find":
        log.info("%-13s %-4s %8.2f s%s", name, workload, seconds, shown)
    else:
        log.info("%-13s %-4s %8.1f MB/s%s", name, workload, rate(setup, workload, seconds), shown)


def measure_fuse(
    name: str, setup: Setup, results: Results, rss: dict[str, int], workloads: list[str]
) -> None:
    """Each group of workloads on a fresh mount; W4 follows W2 on the same one, and
    W3z's two views are two mounts of the Zarr set (the second with ``--decode``)."""
    mount = mounter(name, setup)
    if name == "refmount.process":  # refmount with credentials from a credential_process
        workloads = [w for w in workloads if protocol(w) == "s3"]
    groups = [("W1",), ("W2", "W4"), ("W2c",), ("W3",), ("W3d",)]
    groups = [tuple(w for w in g if w in workloads) for g in groups]
    plan: list[tuple[Path, tuple[str, ...], list[str]]] = [
        (setup.refs_path, g, []) for g in groups if g
    ]
    if "W3z" in workloads and setup.zarr_refs and name != "fsspec.fuse":  # no decoded view
        plan += [(setup.zarr_refs, ("W3z",), []), (setup.zarr_refs, (DECODED,), ["--decode"])]
    if "find" in workloads and name != "fsspec.fuse":  # 1M LOOKUPs through fusepy: hours
        plan.append((setup.find_refs, ("find",), []))
    for over, (refs_path, _) in setup.protocol_refs.items():
        plan += [(refs_path, (row,), []) for row in workloads if protocol(row) == over]
    mountpoint = Path(tempfile.mkdtemp(prefix=f"mnt-{name}-", dir=setup.work))
    try:
        for refs, group, extra in plan:
            with mount(refs, mountpoint, extra) as pid:
                sampler = RssSampler(pid)
                try:
                    if extra:
                        wait_idle(pid)
                    for workload in group:
                        server_files_as_the_row_needs(setup, workload)
                        cpu_before, own_before = tree_cpu_seconds(pid), own_cpu_seconds(pid)
                        start_meter(setup)
                        seconds = run_commands(mountpoint, setup, workload)
                        cpu = tree_cpu_seconds(pid) - cpu_before
                        helpers = max(0.0, cpu - (own_cpu_seconds(pid) - own_before))
                        record(results, name, workload, seconds, setup, cpu, helpers)
                finally:
                    # The find set's peak is its 1M-key load, not reading: kept apart.
                    label = f"{name} (find set: load + find)" if group == ("find",) else name
                    rss[label] = max(rss.get(label, 0), sampler.close())
    finally:
        unmount(mountpoint)
        shutil.rmtree(mountpoint, ignore_errors=True)


def measure_inprocess(name: str, setup: Setup, results: Results, workloads: list[str]) -> None:
    runner = run_limit if name == "limit" else run_fsspec
    for workload in workloads:
        if workload == "W3z":  # the views of refmount's mount only
            continue
        if protocol(workload) != "http" and name != "limit":  # the limit alone
            continue
        if workload == "find":
            if name == "fsspec":
                record(results, name, workload, run_fsspec_find(setup), setup)
            continue
        record(results, name, workload, runner(setup, workload), setup)


def measure_tmpfs(setup: Setup, results: Results, workloads: list[str]) -> None:
    """The same chunk files, and the find set's keys, as plain files on tmpfs."""
    if not is_tmpfs(TMPFS_ROOT):
        raise RuntimeError(f"{TMPFS_ROOT} is not a tmpfs mount")
    root = Path(tempfile.mkdtemp(prefix="refmount-bench-", dir=TMPFS_ROOT))
    try:
        if "W2" in workloads or "W4" in workloads:
            (root / "c").mkdir()
            with open(setup.data / "chunks.bin", "rb") as chunks:
                for key in setup.keys:
                    (root / key).write_bytes(chunks.read(CHUNK))
            for workload in ("W2", "W4"):
                if workload in workloads:
                    record(results, "tmpfs", workload, run_commands(root, setup, workload), setup)
            shutil.rmtree(root / "c")
        if "find" in workloads:
            plant_keys(root, setup.find_refs)
            record(results, "tmpfs", "find", run_commands(root, setup, "find"), setup)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def plant_keys(root: Path, refs: Path) -> None:
    """An empty file for every key of a version-0 JSON set, under ``root``."""
    keys = json.loads(refs.read_text())
    made: set[str] = set()
    for key in keys:
        parent = os.path.dirname(key)
        if parent not in made:
            os.makedirs(root / parent, exist_ok=True)
            made.add(parent)
        os.close(os.open(root / key, os.O_CREAT | os.O_WRONLY, 0o644))


def is_tmpfs(path: Path) -> bool:
    with open("/proc/self/mounts") as mounts:
        return any(
            fields[1] == str(path) and fields[2] == "tmpfs"
            for fields in (line.split() for line in mounts)
        )


def rate(setup: Setup, workload: str, seconds: float) -> float:
    return workload_bytes(setup, workload) / seconds / 1e6


@contextlib.contextmanager
def data_server(
    kind: str,
    root: Path,
    delay: float,
    certificates: Certificates | None = None,
    wire_log: Path | None = None,
) -> Iterator[NginxServer]:
    if kind != "nginx":
        if certificates is not None:
            raise RuntimeError("https:// and s3:// are measured against nginx only")
        server: Any = RangeServer(root, delay=delay)
    else:
        server = NginxServer(root, delay=delay, tls=certificates, wire_log=wire_log)
    with server:
        yield server


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = Sizes.pick(args.quick)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    systems = [s for s in (args.only or SYSTEMS) if s not in args.skip]
    chosen = [w for w in (args.workloads or WORKLOADS)]
    workloads = chosen if "http" in args.protocols else []
    workloads += [
        f"{w}@{p}" for p in args.protocols if p != "http" for w in PROTOCOL_WORKLOADS if w in chosen
    ]
    notes = []
    if not args.no_fusectl and any(s in FUSE_SYSTEMS for s in systems):
        mounted = mount_fusectl(CONNECTIONS_ROOT)
        notes.append("fusectl mounted" if mounted else "fusectl NOT mounted: kernel defaults")
    if "fsspec.fuse" in systems and (why := fsspec_fuse_available()):
        notes.append(f"fsspec.fuse skipped: {why}")
        systems.remove("fsspec.fuse")
    if args.note:
        notes.append(args.note)
    results: Results = {s: {w: Result() for w in ROWS} for s in SYSTEMS}
    rss: dict[str, int] = {}
    data = data_dir(work, sizes)
    certificates = None
    if set(args.protocols) - {"http"}:
        certificates = make_certificates(work / "tls", "refmount bench CA")
        # Trusted as a user trusts a lab's CA: the daemon reads SSL_CERT_FILE.
        os.environ["SSL_CERT_FILE"] = str(certificates.ca)
        notes.append("https:// and s3:// over nginx's TLS, its CA trusted by SSL_CERT_FILE")
        bucket = data / S3_BUCKET
        if not bucket.is_symlink():
            bucket.symlink_to(".")  # path-style s3 GETs: /bucket/chunks.bin
    wire_log = work / "nginx-wire.log"
    wire_log.unlink(missing_ok=True)
    with data_server(args.server, data, args.delay, certificates, wire_log) as server:
        setup = build(work, sizes, data, server.url, args)
        setup.ca = certificates.ca if certificates else None
        setup.meter = CpuMeter(getattr(server, "pid", None))
        if args.server == "nginx":
            setup.wire = WireLog(wire_log)
            setup.wire.take()  # nginx's start and the set's build
        for over in args.protocols:
            if over != "http":
                url = server.https_url
                data_url = url if over == "https" else f"s3://{S3_BUCKET}"
                refs_path = work / f"refs-{over}.json"
                write_chunk_refs(refs_path, data_url, sizes)
                setup.protocol_refs[over] = (refs_path, url)
        log.info("data in %s, served by %s at %s, %g s per request", data, args.server,
                 server.url, args.delay)  # fmt: skip
        for repeat in range(args.repeat):
            log.info("round %d of %d", repeat + 1, args.repeat)
            for name in systems:
                try:
                    if name in ("limit", "fsspec"):
                        measure_inprocess(name, setup, results, workloads)
                    elif name == "tmpfs":
                        measure_tmpfs(setup, results, workloads)
                    else:
                        measure_fuse(name, setup, results, rss, workloads)
                except Exception as exc:
                    log.error("%s failed: %s", name, exc)
                    for result in results[name].values():
                        result.error = result.error or str(exc)[:500]
    figures: dict[str, dict[str, float | None]] = {}
    daemon_cpu = {s: {w: r.median_cpu() for w, r in results[s].items()} for s in SYSTEMS}
    child_cpu = {s: {w: r.median_child_cpu() for w, r in results[s].items()} for s in SYSTEMS}
    for s in SYSTEMS:
        figures[s] = {}
        for w, r in results[s].items():
            seconds = r.median()
            if seconds is None or w == "find":
                figures[s][w] = seconds
            else:
                figures[s][w] = workload_bytes(setup, w) / seconds / 1e6
    return {
        "command": " ".join(["python", "bench/throughput.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "server": args.server,
        "delay": args.delay,
        "quick": args.quick,
        "sizes": sizes.__dict__,
        "budget": args.cache_size,
        "budget_bytes": parse_size(args.cache_size),
        "refmount_args": args.refmount_args,
        "systems": systems,
        "workloads": workloads,
        "protocols": args.protocols,
        "rows": [row for w in workloads for row in ((w, DECODED) if w == "W3z" else (w,))],
        "notes": notes,
        "figures": figures,
        "daemon_cpu_seconds": daemon_cpu,
        "child_cpu_seconds": child_cpu,
        "zarr": {
            "stored_bytes": setup.zarr_stored,
            "decoded_bytes": workload_bytes(setup, "W3z") if setup.zarr_stored else 0,
        },
        "errors": {s: {w: r.error for w, r in results[s].items() if r.error} for s in SYSTEMS},
        "wire": {s: {w: r.wire for w, r in results[s].items() if r.wire} for s in SYSTEMS},
        "machine_cpu_seconds": {
            s: {w: _median_sides(r.machine) for w, r in results[s].items() if r.machine}
            for s in SYSTEMS
        },
        "peak_rss_mib": {s: kib / 1024 for s, kib in rss.items()},
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "load": os.getloadavg()[0],
        },
    }


def _median_sides(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {side: statistics.median(r[side] for r in rounds) for side in rounds[0]}


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


# -- report -----------------------------------------------------------------------------

# Issue 15's targets: (workload, peer system, peer workload, ratio refmount/peer at least);
# the limit's W3 is one GET per chunk, 16 in flight.
TARGETS: dict[str, tuple[str, str, float | None]] = {
    "W1": ("limit", "W1", 0.6),
    "W2": ("limit", "W1", 0.5),
    "W2c": ("limit", "W2c", None),  # issue 22 reports it against one stream, sets no target
    "W3": ("limit", "W3", 0.9),
    "W3d": ("limit", "W3d", 0.9),  # issue 22: the limit is one obstore GET per chunk
    DECODED: ("refmount", "W3z", 0.7),  # issue 22: the decoded view against the raw view's
    "W4": ("tmpfs", "W4", 0.6),
}
#: Daemon CPU per chunk file at most, in ms (issues 15 and 22; issue 28: W3d over
#: https:// and s3:// at most 0.6, over http:// no step back from 0.5).
CPU_MS_PER_CHUNK = {"W3": 0.5, "W3d": 0.5, "W3d@https": 0.6, "W3d@s3": 0.6}
FIND_SECONDS_PER_MILLION = 5.0


def title(row: str, sizes: dict[str, int]) -> str:
    workload = base(row)
    over = f" over {protocol(row)}://" if "@" in row else ""
    return {
        "W1": f"dd {sizes['big'] // MiB} MiB",
        "W2": f"cat {sizes['chunks']} chunks",
        "W2c": "W2, page cache dropped",
        "W3": f"{RANDOM_READERS} random readers",
        "W3d": f"{RANDOM_READERS} readers, {sizes.get('distinct_files', 0)} distinct chunks, cold",
        "W3z": "W3d over zlib chunks of a Zarr array, raw view",
        DECODED: "W3z through the decoded view (--decode)",
        "W4": "W2 warm",
        "find": f"{sizes['find_keys']:,} keys",
    }[workload] + over


def fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def target_cell(report: dict[str, Any], system: str, workload: str) -> str:
    figures = report["figures"]
    ours = figures[system][workload]
    if ours is None:
        return "-"
    if workload == "find":
        limit = FIND_SECONDS_PER_MILLION * report["sizes"]["find_keys"] / 1e6
        return f"≤ {limit:g} s: {'met' if ours <= limit else 'MISSED'}"
    if base(workload) not in TARGETS:
        return "-"
    peer, peer_workload, want = TARGETS[base(workload)]
    if protocol(workload) != "http":
        peer_workload = f"{peer_workload}@{protocol(workload)}"
    theirs = figures[peer][peer_workload]
    if not theirs:
        return "-"
    ratio = ours / theirs
    if want is None:
        cell = f"{ratio:.2f} of {peer} {peer_workload}"
    else:
        verdict = "met" if ratio >= want else "MISSED"
        cell = f"{ratio:.2f} of {peer} {peer_workload} (≥ {want:g}): {verdict}"
    cpu = report["daemon_cpu_seconds"][system][workload]
    most = CPU_MS_PER_CHUNK.get(workload, CPU_MS_PER_CHUNK.get(base(workload)))
    if most is not None and cpu is not None:
        per_chunk = cpu / chunks_of(report["sizes"], workload) * 1000
        cell += f"; {per_chunk:.2f} ms CPU/chunk (≤ {most:g}): "
        cell += "met" if per_chunk <= most else "MISSED"
    return cell


def ratio(figures: dict[str, dict[str, float | None]], a: str, b: str, workload: str) -> str:
    """``a`` over ``b`` as a speed-up (for find, in seconds, ``b`` over ``a``)."""
    x, y = figures[a][workload], figures[b][workload]
    if not x or not y:
        return "-"
    return f"{(y / x if workload == 'find' else x / y):.2f}"


def markdown(report: dict[str, Any]) -> str:
    figures, systems = report["figures"], [s for s in SYSTEMS if s in report["systems"]]
    lines = [
        f"`{report['command']}`, {report['date']}: {report['server']} on 127.0.0.1 with "
        f"{report['delay'] * 1000:g} ms per request; refmount --cache-size {report['budget']}"
        + (f" {report['refmount_args']}" if report["refmount_args"] else "")
        + f"; {report['machine']['cpus']} CPUs, load {report['machine']['load']:.1f} at the end"
        + (" (quick sizes)" if report["quick"] else ""),
        "",
        "| workload | "
        + " | ".join(systems)
        + " | refmount target | 1 cpu / 2 | patched / stock |",
        "|---" * (len(systems) + 4) + "|",
    ]
    for w in report["rows"]:
        spec = ".2f" if w == "find" else ".0f"
        unit = " (s)" if w == "find" else ""
        row = [f"{w} {title(w, report['sizes'])}{unit}"] + [
            fmt(figures[s][w], spec) for s in systems
        ]
        row.append(target_cell(report, "refmount", w))
        row.append(ratio(figures, "refmount.1cpu", "refmount", w))
        row.append(ratio(figures, "refmount", "refmount.stock", w))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "MB/s (10^6 bytes per second) of useful bytes, median of rounds; find in s."]
    lines += zarr_lines(report, systems)
    fuse = [s for s in systems if s in FUSE_SYSTEMS]
    if fuse:
        lines += [
            "",
            "The daemon's CPU (user + system, all threads and child processes), median of rounds:",
            "",
            "| workload | " + " | ".join(fuse) + " |",
            "|---" * (len(fuse) + 1) + "|",
        ]
        cpu, child_cpu = report["daemon_cpu_seconds"], report["child_cpu_seconds"]
        for w in report["rows"]:
            cells = [cpu_cell(report["sizes"], w, cpu[s][w]) for s in fuse]
            for n, s in enumerate(fuse):
                if (child_cpu[s][w] or 0) >= 0.01 and (chunks := chunks_of(report["sizes"], w)):
                    cells[n] += f" (child processes {child_cpu[s][w] / chunks * 1000:.2f})"
            lines.append(f"| {w} | " + " | ".join(cells) + " |")
        lines.append("")
    allowed = (report["budget_bytes"] + RSS_ALLOWANCE) / MiB
    for name, mib in report["peak_rss_mib"].items():
        if name.startswith("refmount") and "find set" not in name:
            verdict = "met" if mib <= allowed else "MISSED"
            target = f" (budget + 150 MB = {allowed:.0f} MiB: {verdict})"
        else:
            target = ""
        lines.append(f"Peak RSS of the {name} daemon: {mib:.0f} MiB{target}.")
    lines += machine_lines(report, systems)
    lines += [f"Note: {note}." for note in report["notes"]]
    lines += wire_lines(report, systems)
    for name, errors in report["errors"].items():
        lines += [f"Error: {name} {w}: {error}" for w, error in errors.items()]
    return "\n".join(lines) + "\n"


def machine_lines(report: dict[str, Any], systems: list[str]) -> list[str]:
    """What a chunk costs the machine in each row: the client (the limit's process, or
    the daemon), the reader processes and the server, in ms, medians of rounds."""
    machine = report.get("machine_cpu_seconds", {})
    rows = []
    for w in report["rows"]:
        chunks = chunks_of(report["sizes"], w)
        for s in systems:
            sides = machine.get(s, {}).get(w)
            if chunks and sides:
                ms = {side: seconds / chunks * 1000 for side, seconds in sides.items()}
                total = sum(ms.values())
                rows.append(f"| {w} | {s} | {ms['own']:.2f} | {ms['readers']:.2f} | "
                            f"{ms['server']:.2f} | {total:.2f} |")  # fmt: skip
    if not rows:
        return []
    return [
        "",
        "CPU per chunk file on the machine (ms, medians of rounds; the server's and the "
        "readers' compete with the client for the same cores):",
        "",
        "| workload | system | client (its process, or the daemon) | readers | server | all |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def wire_lines(report: dict[str, Any], systems: list[str]) -> list[str]:
    """What each row spoke to nginx, round by round (from its wire log)."""
    wire = report.get("wire", {})
    lines = []
    for w in report["rows"]:
        for s in systems:
            if rounds := wire.get(s, {}).get(w):
                lines.append(f"Wire: {s} {w}: " + " | ".join(rounds))
    return lines


def zarr_lines(report: dict[str, Any], systems: list[str]) -> list[str]:
    """What W3z's rates count, and the same rates in compressed bytes."""
    zarr = report["zarr"]
    if "W3z" not in report["workloads"] or not zarr["stored_bytes"]:
        return []
    shrink = zarr["decoded_bytes"] / zarr["stored_bytes"]
    rates = []
    for s in systems:
        for row, view in (("W3z", "raw"), (DECODED, "decoded")):
            value = report["figures"][s][row]
            if value is not None:
                rates.append(f"{s} {view} {value / shrink:.0f}")
    return [
        "",
        f"W3z: both views' MB/s count decoded bytes (256 KiB per chunk file read; the raw "
        f"view's files hold {zarr['stored_bytes'] / 1e6:.0f} MB of zlib for the "
        f"{zarr['decoded_bytes'] / 1e6:.0f} MB its readers read: ratio {shrink:.2f}). "
        "In compressed MB/s: " + ", ".join(rates) + ".",
    ]


def write_csv(report: dict[str, Any], path: Path) -> None:
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["workload", "system", "value", "unit", "server", "delay_s", "quick"])
        for s in report["systems"]:
            for w in report["rows"]:
                value = report["figures"][s][w]
                if value is not None:
                    unit = "s" if w == "find" else "MB/s"
                    writer.writerow([w, s, f"{value:.4g}", unit, report["server"],
                                     report["delay"], report["quick"]])  # fmt: skip


def raise_interrupt(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C: every ``finally`` unmounts and stops its server."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 MiB, 400 chunks, 100k keys")
    parser.add_argument("--server", choices=("nginx", "python"), default="nginx")
    parser.add_argument("--delay", type=float, default=0.01, help="seconds per request")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; medians are reported")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    parser.add_argument(
        "--workdir",
        default=str(Path(tempfile.gettempdir()) / "refmount-bench"),
        help="data, refs and mount points (data is kept for the next run)",
    )
    parser.add_argument("--cache-size", default="512M", help="refmount's --cache-size")
    parser.add_argument("--refmount-args", default="", help="more refmount options")
    parser.add_argument("--only", nargs="*", choices=SYSTEMS, help="these systems only")
    parser.add_argument("--skip", nargs="*", default=[], choices=SYSTEMS)
    parser.add_argument("--workloads", nargs="*", choices=WORKLOADS, help="these only")
    parser.add_argument(
        "--protocols",
        nargs="+",
        default=["http"],
        choices=PROTOCOLS,
        help="read the chunks over these (W1, W2c, W3d over https:// and s3://)",
    )
    parser.add_argument("--note", help="a note for the report, e.g. 'machine shared'")
    parser.add_argument(
        "--stock-pyfuse3",
        metavar="DIR",
        help="a stock pyfuse3 (pip install --target DIR --no-binary :all: pyfuse3==3.5.0) for "
        "refmount.stock; without it, refmount.stock hides the patch's features on the "
        "patched build (its faster request loop stays)",
    )
    parser.add_argument(
        "--no-fusectl", action="store_true", help="do not mount fusectl when it is missing"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    signal.signal(signal.SIGTERM, raise_interrupt)
    # Started in the background by a shell, SIGINT arrives ignored: make Ctrl-C count.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        report = run(args)
    except KeyboardInterrupt:
        log.error("interrupted: mounts undone, servers stopped")
        return 130
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(report)
    (out / "results.md").write_text(table)
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    write_csv(report, out / "results.csv")
    sys.stdout.write(table)
    sys.stdout.write(f"(written to {out})\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
