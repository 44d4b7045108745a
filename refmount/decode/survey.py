"""What the decoded view makes of each array of a set, for ``refmount check --decode``."""

from __future__ import annotations

from dataclasses import dataclass

from refmount.decode.arrays import ArrayRefused
from refmount.decode.view import DecodedRefSet
from refmount.refs.model import RefSet

#: A string array's note with ``--decode-strings fixed``: check does not fetch its chunks.
STRINGS = "fixed-width strings (--decode-strings fixed), as wide as measured when mounted"


@dataclass
class ArrayNote:
    """One array: ``status`` is ``decoded``, ``not decoded`` (its chunks read as EIO:
    a codec refmount does not decode) or ``left out`` (not in the decoded view)."""

    array: str
    status: str
    reason: str | None = None


async def survey(raw: RefSet, *, fixed_strings: bool = False) -> list[ArrayNote]:
    """Every array of ``raw`` (a directory holding a ``.zarray``), in path order.  Arrays'
    own directories are not walked: their chunks say nothing more."""
    view = DecodedRefSet(raw, serial=0, fixed_strings=fixed_strings)
    tree = view.raw  # a Zarr v3 set as its v2 tree
    notes = []
    pending = [""]
    while pending:
        path = pending.pop()
        await tree.ensure(f"{path}/.zarray" if path else ".zarray")
        array = view.array_at(path)
        if isinstance(array, ArrayRefused) and view.string_array(path):
            notes.append(ArrayNote(path or "/", "decoded", STRINGS))
            continue
        if isinstance(array, ArrayRefused):
            notes.append(ArrayNote(path or "/", "left out", str(array)))
            continue
        if array is not None:
            error = array.decoder.error
            notes.append(ArrayNote(path or "/", "not decoded" if error else "decoded", error))
            continue
        after = -1
        while True:
            await tree.ensure(path, after)
            listed = False
            for child in tree.children(path, after):
                after, listed = child.cursor, True
                if child.file_id is None:
                    pending.append(f"{path}/{child.name}" if path else child.name)
            if not listed:
                break
    return sorted(notes, key=lambda note: note.array)
