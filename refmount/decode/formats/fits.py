"""FITS tables: the codecs ``kerchunk.fits`` (and kerchunk's record splitting) write.

- ``FITSAscii``: an ASCII table's rows as fixed-width text fields (``indtypes``, each
  ``S<width>``) parsed into ``outdtypes`` (numbers or fixed-width text).  Its input has
  exactly ``rows * input row width`` bytes.
- ``record_member``: one field (``member``) of a record array (``dtype``, a list of
  ``[name, dtype]`` or ``[name, dtype, shape]``) taken out as an array of its own.

``FITSVarBintable`` (variable-length arrays in a binary table) decodes to Python
objects, which have no fixed-size bytes: its arrays are left out of the decoded view
(their dtype has ``O`` fields).  FITS images need none of these: their data is plain
big-endian values, with ``fixedscaleoffset`` for ``BSCALE``/``BZERO``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from refmount.decode.stage import (
    Buffer,
    CodecError,
    DecodeError,
    Stage,
    exact,
    record_dtype,
    to_bytes,
)


def _fits_ascii(config: Mapping[str, Any]) -> Stage:
    indtype = record_dtype(config.get("indtypes"), "FITSAscii: indtypes")
    outdtype = record_dtype(config.get("outdtypes"), "FITSAscii: outdtypes")
    if indtype.names != outdtype.names or any(
        indtype[name].kind != "S" for name in indtype.names or ()
    ):
        raise CodecError("FITSAscii: indtypes are not text fields of the outdtypes' names")

    def encoded_size(size: int) -> int:
        if size % outdtype.itemsize:
            raise CodecError(f"FITSAscii: chunk size {size} is not whole rows")
        return size // outdtype.itemsize * indtype.itemsize

    def decode(data: Buffer, size: int) -> Buffer:
        rows = np.frombuffer(exact(data, encoded_size(size), "FITSAscii"), dtype=indtype)
        try:
            values = rows.astype(outdtype)
        except ValueError as exc:
            raise DecodeError(f"FITSAscii: a field that is not its type: {exc}") from None
        return exact(to_bytes(values), size, "FITSAscii")

    return Stage("FITSAscii", decode, encoded_size)


def _record_member(config: Mapping[str, Any]) -> Stage:
    record = record_dtype(config.get("dtype"), "record_member: dtype")
    member = config.get("member")
    if not isinstance(member, str) or member not in (record.names or ()):
        raise CodecError(f"record_member: member {member!r} is not a field of its dtype")
    field = record[member]

    def encoded_size(size: int) -> int:
        if size % field.itemsize:
            raise CodecError(f"record_member: chunk size {size} is not whole {member!r} values")
        return size // field.itemsize * record.itemsize

    def decode(data: Buffer, size: int) -> Buffer:
        records = np.frombuffer(exact(data, encoded_size(size), "record_member"), dtype=record)
        return exact(to_bytes(records[member]), size, "record_member")

    return Stage("record_member", decode, encoded_size)


BUILDERS: dict[str, Callable[[Mapping[str, Any]], Stage]] = {
    "FITSAscii": _fits_ascii,
    "record_member": _record_member,
}
