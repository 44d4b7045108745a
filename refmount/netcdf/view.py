"""The netCDF view of a reference set (``--netcdf``): its groups as netCDF classic files.

:class:`NetcdfRefSet` wraps the decoded view (:class:`refmount.decode.view.DecodedRefSet`)
and is what the tree is given: a root directory holding ``<name>.nc`` (the root group)
and ``<name>.<a>.<b>.nc`` per group ``a/b`` with arrays (:mod:`refmount.netcdf.names`);
the root group's is file 0, which a catalog lists beside each set before loading it.
Each file is a URL ``refmount-netcdf:<view serial>/<file id>`` of the exact size its
header says, known from the metadata alone; :mod:`refmount.netcdf.reads` serves its bytes.
The files are made when the set is first used (the decoded view measures string arrays
then, reading their chunks): a set that cannot be presented fails that use (EIO, logged,
naming why), and is tried again on the next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import trio

from refmount.decode.view import DecodedRefSet
from refmount.errors import FetchError
from refmount.netcdf.model import Files, NcFile, build
from refmount.refs.model import Child, Ref, RefSet

#: The scheme of a file's URL: ``refmount-netcdf:<view serial>/<file id>``.
SCHEME = "refmount-netcdf:"


class NetcdfRefSet(RefSet):
    """``decoded`` as netCDF files; ``name`` names the root group's file, ``choice`` is
    ``--netcdf-format``; ``closing`` is told when the view closes (its read-ahead
    stops)."""

    def __init__(
        self,
        decoded: DecodedRefSet,
        serial: int,
        name: str,
        choice: str,
        *,
        closing: Callable[[NetcdfRefSet], None] = lambda view: None,
    ) -> None:
        self.decoded = decoded
        self.raw = decoded.raw
        self.serial = serial
        self.name = name
        self.choice = choice
        self.mtime = decoded.mtime
        self._files: Files | None = None
        self._ids: dict[str, int] = {}
        self._building: trio.Lock | None = None
        self._closing = closing
        self.closed = False

    async def files(self) -> Files:
        """The files, made on first use."""
        if self._files is not None:
            return self._files
        if self._building is None:
            self._building = trio.Lock()
        async with self._building:
            if self._files is None:
                files = await build(self.decoded, self.name, self.choice)
                self._ids = {f.key: i for i, f in enumerate(files.files)}
                self._files = files
        return self._files

    def file(self, file_id: int) -> NcFile:
        if self._files is None or not 0 <= file_id < len(self._files.files):
            raise FetchError(f"no netCDF file {file_id} in this view")
        return self._files.files[file_id]

    # -- the RefSet interface -------------------------------------------------------------

    def file_id(self, key: str) -> int | None:
        return self._ids.get(key)

    def key(self, file_id: int) -> str:
        return self.file(file_id).key

    def ref(self, file_id: int) -> Ref:
        return Ref(url=f"{SCHEME}{self.serial}/{file_id}", length=self.file(file_id).size)

    def file_size(self, file_id: int) -> int | None:
        return self.file(file_id).size

    def block_size(self, file_id: int) -> int:
        return self.file(file_id).block_size

    def is_dir(self, path: str) -> bool:
        return path == ""

    def children(self, path: str, after: int = -1) -> Iterator[Child]:
        if path or self._files is None:
            return
        for file_id, made in enumerate(self._files.files):
            if file_id > after:
                yield Child(made.key, file_id, file_id)

    def subdirectory_count(self, path: str) -> int:
        return 0

    async def ensure(self, path: str, after: int = -1) -> None:
        await self.files()

    def url_extent(self, url: str) -> int | None:
        return self.decoded.url_extent(url)

    def protocols(self) -> set[str]:
        return self.decoded.protocols()

    def target_urls(self) -> Sequence[str] | None:
        return self.decoded.target_urls()

    def source_version(self) -> dict[str, Any] | None:
        return self.decoded.raw.source_version()

    def close(self) -> None:
        self.closed = True
        self._closing(self)
        self.decoded.close()
