"""``refmount status MOUNTPOINT``: a mount's live counters, asked of its daemon through
the control socket (:mod:`refmount.service.control`), so it works whatever ``--xattrs``
says."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from refmount.service.control import socket_path

FSTYPE = "fuse.refmount"
QUERY_SECONDS = 10.0


class StatusError(Exception):
    """No status to be had; the message says why and what to do."""


@dataclass(frozen=True)
class MountEntry:
    source: str
    target: str
    fstype: str
    options: tuple[str, ...]

    @property
    def user_id(self) -> int | None:
        """The uid that made the mount (FUSE's ``user_id=`` option): the daemon's user."""
        for option in self.options:
            name, _, value = option.partition("=")
            if name == "user_id" and value.isdigit():
                return int(value)
        return None


def _unescape(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def find_mount(path: str, mounts: str = "/proc/mounts") -> MountEntry | None:
    """The last mount on ``path`` (the one visible there), or None.

    The path's directory is resolved, but not the path itself at first: resolving it
    would ask the mount's own daemon (an ``lstat`` of its root), which may hang."""
    with open(mounts, encoding="utf-8", errors="surrogateescape") as table:
        entries = [line.split() for line in table]
    parent, name = os.path.split(os.path.abspath(path))
    candidates = [os.path.join(os.path.realpath(parent), name), os.path.realpath(path)]
    for target in candidates:
        found = None
        for fields in entries:
            if len(fields) >= 4 and _unescape(fields[1]) == target:
                options = tuple(fields[3].split(","))
                found = MountEntry(_unescape(fields[0]), target, fields[2], options)
        if found is not None:
            return found
    return None


def query(path: Path, timeout: float = QUERY_SECONDS) -> dict[str, Any]:
    """The JSON document the daemon answers on its control socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(os.fspath(path))
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    document = json.loads(b"".join(chunks))
    if not isinstance(document, dict):
        raise ValueError("the answer is not a JSON object")
    return document


def mount_status(mountpoint: str) -> dict[str, Any]:
    """The live state of the refmount mount on ``mountpoint``, or :class:`StatusError`."""
    entry = find_mount(mountpoint)
    if entry is None or entry.fstype != FSTYPE:
        what = "nothing" if entry is None else entry.fstype
        raise StatusError(f"{mountpoint} is not a refmount mount (mounted there: {what})")
    uid = entry.user_id if entry.user_id is not None else os.geteuid()
    path = socket_path(entry.target, uid)
    try:
        return query(path)
    except FileNotFoundError:
        raise StatusError(
            f"the refmount mount on {entry.target} has no status channel at {path} "
            "(its daemon is older than this refmount, or runs with another runtime directory)"
        ) from None
    except ConnectionRefusedError:
        raise StatusError(
            f"the daemon of {entry.target} does not answer at {path}: it is gone; "
            f"clear the mount with: fusermount3 -u -z {entry.target}"
        ) from None
    except TimeoutError:
        raise StatusError(
            f"the daemon of {entry.target} did not answer within {QUERY_SECONDS:g} s (hung?)"
        ) from None
    except PermissionError:
        raise StatusError(
            f"not allowed to ask the daemon of {entry.target} (run as uid {uid} or root)"
        ) from None
    except (OSError, ValueError) as exc:
        raise StatusError(f"the daemon of {entry.target} gave no status: {exc}") from None


# -- the human table ----------------------------------------------------------------------


def _when(epoch: float, now: float) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))
    return f"{stamp} ({_duration(max(0.0, now - epoch))} ago)"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


def render(status: dict[str, Any], now: float | None = None) -> str:
    """The status as a two-column table."""
    now = time.time() if now is None else now
    fetch, cache = status.get("fetch", {}), status.get("cache", {})
    reload = status.get("last_reload")
    if reload:
        outcome = "ok" if reload.get("ok") else "FAILED"
        message = f": {reload['message']}" if reload.get("message") else ""
        last_reload = f"{_when(reload['time'], now)} {outcome}{message}"
    else:
        last_reload = "never"
    keys = status.get("keys")
    rows = [
        ("mount point", status.get("mountpoint", "?")),
        ("reference set", status.get("refs", "?")),
        ("keys", "not counted (loaded lazily)" if keys is None else f"{keys:,}"),
        ("mounted since", _when(status["mounted_since"], now)),
        ("last reload", last_reload),
        ("daemon", f"pid {status.get('pid')}, refmount {status.get('refmount')}"),
        ("reads in flight", f"{status.get('reads_in_flight', 0):,}"),
        ("files the kernel holds", f"{status.get('kernel_files', 0):,}"),
        ("requests", f"{fetch.get('requests', 0):,}"),
        ("bytes fetched", _size(fetch.get("bytes_fetched", 0))),
        ("cache hits", f"{cache.get('hits', 0):,}"),
        ("cache misses", f"{cache.get('misses', 0):,}"),
        ("errors", f"{fetch.get('errors', 0):,}"),
        ("retries", f"{fetch.get('retries', 0):,}"),
        ("cached", f"{_size(cache.get('bytes_cached', 0))} of {_size(cache.get('budget', 0))}"),
    ]
    rows += _version_rows(status.get("version"), status.get("last_check"), now)
    rows += _catalog_rows(status.get("catalog"))
    if "disk_hits" in cache:
        rows += _disk_rows(cache)
    if "worker_starts" in cache:
        rows += _worker_rows(cache)
    if "fetch_worker_starts" in fetch:
        rows += _fetch_worker_rows(fetch)
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _version_rows(
    version: dict[str, Any] | None, last_check: float | None, now: float
) -> list[tuple[str, str]]:
    """A versioned source's (an Icechunk repository's): the snapshot served, and when
    the source was last asked for a newer one."""
    if not version:
        return []
    written = version.get("written")
    when = f", written {_when(written, now)}" if written else ""
    served = f"{version.get('snapshot')} ({version.get('version')}{when})"
    checked = "never" if last_check is None else _when(last_check, now)
    return [("snapshot", served), ("last checked", checked)]


def _catalog_rows(catalog: dict[str, Any] | None) -> list[tuple[str, str]]:
    """A catalog's sets: how many, which are loaded (with their keys), which failed."""
    if not catalog:
        return []
    loaded = catalog.get("loaded", {})
    shown = ", ".join(
        name if keys is None else f"{name} ({keys:,} keys)" for name, keys in loaded.items()
    )
    rows = [
        ("sets", f"{catalog.get('sets', 0):,} ({catalog.get('loads', 0):,} loads)"),
        ("loaded sets", f"{len(loaded)} of at most {catalog.get('max_loaded')}: {shown or '-'}"),
        ("loaded indexes", _size(catalog.get("loaded_bytes", 0))),
    ]
    for name, error in sorted(catalog.get("errors", {}).items()):
        rows.append(("load error", f"{name}: {error}"))
    return rows


