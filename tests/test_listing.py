"""Listings of large JSON directories: decoded in batches, resumable at every cursor."""

from __future__ import annotations

import json
from pathlib import Path

from refmount.refs import open_refset

FILES = 2600  # more than two listing batches


def expected_listing(keys: list[str], path: str) -> list[tuple[str, bool]]:
    """(name, is_file) of a directory's entries, in key order, from the keys alone."""
    prefix = f"{path}/" if path else ""
    seen: dict[str, bool] = {}
    for key in sorted(keys):
        if key.startswith(prefix):
            name, slash, _ = key[len(prefix) :].partition("/")
            seen.setdefault(name, not slash)
    return list(seen.items())


def test_large_directory_with_subdirectories_between_batches(tmp_path: Path) -> None:
    keys = [f"arr/{i:05d}" for i in range(FILES)]
    # Subdirectories whose names sort among the files: first, inside the first and
    # second batch, at a batch edge, and last; one deep, one with non-ASCII names.
    for name in ("00000a", "00700x", "01023z", "01500é", "99999"):
        keys += [f"arr/{name}/0", f"arr/{name}/1"]
    keys += ["arr/01024q/deep/er/0", "top", "été/0"]
    refs = {"version": 1, "refs": {key: "v" for key in keys}}
    path = tmp_path / "refs.json"
    path.write_text(json.dumps(refs))
    refset = open_refset(str(path))

    for directory in ("", "arr", "arr/01024q", "été"):
        children = list(refset.children(directory))
        got = [(c.name, c.file_id is not None) for c in children]
        assert got == expected_listing(keys, directory), directory
        for child in children:
            if child.file_id is not None:
                prefix = f"{directory}/" if directory else ""
                assert refset.key(child.file_id) == prefix + child.name
        # Resuming after any entry's cursor lists exactly the entries after it.
        cursors = [c.cursor for c in children]
        assert cursors == sorted(cursors)
        for i in [*range(0, len(children), 97), len(children) - 1]:
            assert list(refset.children(directory, children[i].cursor)) == children[i + 1 :]
