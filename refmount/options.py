"""The command line, including ``-o`` mount options as mount(8) and fstab pass them.

Every long option can also be given as ``-o name=value`` (or ``-o name`` for a flag), so
that an fstab line can say everything.  Options that only mean something to mount(8)
(``_netdev``, ``nofail``, ``x-*`` ...) are accepted and ignored.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Options for mount(8) or systemd, not for the filesystem; refmount is always ro,nodev,nosuid.
IGNORED = frozenset(
    [
        "defaults",
        "auto",
        "noauto",
        "user",
        "nouser",
        "users",
        "owner",
        "group",
        "_netdev",
        "nofail",
        "ro",
        "rw",
        "nodev",
        "nosuid",
        "dev",
        "suid",
        "exec",
        "noexec",
        "atime",
        "noatime",
        "relatime",
        "nodiratime",
        "sync",
        "async",
        "dirsync",
    ]
)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


class UsageError(Exception):
    """Options that make no sense; the message says which."""


@dataclass
class Config:
    refs: str
    mountpoint: str
    foreground: bool = False
    debug: bool = False
    refs_options: dict[str, Any] = field(default_factory=dict)
    remote_protocol: str | None = None
    remote_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    allow_local: bool = False
    cache_size: int = 1 << 30
    timeout: float = 30.0
    retries: int = 3
    max_requests: int = 64
    max_requests_per_host: int = 32
    fetch_backend: str = "auto"
    read_ahead_kb: int = 16384
    max_background: int = 64
    allow_other: bool = False
    allow_root: bool = False
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    umask: int = 0
    fsname: str | None = None
    xattrs: bool = False
    log_level: str = "INFO"
    log_file: str | None = None
    ready_timeout: float = 600.0


def parse_size(text: str) -> int:
    """``1G``, ``512MiB``, ``1048576`` -> bytes."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 512M or 2G)")
    number, unit, _ = match.groups()
    return int(float(number) * 1024 ** "bkmgt".index(unit.lower() or "b"))


def parse_json_object(text: str) -> dict[str, Any]:
    """A JSON object given inline, or ``@path`` to read it from a file (keeps secrets
    out of the process list and fstab)."""
    try:
        if text.startswith("@"):
            text = Path(text[1:]).read_text()
        value = json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"not a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def parse_octal(text: str) -> int:
    try:
        value = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an octal mask: {text!r}") from None
    if not 0 <= value <= 0o777:
        raise argparse.ArgumentTypeError(f"a mask is 000 to 777: {text!r}")
    return value


def at_least(minimum: int) -> Callable[[str], int]:
    """An integer option that must be ``minimum`` or more."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}: {text!r}")
        return value

    return parse


def seconds(text: str) -> float:
    """A positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="refmount",
        description="Mount a kerchunk/fsspec reference set (JSON or Parquet) as a read-only "
        "directory tree.",
        epilog="Every long option may also be given as -o name=value (fstab).",
    )
    p.add_argument("refs", help="reference set: JSON file (plain/gzip/bz2/xz/zstd) or "
                   "Parquet directory, a local path or any fsspec URL")  # fmt: skip
    p.add_argument("mountpoint", help="an existing, empty directory")
    p.add_argument(
        "-o",
        dest="mount_options",
        action="append",
        default=[],
        metavar="OPTS",
        help="comma-separated mount options (escape a comma in a value as \\,)",
    )
    p.add_argument(
        "-f",
        "--foreground",
        action="store_true",
        help="stay in the foreground (systemd, debugging)",
    )
    p.add_argument("-d", "--debug", action="store_true", help="debug logging; implies -f")
    p.add_argument("--version", action="version", version=_version_text())
    g = p.add_argument_group("reference set")
    g.add_argument(
        "--refs-options",
        type=parse_json_object,
        default={},
        metavar="JSON",
        help="fsspec storage options for reading REFS (or @file.json)",
    )
    g.add_argument(
        "--remote-protocol",
        metavar="P",
        help="protocol of target URLs written without one (default: paths "
        "relative to REFS' own directory)",
    )
    g.add_argument(
        "--remote-options",
        type=parse_json_object,
        default={},
        metavar="JSON",
        help="fsspec storage options for target filesystems: flat (for "
        "--remote-protocol, or every remote protocol) or keyed by protocol "
        '({"s3": {...}, "https": {...}}); or @file.json',
    )
    g.add_argument(
        "--allow-local",
        action="store_true",
        help="let a reference set that is not local point at local files",
    )
    g = p.add_argument_group("reading")
    g.add_argument(
        "--cache-size",
        type=parse_size,
        default=Config.cache_size,
        metavar="SIZE",
        help="memory for cached and read-ahead blocks (default 1G)",
    )
    g.add_argument(
        "--timeout",
        type=seconds,
        default=Config.timeout,
        metavar="S",
        help="deadline of one remote request attempt (default 30)",
    )
    g.add_argument(
        "--fetch-backend",
        choices=("auto", "fsspec"),
        default=Config.fetch_backend,
        help="what reads remote byte ranges: auto (obstore for http(s), s3, gs and az "
        "when their options translate, fsspec otherwise) or fsspec (always)",
    )
    g.add_argument(
        "--retries",
        type=at_least(0),
        default=Config.retries,
        metavar="N",
        help="further attempts after a transient failure (default 3)",
    )
    g.add_argument(
        "--max-requests",
        type=at_least(1),
        default=Config.max_requests,
        metavar="N",
        help="remote requests in flight, all hosts (default 64)",
    )
    g.add_argument(
        "--max-requests-per-host",
        type=at_least(1),
        default=Config.max_requests_per_host,
        metavar="N",
        help="remote requests in flight to one host (default 32)",
    )
    g.add_argument(
        "--read-ahead-kb",
        type=at_least(0),
        default=Config.read_ahead_kb,
        metavar="KB",
        help="kernel read-ahead set on the mount (default 16384)",
    )
    g.add_argument(
        "--max-background",
        type=at_least(1),
        default=Config.max_background,
        metavar="N",
        help="kernel FUSE requests in flight (default 64)",
    )
    g = p.add_argument_group("ownership and access")
    g.add_argument("--allow-other", action="store_true", help="let other users read the mount")
    g.add_argument("--allow-root", action="store_true", help="let root read the mount")
    g.add_argument("--uid", type=at_least(0), default=None, help="owner of every entry")
    g.add_argument("--gid", type=at_least(0), default=None, help="group of every entry")
    g.add_argument("--umask", type=parse_octal, default=0, help="mask over 0444/0555 (octal)")
    g.add_argument("--fsname", help="source name shown in mount tables (default: REFS)")
    g.add_argument(
        "--xattrs",
        action="store_true",
        help="answer user.refmount.* extended attributes (where bytes come from, "
        "counters on the root); off by default because `ls -l` then asks the "
        "daemon twice per file",
    )
    g = p.add_argument_group("logging and life cycle")
    g.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper
    )
    g.add_argument(
        "--log-file",
        metavar="PATH",
        help="log here (default: stderr in the "
        "foreground, syslog in the background when there is one)",
    )
    g.add_argument(
        "--ready-timeout",
        type=seconds,
        default=Config.ready_timeout,
        metavar="S",
        help="how long the background start waits for the mount (default 600)",
    )
    return p


