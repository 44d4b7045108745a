"""The command line as a user runs it: errors, life cycle, options, and what the tree says.

Every check runs ``python -m refmount`` as a separate process and looks at the result the
way a user would: exit status, what was printed, /proc/mounts, and ``ls``/``stat``/
``getfattr``/``cat`` on the mount from other processes.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.metadata
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import (
    REFMOUNT,
    Mounted,
    daemon_pids,
    is_mounted,
    refmount_cli,
    unmount,
)
from tests.support.servers import RangeServer

SETTLE = 20.0  # seconds a daemon gets to exit after a signal


# -- helpers -----------------------------------------------------------------------------------


def write_json(directory: Path, document: object, name: str = "refs.json") -> Path:
    path = directory / name
    path.write_text(json.dumps(document))
    return path


def mount_lines(path: Path) -> list[list[str]]:
    """The /proc/mounts rows (split in fields) whose target is path."""
    target = os.path.realpath(path)
    with open("/proc/mounts") as mounts:
        rows = [line.split() for line in mounts]
    return [row for row in rows if row[1] == target]


def python_daemons(mountpoint: Path) -> list[int]:
    """refmount's own processes for mountpoint (not libfuse's fusermount3 helper)."""
    pids = []
    for pid in daemon_pids(mountpoint):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"-m" in argv and b"refmount" in argv and running(pid):
                pids.append(pid)
    return pids


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphaned daemon's parent may never reap it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X")


def wait_for(condition: Callable[[], bool], timeout: float = SETTLE, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.02)


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


def xattrs(path: Path) -> dict[str, str]:
    """``getfattr -d -m -`` of path, as a dict of text values."""
    result = run(["getfattr", "--absolute-names", "-d", "-m", "-", "-e", "text", str(path)])
    assert result.returncode == 0, result.stderr
    found = {}
    for line in result.stdout.splitlines():
        if "=" in line and not line.startswith("#"):
            name, _, value = line.partition("=")
            found[name] = json.loads(value) if value.startswith('"') else value
    return found


def xattr_value(path: Path, name: str) -> str:
    result = run(["getfattr", "--absolute-names", "--only-values", "-n", name, str(path)])
    assert result.returncode == 0, result.stderr
    return result.stdout


def stop_background(mountpoint: Path) -> None:
    for pid in python_daemons(mountpoint):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not python_daemons(mountpoint), what="the daemon to exit")
    unmount(mountpoint)


@contextlib.contextmanager
def public_mountpoint() -> Iterator[Path]:
    """A mount point every user can reach (pytest's tmp_path is private to root)."""
    base = Path(tempfile.mkdtemp(prefix="refmount-cli-"))
    base.chmod(0o755)
    mountpoint = base / "mnt"
    mountpoint.mkdir()
    try:
        yield mountpoint
    finally:
        stop_background(mountpoint)
        shutil.rmtree(base, ignore_errors=True)


def as_nobody(args: list[str]) -> subprocess.CompletedProcess[str]:
    return run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *args])


@pytest.fixture
def simple_refs(tmp_path: Path) -> Path:
    return write_json(tmp_path, {"version": 1, "refs": {"a": "alpha", "d/b": "beta"}})


# -- bad input: a clear message, a non-zero exit, and nothing mounted --------------------------

