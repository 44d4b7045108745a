"""Data files on the range server, named after the test that writes them, and the
reference sets that point at them: so that neither the kernel's page cache nor refmount's
block cache can answer from an earlier test."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Remote:
    """A data file served by the range server."""

    name: str
    url: str
    data: bytes

    @property
    def path(self) -> str:
        """The path the server sees (what fault rules match)."""
        return "/" + self.name


def write_refs(directory: Path, refs: dict[str, object]) -> Path:
    path = directory / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path
