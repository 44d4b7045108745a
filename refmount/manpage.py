"""``man refmount``: the manual page, written from the command line's own argparse
definitions (the mount's parser and those of ``refmount check`` and ``refmount status``),
so that it lists exactly the options ``--help`` does.

``python -m refmount.manpage`` prints it; ``-o FILE`` writes it.  The copy the package
installs (``man/refmount.1``, under ``share/man/man1``) is kept equal to this output by
``tests/test_manpage.py``.
"""

from __future__ import annotations

import argparse
import re
import sys

from refmount import __version__
from refmount.cli import check_parser, status_parser
from refmount.options import REFS_ENV, build_parser

_DESCRIPTION = """\
refmount serves each key of a kerchunk/fsspec reference set (JSON version 0 or 1, plain or
compressed; a Parquet reference directory) or of an Icechunk repository as a file of a
read-only FUSE directory tree: a key's size is its reference's length, and reading it
fetches the referenced byte range from local files, HTTP(S), S3, GCS or Azure, through a
memory block cache with read-ahead (and, with --disk-cache, a disk cache shared by
mounts). Any program can then read the virtual Zarr dataset the set describes.
--decode serves every chunk decoded, for readers without the set's codecs (netCDF-C,
GDAL before 3.11); --netcdf serves each set as netCDF classic files, for programs that
open a .nc path. A directory or prefix of many reference sets mounts as a catalog, one
directory per set.
.PP
Without -f, refmount goes to the background and returns once the mount answers; if
mounting fails it prints why and exits with nothing mounted. SIGINT and SIGTERM unmount;
SIGHUP reloads REFS (the old tree serves until the new one is ready). The mount is
always ro, nodev, nosuid."""

_MOUNT_OPTIONS = """\
Every long option can also be given as a mount option, -o name=value (or -o name for a
flag), with - or _ in its name, so that an fstab line or a .mount unit can say everything:
.PP
.RS
.nf
/srv/refs/refs.json /mnt/air fuse.refmount ro,nodev,nosuid,_netdev,nofail,allow_other 0 0
.fi
.RE
.PP
Options that only mean something to mount(8) or systemd (_netdev, nofail, auto, defaults,
x\\-*, ...) are accepted and ignored. Escape a comma inside a value as \\e,."""

_ENVIRONMENT = f"""\
.TP
.B {REFS_ENV}
REFS, when the argument is left out: a URL holding credentials then stays out of the
process list. REFS given as @FILE is read from FILE's first line.
.TP
.B AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION
S3 credentials and region where --remote-options and --refs-options name none.
.TP
.B SSL_CERT_FILE, AWS_CA_BUNDLE, REQUESTS_CA_BUNDLE
PEM files of CAs trusted beside the system's (and a ca_bundle remote option per protocol
or host)."""

_EXIT_STATUS = """\
A mount: 0 once mounted (in the foreground: once unmounted by a signal), 1 when mounting
failed, 2 for a usage error.
.B refmount check:
0 when the set loads and nothing is wrong, 1 otherwise, 2 for a usage error.
.B refmount status:
0, or 1 when the path is not a refmount mount or its daemon does not answer."""

_SEE_ALSO = """\
.BR mount.fuse3 (8),
.BR fusermount3 (1),
.BR fstab (5),
.BR systemd.mount (5).
The documentation beside the source: README.md and docs/ (getting-started, sources, views,
stores, service, configuration, performance, security, troubleshooting, design)."""


def roff_text(text: str) -> str:
    """Text as roff reads it literally: backslashes escaped, hyphens as \\-, and no line
    that starts with a control character."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(
        "\\&" + line if line.startswith((".", "'")) else line for line in text.split("\n")
    )


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    text = formatter._expand_help(action) if action.help else ""
    if action.choices and not text:
        text = f"one of: {', '.join(map(str, action.choices))}"
    return " ".join(text.split())


def _synopsis_of(action: argparse.Action) -> str:
    """``\\fB\\-\\-cache\\-size\\fR \\fISIZE\\fR, ...`` for an option's .TP line."""
    if action.nargs == 0:
        value = ""
    elif action.metavar:
        value = f" \\fI{roff_text(str(action.metavar))}\\fR"
    elif action.choices:
        value = " \\fI" + roff_text("|".join(map(str, action.choices))) + "\\fR"
    else:
        value = f" \\fI{roff_text(action.dest.upper())}\\fR"
    return ", ".join(f"\\fB{roff_text(option)}\\fR{value}" for option in action.option_strings)


def _options(parser: argparse.ArgumentParser, heading: str | None) -> list[str]:
    """Each option as a tagged paragraph; each group of them under a ``heading``
    (``SS``) of its title, or all together when ``heading`` is None."""
    lines: list[str] = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.option_strings]
        if not actions:
            continue
        title = group.title or ""
        if heading and title not in ("options", "optional arguments"):
            lines += [f".{heading} {roff_text(_title(title))}"]
        for action in actions:
            lines += [".TP", _synopsis_of(action), roff_text(_help(parser, action))]
    return lines


def _title(text: str) -> str:
    """A group's title without its pointer into the docs: ``netCDF files``."""
    return re.sub(r"\s*\((?:README|docs/)[^)]*\)", "", text)


def _positionals(parser: argparse.ArgumentParser) -> list[str]:
    lines: list[str] = []
    for action in parser._actions:
        if not action.option_strings:
            name = action.metavar or action.dest.upper()
            lines += [".TP", f"\\fI{roff_text(name)}\\fR", roff_text(_help(parser, action))]
    return lines


def render() -> str:
    mount, check, status = build_parser(), check_parser(), status_parser()
    lines = [
        f'.TH REFMOUNT 1 "" "refmount {__version__}" "User Commands"',
        ".nh",  # option names are never hyphenated
        ".ad l",
        ".SH NAME",
        "refmount \\- " + roff_text(mount.description or ""),
        ".SH SYNOPSIS",
        ".B refmount",
        "[\\fIOPTIONS\\fR] \\fIREFS\\fR \\fIMOUNTPOINT\\fR",
        ".br",
        ".B refmount check",
        "[\\fIOPTIONS\\fR] \\fIREFS\\fR",
        ".br",
        ".B refmount status",
        "[\\fB\\-\\-json\\fR | \\fB\\-\\-pid\\fR] \\fIMOUNTPOINT\\fR",
        ".SH DESCRIPTION",
        _DESCRIPTION.replace("-", "\\-").replace(".PP\n", "\n.PP\n").replace("\n\n", "\n"),
        *_positionals(mount),
        ".SH OPTIONS",
        *_options(mount, "SS"),
        ".SH MOUNT OPTIONS",
        _MOUNT_OPTIONS,
        ".SH COMMANDS",
        ".SS refmount check [OPTIONS] REFS",
        roff_text(check.description or ""),
        *_positionals(check),
        *_options(check, None),
        ".SS refmount status [OPTIONS] MOUNTPOINT",
        roff_text(status.description or ""),
        *_positionals(status),
        *_options(status, None),
        ".SH ENVIRONMENT",
        _ENVIRONMENT,
        ".SH EXIT STATUS",
        _EXIT_STATUS,
        ".SH SEE ALSO",
        _SEE_ALSO,
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refmount.manpage", description=__doc__)
    parser.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    args = parser.parse_args(argv)
    text = render()
    if args.output:
        with open(args.output, "w") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
