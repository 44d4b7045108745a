"""``refmount`` command: parse options and hand over to the daemon."""

from __future__ import annotations

import sys

from refmount.daemon import MountError, run
from refmount.options import parse_args


def main(argv: list[str] | None = None) -> int:
    config = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(config)
    except MountError as exc:
        print(f"refmount: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
