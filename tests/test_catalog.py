"""Catalogs mounted for real: a directory or prefix of reference sets, each a directory
of the mount, loaded on first use.  Local, on S3 (moto) and on HTTP (nginx's index
pages); every check goes through the mount with separate processes, and loads are
counted in the daemon's log."""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REFMOUNT, Mounted
from tests.support.mounting import RssSampler
from tests.support.nginx import NginxServer, nginx_available
from tests.support.parquet_sets import refs_to_parquet
from tests.support.servers import MotoServer

CHUNK = 1000
SETTLE = 20.0  # seconds within which a change of the source shows through the mount


def data_for(count: int) -> bytes:
    return random.Random(count).randbytes(count * CHUNK)


def refs_doc(data_url: str, n: int) -> bytes:
    zarray = {"shape": [CHUNK], "chunks": [CHUNK], "dtype": "|u1", "compressor": None,
              "fill_value": 0, "filters": None, "order": "C", "zarr_format": 2}  # fmt: skip
    refs = {
        ".zgroup": '{"zarr_format":2}',
        "v/.zarray": json.dumps(zarray),
        "v/0": [data_url, n * CHUNK, CHUNK],
        "name": json.dumps({"set": n}),
    }
    return json.dumps({"version": 1, "refs": refs}).encode()


def loads(m: Mounted, name: str | None = None) -> int:
    lines = [line for line in m.log().splitlines() if "catalog: loaded set" in line]
    if name is not None:
        lines = [line for line in lines if f"loaded set {name} (" in line]
    return len(lines)


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(list(args), capture_output=True, timeout=timeout)


def cat(path: Path) -> bytes:
    done = run("cat", str(path))
    assert done.returncode == 0, done.stderr
    return done.stdout


def eventually(check: Callable[[], bool], what: str, timeout: float = SETTLE) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.2)


