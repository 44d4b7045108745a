"""W3d over ``https://`` through a cross-host pre-signed redirect, against the same row
read directly (issue 38, item 5's second row).

    python bench/redirect_throughput.py [--chunks 1000] [--rounds 3] [--workdir DIR]

nginx (TLS, a CA made for the run, in ``SSL_CERT_FILE`` for the daemon) serves
``chunks.bin`` (``--chunks`` x 256 KiB) on two loopback addresses, as a platform does:
``127.0.0.4`` answers ranges (the pre-signed host), ``127.0.0.3`` answers every GET with
a ``307`` to the same path on ``127.0.0.4`` with a signature in the query (the archive
with a session in place).  Two reference sets map ``c/00000`` ... to the chunks, one
through each host.  A row: a fresh ``refmount`` mount, 16 ``cat`` processes over the
chunk files (half of them, chosen at random, each read once: W3d), the server's file in
the page cache.
Rows alternate (direct, redirected) ``--rounds`` times; the output gives each row's
median MB/s and the daemon's CPU per chunk file (user + system of all its threads).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.certificates import make_certificates
from tests.support.mounting import REFMOUNT, child_env, unmount
from tests.support.nginx import nginx_main
from tests.support.servers import free_port

CHUNK = 256 << 10
READERS = 16
ARCHIVE, PRESIGNED = "127.0.0.3", "127.0.0.4"


def nginx_config(root: Path, port: int, prefix: Path, cert: Path, key: Path) -> str:
    tls = f"ssl_certificate {cert}; ssl_certificate_key {key}; ssl_session_cache off;"
    signature = "X-Amz-Expires=3600&X-Amz-Signature=0123456789abcdef0123456789abcdef"
    return nginx_main(
        prefix,
        f"""
    server {{
        listen {PRESIGNED}:{port} ssl;
        {tls}
        root {root};
    }}
    server {{
        listen {ARCHIVE}:{port} ssl;
        {tls}
        access_log {prefix}/archive.log;
        location / {{ return 307 https://{PRESIGNED}:{port}$uri?{signature}; }}
    }}""",
    )


def write_refs(path: Path, url: str, chunks: int) -> list[str]:
    import json

    refs = {f"c/{n:05d}": [url, n * CHUNK, CHUNK] for n in range(chunks)}
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return sorted(refs)


def tree_cpu(pid: int) -> float:
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def one_row(
    refs: Path, keys: list[str], mountpoint: Path, env: dict[str, str]
) -> tuple[float, float]:
    """(seconds, daemon CPU seconds) of W3d on a fresh mount of ``refs``."""
    log = open(mountpoint.parent / "refmount.log", "ab")  # noqa: SIM115 - closed below
    daemon = subprocess.Popen(
        [*REFMOUNT, str(refs), str(mountpoint), "-f", "--cache-size", "512M"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not os.path.ismount(mountpoint):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"refmount did not mount: see {log.name}")
            time.sleep(0.02)
        # W3d: half the chunk files, chosen at random, each read once by one reader
        chosen = random.Random(len(keys)).sample(keys, len(keys) // 2)
        lists = [chosen[i::READERS] for i in range(READERS)]
        before = tree_cpu(daemon.pid)
        started = time.monotonic()

        def read(names: list[str]) -> int:
            paths = [str(mountpoint / name) for name in names]
            done = subprocess.run(["cat", *paths], capture_output=True, check=True)
            return len(done.stdout)

        with ThreadPoolExecutor(READERS) as pool:
            got = sum(pool.map(read, lists))
        seconds = time.monotonic() - started
        cpu = tree_cpu(daemon.pid) - before
        if got != len(chosen) * CHUNK:
            raise RuntimeError(f"read {got} bytes, not {len(chosen) * CHUNK}")
        return seconds, cpu
    finally:
        unmount(mountpoint)
        daemon.wait(30)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="refmount-redirect-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "www").mkdir(exist_ok=True)
    data = work / "www" / "chunks.bin"
    if not data.exists() or data.stat().st_size != args.chunks * CHUNK:
        data.write_bytes(os.urandom(args.chunks * CHUNK))
    data.read_bytes()  # into the page cache: the rows measure refmount, not the disk
    certificates = make_certificates(work / "certs", addresses=(ARCHIVE, PRESIGNED))
    port = free_port()
    prefix = work / "nginx"
    prefix.mkdir(exist_ok=True)
    config = prefix / "nginx.conf"
    key = certificates.key
    config.write_text(nginx_config(work / "www", port, prefix, certificates.cert, key))
    nginx = subprocess.Popen(["nginx", "-c", str(config), "-p", str(prefix)])
    env = {**child_env(), "SSL_CERT_FILE": str(certificates.ca), "NETRC": str(work / "none")}
    try:
        time.sleep(0.5)
        rows = {
            "direct": write_refs(work / "direct.json", f"https://{PRESIGNED}:{port}/chunks.bin",
                                 args.chunks),
            "redirected": write_refs(work / "redirected.json",
                                     f"https://{ARCHIVE}:{port}/chunks.bin", args.chunks),
        }  # fmt: skip
        results: dict[str, list[tuple[float, float]]] = {row: [] for row in rows}
        mountpoint = work / "mnt"
        mountpoint.mkdir(exist_ok=True)
        for _ in range(args.rounds):
            for row, keys in rows.items():
                results[row].append(one_row(work / f"{row}.json", keys, mountpoint, env))
        files = args.chunks // 2
        megabytes = files * CHUNK / 1e6
        print(f"W3d over https, {files} of {args.chunks} x 256 KiB, {READERS} readers, "
              f"{args.rounds} rounds; load {os.getloadavg()[0]:.2f}")  # fmt: skip
        print("| row | MB/s (median) | daemon CPU ms per chunk (median) |")
        print("|---|---|---|")
        rates = {}
        for row, found in results.items():
            rates[row] = statistics.median(megabytes / seconds for seconds, _ in found)
            cpu = statistics.median(1000 * cpu / files for _, cpu in found)
            print(f"| {row} | {rates[row]:.0f} | {cpu:.2f} |")
        print(f"redirected / direct: {rates['redirected'] / rates['direct']:.2f}")
        redirects = (prefix / "archive.log").read_text().count(" 307 ")
        print(f"redirects answered by the archive host: {redirects:,}")
        if not redirects:
            raise RuntimeError("the redirected rows were not redirected")
    finally:
        nginx.terminate()
        nginx.wait(10)


if __name__ == "__main__":
    main()