BAD_REFS: dict[str, tuple[object, list[str]]] = {
    # name: (document, substrings the message must contain)
    "version 2": ({"version": 2, "refs": {}}, ["version", "2"]),
    "gen without url": (
        {"version": 1, "gen": [{"key": "k{{i}}", "dimensions": {"i": {"stop": 2}}}]},
        ["gen[0]", "url"],
    ),
    "gen without dimensions": (
        {"version": 1, "gen": [{"key": "k{{i}}", "url": "http://h/{{i}}"}]},
        ["gen[0]", "dimensions"],
    ),
    "gen offset without length": (
        {
            "version": 1,
            "gen": [
                {
                    "key": "k{{i}}",
                    "url": "http://h/{{i}}",
                    "offset": "{{i}}",
                    "dimensions": {"i": {"stop": 2}},
                }
            ],
        },
        ["gen[0]", "offset", "length"],
    ),
    "undefined template name": (
        {"version": 1, "refs": {"undef-key": ["{{nowhere}}/x.bin", 0, 10]}},
        ["undef-key", "nowhere"],
    ),
    "function globals": (
        {
            "version": 1,
            "templates": {"f": "{{c}}"},
            "refs": {"glob-key": ["{{ f.__globals__ }}", 0, 10]},
        },
        ["glob-key"],
    ),
    "dunder class": (
        {"version": 1, "refs": {"class-key": ["{{ ''.__class__.__mro__ }}", 0, 10]}},
        ["class-key"],
    ),
    "for statement": (
        {
            "version": 1,
            "refs": {"loop-key": ["{{ 'u' }}{% for i in range(9) %}x{% endfor %}", 0, 10]},
        },
        ["loop-key"],
    ),
    "for statement in gen": (
        {
            "version": 1,
            "gen": [
                {
                    "key": "{% for i in range(99999999) %}x{% endfor %}",
                    "url": "http://h/x",
                    "dimensions": {"i": [1]},
                }
            ],
        },
        ["gen[0]"],
    ),
    "huge string": (
        {"version": 1, "refs": {"huge-key": ["{{ 'a' * 10**9 }}", 0, 10]}},
        ["huge-key"],
    ),
    "huge power": (
        {"version": 1, "refs": {"pow-key": ["{{ 9**9**9 }}", 0, 10]}},
        ["pow-key"],
    ),
    "negative offset": ({"neg-off": ["http://h/x", -1, 10]}, ["neg-off"]),
    "negative length": ({"neg-len": ["http://h/x", 0, -10]}, ["neg-len"]),
    "float offset": ({"float-off": ["http://h/x", 1.5, 10]}, ["float-off"]),
    "float length": ({"float-len": ["http://h/x", 0, 10.0]}, ["float-len"]),
    "boolean offset": ({"bool-off": ["http://h/x", True, 10]}, ["bool-off"]),
    "boolean length": ({"bool-len": ["http://h/x", 0, False]}, ["bool-len"]),
    "overflowing offset": ({"big-off": ["http://h/x", 2**63, 10]}, ["big-off"]),
    "overflowing length": ({"big-len": ["http://h/x", 0, 2**63]}, ["big-len"]),
    "overflowing sum": ({"big-sum": ["http://h/x", 2**62, 2**62]}, ["big-sum"]),
    "string offset": ({"str-off": ["http://h/x", "5", 10]}, ["str-off"]),
    "number value": ({"num-key": 42}, ["num-key"]),
    "null value": ({"null-key": None}, ["null-key"]),
    "list of two": ({"pair-key": ["http://h/x", 5]}, ["pair-key"]),
    "empty url": ({"nourl-key": ["", 0, 1]}, ["nourl-key"]),
    "bad base64": ({"b64-key": "base64:not*base64"}, ["b64-key"]),
    "gen negative offset": (
        {
            "version": 1,
            "gen": [
                {
                    "key": "k{{i}}",
                    "url": "http://h/x",
                    "offset": "{{ i - 5 }}",
                    "length": "10",
                    "dimensions": {"i": {"stop": 2}},
                }
            ],
        },
        ["gen[0]", "offset"],
    ),
    "gen overflowing length": (
        {
            "version": 1,
            "gen": [
                {
                    "key": "gk{{i}}",
                    "url": "http://h/x",
                    "offset": "0",
                    "length": str(2**63),
                    "dimensions": {"i": {"stop": 1}},
                }
            ],
        },
        ["gk0"],
    ),
    "not an object": ([1, 2, 3], ["object"]),
}
LEAKS = ("<function", "<class", "builtins", "__import__", "Traceback")


def assert_refused(result: subprocess.CompletedProcess[str], mountpoint: Path) -> None:
    assert result.returncode != 0, result
    assert result.stderr.startswith("refmount") or "refmount:" in result.stderr, result.stderr
    for leak in LEAKS:
        assert leak not in result.stderr, result.stderr
    assert not is_mounted(mountpoint)
    assert mount_lines(mountpoint) == []
    assert python_daemons(mountpoint) == []