def status(m: Mounted) -> dict:
    done = subprocess.run(
        [*REFMOUNT, "status", "--json", str(m.mountpoint)], capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def local_catalog(tmp_path: Path) -> tuple[Path, bytes]:
    """Three good sets (plain, gzip'd in a subdirectory, Parquet), a broken one, two that
    clash, and a file that is no set."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    data = data_for(4)
    (tmp_path / "data.bin").write_bytes(data)
    url = str(tmp_path / "data.bin")
    (src / "run0.json").write_bytes(refs_doc(url, 0))
    (src / "sub" / "run1.json.gz").write_bytes(gzip.compress(refs_doc(url, 1)))
    refs_to_parquet(json.loads(refs_doc(url, 2)), src / "run2.parq", record_size=10)
    (src / "broken.json").write_text('{"version": 1, "refs": ')
    (src / "twin.json").write_bytes(refs_doc(url, 3))
    (src / "twin.json.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    (src / "notes.txt").write_text("not a set")
    return src, data


def test_a_local_catalog_lists_without_loading_and_loads_one_set_at_a_time(
    local_catalog: tuple[Path, bytes], mount: Callable[..., Mounted]
) -> None:
    src, data = local_catalog
    m = mount(src, "--xattrs")
    root = m.mountpoint
    assert sorted(os.listdir(root)) == ["broken", "run0", "run2", "sub"]
    assert os.listdir(root / "sub") == ["run1"]
    listed = run("ls", "-l", str(root), str(root / "sub"))
    assert listed.returncode == 0
    assert os.stat(root / "run0").st_mtime == pytest.approx((src / "run0.json").stat().st_mtime)
    assert loads(m) == 0  # listing and stat'ing the catalog loads nothing

    assert cat(root / "run0" / "v" / "0") == data[:CHUNK]
    assert loads(m) == 1 and loads(m, "run0") == 1
    assert cat(root / "sub" / "run1" / "v" / "0") == data[CHUNK : 2 * CHUNK]
    assert cat(root / "run2" / "v" / "0") == data[2 * CHUNK : 3 * CHUNK]
    assert json.loads(cat(root / "run2" / "name")) == {"set": 2}
    assert loads(m) == 3

    for path in (root / "broken", root / "broken" / "v"):  # EIO for that set only
        failed = run("ls", str(path))
        assert failed.returncode != 0 and b"Input/output error" in failed.stderr
    assert json.loads(cat(root / "run0" / "name")) == {"set": 0}
    assert run("stat", str(root / "twin")).returncode != 0  # clashing names: skipped
    log = m.log()
    assert log.count("twin: skipped: 2 sets would have this name") == 1
    warned = [line for line in log.splitlines() if "WARNING" in line and "malformed" in line]
    assert len(warned) == 1, warned  # logged once
    inodes = {os.stat(p).st_ino for p in (root / "run0" / "v" / "0", root / "run2" / "v" / "0")}
    assert len(inodes) == 2
    xattr = run(
        "getfattr",
        "-n",
        "user.refmount.offset",
        "--only-values",
        str(root / "sub" / "run1" / "v" / "0"),
    )
    assert xattr.stdout == str(CHUNK).encode()

    state = status(m)["catalog"]
    assert state["sets"] == 4 and state["loads"] == 3
    assert sorted(state["loaded"]) == ["run0", "run2", "sub/run1"]
    assert state["loaded"]["run0"] == 4  # keys
    assert "broken" in state["errors"]
    shown = subprocess.run([*REFMOUNT, "status", str(root)], capture_output=True, text=True)
    assert "loaded sets" in shown.stdout and "broken" in shown.stdout


def test_two_hundred_first_reads_load_a_set_once(
    local_catalog: tuple[Path, bytes], mount: Callable[..., Mounted]
) -> None:
    src, data = local_catalog
    m = mount(src)
    target = m.mountpoint / "sub" / "run1" / "v" / "0"
    readers = [
        subprocess.Popen(["cat", str(target)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(200)
    ]
    outputs = [reader.communicate(timeout=120) for reader in readers]
    assert all(reader.returncode == 0 for reader in readers), outputs[0][1]
    assert {out for out, _ in outputs} == {data[CHUNK : 2 * CHUNK]}
    assert loads(m, "sub/run1") == 1 and loads(m) == 1


def write_many(src: Path, count: int, url: str) -> None:
    for n in range(count):
        (src / f"g{n % 10}").mkdir(parents=True, exist_ok=True)
        (src / f"g{n % 10}" / f"s{n:04d}.json").write_bytes(refs_doc(url, n))


def test_find_and_read_over_a_thousand_sets_with_five_loaded(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    count = 1000
    src = tmp_path / "src"
    data = data_for(count)
    (tmp_path / "data.bin").write_bytes(data)
    write_many(src, count, str(tmp_path / "data.bin"))
    m = mount(src, "--max-loaded-sets", "5")
    sampler = RssSampler(m.pid)
    try:
        found = run("find", str(m.mountpoint), timeout=600)
        assert found.returncode == 0, found.stderr[-2000:]
        files = sorted(line for line in found.stdout.decode().splitlines() if line.endswith("/v/0"))
        assert len(files) == count
        assert loads(m) == count
        by_set = {int(Path(f).parts[-3][1:]): f for f in files}
        listing = "\n".join(by_set[n] for n in range(count)).encode()
        catted = subprocess.run(
            ["xargs", "-d", "\n", "cat"], input=listing, capture_output=True, timeout=600
        )
        assert catted.returncode == 0, catted.stderr[-2000:]
        assert catted.stdout == data  # every byte right, set after set
    finally:
        peak = sampler.close()
    state = status(m)["catalog"]
    assert len(state["loaded"]) <= 5
    assert peak < 600 * 1024, f"peak resident memory {peak} KiB"


def test_sets_added_replaced_and_removed_under_a_running_mount(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    data = data_for(4)
    (tmp_path / "data.bin").write_bytes(data)
    url = str(tmp_path / "data.bin")
    (src / "a.json").write_bytes(refs_doc(url, 0))
    (src / "b.json").write_bytes(refs_doc(url, 1))
    m = mount(src, "--catalog-ttl", "1")
    root = m.mountpoint
    assert cat(root / "a" / "v" / "0") == data[:CHUNK]
    assert run("stat", str(root / "c")).returncode != 0  # the kernel may cache it as missing
    kept = os.stat(root / "a" / "name").st_ino
    opened = open(root / "a" / "v" / "0", "rb")  # noqa: SIM115 - held across the reload
    removed = open(root / "b" / "v" / "0", "rb")  # noqa: SIM115 - held across the removal
    try:
        (src / "c.json").write_bytes(refs_doc(url, 2))
        (src / "b.json").unlink()
        partial = src / "a.json.partial"
        doc = json.loads(refs_doc(url, 0))
        doc["refs"]["v/0"] = [url, 3 * CHUNK, CHUNK]
        partial.write_text(json.dumps(doc))
        os.utime(partial, (1, 1))
        partial.rename(src / "a.json")
        eventually(lambda: sorted(os.listdir(root)) == ["a", "c"], "c added, b removed")
        eventually(lambda: cat(root / "a" / "v" / "0") == data[3 * CHUNK :], "a reloaded")
        assert cat(root / "c" / "v" / "0") == data[2 * CHUNK : 3 * CHUNK]
        assert b"No such file" in run("stat", str(root / "b")).stderr
        assert os.stat(root / "a" / "name").st_ino == kept  # unchanged key: same inode
        assert opened.read() == data[:CHUNK]  # opened before: the bytes it opened
        assert removed.read() == data[CHUNK : 2 * CHUNK]  # its set is gone: still its bytes
    finally:
        opened.close()
        removed.close()
    assert "catalog: reloaded set a" in m.log()


def test_sighup_refreshes_the_whole_catalog(tmp_path: Path, mount: Callable[..., Mounted]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    data = data_for(4)
    (tmp_path / "data.bin").write_bytes(data)
    url = str(tmp_path / "data.bin")
    (src / "a.json").write_bytes(refs_doc(url, 0))
    m = mount(src, "--catalog-ttl", "3600")
    root = m.mountpoint
    assert cat(root / "a" / "v" / "0") == data[:CHUNK]
    doc = json.loads(refs_doc(url, 0))
    doc["refs"]["v/0"] = [url, CHUNK, CHUNK]
    (src / "a.json").write_text(json.dumps(doc))
    (src / "new.json").write_bytes(refs_doc(url, 2))
    time.sleep(0.5)
    assert sorted(os.listdir(root)) == ["a"]  # within the TTL: the listing is kept
    m.process.send_signal(signal.SIGHUP)
    eventually(lambda: sorted(os.listdir(root)) == ["a", "new"], "the new set")
    eventually(lambda: cat(root / "a" / "v" / "0") == data[CHUNK : 2 * CHUNK], "a reloaded")
    assert cat(root / "new" / "v" / "0") == data[2 * CHUNK : 3 * CHUNK]
    last = status(m)["last_reload"]
    assert last["ok"] and last["message"] == "2 sets listed"
    assert m.process.poll() is None


# -- remote sources --------------------------------------------------------------------------


@pytest.fixture
def s3_catalog(s3_server: MotoServer, request: pytest.FixtureRequest) -> Iterator[str]:
    bucket = f"catalog-{abs(hash(request.node.name)) % 10**8}"
    s3_server.make_bucket(bucket)
    yield bucket


def test_a_catalog_on_s3(
    s3_server: MotoServer, s3_catalog: str, mount: Callable[..., Mounted]
) -> None:
    bucket, data = s3_catalog, data_for(3)
    s3_server.put(bucket, "data/data.bin", data)
    url = f"s3://{bucket}/data/data.bin"
    s3_server.put(bucket, "refs/run0.json", refs_doc(url, 0))
    s3_server.put(bucket, "refs/deep/run1.json.gz", gzip.compress(refs_doc(url, 1)))
    s3_server.put(bucket, "refs/bad.json", b"[1, 2")
    options = json.dumps(s3_server.storage_options)
    m = mount(
        f"s3://{bucket}/refs/",
        "--refs-options", options,
        "--remote-options", json.dumps({f"s3://{bucket}": s3_server.storage_options}),
    )  # fmt: skip
    root = m.mountpoint
    assert sorted(os.listdir(root)) == ["bad", "deep", "run0"]
    assert os.listdir(root / "deep") == ["run1"]
    assert loads(m) == 0
    assert cat(root / "deep" / "run1" / "v" / "0") == data[CHUNK : 2 * CHUNK]
    assert loads(m) == 1 and loads(m, "deep/run1") == 1
    assert b"Input/output error" in run("ls", str(root / "bad")).stderr
    assert cat(root / "run0" / "v" / "0") == data[:CHUNK]
    s3_server.put(bucket, "refs/late.json", refs_doc(url, 2))
    m.process.send_signal(signal.SIGHUP)
    eventually(lambda: "late" in os.listdir(root), "a set added on S3")
    assert cat(root / "late" / "v" / "0") == data[2 * CHUNK :]


def test_a_thousand_sets_on_s3(
    s3_server: MotoServer, s3_catalog: str, mount: Callable[..., Mounted]
) -> None:
    bucket, count = s3_catalog, 1000
    data = data_for(count)
    s3_server.put(bucket, "data.bin", data)
    for n in range(count):
        s3_server.put(bucket, f"refs/s{n:04d}.json", refs_doc(f"s3://{bucket}/data.bin", n))
    m = mount(
        f"s3://{bucket}/refs",
        "--refs-options", json.dumps(s3_server.storage_options),
        "--remote-options", json.dumps({"s3": s3_server.storage_options}),
        "--max-loaded-sets", "5",
    )  # fmt: skip
    names = sorted(os.listdir(m.mountpoint))
    assert names == [f"s{n:04d}" for n in range(count)]
    assert loads(m) == 0
    for n in (0, 517, 999):
        assert cat(m.mountpoint / f"s{n:04d}" / "v" / "0") == data[n * CHUNK : (n + 1) * CHUNK]
    assert loads(m) == 3


@pytest.mark.skipif(nginx_available() is not None, reason=str(nginx_available()))
def test_a_catalog_on_http_index_pages(tmp_path: Path, mount: Callable[..., Mounted]) -> None:
    root_dir = tmp_path / "www"
    (root_dir / "refs" / "2024").mkdir(parents=True)
    count = 1000
    data = data_for(count)
    (root_dir / "data.bin").write_bytes(data)
    with NginxServer(root_dir, autoindex=True) as server:
        url = f"{server.url}/data.bin"
        for n in range(count):
            (root_dir / "refs" / f"s{n:04d}.json").write_bytes(refs_doc(url, n))
        (root_dir / "refs" / "2024" / "jan.json.gz").write_bytes(gzip.compress(refs_doc(url, 5)))
        (root_dir / "refs" / "broken.json").write_text("{")
        m = mount(f"{server.url}/refs/", "--max-loaded-sets", "5")
        root = m.mountpoint
        names = sorted(os.listdir(root))
        assert names == ["2024", "broken", *[f"s{n:04d}" for n in range(count)]]
        assert os.listdir(root / "2024") == ["jan"]
        assert loads(m) == 0
        assert cat(root / "2024" / "jan" / "v" / "0") == data[5 * CHUNK : 6 * CHUNK]
        assert b"Input/output error" in run("cat", str(root / "broken" / "x")).stderr
        for n in range(0, count, 97):
            assert cat(root / f"s{n:04d}" / "v" / "0") == data[n * CHUNK : (n + 1) * CHUNK]
        assert loads(m) == 1 + len(range(0, count, 97))
        assert len(status(m)["catalog"]["loaded"]) <= 5


def test_check_walks_every_set_of_a_catalog(local_catalog: tuple[Path, bytes]) -> None:
    src, _ = local_catalog
    done = subprocess.run(
        [*REFMOUNT, "check", "--json", str(src)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stderr  # a broken set and a clash
    report = json.loads(done.stdout)
    assert report["catalog"] and not report["ok"]
    assert sorted(report["sets"]) == ["broken", "run0", "run2", "sub/run1"]
    assert report["sets"]["run0"]["ok"] and report["sets"]["run0"]["keys"] == 4
    assert report["sets"]["run2"]["format"] == "Parquet"
    assert not report["sets"]["broken"]["loaded"]
    assert any("twin" in problem for problem in report["problems"])
    shown = subprocess.run([*REFMOUNT, "check", str(src)], capture_output=True, text=True)
    assert "summary: 3 of 4 sets fine" in shown.stdout


def test_loaded_sets_stay_within_catalog_memory(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    data = data_for(8)
    (tmp_path / "data.bin").write_bytes(data)
    url = str(tmp_path / "data.bin")
    for n in range(8):
        doc = json.loads(refs_doc(url, n))
        doc["refs"].update({f"pad/{i}": [url, 0, 1] for i in range(10_000)})
        (src / f"big{n}.json").write_text(json.dumps(doc))
    m = mount(src, "--catalog-memory", "1M")
    for n in range(8):
        assert cat(m.mountpoint / f"big{n}" / "v" / "0") == data[n * CHUNK : (n + 1) * CHUNK]
        state = status(m)["catalog"]
        assert 0 < state["loaded_bytes"] <= 1 << 20, state
        assert len(state["loaded"]) < 8
    assert loads(m) == 8 and len(status(m)["catalog"]["loaded"]) <= 3


def test_an_empty_directory_mounts_as_a_catalog_only_when_asked(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    src, target = tmp_path / "src", tmp_path / "target"
    src.mkdir()
    target.mkdir()
    refused = subprocess.run(
        [*REFMOUNT, str(src), str(target), "-f"], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 1 and "--catalog mounts it anyway" in refused.stderr
    m = mount(src, "--catalog")
    assert os.listdir(m.mountpoint) == []
    (tmp_path / "data.bin").write_bytes(data_for(1))
    (src / "first.json").write_bytes(refs_doc(str(tmp_path / "data.bin"), 0))
    m.process.send_signal(signal.SIGHUP)
    eventually(lambda: os.listdir(m.mountpoint) == ["first"], "the first set")
    assert cat(m.mountpoint / "first" / "v" / "0") == data_for(1)


def test_a_catalog_mounted_with_decode_serves_each_set_decoded(
    tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    """Every set of a catalog is a decoded view with --decode: Debian's ncdump reads the
    air example's exact values in each (the raw chunks are shuffle + zlib)."""
    import netCDF4
    import numpy as np

    from tests.test_decode_mount import AIR, CHUNK_BYTES, ncdump_values

    refs = json.loads((AIR / "refs.json").read_text())
    for value in refs["refs"].values():
        if isinstance(value, list):
            value[0] = str(AIR / value[0])
    source = tmp_path / "sets"
    source.mkdir()
    for name in ("run01.json", "run02.json"):
        (source / name).write_text(json.dumps(refs))
    m = mount(source, "--decode", "--allow-local")
    with netCDF4.Dataset(AIR / "air.nc") as ds:
        ds.set_auto_maskandscale(False)
        expected = ds["air"][:].ravel()
    for name in ("run01", "run02"):
        assert (m.mountpoint / name / "air" / "0.0.0").stat().st_size == CHUNK_BYTES
        assert np.array_equal(ncdump_values(m.mountpoint / name, "air"), expected)
