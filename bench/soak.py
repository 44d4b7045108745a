"""Soak: 16 readers for minutes against a store that fails on a schedule (issue 8).

    .venv/bin/python bench/soak.py [--minutes 3] [--readers 16] [--every 2] [--cache-size 64M]
                                   [--disk-cache DIR [--disk-cache-size 64M]] [--no-validators]

Serves generated files from tests/support/rangeserver.py on 127.0.0.1, mounts a JSON
reference set of ranges into them (and a few whole-file keys) with refmount in the
foreground, and runs reader threads that read random keys (whole, or a random slice) the
way ``cat`` does (a short read is followed by another, until the end or an error) and
compare every byte with the file on disk; a read that fails part way must have read right
bytes before its error.  Every ``--every`` seconds a fault rule is
added for a random file: error statuses, resets, stalls, short/long/truncated bodies,
ignored ranges, a 10 GiB body, an endless body, a gzip bomb, a wrong Content-Range.

Every ``--sample`` seconds it prints reads, bytes, errors by errno, wrong bytes, and the
daemon's RSS, peak RSS, threads and open descriptors.  Wrong bytes must stay 0; RSS,
threads and descriptors must stay flat.  The exit status is 1 when any byte was wrong or
the daemon died.  It unmounts and stops only the processes it started, by pid.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.servers import RangeServer

FILES = 16
RSS_ALLOWANCE = 150 * 10**6  # the daemon may hold its memory cache plus this
FILE_SIZE = 8 << 20
FAULTS = [  # (mode, how many requests it affects)
    ("503", 3), ("500", 2), ("429", 2), ("404", 4), ("403", 4), ("reset", 2),
    ("truncate", 2), ("short", 2), ("ignore-range", 2), ("stall", 2), ("huge", 2),
    ("endless", 2), ("gzip-bomb", 2), ("exact-200", 2), ("wrong-range", 2), ("long", 2),
]  # fmt: skip


@dataclass
class Tally:
    """What the readers saw, shared between their threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    reads: int = 0
    bytes: int = 0
    wrong_reads: int = 0
    wrong_bytes: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)  # the first few wrong reads, described

    def add(self, got: bytes, expected: bytes, err: int | None, where: str) -> None:
        """One read: ``got`` must equal ``expected`` (when the read ended with ``err``,
        ``expected`` is the right bytes up to where it failed)."""
        with self.lock:
            self.reads += 1
            self.bytes += len(got)
            if err is not None:
                self.errors[errno.errorcode.get(err, str(err))] += 1
            if got != expected:
                self.wrong_reads += 1
                differing = [
                    i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b
                ]
                self.wrong_bytes += len(differing) + abs(len(got) - len(expected))
                if len(self.wrong) < 10:
                    first = differing[0] if differing else None
                    self.wrong.append(
                        f"{where}: got {len(got)} bytes, expected "
                        f"{len(expected)}, first difference at {first}"
                    )


def build(work: Path) -> tuple[dict[str, object], dict[str, bytes]]:
    """Data files under work/root, and a reference set of ranges and whole files in them:
    the refs and each key's expected bytes."""
    root = work / "root"
    root.mkdir()
    rng = random.Random(8)
    refs: dict[str, object] = {}
    expected: dict[str, bytes] = {}
    for f in range(FILES):
        data = rng.randbytes(FILE_SIZE)
        (root / f"f{f}.bin").write_bytes(data)
        offset = 0
        while offset < FILE_SIZE:
            length = min(rng.choice([4096, 65536, 300_000, 1 << 20]), FILE_SIZE - offset)
            key = f"f{f}/{offset:09d}"
            refs[key] = [f"{{{{u}}}}/f{f}.bin", offset, length]
            expected[key] = data[offset : offset + length]
            offset += length
        if f < 4:
            small = rng.randbytes(50_000)
            (root / f"w{f}.bin").write_bytes(small)
            refs[f"whole/w{f}"] = [f"{{{{u}}}}/w{f}.bin"]
            expected[f"whole/w{f}"] = small
    return refs, expected


