"""``refmount check REFS``: validate a reference set without mounting it.

The set is loaded exactly as the daemon loads it, then every key is walked as a listing
of the mount would walk it: keys, directories, inline bytes, and the targets by protocol
and host are counted.  What the loaders warn about (skipped keys and why, bounds hit) is
captured from their log records and reported as problems.  ``--probe N`` asks N targets,
drawn at random (reproducibly, ``--seed``), for their size through refmount's own
fetcher (deadlines, retries), and reports those unreachable or shorter than the bytes a
key references in them.  The exit status is 0 when the set loads and nothing is wrong.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import trio
from fsspec.core import split_protocol

from refmount.errors import FetchError, RefsError
from refmount.fetch import Fetcher, FetchPolicy
from refmount.protocols import LOCAL_PROTOCOLS
from refmount.redaction import display_url, redact
from refmount.refs import Ref, RefSet, open_refset

if TYPE_CHECKING:
    from refmount.decode.survey import ArrayNote

#: A string array of the netCDF view (:data:`refmount.netcdf.survey.STRINGS`).
STRINGS_NOTE = "char array, as wide as its longest value when mounted"


@dataclass
class Problem:
    """One thing wrong: ``kind`` is ``load``, ``skipped``, ``warning``, ``unreachable``
    or ``short``."""

    kind: str
    message: str


@dataclass
class Probe:
    """One target asked for its size."""

    key: str
    url: str  # as displayed: protocol shown, secrets redacted
    needs: int  # bytes the key needs the target to have (offset + length)
    size: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.size is not None and self.size >= self.needs


@dataclass
class Report:
    refs: str
    loaded: bool = False
    format: str | None = None
    keys: int = 0
    directories: int = 0
    inline_keys: int = 0
    inline_bytes: int = 0
    range_keys: int = 0
    range_bytes: int = 0  # bytes the byte-range keys reference
    whole_file_keys: int = 0
    #: protocol -> host -> {"files": distinct redacted URLs, "keys": keys pointing there}
    targets: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    probes: list[Probe] | None = None
    seed: int | None = None
    #: With ``--decode``: each array and what the decoded view makes of it.
    arrays: list[ArrayNote] | None = None
    #: With ``--netcdf``: the files, their formats and variables, what is left out.
    netcdf: dict[str, Any] | None = None
    #: An Icechunk repository's versions, containers and arrays by chunk kind.
    icechunk: dict[str, Any] | None = None
    #: With ``--probe``: where each S3 scope's requests are signed from, by scope.
    credentials: dict[str, str] | None = None

    @property
    def ok(self) -> bool:
        return self.loaded and not self.problems

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        if self.probes is not None:
            for probe, entry in zip(self.probes, out["probes"], strict=True):
                entry["ok"] = probe.ok
        return out


@dataclass
class CheckOptions:
    refs: str
    refs_options: dict[str, Any] = field(default_factory=dict)
    remote_protocol: str | None = None
    remote_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    allow_local: bool = False
    probe: int = 0
    seed: int = 0
    timeout: float = 30.0
    retries: int = 3
    decode: bool = False
    decode_strings: str = "omit"
    netcdf: bool = False
    netcdf_format: str = "auto"
    netcdf_name: str | None = None
    icechunk: bool = False
    branch: str | None = None
    tag: str | None = None
    snapshot: str | None = None
    containers: list[str] | None = None


def _open(options: CheckOptions, progress: Any) -> RefSet:
    if options.icechunk:
        from refmount.icechunk import open_configured

        return open_configured(options)
    return open_refset(
        options.refs,
        storage_options=options.refs_options,
        remote_protocol=options.remote_protocol,
        allow_local=options.allow_local,
        timeout=options.timeout,
        progress=progress,
    )


def check(options: CheckOptions, progress: Any = None) -> Report:
    """Load, walk and (optionally) probe the reference set."""
    report = Report(refs=display_url(options.refs))
    with _captured_warnings(report.problems):
        try:
            refset = _open(options, progress)
        except (RefsError, OSError, ValueError) as exc:
            report.problems.append(Problem("load", str(exc)))
            return report
        report.loaded = True
        from refmount.refs.parquet import ParquetRefSet

        report.format = "Parquet" if isinstance(refset, ParquetRefSet) else "JSON"
        if options.icechunk:
            report.format = "Icechunk"
        try:
            sample = trio.run(_walk, refset, report, options.probe, random.Random(options.seed))
            if options.icechunk:
                report.icechunk = refset.summary()  # type: ignore[attr-defined]
            if options.decode:
                from refmount.decode.survey import survey

                fixed = options.decode_strings == "fixed"
                report.arrays = trio.run(partial(survey, refset, fixed_strings=fixed))
            if options.netcdf:
                from refmount.netcdf.options import default_name
                from refmount.netcdf.survey import survey as netcdf_survey

                name = options.netcdf_name or default_name(options.refs)
                report.netcdf = trio.run(netcdf_survey, refset, name, options.netcdf_format)
        finally:
            refset.close()
        if options.probe:
            report.seed = options.seed
            report.probes, report.credentials = _probe(sample, options)
    for note in report.arrays or []:
        if note.status != "decoded":
            report.problems.append(Problem("decode", f"{note.array}: {note.status}: {note.reason}"))
    if report.netcdf is not None:
        if report.netcdf["error"]:
            report.problems.append(Problem("netcdf", report.netcdf["error"]))
        for array, why in report.netcdf["left_out"].items():
            report.problems.append(Problem("netcdf", f"{array}: left out of the file: {why}"))
    for probe in report.probes or []:
        if probe.error is not None:
            report.problems.append(
                Problem("unreachable", f"{probe.key}: {probe.url}: {probe.error}")
            )
        elif not probe.ok:
            report.problems.append(
                Problem(
                    "short",
                    f"{probe.key}: {probe.url} has {probe.size:,} bytes, "
                    f"the key needs {probe.needs:,}",
                )
            )
    return report


# -- the walk ---------------------------------------------------------------------------


async def _walk(
    refset: RefSet, report: Report, keep: int, rng: random.Random
) -> list[tuple[str, Ref]]:
    """Count every key and directory; return up to ``keep`` targets drawn uniformly at
    random from the keys that have one (reservoir sampling, in the walk's stable order)."""
    keys_by_url: Counter[str] = Counter()  # many keys share a URL: hosts are parsed per URL
    sample: list[tuple[str, Ref]] = []
    seen = 0
    async for key, ref in _files(refset, report):
        report.keys += 1
        if ref.data is not None:
            report.inline_keys += 1
            report.inline_bytes += len(ref.data)
            continue
        assert ref.url is not None
        if ref.length is None:
            report.whole_file_keys += 1
        else:
            report.range_keys += 1
            report.range_bytes += ref.length
        keys_by_url[ref.url] += 1
        seen += 1
        if len(sample) < keep:
            sample.append((key, ref))
        elif keep and (slot := rng.randrange(seen)) < keep:
            sample[slot] = (key, ref)
    files: dict[tuple[str, str], set[str]] = defaultdict(set)
    keys: Counter[tuple[str, str]] = Counter()
    for url, count in keys_by_url.items():
        where = _protocol_and_host(url)
        files[where].add(redact(url))  # a signed URL's query is no new file
        keys[where] += count
    for protocol, host in sorted(files):
        counts = {"files": len(files[protocol, host]), "keys": keys[protocol, host]}
        report.targets.setdefault(protocol, {})[host] = counts
    return sample


async def _files(refset: RefSet, report: Report) -> AsyncIterator[tuple[str, Ref]]:
    """Every file key and its reference, depth first, loaded as a listing of the mount
    loads them (a lazily loaded set lists what it holds; ``ensure`` loads the next part);
    a directory that cannot be listed (an unreadable record file) is a problem, and the
    walk goes on."""
    pending = [""]
    while pending:
        path = pending.pop()
        prefix = f"{path}/" if path else ""
        subdirectories = []
        after = -1
        try:
            while True:
                await refset.ensure(path, after)
                listed = False
                for child in refset.children(path, after):
                    after, listed = child.cursor, True
                    if child.file_id is None:
                        report.directories += 1
                        subdirectories.append(prefix + child.name)
                    else:
                        try:
                            ref = await refset.file_ref(child.file_id)
                        except FetchError as exc:  # this key refused, the others still read
                            report.problems.append(Problem("refused", str(exc)))
                            continue
                        yield prefix + child.name, ref
                if not listed:
                    break
        except (FetchError, RefsError, OSError, KeyError) as exc:
            report.problems.append(Problem("load", f"listing {path or '/'}: {exc}"))
        pending.extend(reversed(subdirectories))


def _protocol_and_host(url: str) -> tuple[str, str]:
    protocol, _ = split_protocol(url)
    if protocol is None or protocol in LOCAL_PROTOCOLS:
        return "file", "local"
    parts = urlsplit(url)
    host = parts.hostname or ""
    with contextlib.suppress(ValueError):
        if parts.port:
            host = f"{host}:{parts.port}"
    return protocol, host


# -- the probe --------------------------------------------------------------------------


def _probe(
    sample: list[tuple[str, Ref]], options: CheckOptions
) -> tuple[list[Probe], dict[str, str]]:
    """The probes, and where the S3 scopes asked sign from (never the secrets)."""
    probes = [
        Probe(key, display_url(ref.url or ""), ref.offset + (ref.length or 0))
        for key, ref in sample
    ]
    fetcher = Fetcher(
        remote_options=options.remote_options,
        policy=FetchPolicy(timeout=options.timeout, retries=options.retries),
    )

    async def ask(probe: Probe, url: str) -> None:
        try:
            probe.size = await fetcher.size(url)
        except FetchError as exc:
            probe.error = str(exc)

    async def ask_all() -> dict[str, str]:
        async with trio.open_nursery() as nursery:
            for probe, (_, ref) in zip(probes, sample, strict=True):
                assert ref.url is not None
                nursery.start_soon(ask, probe, ref.url)
        with trio.move_on_after(options.timeout):
            return await fetcher.signing()
        return {}

    try:
        signing = trio.run(ask_all)
    finally:
        fetcher.close()
    return probes, signing


# -- warnings of the loaders ------------------------------------------------------------


class _Collector(logging.Handler):
    """Turns the reference loaders' warnings into problems."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(logging.WARNING)
        self.problems = problems

    def emit(self, record: logging.LogRecord) -> None:
        if not record.name.startswith("refmount.refs"):
            return  # the fetcher's own warnings repeat what the probe reports
        message = record.getMessage()
        kind = "skipped" if "skipping" in message or "skipped" in message else "warning"
        self.problems.append(Problem(kind, message))


@contextlib.contextmanager
def _captured_warnings(problems: list[Problem]) -> Iterator[None]:
    """Collect refmount's warnings into ``problems`` instead of printing them: the
    report lists them."""
    logger = logging.getLogger("refmount")
    handler = _Collector(problems)
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.level, logger.propagate = saved


# -- the human report -------------------------------------------------------------------


def render(report: Report) -> str:
    lines = []
    if report.loaded:
        lines.append(f"{report.refs}: {report.format} reference set, loaded")
        remote = report.range_keys + report.whole_file_keys
        files = sum(h["files"] for hosts in report.targets.values() for h in hosts.values())
        lines += [
            f"  keys              {report.keys:,} ({report.inline_keys:,} inline, "
            f"{report.range_keys:,} byte ranges, {report.whole_file_keys:,} whole files)",
            f"  directories       {report.directories:,}",
            f"  bytes inline      {report.inline_bytes:,}",
            f"  bytes in ranges   {report.range_bytes:,}",
            f"  targets           {files:,} files for {remote:,} keys",
        ]
        for protocol, hosts in report.targets.items():
            for host, counts in hosts.items():
                where = "local files" if protocol == "file" else f"{protocol}://{host}"
                lines.append(
                    f"    {where:<32} {counts['files']:>8,} files {counts['keys']:>10,} keys"
                )
    else:
        lines.append(f"{report.refs}: not loaded")
    if report.icechunk is not None:
        lines += _icechunk_lines(report.icechunk)
    if report.arrays is not None:
        counts = Counter(note.status for note in report.arrays)
        lines.append(
            f"  decoded view      {counts['decoded']:,} arrays decoded, "
            f"{counts['not decoded']:,} not decoded (EIO), {counts['left out']:,} left out"
        )
    if report.netcdf is not None:
        lines += _netcdf_lines(report.netcdf)
    if report.probes is not None:
        good = sum(probe.ok for probe in report.probes)
        lines.append(
            f"  probe             {len(report.probes):,} targets asked (seed {report.seed}): "
            f"{good:,} fine, {len(report.probes) - good:,} not"
        )
    for scope, source in (report.credentials or {}).items():
        lines.append(f"  s3 credentials    {scope}: {source}")
    if report.problems:
        lines.append(f"problems: {len(report.problems):,}")
        lines += [f"  {problem.kind}: {problem.message}" for problem in report.problems]
    else:
        lines.append("problems: none")
    return "\n".join(lines)


def _netcdf_lines(found: dict[str, Any]) -> list[str]:
    """The netCDF view's files and their variables."""
    lines = [f"  netCDF view       {len(found['files']):,} files"]
    for made in found["files"]:
        names = ", ".join(made["variables"]) or "-"
        lines.append(f"    {made['name']:<32} {made['format']}: {names}")
    for array in found["strings"]:
        lines.append(f"    {array:<32} {STRINGS_NOTE}")
    for array, cost in found.get("costly", {}).items():
        lines.append(f"    {array:<32} {cost}")
    return lines


def _icechunk_lines(summary: dict[str, Any]) -> list[str]:
    """A repository's versions, containers and each array's chunks by kind."""
    lines = [
        f"  snapshot          {summary['snapshot']} ({summary['version']})",
        f"  branches          {', '.join(sorted(summary['branches'])) or '-'}",
        f"  tags              {', '.join(sorted(summary['tags'])) or '-'}",
        f"  containers        {', '.join(summary['containers']) or '-'}",
        f"  arrays            {len(summary['arrays']):,}",
    ]
    for path, kinds in sorted(summary["arrays"].items()):
        counts = ", ".join(f"{n:,} {kind}" for kind, n in kinds.items())
        lines.append(f"    {path:<32} {counts}")
    return lines