@pytest.mark.parametrize("case", list(BAD_REFS))
def test_bad_refs_are_refused_with_a_message(case: str, tmp_path: Path, mountpoint: Path) -> None:
    document, expected = BAD_REFS[case]
    refs = write_json(tmp_path, document)

    result = refmount_cli(str(refs), str(mountpoint))

    assert_refused(result, mountpoint)
    for text in expected:
        assert text in result.stderr, (text, result.stderr)


def test_malformed_json_names_line_and_column(tmp_path: Path, mountpoint: Path) -> None:
    refs = tmp_path / "broken.json"
    refs.write_text('{"a": "b",\n  "c": [1, 2,\n  }\n')

    result = refmount_cli(str(refs), str(mountpoint))

    assert_refused(result, mountpoint)
    assert "line 3" in result.stderr and "column 3" in result.stderr, result.stderr
    assert "broken.json" in result.stderr


def test_missing_refs(tmp_path: Path, mountpoint: Path) -> None:
    refs = tmp_path / "does-not-exist.json"
    result = refmount_cli(str(refs), str(mountpoint))
    assert_refused(result, mountpoint)
    assert "does-not-exist.json" in result.stderr
    assert "no such file" in result.stderr.lower()


def test_directory_without_zmetadata(tmp_path: Path, mountpoint: Path) -> None:
    refs = tmp_path / "not-parquet"
    refs.mkdir()
    (refs / "somefile").write_text("x")
    result = refmount_cli(str(refs), str(mountpoint))
    assert_refused(result, mountpoint)
    assert "not-parquet" in result.stderr and ".zmetadata" in result.stderr