def split_mount_options(text: str) -> list[str]:
    """Split on commas not escaped with a backslash."""
    parts, current, chars = [], [], iter(text)
    for char in chars:
        if char == "\\":
            current.append(next(chars, "\\"))
        elif char == ",":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part for part in parts if part]


def translate_mount_options(groups: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``-o`` options as the equivalent long options."""
    known = {
        action.option_strings[-1][2:].replace("-", "_"): action
        for action in parser._actions
        if action.option_strings and action.option_strings[-1].startswith("--")
    }
    argv: list[str] = []
    for option in (o for group in groups for o in split_mount_options(group)):
        name, has_value, value = option.partition("=")
        if name in IGNORED or name.startswith("x-") or name == "comment":
            continue
        action = known.get(name.replace("-", "_"))
        if action is None or name in ("help", "version"):
            raise UsageError(f"unknown mount option {name!r}")
        flag = action.option_strings[-1]
        if action.nargs == 0:
            if has_value:
                raise UsageError(f"mount option {name!r} takes no value")
            argv.append(flag)
        else:
            if not has_value:
                raise UsageError(f"mount option {name!r} needs a value ({name}=...)")
            argv.append(f"{flag}={value}")
    return argv


def parse_args(argv: list[str]) -> Config:
    parser = build_parser()
    first = parser.parse_args(argv)
    try:
        extra = translate_mount_options(first.mount_options, parser)
    except UsageError as exc:
        parser.error(str(exc))
    # -o options first, so that the same option given directly wins.
    args = parser.parse_args(extra + argv)
    if args.debug:
        args.foreground = True
        args.log_level = "DEBUG"
    values = {k: v for k, v in vars(args).items() if k != "mount_options" and v is not None}
    values["remote_options"] = per_protocol(args.remote_options, args.remote_protocol)
    return Config(**values)


def per_protocol(options: dict[str, Any], remote_protocol: str | None) -> dict[str, dict]:
    """Remote options keyed by protocol; ``"*"`` means every remote protocol."""
    if not options:
        return {}
    import fsspec

    protocols = set(fsspec.available_protocols())
    if all(k in protocols and isinstance(v, dict) for k, v in options.items()):
        return {k: dict(v) for k, v in options.items()}
    return {remote_protocol or "*": options}


def _version_text() -> str:
    from refmount import __version__

    try:
        import pyfuse3

        fuse = f"pyfuse3 {pyfuse3.__version__}"
    except (ImportError, AttributeError):
        fuse = "pyfuse3 unavailable"
    return f"refmount {__version__} ({fuse}, {_libfuse_version()})"


def _libfuse_version() -> str:
    import ctypes

    try:
        lib = ctypes.CDLL("libfuse3.so.3")
        number = lib.fuse_version()
        return f"libfuse {number // 100}.{number % 100}"  # FUSE_MAKE_VERSION: major*100+minor
    except (OSError, AttributeError):
        return "libfuse unavailable"
