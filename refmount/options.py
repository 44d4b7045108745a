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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from refmount import header_text
from refmount.netcdf.options import add_netcdf_options

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

#: Bounds of values the kernel, libfuse or pyfuse3 can hold, and of sane ones.
MAX_ID = (1 << 32) - 2  # uid_t/gid_t; (uid_t)-1 means "no owner"
MAX_BACKGROUND = (1 << 16) - 1  # fuse_init_out.max_background is 16 bits
MAX_READ_AHEAD_KB = 1 << 20  # 1 GiB of read-ahead per stream is already absurd
MAX_RETRIES = 20  # the backoff doubles each retry: 20 is hours already
MAX_REQUESTS = 1 << 16
MAX_SECONDS = 86400.0 * 7  # a week: longer deadlines are mistakes, and overflow select()
REFS_ENV = "REFMOUNT_REFS"


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
    #: Worker processes remote requests run in; 0: in the daemon (docs/performance.md,
    #: Fetch workers).
    fetch_workers: int = 0
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
    nonempty: bool = False
    max_refs_size: int | None = None
    reload_interval: float | None = None
    decode: bool = False
    #: Worker processes decoding chunks (``--decode``); None: one per CPU.
    decode_workers: int | None = None
    decode_deadline: float = 120.0
    decode_memory: int = 6 << 30
    decode_strings: str = "omit"
    #: The netCDF view (refmount.netcdf.options).
    netcdf: bool = False
    netcdf_format: str = "auto"
    netcdf_name: str | None = None
    catalog: bool = False
    catalog_ttl: float = 60.0
    max_loaded_sets: int = 64
    catalog_memory: int = 1 << 30
    disk_cache: str | None = None
    disk_cache_size: int = 10 << 30
    disk_cache_min_free: int | float = 0.10
    disk_cache_immutable: bool = False
    disk_cache_check_interval: float = 60.0
    # Icechunk repositories (refmount.icechunk)
    icechunk: bool = False
    branch: str | None = None
    tag: str | None = None
    snapshot: str | None = None
    containers: list[str] | None = None
    versions: bool = False


def parse_size(text: str) -> int:
    """``1G``, ``512MiB``, ``1048576`` -> bytes."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 512M or 2G)")
    number, unit, _ = match.groups()
    return int(float(number) * 1024 ** "bkmgt".index(unit.lower() or "b"))


def memory_size(text: str) -> int:
    """A size of memory to use: at least 1 MiB, at most the machine's memory."""
    value = parse_size(text)
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if not 1 << 20 <= value <= physical:
        raise argparse.ArgumentTypeError(
            f"must be between 1M and this machine's memory ({human_size(physical)}): {text!r}"
        )
    return value


def size_or_percent(text: str) -> int | float:
    """``2G`` -> bytes; ``10%`` -> the fraction 0.1 (of a filesystem's size)."""
    if text.strip().endswith("%"):
        try:
            percent = float(text.strip()[:-1])
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
        if not 0 <= percent < 100:
            raise argparse.ArgumentTypeError(f"a percentage from 0 to 99: {text!r}")
        return percent / 100
    return parse_size(text)


def human_size(size: int) -> str:
    """``1073741824`` -> ``1G``: the shortest exact way to write a size."""
    for unit in "TGMK":
        scale = 1024 ** ("BKMGT".index(unit))
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


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