def test_broken_gzip(tmp_path: Path, mountpoint: Path) -> None:
    refs = tmp_path / "refs.json.gz"
    whole = gzip.compress(json.dumps({"a": os.urandom(20000).hex()}).encode())
    refs.write_bytes(whole[: len(whole) // 2])
    result = refmount_cli(str(refs), str(mountpoint))
    assert_refused(result, mountpoint)
    assert "refs.json.gz" in result.stderr


def test_bad_refs_in_the_foreground(tmp_path: Path, mountpoint: Path) -> None:
    refs = write_json(tmp_path, {"fg-key": ["http://h/x", -5, 1]})
    result = refmount_cli(str(refs), str(mountpoint), "-f")
    assert_refused(result, mountpoint)
    assert "fg-key" in result.stderr


def test_missing_mountpoint(simple_refs: Path, tmp_path: Path) -> None:
    target = tmp_path / "no-such-dir"
    result = refmount_cli(str(simple_refs), str(target))
    assert result.returncode != 0
    assert "no-such-dir" in result.stderr and "does not exist" in result.stderr
    assert not target.exists()


def test_mountpoint_not_a_directory(simple_refs: Path, tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("")
    result = refmount_cli(str(simple_refs), str(target))
    assert result.returncode != 0
    assert "a-file" in result.stderr and "not a directory" in result.stderr
    assert mount_lines(target) == []


def test_mountpoint_already_mounted(simple_refs: Path, mountpoint: Path) -> None:
    first = refmount_cli(str(simple_refs), str(mountpoint))
    assert first.returncode == 0, first.stderr
    assert len(mount_lines(mountpoint)) == 1

    second = refmount_cli(str(simple_refs), str(mountpoint))

    assert second.returncode != 0
    assert "already" in second.stderr and str(mountpoint) in second.stderr
    assert len(mount_lines(mountpoint)) == 1  # not stacked
    assert len(python_daemons(mountpoint)) == 1
    assert run(["cat", str(mountpoint / "a")]).stdout == "alpha"  # the first still serves


# -- life cycle --------------------------------------------------------------------------------


def test_background_returns_once_the_mount_answers(
    simple_refs: Path, mountpoint: Path, tmp_path: Path
) -> None:
    log = tmp_path / "daemon.log"
    result = refmount_cli(str(simple_refs), str(mountpoint), "--log-file", str(log))

    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "")  # a quiet success, like mount(8)
    # No polling: ready means ready.
    assert len(mount_lines(mountpoint)) == 1
    listing = run(["ls", str(mountpoint)])
    assert listing.returncode == 0 and listing.stdout.split() == ["a", "d"]
    assert run(["cat", str(mountpoint / "d" / "b")]).stdout == "beta"
    pids = python_daemons(mountpoint)
    assert len(pids) == 1
    (pid,) = pids
    assert pid != os.getpid()
    assert os.getsid(pid) == pid  # detached into its own session

    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not running(pid), what="the daemon to exit")
    assert not is_mounted(mountpoint)
    assert os.listdir(mountpoint) == []  # a plain directory again, not ENOTCONN
    text = log.read_text()
    assert "SIGTERM" in text and "unmounted" in text, text


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_foreground_signal_unmounts_and_exits_0(
    signum: signal.Signals, simple_refs: Path, mountpoint: Path, tmp_path: Path
) -> None:
    with (tmp_path / "fg.log").open("wb") as log:
        proc = subprocess.Popen(
            [*REFMOUNT, str(simple_refs), str(mountpoint), "-f"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for(lambda: is_mounted(mountpoint) or proc.poll() is not None, what="mount")
            assert proc.poll() is None, (tmp_path / "fg.log").read_text()
            assert run(["cat", str(mountpoint / "a")]).stdout == "alpha"
            proc.send_signal(signum)
            assert proc.wait(SETTLE) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not is_mounted(mountpoint)
    assert os.listdir(mountpoint) == []
    assert "unmounted" in (tmp_path / "fg.log").read_text()


def test_debug_flag_stays_in_the_foreground(
    simple_refs: Path, mount: Callable[..., Mounted]
) -> None:
    m = mount(simple_refs, "-d")
    assert run(["cat", str(m.mountpoint / "a")]).stdout == "alpha"
    assert m.process.poll() is None  # -d did not fork away
    assert m.stop() == 0
    assert " DEBUG " in m.log()


# -- read-only ---------------------------------------------------------------------------------


def test_every_write_is_refused_as_read_only(
    simple_refs: Path, mount: Callable[..., Mounted]
) -> None:
    m = mount(simple_refs)
    root = m.mountpoint
    file = root / "a"
    attempts = {
        "touch new": ["touch", str(root / "new")],
        "touch existing": ["touch", str(file)],
        "redirect": ["sh", "-c", f"echo x > {file}"],
        "append": ["sh", "-c", f"echo x >> {file}"],
        "create": ["sh", "-c", f"echo x > {root / 'created'}"],
        "rm": ["rm", "-f", str(file)],
        "rmdir": ["rmdir", str(root / "d")],
        "mkdir": ["mkdir", str(root / "newdir")],
        "mv": ["mv", str(file), str(root / "moved")],
        "chmod": ["chmod", "777", str(file)],
        "chown": ["chown", "1:1", str(file)],
        "ln": ["ln", str(file), str(root / "hard")],
        "ln -s": ["ln", "-s", "a", str(root / "soft")],
        "setfattr": ["setfattr", "-n", "user.x", "-v", "y", str(file)],
        "setfattr -x": ["setfattr", "-x", "user.refmount.source", str(file)],
        "truncate": ["truncate", "-s", "0", str(file)],
        "mknod": ["mkfifo", str(root / "fifo")],
    }
    for what, args in attempts.items():
        result = run(args)
        assert result.returncode != 0, what
        assert "Read-only file system" in result.stderr, (what, result.stderr)
    assert run(["cat", str(file)]).stdout == "alpha"
    assert sorted(os.listdir(root)) == ["a", "d"]


# -- -o options --------------------------------------------------------------------------------


def test_uid_gid_umask_options(simple_refs: Path, mount: Callable[..., Mounted]) -> None:
    m = mount(simple_refs, "-o", "uid=1234,gid=4321,umask=027")
    for path, mode in ((m.mountpoint, 0o550), (m.mountpoint / "d", 0o550),
                       (m.mountpoint / "a", 0o440), (m.mountpoint / "d" / "b", 0o440)):  # fmt: skip
        st = os.stat(path)
        assert (st.st_uid, st.st_gid) == (1234, 4321), path
        assert stat.S_IMODE(st.st_mode) == mode, (path, oct(st.st_mode))
    # The same through readdir (ls -ln), not only lookup.
    listing = run(["ls", "-ln", str(m.mountpoint)]).stdout
    assert re.search(r"^-r--r----- 1 1234 4321 +5 .* a$", listing, re.MULTILINE), listing
    assert re.search(r"^dr-xr-x--- 2 1234 4321 .* d$", listing, re.MULTILINE), listing


def test_default_owner_is_the_caller_and_modes_are_read_only(
    simple_refs: Path, mount: Callable[..., Mounted]
) -> None:
    m = mount(simple_refs)
    st = os.stat(m.mountpoint / "a")
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
    assert stat.S_IMODE(st.st_mode) == 0o444
    assert stat.S_IMODE(os.stat(m.mountpoint / "d").st_mode) == 0o555


def test_mount_flags_are_always_ro_nodev_nosuid(
    simple_refs: Path, mount: Callable[..., Mounted]
) -> None:
    m = mount(simple_refs)
    ((source, _, fstype, options, *_),) = mount_lines(m.mountpoint)
    flags = options.split(",")
    assert fstype == "fuse.refmount"
    assert source == str(simple_refs)
    for flag in ("ro", "nodev", "nosuid", "default_permissions"):
        assert flag in flags, options
    assert "allow_other" not in flags


def test_allow_other(simple_refs: Path) -> None:
    with public_mountpoint() as mp:
        result = refmount_cli(str(simple_refs), str(mp), "-o", "allow_other")
        assert result.returncode == 0, result.stderr
        ((*_, options, _, _),) = mount_lines(mp)
        assert "allow_other" in options.split(",")
        assert "default_permissions" in options.split(",")
        read = as_nobody(["cat", str(mp / "a")])
        assert read.returncode == 0, read.stderr
        assert read.stdout == "alpha"


def test_without_allow_other_other_users_are_refused(simple_refs: Path) -> None:
    with public_mountpoint() as mp:
        result = refmount_cli(str(simple_refs), str(mp))
        assert result.returncode == 0, result.stderr
        read = as_nobody(["cat", str(mp / "a")])
        assert read.returncode != 0
        assert "Permission denied" in read.stderr


@pytest.mark.parametrize("how", ["-o", "--fsname"])
def test_fsname_with_commas_injects_no_option(
    how: str, simple_refs: Path, mountpoint: Path
) -> None:
    if how == "-o":
        args = ["-o", r"fsname=src\,allow_other\,b"]
    else:
        args = ["--fsname", "src,allow_other,b"]
    result = refmount_cli(str(simple_refs), str(mountpoint), *args)
    assert result.returncode == 0, result.stderr

    ((source, _, _, options, *_),) = mount_lines(mountpoint)
    assert source == "src,allow_other,b"
    flags = options.split(",")
    assert "allow_other" not in flags and "b" not in flags, options
    assert all(not f.startswith("src") for f in flags)


def test_every_long_option_as_key_value(
    tmp_path: Path, http: RangeServer, mount: Callable[..., Mounted]
) -> None:
    stalled, failing = "cli-o-stalled.bin", "cli-o-failing.bin"
    for name in (stalled, failing):
        (http.root / name).write_bytes(os.urandom(2000))
    refs = write_json(tmp_path, {"version": 1, "refs": {
        "stalled": [f"{http.url}/{stalled}", 0, 1000],
        "failing": [f"{http.url}/{failing}", 0, 1000],
    }})  # fmt: skip
    m = mount(
        refs, "-o", "timeout=1,retries=2,cache_size=64M,log_level=debug,xattrs",
        "-o", "read_ahead_kb=4096,max_background=20,ready_timeout=30",
    )  # fmt: skip
    http.fault(f"/{stalled}", "stall", count=-1)
    http.fault(f"/{failing}", "503", count=-1)

    stats = json.loads(xattr_value(m.mountpoint, "user.refmount.stats"))
    assert stats["budget"] == 64 << 20  # cache_size
    assert run(["dd", f"if={m.mountpoint / 'failing'}", "bs=1", "count=1"]).returncode != 0
    requests = http.stats()["requests"]
    assert requests in (3, 6), requests  # retries=2: three attempts per READ (one or two)
    assert run(["cat", str(m.mountpoint / "stalled")]).returncode != 0
    # timeout=1 and retries=2 took effect: the log names both (not timed: a busy machine).
    log = m.log()
    assert "no answer within 1 s" in log
    assert "after 3 attempts" in log
    assert " DEBUG " in log  # log_level
    minor = os.minor(os.stat(m.mountpoint).st_dev)
    assert Path(f"/sys/class/bdi/0:{minor}/read_ahead_kb").read_text().strip() == "4096"
    assert Path(f"/sys/fs/fuse/connections/{minor}/max_background").read_text().strip() == "20"


def test_mount_only_options_are_ignored(simple_refs: Path, mountpoint: Path) -> None:
    result = refmount_cli(
        str(simple_refs), str(mountpoint), "-o",
        "_netdev,nofail,auto,x-systemd.automount,defaults,ro,nodev,nosuid,noatime,user,"
        "x-systemd.mount-timeout=30,comment=anything",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert run(["cat", str(mountpoint / "a")]).stdout == "alpha"


@pytest.mark.parametrize(
    ("option", "named"),
    [("bogus", "bogus"), ("timeout", "timeout"), ("allow_other=yes", "allow_other"),
     ("cache_size=lots", "lots"), ("help", "help")],
)  # fmt: skip
def test_bad_o_option_fails_clearly(
    option: str, named: str, simple_refs: Path, mountpoint: Path
) -> None:
    result = refmount_cli(str(simple_refs), str(mountpoint), "-o", f"ro,{option}")
    assert result.returncode != 0
    assert named in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not is_mounted(mountpoint)


@pytest.mark.parametrize(
    "option",
    [["--retries", "-1"], ["--timeout", "0"], ["--timeout", "nan"], ["--max-requests", "0"],
     ["-o", "max_background=0"]],
    ids=lambda o: " ".join(o),
)  # fmt: skip
def test_nonsense_numbers_are_refused(
    option: list[str], simple_refs: Path, mountpoint: Path
) -> None:
    """Values that would make every remote read fail or hang are usage errors, not mounts."""
    result = refmount_cli(str(simple_refs), str(mountpoint), *option)
    assert result.returncode != 0, f"mounted with {option}"
    name = option[1].split("=")[0] if option[0] == "-o" else option[0].lstrip("-")
    assert name.replace("_", "-") in result.stderr.replace("_", "-"), result.stderr
    assert not is_mounted(mountpoint)


# -- --version and --help ----------------------------------------------------------------------


def test_version_names_refmount_pyfuse3_and_libfuse() -> None:
    result = refmount_cli("--version")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert re.search(rf"\brefmount {re.escape(importlib.metadata.version('refmount'))}\b", text)
    assert f"pyfuse3 {importlib.metadata.version('pyfuse3')}" in text, text
    fusermount = run(["fusermount3", "--version"])
    major_minor = re.search(r"(\d+)\.(\d+)", fusermount.stdout + fusermount.stderr)
    assert major_minor, fusermount
    assert re.search(rf"libfuse {major_minor[1]}\.{major_minor[2]}\b", text), text


def test_help_lists_the_options() -> None:
    result = refmount_cli("--help")
    assert result.returncode == 0
    for option in ("-o", "--foreground", "--debug", "--timeout", "--retries", "--cache-size",
                   "--allow-other", "--uid", "--gid", "--umask", "--fsname", "--log-level",
                   "--version", "refs", "mountpoint"):  # fmt: skip
        assert option in result.stdout, option


def test_no_arguments_is_a_usage_error() -> None:
    result = refmount_cli()
    assert result.returncode == 2
    assert "usage:" in result.stderr


# -- extended attributes -----------------------------------------------------------------------


def test_extended_attributes_tell_where_bytes_come_from(
    tmp_path: Path, http: RangeServer, mount: Callable[..., Mounted]
) -> None:
    name = "cli-xattr.bin"
    data = os.urandom(5000)
    (http.root / name).write_bytes(data)
    url = f"{http.url}/{name}"
    secret_url = url + "?token=s3cr3t&X-Amz-Signature=hunter2"  # a login is refused
    local = tmp_path / "local.bin"
    local.write_bytes(data)
    refs = write_json(tmp_path, {"version": 1, "refs": {
        "range": [url, 100, 2000], "inline": "hello", "whole": [url], "secret": [secret_url, 0, 10],
        "local": [str(local), 0, 10],
    }})  # fmt: skip
    m = mount(refs, "--xattrs")

    assert xattrs(m.mountpoint / "range") == {
        "user.refmount.source": "range",
        "user.refmount.url": url,
        "user.refmount.offset": "100",
        "user.refmount.length": "2000",
    }
    inline = xattrs(m.mountpoint / "inline")
    assert inline["user.refmount.source"] == "inline"
    assert inline.get("user.refmount.length", "5") == "5"
    assert "user.refmount.url" not in inline
    whole = xattrs(m.mountpoint / "whole")
    assert whole["user.refmount.url"] == url and "user.refmount.length" not in whole
    secret = xattrs(m.mountpoint / "secret")
    assert secret["user.refmount.url"] == url  # no query
    assert "hunter2" not in json.dumps(secret) and "s3cr3t" not in json.dumps(secret)
    assert xattrs(m.mountpoint / "local")["user.refmount.url"] == f"file://{local}"
    assert set(xattrs(m.mountpoint)) == {"user.refmount.stats"}
    missing = run(["getfattr", "-n", "user.refmount.nothing", str(m.mountpoint / "range")])
    assert missing.returncode != 0 and "No such attribute" in missing.stderr

    before = json.loads(xattr_value(m.mountpoint, "user.refmount.stats"))
    read = subprocess.run(["cat", str(m.mountpoint / "range")], capture_output=True, timeout=60)
    assert read.stdout == data[100:2100]
    after = json.loads(xattr_value(m.mountpoint, "user.refmount.stats"))
    assert after["requests"] > before["requests"]
    assert after["bytes_fetched"] >= before["bytes_fetched"] + 2000
    assert after["errors"] == before["errors"] == 0


# -- what the tree says ------------------------------------------------------------------------


TEXT = "héllo wörld ☃ 🦀"
OBJECT = {"zarr_format": 2, "shape": [10, 20], "name": "température", "nested": {"a": None}}
BINARY = bytes(range(256)) * 3


@pytest.fixture
def tree_refs(tmp_path: Path) -> Path:
    import base64

    refs = {
        "text": TEXT,
        "bin": "base64:" + base64.b64encode(BINARY).decode(),
        "obj/.zarray": OBJECT,
        "d/e/f": "x",
        "d/g/h": "y",
        "d/i": "z",
        "d/e/j/k": "deep",
    }
    path = write_json(tmp_path, {"version": 1, "refs": refs})
    os.utime(path, (1_600_000_000.25, 1_600_000_123.5))
    return path


def test_sizes_and_bytes_are_exact(tree_refs: Path, mount: Callable[..., Mounted]) -> None:
    m = mount(tree_refs)
    text = m.mountpoint / "text"
    assert os.stat(text).st_size == len(TEXT.encode()) != len(TEXT)
    assert run(["cat", str(text)]).stdout == TEXT
    binary = m.mountpoint / "bin"
    assert os.stat(binary).st_size == len(BINARY)
    assert subprocess.run(["cat", str(binary)], capture_output=True).stdout == BINARY
    zarray = m.mountpoint / "obj" / ".zarray"
    body = subprocess.run(["cat", str(zarray)], capture_output=True).stdout
    assert os.stat(zarray).st_size == len(body)
    assert json.loads(body) == OBJECT
    assert len(body) in (
        len(json.dumps(OBJECT, separators=(",", ":")).encode()),
        len(json.dumps(OBJECT, separators=(",", ":"), ensure_ascii=False).encode()),
    )  # compact


def test_directory_link_counts(tree_refs: Path, mount: Callable[..., Mounted]) -> None:
    m = mount(tree_refs)
    nlinks = {p: os.stat(m.mountpoint / p).st_nlink for p in ("", "d", "d/e", "d/e/j", "d/g")}
    assert nlinks == {"": 2 + 2, "d": 2 + 2, "d/e": 2 + 1, "d/e/j": 2, "d/g": 2}
    assert os.stat(m.mountpoint / "d" / "i").st_nlink == 1
    # find relies on nlink to skip leaves; it must still see everything.
    found = run(["find", str(m.mountpoint), "-type", "f"]).stdout.split()
    assert len(found) == 7


def test_inodes_are_stable_and_consistent(tree_refs: Path, mount: Callable[..., Mounted]) -> None:
    m = mount(tree_refs)
    paths = ["text", "d", "d/e", "d/e/f", "obj/.zarray"]
    script = "import os, sys; print([os.stat(p).st_ino for p in sys.argv[1:]])"
    args = [sys.executable, "-c", script, *(str(m.mountpoint / p) for p in paths)]
    first, second = run(args).stdout, run(args).stdout
    assert first == second
    inodes = json.loads(first)
    assert len(set(inodes)) == len(inodes)
    assert os.stat(m.mountpoint).st_ino == 1
    # readdir reports the same numbers as lookup
    listing = dict(
        reversed(line.split()) for line in run(["ls", "-i", str(m.mountpoint / "d")]).stdout
        .splitlines()
    )  # fmt: skip
    assert int(listing["e"]) == inodes[2]


def test_mtime_is_the_refs_mtime(tree_refs: Path, mount: Callable[..., Mounted]) -> None:
    m = mount(tree_refs)
    for path in ("", "text", "d", "d/e/f"):
        st = os.stat(m.mountpoint / path)
        assert st.st_mtime == pytest.approx(1_600_000_123.5, abs=1e-6), path


def test_missing_names_are_enoent(tree_refs: Path, mount: Callable[..., Mounted]) -> None:
    m = mount(tree_refs)
    for name in ("nothere", "d/nothere", "d/i/below-a-file", "text/x", "D", "d/e/f/"):
        result = run(["ls", f"{m.mountpoint}/{name}"])
        assert result.returncode != 0, name
        expected = "Not a directory" if name.startswith(("d/i/", "text/", "d/e/f/")) \
            else "No such file or directory"  # fmt: skip
        assert expected in result.stderr, (name, result.stderr)


def test_odd_keys_stay_inside_the_tree(tmp_path: Path, mount: Callable[..., Mounted]) -> None:
    odd = ["/abs", "a//b", "a/../b", "../escape", "x/", "./dot", "q/" + "L" * 300, "n\u0000ul"]
    refs = {key: f"value of {key!r}" for key in odd}
    refs.update({"k": "file and prefix", "k/v": "inside k", "ok": "fine"})
    m = mount(write_json(tmp_path, {"version": 1, "refs": refs}))

    found = run(["find", str(m.mountpoint), "-mindepth", "1", "-printf", "%P %y\n"]).stdout
    assert sorted(found.splitlines()) == ["k d", "k/v f", "ok f"]
    assert run(["cat", str(m.mountpoint / "k" / "v")]).stdout == "inside k"
    assert not (tmp_path / "abs").exists() and not (tmp_path / "escape").exists()

    warnings = [line for line in m.log().splitlines() if "WARNING" in line]
    for key in [*odd, "k"]:
        mentions = [line for line in warnings if f"key {key!r}" in line]
        assert len(mentions) == 1, (key, warnings)
    assert len(warnings) == len(odd) + 1, warnings
