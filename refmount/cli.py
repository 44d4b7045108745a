"""``refmount`` command: mount (``refmount REFS MOUNTPOINT``), or one of the subcommands
``refmount check REFS`` and ``refmount status MOUNTPOINT``.

The first argument is a subcommand when it is exactly ``check`` or ``status``, with one
exception that keeps every mount command working as before: when a file or directory of
that name exists in the current directory and the whole command reads as a mount command
whose MOUNTPOINT is an existing directory not already mounted, it is that mount command.
(To check such a set, or to mount a REFS named ``check`` in any case, write ``./check``.)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys

from refmount.netcdf.options import FORMAT_CHOICES
from refmount.options import (
    MAX_RETRIES,
    UsageError,
    add_icechunk_options,
    check_remote_trust,
    check_signed,
    parse_args,
    parse_json_object,
    per_protocol,
    seconds,
    whole_number,
)

SUBCOMMANDS = ("check", "status")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SUBCOMMANDS and not _is_mount_command(argv):
        try:
            return run_check(argv[1:]) if argv[0] == "check" else run_status(argv[1:])
        except KeyboardInterrupt:
            return 130
    return run_mount(argv)


def run_mount(argv: list[str]) -> int:
    from refmount.service.daemon import MountError, run

    config = parse_args(argv)
    try:
        return run(config)
    except MountError as exc:
        print(f"refmount: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _is_mount_command(argv: list[str]) -> bool:
    """Whether ``check ...`` / ``status ...`` is a mount of a REFS by that name (see the
    module's docstring)."""
    if not os.path.lexists(argv[0]):
        return False
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            config = parse_args(argv)
    except SystemExit:
        return False
    return os.path.isdir(config.mountpoint) and not os.path.ismount(config.mountpoint)


# -- refmount check -----------------------------------------------------------------------


def check_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="refmount check",
        description="Validate a reference set without mounting it: keys, directories, inline "
        "bytes, targets by protocol and host, and problems (skipped keys and why, bounds hit, "
        "with --probe unreachable or short targets).  Exit status 0 when the set loads and "
        "nothing is wrong, 1 otherwise, 2 for a usage error.",
    )
    p.add_argument("refs", help="reference set or catalog of sets, as for mounting")
    p.add_argument(
        "--probe",
        type=whole_number(0, 1_000_000),
        default=0,
        metavar="N",
        help="also ask N targets, drawn at random, for their size",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the random draw of --probe (default 0)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--decode",
        action="store_true",
        help="also list the arrays the decoded view (--decode) cannot decode or leaves out",
    )
    p.add_argument(
        "--decode-strings",
        choices=["omit", "fixed"],
        default="omit",
        help="the decoded view's --decode-strings to check against (default omit)",
    )
    p.add_argument(
        "--netcdf",
        action="store_true",
        help="also list the netCDF view's files (--netcdf) and the arrays left out of them",
    )
    p.add_argument(
        "--netcdf-format",
        choices=FORMAT_CHOICES,
        default="auto",
        help="the netCDF view's --netcdf-format to check against (default auto)",
    )
    p.add_argument("--netcdf-name", metavar="NAME", help="the root group's file is NAME.nc")
    p.add_argument(
        "--netcdf-record-dim",
        metavar="NAME|none",
        help="the netCDF view's --netcdf-record-dim to check against (default: the first "
        "CF time axis)",
    )
    p.add_argument(
        "--catalog",
        action="store_true",
        help="check REFS as a catalog: every set under it, with a summary (a directory "
        "or prefix without .zmetadata is one anyway)",
    )
    p.add_argument(
        "--refs-options",
        type=parse_json_object,
        default={},
        metavar="JSON",
        help="fsspec storage options for reading REFS (or @file.json)",
    )
    p.add_argument(
        "--remote-protocol", metavar="P", help="protocol of target URLs written without one"
    )
    p.add_argument(
        "--remote-options",
        type=parse_json_object,
        default={},
        metavar="JSON",
        help="fsspec storage options for target filesystems, as for a mount",
    )
    p.add_argument(
        "--allow-local",
        action="store_true",
        help="let a reference set that is not local point at local files",
    )
    p.add_argument(
        "--timeout",
        type=seconds,
        default=30.0,
        metavar="S",
        help="deadline of one probe request attempt (default 30)",
    )
    p.add_argument(
        "--retries",
        type=whole_number(0, MAX_RETRIES),
        default=3,
        metavar="N",
        help="further attempts after a transient probe failure (default 3)",
    )
    add_icechunk_options(p)
    return p


def run_check(argv: list[str]) -> int:
    from refmount.catalog import is_catalog
    from refmount.check import CheckOptions, check, render
    from refmount.icechunk import is_repository
    from refmount.service.progress import LoadProgress

    parser = check_parser()
    args = parser.parse_args(argv)
    remote_options = per_protocol(args.remote_options, args.remote_protocol)
    try:
        check_remote_trust(remote_options)
        check_signed(remote_options)
    except UsageError as exc:
        parser.error(str(exc))
    options = CheckOptions(
        refs=args.refs,
        refs_options=args.refs_options,
        remote_protocol=args.remote_protocol,
        remote_options=remote_options,
        allow_local=args.allow_local,
        probe=args.probe,
        seed=args.seed,
        timeout=args.timeout,
        retries=args.retries,
        decode=args.decode,
        decode_strings=args.decode_strings,
        netcdf=args.netcdf,
        netcdf_format=args.netcdf_format,
        netcdf_name=args.netcdf_name,
        netcdf_record_dim=args.netcdf_record_dim,
        icechunk=args.icechunk
        or (not args.catalog and is_repository(args.refs, args.refs_options)),
        branch=args.branch,
        tag=args.tag,
        snapshot=args.snapshot,
        containers=args.containers,
    )
    terminal = sys.stderr if sys.stderr.isatty() else None
    if not options.icechunk and (
        args.catalog or is_catalog(args.refs, args.refs_options, args.timeout)
    ):
        from refmount.catalog.check import check_catalog
        from refmount.catalog.check import render as render_catalog

        catalog = check_catalog(options)
        print(json.dumps(catalog.as_dict(), indent=2) if args.json else render_catalog(catalog))
        return 0 if catalog.ok else 1
    with LoadProgress(args.refs, terminal=terminal, systemd=False) as progress:
        report = check(options, progress)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(render(report))
    return 0 if report.ok else 1


# -- refmount status ----------------------------------------------------------------------


def status_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="refmount status",
        description="Show the live counters of a refmount mount (whatever its --xattrs): "
        "requests, bytes fetched, cache hits and misses, errors, reads in flight, keys, "
        "the reference set, since when it is mounted and its last reload.",
    )
    p.add_argument("mountpoint", help="where the reference set is mounted")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print the status as JSON")
    shown.add_argument(
        "--pid",
        action="store_true",
        help='print only the daemon\'s process id (kill -HUP "$(refmount status --pid M)")',
    )
    return p


def run_status(argv: list[str]) -> int:
    from refmount.service.status import StatusError, mount_status, render

    args = status_parser().parse_args(argv)
    try:
        status = mount_status(args.mountpoint)
    except StatusError as exc:
        print(f"refmount status: {exc}", file=sys.stderr)
        return 1
    if args.pid:
        print(status["pid"])
    else:
        print(json.dumps(status, indent=2, sort_keys=True) if args.json else render(status))
    return 0
