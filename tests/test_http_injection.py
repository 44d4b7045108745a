"""Values that go into a request (checksum ETags from an Icechunk manifest, URLs from a
reference set or a manifest, the user's headers) never end a header line: a CR LF in
one is refused where it enters refmount, with an error naming the key or option, and
the server never sees an injected header or a second, smuggled request (carrying the
credentials the user keyed to that host).  No raw CR or LF reaches the log either.

Through real mounts against a raw socket server of the test's own
(tests/support/rawserver.py), asserting what the reader gets and what the server got.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import icechunk
import zarr

from tests.conftest import Mounted, is_mounted, refmount_cli
from tests.support.rawserver import RawServer, Reply, asked_range, header_lines, partial
from tests.support.remote_files import write_refs

DATA = bytes((i * 61 + (i >> 7)) % 251 for i in range(1 << 16))
OFFSET, LENGTH = 1000, 4096
INJECTED = '"x"\r\nX-Injected: 1\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: elsewhere'
TOKEN = "Bearer for-this-host-only"


def cat(path: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["cat", str(path)], capture_output=True, timeout=60)


def etagged(head: bytes) -> tuple[Reply, bool]:
    """A 206 for the asked range, its object's ETag ``"good"``."""
    return partial(*asked_range(head), DATA, 'ETag: "good"\r\n'), True


def assert_nothing_smuggled(server: RawServer) -> None:
    for head in server.requests:
        assert b"smuggled" not in head and b"x-injected" not in head.lower(), head
        assert head.startswith(b"GET /"), head
    paths = [head.split(b" ")[1] for head in server.requests]
    assert b"/smuggled" not in paths


def assert_one_line_log(m: Mounted) -> None:
    log = m.log()
    assert "\r" not in log
    assert not any(line.startswith(("X-Injected", "GET /smuggled")) for line in log.split("\n"))


def test_a_checksum_etag_holding_cr_lf_is_refused_naming_the_key(
    mount: Callable[..., Mounted], tmp_path: Path, raw_server: Callable[..., RawServer]
) -> None:
    server = raw_server(etagged)
    prefix = server.url("/")
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(
        icechunk.VirtualChunkContainer(prefix, icechunk.http_store())
    )
    storage = icechunk.local_filesystem_storage(str(tmp_path / "repo"))
    session = icechunk.Repository.create(storage, config).writable_session("main")
    group = zarr.group(session.store)
    group.create_array("virt", shape=(2 * LENGTH,), chunks=(LENGTH,), dtype="u1",
                       compressors=None, fill_value=0)  # fmt: skip
    url = f"{prefix}data.bin"
    session.store.set_virtual_ref("virt/c/0", url, offset=OFFSET, length=LENGTH, checksum='"good"')
    session.store.set_virtual_ref("virt/c/1", url, offset=OFFSET, length=LENGTH, checksum=INJECTED)
    session.commit("one chunk whose checksum would end the If-Match line")
    options = {server.url(""): {"headers": {"Authorization": TOKEN}}}
    m = mount(tmp_path / "repo", "--remote-options", json.dumps(options), "--retries", "1")

    bad = cat(m.mountpoint / "virt/c/1")
    assert bad.returncode != 0 and b"Input/output error" in bad.stderr, bad
    good = cat(m.mountpoint / "virt/c/0")
    assert good.returncode == 0, (good.stderr, m.log()[-2000:])
    assert good.stdout == DATA[OFFSET : OFFSET + LENGTH]

    assert len(server.requests) == 1  # the good chunk's; the bad one was never asked
    lines = header_lines(server.requests[0])
    assert b'if-match: "good"' in lines
    assert f"authorization: {TOKEN}".lower().encode() in lines
    assert_nothing_smuggled(server)
    log = m.log()
    assert "virt/c/1" in log, log[-2000:]
    assert "checksum ETag" in log and "control character" in log
    assert_one_line_log(m)


def test_a_reference_url_holding_cr_lf_is_refused_naming_the_key(
    mountpoint: Path, tmp_path: Path, raw_server: Callable[..., RawServer]
) -> None:
    server = raw_server(etagged)
    url = server.url("/data.bin")
    refs = write_refs(tmp_path, {
        "good": [url, OFFSET, LENGTH],
        "bad": [url + " HTTP/1.1\r\nX-Injected: 1\r\n\r\nGET /smuggled", OFFSET, LENGTH],
    })  # fmt: skip
    result = refmount_cli(str(refs), str(mountpoint), "-f")
    assert result.returncode != 0
    assert "key 'bad'" in result.stderr and "control character" in result.stderr, result.stderr
    assert "\r" not in result.stderr
    assert not is_mounted(mountpoint)
    assert server.requests == []


def test_a_users_header_holding_cr_lf_is_refused_naming_it(
    mountpoint: Path, tmp_path: Path, raw_server: Callable[..., RawServer]
) -> None:
    server = raw_server(etagged)
    refs = write_refs(tmp_path, {"good": [server.url("/data.bin"), OFFSET, LENGTH]})
    options = {server.url(""): {"headers": {"X-Key": "k\r\nX-Injected: 1"}}}
    result = refmount_cli(str(refs), str(mountpoint), "-f", "--remote-options", json.dumps(options))
    assert result.returncode != 0
    assert "header 'X-Key'" in result.stderr and "control character" in result.stderr, result.stderr
    assert not is_mounted(mountpoint)
    assert server.requests == []


def test_a_checksummed_read_sends_its_condition_and_the_users_header_as_single_lines(
    mount: Callable[..., Mounted], tmp_path: Path, raw_server: Callable[..., RawServer]
) -> None:
    # Tabs and Latin-1 are header text; nothing else of a value makes a line of its own.
    server = raw_server(etagged)
    refs = write_refs(tmp_path, {"good": [server.url("/data.bin"), OFFSET, LENGTH]})
    options = {server.url(""): {"headers": {"X-Key": "a\tb \xe9"}}}
    m = mount(refs, "--remote-options", json.dumps(options))
    good = cat(m.mountpoint / "good")
    assert good.returncode == 0 and good.stdout == DATA[OFFSET : OFFSET + LENGTH]
    assert "x-key: a\tb \xe9".encode("latin-1") in header_lines(server.requests[0])
    assert_nothing_smuggled(server)
