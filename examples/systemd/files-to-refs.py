"""A stand-in reference set generator: every regular file under DIR as a key that is
the whole file, printed as a version 1 JSON reference set.

    python3 files-to-refs.py /srv/data > refs.json

Real sets come from kerchunk (or similar) scanning the files; this one needs nothing but
Python, so that the daily refresh of examples/systemd can be tried as written.
"""

from __future__ import annotations

import json
import os
import sys


def references(top: str) -> dict[str, list[str]]:
    top = os.path.abspath(top)
    refs = {}
    for directory, subdirectories, files in os.walk(top):
        subdirectories.sort()
        for name in sorted(files):
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                refs[os.path.relpath(path, top)] = [path]
    return refs


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: files-to-refs.py DIR")
    json.dump({"version": 1, "refs": references(sys.argv[1])}, sys.stdout, indent=0)
    sys.stdout.write("\n")
