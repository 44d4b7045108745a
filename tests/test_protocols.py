"""Targets and reference sets on real remote stores: HTTP (the range server) and S3 (moto).

Every test mounts for real and reads through the kernel; the expected bytes are sliced from
the data the test itself put on the server.
"""

from __future__ import annotations

import base64
import errno
import itertools
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Mounted, is_mounted, refmount_cli
from tests.data_builders import compress, dump_refs
from tests.support.servers import MotoServer, RangeServer

_bucket_numbers = itertools.count()


def payload(size: int, seed: int) -> bytes:
    """Deterministic bytes that are not all alike, so a wrong offset cannot match."""
    return bytes((i * 131 + seed * 7 + (i >> 8) * 17) % 251 for i in range(size))


def read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def assert_reads(mnt: Path, expected: dict[str, bytes]) -> None:
    """Each key's size and bytes through the mount, and the tree holds nothing else."""
    found = sorted(
        os.path.relpath(os.path.join(root, name), mnt)
        for root, _dirs, names in os.walk(mnt)
        for name in names
    )
    assert found == sorted(expected)
    for key, data in expected.items():
        assert os.stat(mnt / key).st_size == len(data), key
        assert read(mnt / key) == data, key


@pytest.fixture
def bucket(s3_server: MotoServer) -> str:
    name = f"refmount-test-{os.getpid()}-{next(_bucket_numbers)}"
    s3_server.make_bucket(name)
    return name


