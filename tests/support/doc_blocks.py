"""The runnable shell blocks of README.md and docs/*.md, and the output each shows.

The convention (docs/design.md, "Docs that cannot go stale"): a fenced block whose
opening fence follows a line ``<!-- runnable -->`` is run as written; a fenced block
after a line ``<!-- output -->``, following a runnable block, is what it must print.  In
the expected output a line ``...`` stands for any number of lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUNNABLE = "<!-- runnable -->"
OUTPUT = "<!-- output -->"
_FENCE = re.compile(r"^\s*(`{3,})")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the block's first line of code, 1-based
    code: str
    output: str | None = None

    @property
    def name(self) -> str:
        return f"{self.page.name}:{self.line}"


def _fenced(lines: list[str], start: int, page: Path) -> tuple[str, int]:
    """The body of the fenced block opening at ``lines[start]``, and the index after it."""
    fence = _FENCE.match(lines[start])
    if fence is None:
        raise ValueError(f"{page}:{start + 1}: a marker must be followed by a fenced block")
    for end in range(start + 1, len(lines)):
        if lines[end].strip() == fence.group(1):
            return "\n".join(lines[start + 1 : end]) + "\n", end + 1
    raise ValueError(f"{page}:{start + 1}: the block is not closed")


def _next_line(lines: list[str], index: int) -> int:
    while index < len(lines) and not lines[index].strip():
        index += 1
    return index


def blocks_in(page: Path) -> list[Block]:
    lines = page.read_text().split("\n")
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        if lines[index].strip() == OUTPUT:
            raise ValueError(f"{page}:{index + 1}: an output block follows no runnable block")
        if _FENCE.match(lines[index]):  # a block not marked (or an example of the markers)
            _, index = _fenced(lines, index, page)
            continue
        if lines[index].strip() != RUNNABLE:
            index += 1
            continue
        start = _next_line(lines, index + 1)
        code, index = _fenced(lines, start, page)
        output = None
        after = _next_line(lines, index)
        if after < len(lines) and lines[after].strip() == OUTPUT:
            output, index = _fenced(lines, _next_line(lines, after + 1), page)
        blocks.append(Block(page, start + 2, code, output))
    return blocks


def output_matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` is ``expected``, trailing spaces ignored, ``...`` lines any lines."""
    pattern = ""
    for line in expected.rstrip("\n").split("\n"):
        pattern += r"(?:[^\n]*\n)*?" if line.strip() == "..." else re.escape(line.rstrip()) + r"\n"
    tidy = "".join(line.rstrip() + "\n" for line in actual.rstrip("\n").split("\n"))
    return re.fullmatch(pattern, tidy) is not None