def _worker_rows(cache: dict[str, Any]) -> list[tuple[str, str]]:
    """The decoding worker processes (``--decode``)."""
    return [
        (
            "decode workers",
            f"{cache.get('workers', 0):,} running ({cache.get('workers_busy', 0):,} busy), "
            f"{cache.get('worker_starts', 0):,} started, {cache.get('worker_deaths', 0):,} "
            "killed or died",
        ),
        (
            "decode jobs",
            f"{cache.get('worker_jobs', 0):,}, {cache.get('worker_job_errors', 0):,} failed",
        ),
    ]


def _fetch_worker_rows(fetch: dict[str, Any]) -> list[tuple[str, str]]:
    """The worker processes remote requests run in (``--fetch-workers``)."""
    pids = ", ".join(str(pid) for pid in fetch.get("fetch_worker_pids", [])) or "-"
    return [
        (
            "fetch workers",
            f"{fetch.get('fetch_workers', 0):,} running (pids {pids}), "
            f"{fetch.get('fetch_worker_starts', 0):,} started, "
            f"{fetch.get('fetch_worker_deaths', 0):,} died",
        ),
        ("fetch worker requests", f"{fetch.get('fetch_worker_requests', 0):,} in flight"),
    ]


def _disk_rows(cache: dict[str, Any]) -> list[tuple[str, str]]:
    """The disk cache's counters (``--disk-cache``)."""
    return [
        ("disk hits", f"{cache.get('disk_hits', 0):,} ({_size(cache.get('disk_hit_bytes', 0))})"),
        ("disk misses", f"{cache.get('disk_misses', 0):,}"),
        (
            "disk written",
            f"{cache.get('disk_written_entries', 0):,} entries "
            f"({_size(cache.get('disk_written_bytes', 0))})",
        ),
        ("disk evictions", f"{cache.get('disk_evictions', 0):,}"),
        ("disk corrupt found", f"{cache.get('disk_corrupt', 0):,}"),
        ("disk refusals", f"{cache.get('disk_refusals', 0):,}"),
        (
            "disk used",
            f"{_size(cache.get('disk_bytes', 0))} of {_size(cache.get('disk_limit', 0))}",
        ),
    ]


def _size(n: int) -> str:
    """``123 B``, ``45.6 MiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n:,} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