def whole_number(minimum: int, maximum: int) -> Callable[[str], int]:
    """An integer option from ``minimum`` to ``maximum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be {minimum} to {maximum}: {text!r}")
        return value

    return parse


def seconds(text: str) -> float:
    """A positive number of seconds, at most :data:`MAX_SECONDS`."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds above 0 and at most {MAX_SECONDS:g}: {text!r}"
        )
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="refmount",
        description="Mount a kerchunk/fsspec reference set (JSON or Parquet) or an Icechunk "
        "repository as a read-only directory tree.",
        epilog="Every long option may also be given as -o name=value (fstab).  REFS may be "
        f"left out when ${REFS_ENV} holds it; @FILE reads it from FILE's first line: "
        "either way a URL with credentials stays out of the process list.",
    )
    p.add_argument(
        "refs",
        nargs="?",
        help="reference set: JSON file (plain/gzip/bz2/xz/zstd), Parquet directory or "
        "Icechunk repository, a local path or any fsspec URL; @FILE to read it from a file "
        f"(default: ${REFS_ENV})",
    )
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
        help="fsspec storage options for target filesystems, keyed by protocol, host or "
        'URL prefix ({"s3": {...}, "https://data.example.org": {...}}), or flat: then for '
        "--remote-protocol, or the one remote host of the set; or @file.json",
    )
    g.add_argument(
        "--allow-local",
        action="store_true",
        help="let a reference set that is not local point at local files",
    )
    g.add_argument(
        "--max-refs-size",
        type=parse_size,
        metavar="SIZE",
        help="refuse a reference set larger than this, read or decompressed",
    )
    g.add_argument(
        "--reload-interval",
        type=seconds,
        metavar="S",
        help="check REFS every S seconds (its ETag, mtime or size) and reload it when it "
        "changed; SIGHUP reloads at any time",
    )
    add_icechunk_options(p)
    g = p.add_argument_group("catalogs (REFS a directory or prefix of many sets)")
    g.add_argument(
        "--catalog",
        action="store_true",
        help="read REFS as a catalog of reference sets even when it does not look like "
        "one (a directory or prefix without .zmetadata is one anyway)",
    )
    g.add_argument(
        "--catalog-ttl",
        type=seconds,
        default=Config.catalog_ttl,
        metavar="S",
        help="how long a listing of the catalog's source is used before it is listed "
        "again: new and removed sets show after this (default %(default)g)",
    )
    g.add_argument(
        "--max-loaded-sets",
        type=whole_number(1, 1_000_000),
        default=Config.max_loaded_sets,
        metavar="N",
        help="sets of a catalog kept loaded; the least recently used idle ones are "
        "unloaded past this (default %(default)s)",
    )
    g.add_argument(
        "--catalog-memory",
        type=memory_size,
        default=Config.catalog_memory,
        metavar="SIZE",
        help="memory the indexes of a catalog's loaded sets may hold, besides "
        "--cache-size; idle sets are unloaded past it "
        f"(default {human_size(Config.catalog_memory)})",
    )
    g = p.add_argument_group("reading")
    g.add_argument(
        "--cache-size",
        type=memory_size,
        default=Config.cache_size,
        metavar="SIZE",
        help=f"memory for cached and read-ahead blocks (default {human_size(Config.cache_size)})",
    )
    g.add_argument(
        "--timeout",
        type=seconds,
        default=Config.timeout,
        metavar="S",
        help="deadline of one remote request attempt (default %(default)g)",
    )
    g.add_argument(
        "--fetch-backend",
        choices=("auto", "obstore", "fsspec"),
        default=Config.fetch_backend,
        help="what reads remote byte ranges: auto (refmount's own HTTP client for "
        "http://, https:// and s3://, obstore for gs and az when their options translate, "
        "fsspec otherwise), obstore (obstore wherever it serves the protocol) or fsspec "
        "(always)",
    )
    g.add_argument(
        "--retries",
        type=whole_number(0, MAX_RETRIES),
        default=Config.retries,
        metavar="N",
        help="further attempts after a transient failure (default %(default)s)",
    )
    g.add_argument(
        "--max-requests",
        type=whole_number(1, MAX_REQUESTS),
        default=Config.max_requests,
        metavar="N",
        help="remote requests in flight, all hosts (default %(default)s)",
    )
    g.add_argument(
        "--max-requests-per-host",
        type=whole_number(1, MAX_REQUESTS),
        default=Config.max_requests_per_host,
        metavar="N",
        help="remote requests in flight to one host (default %(default)s)",
    )
    g.add_argument(
        "--fetch-workers",
        type=whole_number(0, 64),
        default=Config.fetch_workers,
        metavar="N",
        help="worker processes that make the remote requests and receive the bytes, "
        "outside the daemon's interpreter; 0: in the daemon (default %(default)s)",
    )
    g.add_argument(
        "--read-ahead-kb",
        type=whole_number(0, MAX_READ_AHEAD_KB),
        default=Config.read_ahead_kb,
        metavar="KB",
        help="kernel read-ahead set on the mount (default %(default)s)",
    )
    g.add_argument(
        "--max-background",
        type=whole_number(1, MAX_BACKGROUND),
        default=Config.max_background,
        metavar="N",
        help="kernel FUSE requests in flight (default %(default)s)",
    )
    g = p.add_argument_group("disk cache")
    g.add_argument(
        "--disk-cache",
        metavar="DIR",
        help="keep fetched bytes in DIR (made if missing, must be this user's own), "
        "shared by every refmount that uses it, kept across mounts",
    )
    g.add_argument(
        "--disk-cache-size",
        type=parse_size,
        default=Config.disk_cache_size,
        metavar="SIZE",
        help="most the entries in DIR take, in allocated blocks (default "
        f"{human_size(Config.disk_cache_size)})",
    )
    g.add_argument(
        "--disk-cache-min-free",
        type=size_or_percent,
        default=Config.disk_cache_min_free,
        metavar="SIZE|PCT",
        help="free space to leave on DIR's filesystem (default 10%%)",
    )
    g.add_argument(
        "--disk-cache-immutable",
        action="store_true",
        help="keep objects whose store names no version (no ETag, generation or "
        "Last-Modified) too: say so only for data that never changes",
    )
    g.add_argument(
        "--disk-cache-check-interval",
        type=seconds,
        default=Config.disk_cache_check_interval,
        metavar="S",
        help="ask an object's version (one HEAD or stat) at most every S seconds "
        "(default %(default)g)",
    )
    g = p.add_argument_group("ownership and access")
    g.add_argument("--allow-other", action="store_true", help="let other users read the mount")
    g.add_argument("--allow-root", action="store_true", help="let root read the mount")
    g.add_argument("--uid", type=whole_number(0, MAX_ID), default=None, help="owner of every entry")
    g.add_argument("--gid", type=whole_number(0, MAX_ID), default=None, help="group of every entry")
    g.add_argument("--umask", type=parse_octal, default=0, help="mask over 0444/0555 (octal)")
    g.add_argument(
        "--fsname",
        help="source name shown in mount tables (default: REFS, credentials removed)",
    )
    g.add_argument(
        "--nonempty",
        action="store_true",
        help="mount over a directory that is not empty (hiding what it holds)",
    )
    g.add_argument(
        "--xattrs",
        action="store_true",
        help="answer user.refmount.* extended attributes (where bytes come from, "
        "counters on the root); off by default because `ls -l` then asks the "
        "daemon twice per file",
    )
    g.add_argument(
        "--decode",
        action="store_true",
        help="serve arrays' chunks decoded (decompressed, unfiltered, little-endian, C "
        "order) and their metadata rewritten to match, for readers without the codecs "
        "(docs/views.md: Decoded view)",
    )
    g.add_argument(
        "--decode-workers",
        type=whole_number(1, 256),
        metavar="N",
        help="worker processes that decode chunks, each isolated from the daemon "
        "(default: one per CPU)",
    )
    g.add_argument(
        "--decode-deadline",
        type=seconds,
        default=Config.decode_deadline,
        metavar="S",
        help="seconds a chunk's decoding may take before its worker is killed and the "
        "read fails (default %(default)g)",
    )
    g.add_argument(
        "--decode-memory",
        type=parse_size,
        default=Config.decode_memory,
        metavar="SIZE",
        help=f"address space of each decoding worker (default {human_size(Config.decode_memory)})",
    )
    g.add_argument(
        "--decode-strings",
        choices=["omit", "fixed"],
        help="with --decode, string arrays: 'omit' (the default: Debian's netCDF-C 4.9.0 "
        "dies on a tree holding one) or 'fixed' (fixed-width bytes |S<n>, for GDAL, zarr "
        "and newer netCDF-C)",
    )
    add_netcdf_options(p)
    g = p.add_argument_group("logging and life cycle")
    g.add_argument(
        "--log-level",
        default=Config.log_level,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="what to log: DEBUG, INFO, WARNING or ERROR (default %(default)s)",
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
        help="how long the background start waits for the mount (default %(default)g)",
    )
    return p


