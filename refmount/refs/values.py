"""The bytes of inline reference values, as fsspec's ReferenceFileSystem serves them."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from refmount.errors import RefsError


def inline_bytes(value: str | dict[str, Any], key: str) -> bytes:
    """Bytes of a string, ``base64:`` string or JSON-object value of ``key``.

    Strings are data (UTF-8); ``base64:...`` decodes strictly; a JSON object is served as
    compact, ASCII-escaped JSON (JSON-equal to what fsspec serves).
    """
    if isinstance(value, str):
        if value.startswith("base64:"):
            try:
                return base64.b64decode(value[7:], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise RefsError(f"key {key!r}: invalid base64 data ({exc})") from None
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, dict):
        try:
            return json.dumps(value, separators=(",", ":")).encode("ascii")
        except (RecursionError, ValueError) as exc:  # nested too deep for the encoder
            raise RefsError(f"key {key!r}: cannot serve this JSON object ({exc})") from None
    raise RefsError(f"key {key!r}: expected a string or a JSON object, got {type(value).__name__}")
