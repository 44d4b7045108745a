"""Numbers in what a server sends, read as ASCII decimal digits only.

``int()`` and ``str.isdigit()`` take far more than ``0``-``9``: ``int("١٢")`` is 12
(Arabic-Indic digits), ``"²".isdigit()`` is true and ``int("²")`` raises ``ValueError``,
and a regular expression's ``\\d`` matches every Unicode decimal digit.  A length or an
offset from a server is a number only when it is written the way HTTP writes one
(RFC 9110 ``1*DIGIT``, DIGIT being ``%x30-39``); anything else is refused by the caller
as a malformed answer, never read as some other number or left to raise ``ValueError``.
"""

from __future__ import annotations

import re

#: 19 digits hold every length a 64-bit offset can express, and no more than one.
MAX_DIGITS = 19
_DECIMAL = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}")


def ascii_decimal(text: str) -> int | None:
    """``text`` (surrounding spaces and tabs allowed) as a non-negative integer when it is
    1 to 19 ASCII digits, else None."""
    value = text.strip(" \t")
    if _DECIMAL.fullmatch(value) is None:
        return None
    return int(value)
