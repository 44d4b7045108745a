"""Through a real mount: references that carry checksums (as Icechunk's virtual chunks
do) read while their objects are unchanged, and are EIO once an object changed (a local
file touched, a file replaced on nginx, one replaced on a server that ignores
``If-Match``, an S3 object overwritten), with one log line naming the key and the object;
references without a checksum still read.  A disk-cache entry written before the change
is not served after a remount."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from tests.support.changed_files import etag, replace, touch_later
from tests.support.mounting import REPO, Mounted
from tests.support.nginx import NginxServer
from tests.support.servers import MotoServer, RangeServer

DAEMON = [sys.executable, str(REPO / "tests" / "support" / "checksummed_daemon.py")]
SIZE = 600_000
BEFORE = (1000, 5000)  # the range each object's "before" key reads
AFTER = (400_000, 404_000)  # ... and its "after" key, read only once the object changed


def cat(path: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["cat", str(path)], capture_output=True, timeout=60)


def mount_checksummed(
    tmp_path: Path, name: str, refs: dict, checksums: dict, *args: str
) -> Mounted:
    (tmp_path / f"{name}.json").write_text(json.dumps({"version": 1, "refs": refs}))
    (tmp_path / f"{name}-checksums.json").write_text(json.dumps(checksums))
    mountpoint = tmp_path / f"mnt-{name}"
    mountpoint.mkdir(exist_ok=True)
    return Mounted(
        tmp_path / f"{name}.json",
        mountpoint,
        ["--retries", "1", *args],
        tmp_path / f"{name}.log",
        command=[*DAEMON, str(tmp_path / f"{name}-checksums.json")],
    )


def test_changed_objects_are_eio_through_a_mount(
    tmp_path: Path, nginx: NginxServer, s3_server: MotoServer
) -> None:
    data = {}
    local = tmp_path / "local.bin"
    data["local"] = random.Random(1).randbytes(SIZE)
    local.write_bytes(data["local"])
    on_nginx = nginx.root / f"checksums-mount-{os.getpid()}.bin"
    data["nginx"] = random.Random(2).randbytes(SIZE)
    on_nginx.write_bytes(data["nginx"])
    www = tmp_path / "www"
    www.mkdir()
    data["ignoring"] = random.Random(3).randbytes(SIZE)
    (www / "data.bin").write_bytes(data["ignoring"])
    bucket = f"checksums-mount-{os.getpid()}"
    s3_server.make_bucket(bucket)
    data["s3"] = random.Random(4).randbytes(SIZE)
    s3_server.put(bucket, "data.bin", data["s3"])
    s3_etag = s3_server.client().head_object(Bucket=bucket, Key="data.bin")["ETag"]

    with RangeServer(www, validators=True) as ignoring:
        urls = {
            "local": local.as_uri(),
            "nginx": f"{nginx.url}/{on_nginx.name}",
            "ignoring": f"{ignoring.url}/data.bin",
            "s3": f"s3://{bucket}/data.bin",
        }
        checksum_of = {
            "local": {"last_modified": local.stat().st_mtime_ns // 10**9},
            "nginx": {"etag": etag(urls["nginx"])},
            "ignoring": {"etag": etag(urls["ignoring"])},
            "s3": {"etag": s3_etag},
        }
        refs, checksums = {}, {}
        for name, url in urls.items():
            for when, (start, end) in (("before", BEFORE), ("after", AFTER)):
                refs[f"{name}/{when}"] = [url, start, end - start]
                checksums[f"{name}/{when}"] = checksum_of[name]
            refs[f"{name}/unchecked"] = [url, AFTER[0], AFTER[1] - AFTER[0]]
        options = json.dumps({"s3": s3_server.storage_options})
        with mount_checksummed(
            tmp_path, "sources", refs, checksums, "--allow-local", "--remote-options", options
        ) as m:
            for name in urls:
                got = cat(m.mountpoint / name / "before")
                assert got.returncode == 0, (name, got.stderr)
                assert got.stdout == data[name][BEFORE[0] : BEFORE[1]], name
            touch_later(local)
            new = {
                "local": data["local"],  # touched: the same bytes, a new time
                "nginx": replace(on_nginx, 12),
                "ignoring": replace(www / "data.bin", 13),
                "s3": random.Random(14).randbytes(SIZE),
            }
            s3_server.put(bucket, "data.bin", new["s3"])
            ignoring.reset_stats()
            for name in urls:
                for _ in range(2):  # refused again: a refusal is never cached as data
                    got = cat(m.mountpoint / name / "after")
                    assert got.returncode != 0 and got.stdout == b"", name
                    assert b"Input/output error" in got.stderr, name
                unchecked = cat(m.mountpoint / name / "unchecked")
                assert unchecked.stdout == new[name][AFTER[0] : AFTER[1]], name
            assert ignoring.stats()["headers"][0].get("if-match") == checksum_of["ignoring"]["etag"]
            log = m.log()
            for name, url in urls.items():
                lines = [
                    line
                    for line in log.splitlines()
                    if "changed since it was referenced" in line and f"{name}/after" in line
                ]
                assert len(lines) == 1, (name, lines)
                shown = str(local) if name == "local" else url
                assert shown in lines[0], (name, lines[0])
            assert cat(m.mountpoint / "nginx" / "unchecked").returncode == 0  # still serving


def test_a_disk_cache_entry_from_before_the_change_is_not_served(tmp_path: Path) -> None:
    local = tmp_path / "local.bin"
    data = random.Random(5).randbytes(SIZE)
    local.write_bytes(data)
    refs = {"a": [local.as_uri(), AFTER[0], AFTER[1] - AFTER[0]]}
    checksums = {"a": {"last_modified": local.stat().st_mtime_ns // 10**9}}
    cache = tmp_path / "cache"
    args = ("--allow-local", "--disk-cache", str(cache))
    with mount_checksummed(tmp_path, "disk", refs, checksums, *args) as m:
        assert cat(m.mountpoint / "a").stdout == data[AFTER[0] : AFTER[1]]
    assert any(cache.rglob("*")), "the first mount wrote nothing to the disk cache"
    touch_later(local)
    with mount_checksummed(tmp_path, "disk", refs, checksums, *args) as m:
        got = cat(m.mountpoint / "a")
        assert got.returncode != 0 and got.stdout == b""
        assert b"Input/output error" in got.stderr
        assert "changed since it was referenced" in m.log()