@pytest.fixture
def http_dir(http: RangeServer, http_root: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh directory on the HTTP server for one test: its URL path (``/protocols/...``)."""
    name = request.node.name.replace("[", "_").replace("]", "").replace("/", "_")
    directory = http_root / "protocols" / name
    directory.mkdir(parents=True)
    yield f"/protocols/{name}"


def put_http(http_root: Path, url_path: str, data: bytes) -> None:
    target = http_root / url_path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


# -- HTTP targets ---------------------------------------------------------------------------


def head_requests(stats: dict) -> int:
    """HEAD requests the server answered: every data request that sent no body."""
    return int(stats["requests"]) - len(stats["ranges"])


def test_http_whole_file_size_is_asked_once(
    mount: Callable[..., Mounted],
    http: RangeServer,
    http_root: Path,
    http_dir: str,
    tmp_path: Path,
) -> None:
    one, two = payload(123_457, 1), payload(4_099, 2)
    put_http(http_root, f"{http_dir}/one.bin", one)
    put_http(http_root, f"{http_dir}/two.bin", two)
    refs = {
        "whole": [f"{http.url}{http_dir}/one.bin"],
        "again/same": [f"{http.url}{http_dir}/one.bin"],  # the same URL: no second question
        "other": [f"{http.url}{http_dir}/two.bin"],
    }
    m = mount(dump_refs(refs, tmp_path / "refs.json"))
    # Sizes are asked lazily: mounting asked the server nothing.
    assert http.stats()["requests"] == 0

    for _ in range(3):
        assert os.stat(m.mountpoint / "whole").st_size == len(one)
        assert os.stat(m.mountpoint / "again" / "same").st_size == len(one)
    assert os.stat(m.mountpoint / "other").st_size == len(two)
    stats = http.stats()
    assert stats["ranges"] == []  # no body was sent: the sizes came from HEAD requests
    assert stats["requests"] == 2  # one per URL, not per key nor per stat

    assert read(m.mountpoint / "whole") == one
    assert read(m.mountpoint / "again" / "same") == one
    assert read(m.mountpoint / "other") == two
    stats = http.stats()
    assert head_requests(stats) == 2  # reading asked no size again
    assert {path for path, _, _ in stats["ranges"]} == {
        f"{http_dir}/one.bin",
        f"{http_dir}/two.bin",
    }
    assert all(end <= len(one) for _, _, end in stats["ranges"])


def test_http_ranges_read_exactly_their_bytes(
    mount: Callable[..., Mounted],
    http: RangeServer,
    http_root: Path,
    http_dir: str,
    tmp_path: Path,
) -> None:
    data = payload(300_001, 3)
    put_http(http_root, f"{http_dir}/data.bin", data)
    url = f"{http.url}{http_dir}/data.bin"
    spans = {"a": (0, 10), "b/c": (10, 70_000), "b/d": (299_990, 11), "e": (123_456, 1)}
    refs = {key: [url, start, length] for key, (start, length) in spans.items()}
    m = mount(dump_refs(refs, tmp_path / "refs.json"))
    assert_reads(m.mountpoint, {k: data[s : s + n] for k, (s, n) in spans.items()})
    assert head_requests(http.stats()) == 0  # a range's size is in the reference


def test_http_missing_whole_file_does_not_hide_its_directory(
    mount: Callable[..., Mounted],
    http: RangeServer,
    http_root: Path,
    http_dir: str,
    tmp_path: Path,
) -> None:
    """A whole-file target that is gone fails alone: its neighbours still list and read."""
    data = payload(1_000, 13)
    put_http(http_root, f"{http_dir}/here.bin", data)
    refs = {
        "d/gone": [f"{http.url}{http_dir}/gone.bin"],
        "d/here": [f"{http.url}{http_dir}/here.bin"],
        "d/inline": "text",
        "d/range": [f"{http.url}{http_dir}/here.bin", 100, 10],
    }
    m = mount(dump_refs(refs, tmp_path / "refs.json"))
    assert {"here", "inline", "range"} <= set(os.listdir(m.mountpoint / "d"))
    assert read(m.mountpoint / "d" / "here") == data
    assert read(m.mountpoint / "d" / "range") == data[100:110]
    with pytest.raises(OSError) as failed:  # EIO: ENOENT would mean "no such key"
        read(m.mountpoint / "d" / "gone")
    assert failed.value.errno == errno.EIO


# -- S3 targets -----------------------------------------------------------------------------


@pytest.mark.parametrize("options", ["keyed", "flat-with-protocol", "flat-protocol-less-urls"])
def test_s3_targets(
    mount: Callable[..., Mounted],
    s3_server: MotoServer,
    bucket: str,
    tmp_path: Path,
    options: str,
) -> None:
    data = payload(250_000, 4)
    s3_server.put(bucket, "dir/data.bin", data)
    s3_server.put(bucket, "whole.bin", data[:777])
    prefix = "" if options == "flat-protocol-less-urls" else "s3://"
    refs = {
        "version": 1,
        "refs": {
            "x/first": [f"{prefix}{bucket}/dir/data.bin", 0, 1000],
            "x/middle": [f"{prefix}{bucket}/dir/data.bin", 100_000, 65_536],
            "x/last": [f"{prefix}{bucket}/dir/data.bin", 249_999, 1],
            "whole": [f"{prefix}{bucket}/whole.bin"],
        },
    }
    if options == "keyed":
        args = ["--remote-options", json.dumps({"s3": s3_server.storage_options})]
    else:
        args = ["--remote-options", json.dumps(s3_server.storage_options)]
        args += ["--remote-protocol", "s3"]
    m = mount(dump_refs(refs, tmp_path / "refs.json"), *args)
    assert_reads(
        m.mountpoint,
        {
            "x/first": data[:1000],
            "x/middle": data[100_000:165_536],
            "x/last": data[249_999:],
            "whole": data[:777],
        },
    )


def test_s3_flat_options_apply_to_every_remote_protocol(
    mount: Callable[..., Mounted], s3_server: MotoServer, bucket: str, tmp_path: Path
) -> None:
    """``--help``: flat remote options are "for --remote-protocol, or every remote protocol"."""
    data = payload(5_000, 5)
    s3_server.put(bucket, "data.bin", data)
    refs = {"k": [f"s3://{bucket}/data.bin", 1, 4_000]}
    m = mount(
        dump_refs(refs, tmp_path / "refs.json"),
        "--remote-options", json.dumps(s3_server.storage_options),
    )  # fmt: skip
    assert read(m.mountpoint / "k") == data[1:4_001]


# -- one reference set, many protocols ------------------------------------------------------


def test_mixed_s3_http_and_local_targets(
    mount: Callable[..., Mounted],
    s3_server: MotoServer,
    bucket: str,
    http: RangeServer,
    http_root: Path,
    http_dir: str,
    tmp_path: Path,
) -> None:
    s3_data, http_data, local_data = payload(70_000, 6), payload(80_000, 7), payload(90_000, 8)
    s3_server.put(bucket, "mixed/s3.bin", s3_data)
    put_http(http_root, f"{http_dir}/http.bin", http_data)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "local.bin").write_bytes(local_data)
    binary = bytes(range(256))
    refs = {
        "version": 1,
        "refs": {
            ".zattrs": {"title": "mixed ☃"},
            "inline/text": "plain text ✓",
            "inline/binary": "base64:" + base64.b64encode(binary).decode(),
            "s3/range": [f"s3://{bucket}/mixed/s3.bin", 5, 50_000],
            "s3/whole": [f"s3://{bucket}/mixed/s3.bin"],
            "http/range": [f"{http.url}{http_dir}/http.bin", 79_000, 1_000],
            "http/whole": [f"{http.url}{http_dir}/http.bin"],
            "local/relative": ["data/local.bin", 10, 20_000],
            "local/absolute": [str(tmp_path / "data" / "local.bin"), 0, 5],
            "local/file-url": [(tmp_path / "data" / "local.bin").as_uri()],
        },
    }
    m = mount(
        dump_refs(refs, tmp_path / "refs.json"),
        "--remote-options", json.dumps({"s3": s3_server.storage_options}),
    )  # fmt: skip
    assert_reads(
        m.mountpoint,
        {
            ".zattrs": b'{"title":"mixed \\u2603"}',
            "inline/text": "plain text ✓".encode(),
            "inline/binary": binary,
            "s3/range": s3_data[5:50_005],
            "s3/whole": s3_data,
            "http/range": http_data[79_000:80_000],
            "http/whole": http_data,
            "local/relative": local_data[10:20_010],
            "local/absolute": local_data[:5],
            "local/file-url": local_data,
        },
    )


# -- the reference set itself on a remote store ---------------------------------------------

REMOTE_REFS_VARIANTS = [
    ("refs.json", None),
    ("refs.json.gz", "gzip"),
    ("refs.json.bz2", "bz2"),
    ("refs.json.xz", "xz"),
    ("refs.json.zst", "zstd"),
    ("refs.json.zstd", "zstd"),
    # Compressed but named like plain JSON: recognised by the magic bytes.
    ("refs.json", "zstd"),
    ("refs.json", "gzip"),
    ("refs", "bz2"),
    ("refs", "xz"),
]


def relative_refs() -> tuple[dict, dict[str, bytes], dict[str, bytes]]:
    """(refs with relative target URLs, the files they need, the bytes each key reads)."""
    data, other = payload(60_000, 9), payload(3_000, 10)
    files = {"data.bin": data, "sub/other.bin": other}
    refs = {
        "version": 1,
        "refs": {
            ".zgroup": '{"zarr_format":2}',
            "a/0": ["data.bin", 0, 30_000],
            "a/1": ["data.bin", 30_000, 30_000],
            "b": ["sub/other.bin"],
            "c": ["sub/other.bin", 2_999, 1],
        },
    }
    expected = {
        ".zgroup": b'{"zarr_format":2}',
        "a/0": data[:30_000],
        "a/1": data[30_000:],
        "b": other,
        "c": other[2_999:],
    }
    return refs, files, expected


@pytest.mark.parametrize(("name", "kind"), REMOTE_REFS_VARIANTS)
def test_refs_file_over_http_with_relative_targets(
    mount: Callable[..., Mounted],
    http: RangeServer,
    http_root: Path,
    http_dir: str,
    name: str,
    kind: str | None,
) -> None:
    refs, files, expected = relative_refs()
    for path, data in files.items():
        put_http(http_root, f"{http_dir}/{path}", data)
    put_http(http_root, f"{http_dir}/{name}", compress(json.dumps(refs).encode(), kind))
    m = mount(f"{http.url}{http_dir}/{name}")
    assert_reads(m.mountpoint, expected)
    # The targets were read from beside the refs file, on the same server.
    fetched = {path for path, _, _ in http.stats()["ranges"]}
    assert fetched == {f"{http_dir}/{name}", f"{http_dir}/data.bin", f"{http_dir}/sub/other.bin"}


@pytest.mark.parametrize(("name", "kind"), [("refs.json", None), ("refs.json", "zstd")])
def test_refs_file_on_s3_with_refs_options(
    mount: Callable[..., Mounted],
    s3_server: MotoServer,
    bucket: str,
    name: str,
    kind: str | None,
) -> None:
    refs, files, expected = relative_refs()
    for path, data in files.items():
        s3_server.put(bucket, f"set/{path}", data)
    s3_server.put(bucket, f"set/{name}", compress(json.dumps(refs).encode(), kind))
    options = json.dumps(s3_server.storage_options)
    m = mount(
        f"s3://{bucket}/set/{name}",
        "--refs-options", options,
        "--remote-options", json.dumps({"s3": s3_server.storage_options}),
    )  # fmt: skip
    assert_reads(m.mountpoint, expected)


# -- a remote reference set may not read local files ----------------------------------------


def local_target_refs(local: Path, style: str) -> dict:
    url = local.as_uri() if style == "file-url" else str(local)
    return {"version": 1, "refs": {"ok": "inline", "secret": [url, 0, 6]}}


@pytest.mark.parametrize("style", ["absolute-path", "file-url"])
def test_remote_refs_pointing_at_local_files_are_refused(
    http: RangeServer,
    http_root: Path,
    http_dir: str,
    mountpoint: Path,
    tmp_path: Path,
    style: str,
) -> None:
    local = tmp_path / "secret.txt"
    local.write_bytes(b"secret data")
    put_http(
        http_root, f"{http_dir}/refs.json", json.dumps(local_target_refs(local, style)).encode()
    )
    result = refmount_cli(f"{http.url}{http_dir}/refs.json", str(mountpoint))
    assert result.returncode != 0
    assert "--allow-local" in result.stderr
    assert not is_mounted(mountpoint)
    assert list(mountpoint.iterdir()) == []


def test_refs_on_s3_pointing_at_local_files_are_refused(
    s3_server: MotoServer, bucket: str, mountpoint: Path, tmp_path: Path
) -> None:
    local = tmp_path / "secret.txt"
    local.write_bytes(b"secret data")
    s3_server.put(bucket, "refs.json", json.dumps(local_target_refs(local, "file-url")).encode())
    result = refmount_cli(
        f"s3://{bucket}/refs.json", str(mountpoint),
        "--refs-options", json.dumps(s3_server.storage_options),
    )  # fmt: skip
    assert result.returncode != 0
    assert "--allow-local" in result.stderr
    assert not is_mounted(mountpoint)


@pytest.mark.parametrize("style", ["absolute-path", "file-url"])
def test_allow_local_lets_remote_refs_read_local_files(
    mount: Callable[..., Mounted],
    http: RangeServer,
    http_root: Path,
    http_dir: str,
    tmp_path: Path,
    style: str,
) -> None:
    local = tmp_path / "secret.txt"
    local.write_bytes(b"secret data")
    put_http(
        http_root, f"{http_dir}/refs.json", json.dumps(local_target_refs(local, style)).encode()
    )
    m = mount(f"{http.url}{http_dir}/refs.json", "--allow-local")
    assert_reads(m.mountpoint, {"ok": b"inline", "secret": b"secret"})


# -- relative target URLs with dot segments -------------------------------------------------


def dot_segment_refs() -> tuple[dict, dict[str, bytes], dict[str, bytes]]:
    """Relative URLs resolve like links in a web page (RFC 3986): ``./x`` and ``../x``."""
    here, up = payload(2_000, 11), payload(1_000, 12)
    files = {"set/here.bin": here, "up.bin": up}
    refs = {
        "dot": ["./here.bin", 0, 100],
        "dotdot": ["../up.bin", 10, 20],
        "mid": ["sub/../here.bin"],
    }
    return refs, files, {"dot": here[:100], "dotdot": up[10:30], "mid": here}


def test_remote_refs_resolve_dot_segments_over_http(
    mount: Callable[..., Mounted], http: RangeServer, http_root: Path, http_dir: str
) -> None:
    refs, files, expected = dot_segment_refs()
    for path, data in files.items():
        put_http(http_root, f"{http_dir}/{path}", data)
    put_http(http_root, f"{http_dir}/set/refs.json", json.dumps(refs).encode())
    m = mount(f"{http.url}{http_dir}/set/refs.json")
    assert_reads(m.mountpoint, expected)


def test_remote_refs_resolve_dot_segments_on_s3(
    mount: Callable[..., Mounted], s3_server: MotoServer, bucket: str
) -> None:
    refs, files, expected = dot_segment_refs()
    for path, data in files.items():
        s3_server.put(bucket, f"top/{path}", data)
    s3_server.put(bucket, "top/set/refs.json", json.dumps(refs).encode())
    m = mount(
        f"s3://{bucket}/top/set/refs.json",
        "--refs-options", json.dumps(s3_server.storage_options),
        "--remote-options", json.dumps({"s3": s3_server.storage_options}),
    )  # fmt: skip
    assert_reads(m.mountpoint, expected)