def read_range(path: Path, start: int, size: int) -> tuple[bytes, int | None]:
    """Bytes ``[start, start + size)`` of a file read as ``cat`` does, and the errno that
    ended the read early, if one did.  A read that fails part way through returns the
    bytes before the failure first (POSIX), so a short ``pread`` is followed by another:
    the bytes got before an error must still be the right ones."""
    pieces: list[bytes] = []
    err = None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return b"", exc.errno
    try:
        offset, left = start, size
        while left > 0:
            piece = os.pread(fd, left, offset)
            if not piece:
                break
            pieces.append(piece)
            offset += len(piece)
            left -= len(piece)
    except OSError as exc:
        err = exc.errno
    finally:
        # Drop the kernel's copy, so that the next read of this key asks refmount.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    return b"".join(pieces), err


def reader(mountpoint: Path, expected: dict[str, bytes], tally: Tally, stop: float) -> None:
    keys = sorted(expected)
    rng = random.Random()
    while time.monotonic() < stop:
        key = rng.choice(keys)
        want = expected[key]
        start = 0 if rng.random() < 0.5 else rng.randrange(len(want))
        size = len(want) - start if rng.random() < 0.5 else rng.randrange(1, 200_000)
        got, err = read_range(mountpoint / key, start, size)
        right = want[start : start + size]
        if err is not None:
            right = right[: len(got)]  # the bytes before an error must be right
        tally.add(got, right, err, f"{key} at {start}, {size} asked, errno {err}")


def inject(server: RangeServer, stop: float, every: float, injected: Counter[str]) -> None:
    rng = random.Random(1)
    while time.monotonic() < stop:
        time.sleep(every)
        mode, count = rng.choice(FAULTS)
        name = (
            f"/f{rng.randrange(FILES)}.bin" if rng.random() < 0.8 else f"/w{rng.randrange(4)}.bin"
        )
        with contextlib.suppress(OSError):
            server.fault(name, mode, count=count)
            injected[mode] += 1


