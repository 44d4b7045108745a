"""refmount in the foreground over a JSON reference set whose references carry checksums.

Run as::

    python tests/support/checksummed_daemon.py CHECKSUMS.json REFS MNT [refmount options]

``CHECKSUMS.json`` maps keys to ``{"etag": ...}`` or ``{"last_modified": seconds}``: those
keys' references carry that :class:`~refmount.refs.model.Checksum`, as an Icechunk
repository's virtual chunks do.  Everything else is refmount's own daemon, loading REFS
as it always does; only the loaded set is wrapped.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from refmount import cli
from refmount.refs.model import Checksum, Child, Ref, RefSet
from refmount.service import serve


class ChecksummedRefSet(RefSet):
    """``inner`` with the given keys' references carrying a checksum."""

    def __init__(self, inner: RefSet, checksums: Mapping[str, Checksum]) -> None:
        self.inner = inner
        self.checksums = dict(checksums)
        self.mtime = inner.mtime

    def _with_checksum(self, file_id: int, ref: Ref) -> Ref:
        checksum = self.checksums.get(self.inner.key(file_id))
        return ref if checksum is None else dataclasses.replace(ref, checksum=checksum)

    def file_id(self, key: str) -> int | None:
        return self.inner.file_id(key)

    def key(self, file_id: int) -> str:
        return self.inner.key(file_id)

    def ref(self, file_id: int) -> Ref:
        return self._with_checksum(file_id, self.inner.ref(file_id))

    async def file_ref(self, file_id: int) -> Ref:
        return self._with_checksum(file_id, await self.inner.file_ref(file_id))

    def is_dir(self, path: str) -> bool:
        return self.inner.is_dir(path)

    def children(self, path: str, after: int = -1) -> Iterator[Child]:
        return self.inner.children(path, after)

    def subdirectory_count(self, path: str) -> int:
        return self.inner.subdirectory_count(path)

    def file_size(self, file_id: int) -> int | None:
        return self.inner.file_size(file_id)

    async def ensure(self, path: str, after: int = -1) -> None:
        await self.inner.ensure(path, after)

    def url_extent(self, url: str) -> int | None:
        return self.inner.url_extent(url)

    def protocols(self) -> set[str]:
        return self.inner.protocols()

    def target_urls(self) -> Sequence[str] | None:
        return self.inner.target_urls()

    def close(self) -> None:
        self.inner.close()


def main(argv: list[str]) -> int:
    given: dict[str, dict[str, Any]] = json.loads(Path(argv[0]).read_text())
    checksums = {key: Checksum(**fields) for key, fields in given.items()}
    load = serve.load_refset
    serve.load_refset = lambda *args, **kw: ChecksummedRefSet(load(*args, **kw), checksums)
    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
