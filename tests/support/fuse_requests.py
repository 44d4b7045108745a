"""Count the FUSE requests a daemon receives while a command runs, by opcode.

Every request the kernel sends is one ``read`` of ``/dev/fuse`` by the daemon, starting
with ``fuse_in_header`` (length, opcode); ``strace`` attached to the daemon shows the
first bytes of each.  The daemon is slowed by strace: counts are exact, times are not.
"""

from __future__ import annotations

import collections
import re
import struct
import subprocess
import tempfile
import time
from pathlib import Path

# include/uapi/linux/fuse.h
OPCODES = {
    1: "LOOKUP", 2: "FORGET", 3: "GETATTR", 14: "OPEN", 15: "READ", 17: "STATFS",
    18: "RELEASE", 22: "GETXATTR", 23: "LISTXATTR", 25: "FLUSH", 26: "INIT", 27: "OPENDIR",
    28: "READDIR", 29: "RELEASEDIR", 34: "ACCESS", 36: "INTERRUPT", 42: "BATCH_FORGET",
    44: "READDIRPLUS", 46: "LSEEK",
}  # fmt: skip
# A read of /dev/fuse as strace shows it with -xx: the first bytes in hex.
READ_LINE = re.compile(r'read\(\d+, "((?:\\x[0-9a-f]{2}){8})')


def count_requests(pid: int, command: list[str], cwd: Path) -> collections.Counter[str]:
    """Run ``command`` while strace watches the daemon; requests by opcode name."""
    with tempfile.NamedTemporaryFile(prefix="refmount-strace-", suffix=".txt") as out:
        tracer = subprocess.Popen(
            ["strace", "-f", "-qq", "-xx", "-s", "8", "-e", "trace=read", "-o", out.name,
             "-p", str(pid)],
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(1.0)  # strace attaches to every thread
            subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, check=True, timeout=600)
            time.sleep(0.5)
        finally:
            tracer.terminate()
            tracer.wait(30)
        counts: collections.Counter[str] = collections.Counter()
        for line in Path(out.name).read_text(errors="replace").splitlines():
            found = READ_LINE.search(line)
            if found is None:
                continue
            raw = bytes(int(h, 16) for h in found.group(1).split("\\x")[1:])
            _, opcode = struct.unpack("<II", raw)
            counts[OPCODES.get(opcode, str(opcode))] += 1
        return counts