def parse_size(text: str) -> int:
    """Bytes of a size as refmount's options take it (``64M``, ``1G``)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def process_figures(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    values = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_mb": int(values["VmRSS"].split()[0]) // 1024,  # MiB
        "peak_mb": int(values["VmHWM"].split()[0]) // 1024,
        "threads": int(values["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def is_mounted(path: Path) -> bool:
    with open("/proc/mounts") as mounts:
        return any(line.split()[1] == str(path) for line in mounts)


def mount(refs: Path, mountpoint: Path, log: Path, args: argparse.Namespace) -> subprocess.Popen:
    argv = [sys.executable, "-m", "refmount", str(refs), str(mountpoint), "-f"]
    argv += ["--cache-size", args.cache_size, "--timeout", str(args.timeout), "--retries", "2"]
    if args.disk_cache:
        argv += ["--disk-cache", args.disk_cache, "--disk-cache-size", args.disk_cache_size]
    env = dict(os.environ, **dict(item.split("=", 1) for item in args.env))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    deadline = time.monotonic() + 60
    while not is_mounted(mountpoint):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"refmount did not mount:\n{log.read_text()}")
        time.sleep(0.05)
    return proc


def unmount(proc: subprocess.Popen, mountpoint: Path) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if is_mounted(mountpoint):
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--readers", type=int, default=16)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between faults")
    parser.add_argument("--sample", type=float, default=15.0, help="seconds between lines")
    parser.add_argument("--cache-size", default="64M")
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--disk-cache", metavar="DIR", help="refmount's --disk-cache")
    parser.add_argument("--disk-cache-size", default="64M")
    parser.add_argument(
        "--no-validators", action="store_true", help="the server sends no ETag, Last-Modified"
    )
    parser.add_argument("--env", nargs="*", default=[], help="NAME=VALUE for the daemon")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="refmount-soak-") as tmp:
        work = Path(tmp)
        refs, expected = build(work)
        with RangeServer(work / "root", validators=not args.no_validators) as server:
            text = json.dumps({"version": 1, "templates": {"u": server.url}, "refs": refs})
            (work / "refs.json").write_text(text)
            mountpoint = work / "mnt"
            mountpoint.mkdir()
            log = work / "refmount.log"
            proc = mount(work / "refs.json", mountpoint, log, args)
            try:
                return soak(proc, mountpoint, server, expected, args, log)
            finally:
                unmount(proc, mountpoint)


def soak(
    proc: subprocess.Popen,
    mountpoint: Path,
    server: RangeServer,
    expected: dict[str, bytes],
    args: argparse.Namespace,
    log: Path,
) -> int:
    tally, injected = Tally(), Counter[str]()
    stop = time.monotonic() + args.minutes * 60
    threads = [threading.Thread(target=reader, args=(mountpoint, expected, tally, stop))
               for _ in range(args.readers)]  # fmt: skip
    threads.append(threading.Thread(target=inject, args=(server, stop, args.every, injected)))
    for thread in threads:
        thread.start()
    print(f"{len(expected)} keys in {FILES} files of {FILE_SIZE >> 20} MiB, {args.readers} "
          f"readers, a fault every {args.every:g} s, cache {args.cache_size}, "
          f"{args.minutes:g} min")  # fmt: skip
    print(f"{'s':>5} {'reads':>7} {'MB':>7} {'wrong':>6} {'errors':<28} "
          f"{'rss':>5} {'peak':>5} {'thr':>4} {'fds':>4}")  # fmt: skip
    began = last = time.monotonic()
    samples = []
    while any(t.is_alive() for t in threads):
        time.sleep(0.5)
        if proc.poll() is not None:
            print(f"the daemon died with status {proc.returncode}:\n{log.read_text()[-3000:]}")
            return 1
        if time.monotonic() - last < args.sample and any(t.is_alive() for t in threads):
            continue
        last = time.monotonic()
        figures = process_figures(proc.pid)
        samples.append(figures)
        with tally.lock:
            errors = ",".join(f"{k}:{v}" for k, v in sorted(tally.errors.items())) or "-"
            print(f"{last - began:5.0f} {tally.reads:7d} {tally.bytes / 1e6:7.0f} "
                  f"{tally.wrong_bytes:6d} {errors:<28} {figures['rss_mb']:5d} "
                  f"{figures['peak_mb']:5d} {figures['threads']:4d} {figures['fds']:4d}",
                  flush=True)  # fmt: skip
    for thread in threads:
        thread.join()
    first, last = samples[0], samples[-1]
    print(f"faults injected: {dict(sorted(injected.items()))}")
    for line in tally.wrong:
        print(f"wrong read: {line}")
    print(f"reads {tally.reads}, bytes {tally.bytes}, wrong reads {tally.wrong_reads}, "
          f"wrong bytes {tally.wrong_bytes}, errors {dict(tally.errors)}")  # fmt: skip
    print(f"daemon: RSS {first['rss_mb']} -> {last['rss_mb']} MB (peak {last['peak_mb']}), "
          f"threads {first['threads']} -> {last['threads']}, fds {first['fds']} -> "
          f"{last['fds']}, alive: {proc.poll() is None}")  # fmt: skip
    allowed = (parse_size(args.cache_size) + RSS_ALLOWANCE) >> 20  # MiB, as RSS is shown
    print(f"peak RSS {last['peak_mb']} MB against the cache + 150 MB = {allowed} MB: "
          f"{'met' if last['peak_mb'] <= allowed else 'MISSED'}")  # fmt: skip
    return 1 if tally.wrong_bytes or tally.wrong_reads or proc.poll() is not None else 0


if __name__ == "__main__":
    sys.exit(main())