def add_icechunk_options(p: argparse.ArgumentParser) -> None:
    """Options of an Icechunk repository (:mod:`refmount.icechunk`)."""
    g = p.add_argument_group("Icechunk repositories (REFS a repository's root)")
    g.add_argument(
        "--icechunk",
        action="store_true",
        help="read REFS as an Icechunk repository even when it does not look like one "
        "(it does when it holds 'repo' or 'refs/')",
    )
    versions = g.add_mutually_exclusive_group()
    versions.add_argument(
        "--branch",
        metavar="NAME",
        help="serve the head of this branch and follow it (default: main)",
    )
    versions.add_argument("--tag", metavar="NAME", help="serve this tag")
    versions.add_argument("--snapshot", metavar="ID", help="serve this snapshot")
    versions.add_argument(
        "--versions",
        action="store_true",
        help="serve the history as directories: branches/NAME, tags/NAME, snapshots/ID, "
        "each loaded on first use (a catalog: --max-loaded-sets, --catalog-ttl apply)",
    )
    g.add_argument(
        "--containers",
        type=lambda text: [prefix for prefix in text.split(",") if prefix],
        metavar="PREFIX,...",
        help="read virtual chunks only under these URL prefixes (within the virtual chunk "
        "containers the repository declares; default: all of those)",
    )


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
    try:
        for scope, options in values["remote_options"].items():
            check_headers(options, "--remote-options" + ("" if scope == "*" else f" {scope}"))
        check_remote_trust(values["remote_options"])
        check_headers(values.get("refs_options") or {}, "--refs-options")
        values["refs"] = refs_location(args.refs)
    except UsageError as exc:
        parser.error(str(exc))
    return Config(**values)


