"""S3 credentials from botocore's chain on refmount's own client, renewed before they
expire: mounted for real, read by separate processes' threads, against moto behind a
gate that checks every signature and refuses expired keys (tests/support/sigv4_gate.py).
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Mounted
from tests.support.mounting import FETCH_WORKERS_ENV, REFMOUNT, child_env
from tests.support.servers import S3_REGION, MotoServer
from tests.support.sigv4_gate import SigV4Gate

CHUNK = 64 * 1024
CHUNKS = 64
BUCKET = "daac-protected"
DATA = os.urandom(CHUNK * CHUNKS)
#: Fetch worker processes (``REFMOUNT_TEST_FETCH_WORKERS``) log warnings only: the INFO
#: lines saying which client reads and where its credentials come from are then not
#: there (the gate's count of who asked says it all the same).
INFO_LOGGED = not os.environ.get(FETCH_WORKERS_ENV)
#: Processes that look credentials up, each its own: the daemon, or its fetch workers.
LOOKING_UP = int(os.environ.get(FETCH_WORKERS_ENV) or 0) or 1
OWN_CLIENT = "byte ranges through refmount's HTTP client (S3, SigV4)"


@pytest.fixture(scope="module")
def gate(s3_server: MotoServer) -> Iterator[SigV4Gate]:
    s3_server.make_bucket(BUCKET)
    s3_server.put(BUCKET, "granule.nc", DATA)
    with SigV4Gate(s3_server.endpoint) as gate:
        yield gate


@pytest.fixture
def aws_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An environment with no AWS credentials of its own (the daemons inherit it): no
    keys, no files, no instance metadata; returns where the config file goes."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    config = tmp_path / "aws-config"
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return config


def refs_file(tmp_path: Path) -> Path:
    refs = {
        "version": 1,
        "refs": {
            f"c/{i:02d}": [f"s3://{BUCKET}/granule.nc", i * CHUNK, CHUNK] for i in range(CHUNKS)
        },
    }
    path = tmp_path / "refs.json"
    path.write_text(json.dumps(refs))
    return path


def remote_options(gate: SigV4Gate, **extra: object) -> str:
    return json.dumps(
        {
            "s3": {
                "endpoint_url": gate.endpoint,
                "client_kwargs": {"region_name": S3_REGION},
                **extra,
            }
        }
    )


def process_profile(config: Path, name: str, command: str) -> None:
    config.write_text(f"[profile {name}]\ncredential_process = {command}\n")


def fetching_command(gate: SigV4Gate, ttl: float) -> str:
    """A credential_process that asks the gate for credentials valid ``ttl`` seconds."""
    url = f"{gate.endpoint}/_credentials/process?ttl={ttl:g}"
    code = (
        "import sys, urllib.request; "
        "sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())"
    )
    return shlex.join([sys.executable, "-c", code, url])


def read_chunk(mnt: Path, i: int) -> bytes:
    """Chunk ``i`` read through the mount, then dropped from the page cache (the next
    read of it asks the daemon again)."""
    with open(mnt / "c" / f"{i:02d}", "rb") as file:
        data = file.read()
        os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return data


def mount_args(gate: SigV4Gate, **extra: object) -> list[str]:
    return ["--remote-options", remote_options(gate, **extra), "--cache-size", "1M",
            "--log-level", "INFO", "--retries", "0"]  # fmt: skip


def test_credential_process_keys_expiring_every_few_seconds_while_8_readers_read(
    gate: SigV4Gate, aws_env: Path, tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    process_profile(aws_env, "daac", fetching_command(gate, ttl=4))
    before_keys, before_refused = set(gate.signed_by), sum(gate.refused.values())
    agents = Counter(gate.agents)
    mounted = mount(refs_file(tmp_path), *mount_args(gate, profile="daac"))
    failures: list[str] = []
    reads = [0] * 8
    stop = threading.Event()

    def reader(n: int) -> None:
        i = n
        while not stop.is_set():
            try:
                data = read_chunk(mounted.mountpoint, i % CHUNKS)
            except OSError as exc:
                failures.append(f"c/{i % CHUNKS:02d}: {exc}")
            else:
                if data != DATA[(i % CHUNKS) * CHUNK : (i % CHUNKS + 1) * CHUNK]:
                    failures.append(f"c/{i % CHUNKS:02d}: wrong bytes")
            reads[n] += 1
            i += 7

    threads = [threading.Thread(target=reader, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    try:
        # Until the readers have been signed by four keys in turn (three renewals).
        deadline = time.monotonic() + 180
        while len(set(gate.signed_by) - before_keys) < 4 or min(reads) < 8:
            assert time.monotonic() < deadline, f"{len(gate.signed_by)} keys, {reads} reads"
            assert not failures, failures[:5]
            time.sleep(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert failures == []
    assert sum(gate.refused.values()) == before_refused  # no expired key ever reached it
    assert set(gate.agents - agents) == {"refmount"}  # refmount's client, never botocore's
    log = mounted.log()
    if INFO_LOGGED:
        assert OWN_CLIENT in log
        assert "s3: credentials from credential_process (AWS profile 'daac')" in log
        assert "obstore has no equivalent for credentials from the AWS profile 'daac'" in log


def test_a_failing_credential_process_is_eio_naming_it_and_not_run_per_read(
    gate: SigV4Gate, aws_env: Path, tmp_path: Path, mount: Callable[..., Mounted],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    runs, script = tmp_path / "runs", tmp_path / "credentials.sh"
    script.write_text(f'echo run >> {runs}\necho "token service down" >&2\nexit 3\n')
    process_profile(aws_env, "broken", f"sh {script}")
    monkeypatch.setenv("AWS_PROFILE", "broken")  # the daemon's
    mounted = mount(refs_file(tmp_path), *mount_args(gate))
    errors: list[int | None] = []
    for i in range(24):
        with pytest.raises(OSError) as failed:
            read_chunk(mounted.mountpoint, i)
        errors.append(failed.value.errno)
    assert set(errors) == {errno.EIO}
    assert mounted.process.poll() is None and (mounted.mountpoint / "c").is_dir()
    count = len(runs.read_text().splitlines())
    assert 1 <= count <= 6 * LOOKING_UP, count  # once per back-off (1 s, doubling), not per read
    log = mounted.log()
    assert "S3 credentials from credential_process (AWS profile 'broken')" in log
    assert "token service down" in log
    # Fixed, it is found again after the back-off, without a remount.
    script.write_text(f"exec {fetching_command(gate, ttl=3600)}\n")
    agents = Counter(gate.agents)
    deadline = time.monotonic() + 120
    while True:
        try:
            assert read_chunk(mounted.mountpoint, 5) == DATA[5 * CHUNK : 6 * CHUNK]
            break
        except OSError as exc:
            assert exc.errno == errno.EIO and time.monotonic() < deadline
            time.sleep(0.5)
    assert set(gate.agents - agents) == {"refmount"}
    if INFO_LOGGED:
        assert OWN_CLIENT in mounted.log()


def test_container_credentials_from_a_local_endpoint(
    gate: SigV4Gate, aws_env: Path, tmp_path: Path, mount: Callable[..., Mounted],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    url = f"{gate.endpoint}/_credentials/container?ttl=3600"
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", url)
    agents = Counter(gate.agents)
    mounted = mount(refs_file(tmp_path), *mount_args(gate))
    for i in range(CHUNKS):
        assert read_chunk(mounted.mountpoint, i) == DATA[i * CHUNK : (i + 1) * CHUNK]
    assert gate.agents["refmount"] > agents["refmount"]  # the gate passed the reads' GETs
    assert set(gate.agents - agents) == {"refmount"}
    log = mounted.log()
    if INFO_LOGGED:
        assert OWN_CLIENT in log
        assert "s3: credentials from the container credentials endpoint" in log


def test_web_identity_credentials_from_sts(
    gate: SigV4Gate, aws_env: Path, tmp_path: Path, mount: Callable[..., Mounted],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    token_file = tmp_path / "token"
    token_file.write_text(gate.web_identity)  # as Kubernetes' IRSA mounts it
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/reader")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", gate.endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", S3_REGION)
    issued, agents = gate.issued, Counter(gate.agents)
    mounted = mount(refs_file(tmp_path), *mount_args(gate))
    for i in range(0, CHUNKS, 5):
        assert read_chunk(mounted.mountpoint, i) == DATA[i * CHUNK : (i + 1) * CHUNK]
    assert gate.issued > issued and gate.refused["AssumeRoleWithWebIdentity"] == 0
    assert set(gate.agents - agents) == {"refmount"}
    log = mounted.log()
    if INFO_LOGGED:
        assert OWN_CLIENT in log
        assert "s3: credentials from web identity (AWS_WEB_IDENTITY_TOKEN_FILE)" in log


def test_instance_role_credentials_from_the_metadata_service(
    gate: SigV4Gate, aws_env: Path, tmp_path: Path, mount: Callable[..., Mounted],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", f"{gate.endpoint}/")
    issued, agents = gate.issued, Counter(gate.agents)
    mounted = mount(refs_file(tmp_path), *mount_args(gate))
    for i in range(0, CHUNKS, 5):
        assert read_chunk(mounted.mountpoint, i) == DATA[i * CHUNK : (i + 1) * CHUNK]
    assert gate.issued > issued
    assert set(gate.agents - agents) == {"refmount"}
    log = mounted.log()
    if INFO_LOGGED:
        assert OWN_CLIENT in log
        assert "s3: credentials from the instance metadata service (IMDS)" in log


def test_check_says_where_the_credentials_come_from(
    gate: SigV4Gate, aws_env: Path, tmp_path: Path
) -> None:
    process_profile(aws_env, "daac", fetching_command(gate, ttl=3600))
    secrets_before = {key: value[0] for key, value in gate.keys.items()}
    # ``region`` as refmount spells it: s3fs, which asks the sizes, takes it too.
    options = {"s3": {"endpoint_url": gate.endpoint, "region": S3_REGION, "profile": "daac"}}
    done = subprocess.run(
        [*REFMOUNT, "check", str(refs_file(tmp_path)), "--probe", "4",
         "--remote-options", json.dumps(options)],
        capture_output=True, text=True, env=child_env(), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "s3 credentials    s3://: credential_process (AWS profile 'daac')" in done.stdout
    issued = {key: value[0] for key, value in gate.keys.items() if key not in secrets_before}
    assert issued  # the process ran, and none of what it gave is printed
    for key, secret in issued.items():
        assert key not in done.stdout and secret not in done.stdout


def test_a_credential_process_that_hangs_fails_at_the_deadline_one_at_a_time(
    gate: SigV4Gate, aws_env: Path, tmp_path: Path, mount: Callable[..., Mounted]
) -> None:
    runs, script = tmp_path / "runs", tmp_path / "credentials.sh"
    script.write_text(f"echo run >> {runs}\nexec sleep 60\n")
    process_profile(aws_env, "stuck", f"sh {script}")
    mounted = mount(refs_file(tmp_path), *mount_args(gate, profile="stuck"), "--timeout", "2")
    for i in range(4):
        with pytest.raises(OSError) as failed:
            read_chunk(mounted.mountpoint, i)
        assert failed.value.errno == errno.EIO
    assert mounted.process.poll() is None and (mounted.mountpoint / "c").is_dir()
    # No second lookup beside the one that hangs.
    assert 1 <= len(runs.read_text().splitlines()) <= LOOKING_UP
    log = mounted.log()
    # Which provider hangs, botocore does not say before it answers: the profile is named.
    stuck = "credentials from botocore's credential chain (AWS profile 'stuck')"
    assert f"{stuck}: no answer within 2 s" in log