def refs_location(given: str | None) -> str:
    """REFS as given, read from ``@FILE``, or from ``$REFMOUNT_REFS`` when not given: the
    last two keep a URL with credentials out of the process list (and of fstab)."""
    if given is None:
        given = os.environ.get(REFS_ENV, "").strip()
        if not given:
            raise UsageError(f"REFS is needed (or set ${REFS_ENV})")
    if not given.startswith("@"):
        return given
    path = given[1:]
    try:
        with open(path) as file:
            location = file.readline().strip()
    except OSError as exc:
        raise UsageError(f"cannot read REFS from {path}: {exc.strerror}") from None
    if not location:
        raise UsageError(f"{path} holds no REFS")
    return location


def check_remote_trust(remote_options: Mapping[str, Mapping[str, Any]]) -> None:
    """UsageError for a ``ca_bundle`` remote option that names no CA bundle (see
    :func:`refmount.fetch.trust.check_bundles`)."""
    from refmount.fetch.trust import check_bundles  # the fetch layer: only when parsing

    try:
        check_bundles(remote_options)
    except ValueError as exc:
        raise UsageError(f"--remote-options {exc}") from None


def check_headers(options: Mapping[str, Any], where: str) -> None:
    """UsageError naming the header of ``options`` (``headers``, ``client_kwargs.headers``)
    that cannot be sent as given: a name or value that would end its header line (see
    :mod:`refmount.header_text`)."""
    client = options.get("client_kwargs")
    for found in (
        options.get("headers"),
        client.get("headers") if isinstance(client, dict) else None,
    ):
        if found is None:
            continue
        if not isinstance(found, dict):
            raise UsageError(f"{where}: headers must be an object of names and values")
        for name, value in found.items():
            problem = header_text.name_problem(name) or header_text.value_problem(value)
            if problem is not None:
                shown = header_text.escaped(str(name), 40)
                raise UsageError(f"{where}: header {shown!r}: {problem}")


def per_protocol(options: dict[str, Any], remote_protocol: str | None) -> dict[str, dict]:
    """Remote options by scope: which hosts receive which options.

    * Keyed options, where every key is a protocol fsspec knows (``"s3"``), a protocol
      and host (``"https://data.example.org"``, ``"http://host:8080"``, ``"s3://bucket"``)
      or a URL prefix (``"s3://bucket/data/"``) and every value an object, are kept as
      given: a protocol's entry applies to every host of that protocol, a host's entry
      only to that host (over the protocol's, key by key), a prefix's only to URLs under
      it (over its host's).
    * Flat options with ``--remote-protocol P`` apply to protocol P (as ``{P: options}``).
    * Flat options without it are kept under ``"*"``: at start the daemon binds them to
      the one remote host the reference set points at, and refuses to start when the set
      names more than one (or cannot tell before it is read), so that a token meant for
      one host is never sent to another.
    """
    if not options:
        return {}
    import fsspec

    from refmount.fetch.fetcher import FLAT

    protocols = set(fsspec.available_protocols())

    def is_scope(key: str) -> bool:
        protocol, separator, rest = key.partition("://")
        return protocol in protocols and (not separator or bool(rest.partition("/")[0]))

    if all(is_scope(k) and isinstance(v, dict) for k, v in options.items()):
        return {k: dict(v) for k, v in options.items()}
    return {remote_protocol or FLAT: options}


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
