"""What the mount calls each reference set a catalog's source holds, and which it skips.

Pure: given what a listing of the source found, say which directory of the mount each
set becomes (``2024/run01.json.zst`` -> ``2024/run01``) and which directories lead to
sets.  Names that clash (``run01.json`` beside ``run01.json.gz``, or beside a directory
``run01``) or cannot be names are skipped, each with a problem saying why.

A view may also show one file of each set beside the set's directory (:class:`SetFile`:
the netCDF view's ``2024/run01.nc``): its name follows from the set's alone, so a
listing names it without loading the set.  One that would clash with another entry of
its directory is left out, with a problem.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

JSON_SUFFIXES = (".json", ".json.gz", ".json.bz2", ".json.xz", ".json.zst", ".json.zstd")
PARQUET_SUFFIXES = (".parquet", ".parq")
#: The longest name a directory entry may have (bytes, as Linux counts them).
NAME_MAX = 255


@dataclass(frozen=True)
class Found:
    """One reference set a listing of the source found.

    ``source`` is its path below the catalog's root as the source spells it (``/``
    between parts, no leading slash), ``url`` where to read it; ``parquet`` that it is a
    directory (a Parquet set, or an Icechunk repository), named as it is; ``signature``
    what the listing says of it cheaply (ETag, mtime, size), empty when it says nothing."""

    source: str
    url: str
    parquet: bool
    mtime: float | None = None
    signature: tuple[str, ...] = ()


@dataclass(frozen=True)
class SetEntry:
    """A reference set as the mount shows it: ``path`` is its directory in the mount."""

    path: str
    found: Found

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]

    @property
    def parent(self) -> str:
        return self.path.rpartition("/")[0]


@dataclass(frozen=True)
class SetFile:
    """A file of each set's tree listed beside the set's directory: for the set
    ``a/run01``, ``a/run01<suffix>`` is the file ``run01<suffix>`` at the root of its
    tree, whose file id is ``file_id`` (known before the set is loaded: listings give
    inode numbers and load nothing)."""

    suffix: str
    file_id: int

    def name(self, set_name: str) -> str:
        return set_name + self.suffix


@dataclass
class Plan:
    """The mount's catalog directories: ``sets`` by path, ``dirs`` (``""`` the root)
    mapping each directory to its sorted children, ``files`` each set's file listed
    beside it (its path -> the set's path), and the problems met."""

    sets: dict[str, SetEntry] = field(default_factory=dict)
    dirs: dict[str, list[str]] = field(default_factory=lambda: {"": []})
    files: dict[str, str] = field(default_factory=dict)
    file_counts: dict[str, int] = field(default_factory=dict)  # directory -> its files
    problems: list[str] = field(default_factory=list)

    def subdirectories(self, path: str) -> int:
        """How many of a directory's children are directories (sets and catalog
        directories, not the sets' files)."""
        return len(self.dirs.get(path, ())) - self.file_counts.get(path, 0)


def set_name(filename: str, *, parquet: bool) -> str | None:
    """The name a refs file (or Parquet directory) shows as, or ``None`` when its name
    does not say it is one (``notes.txt``)."""
    suffixes = PARQUET_SUFFIXES if parquet else JSON_SUFFIXES
    for suffix in sorted(suffixes, key=len, reverse=True):
        if filename.endswith(suffix):
            return filename[: -len(suffix)]
    return filename if parquet else None


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a directory entry, or ``None`` when it can."""
    if name in ("", ".", ".."):
        return "an empty or dot name"
    if "/" in name or "\0" in name:
        return "a slash or NUL in the name"
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        return f"a name longer than {NAME_MAX} bytes"
    return None


def plan(found: Iterable[Found], beside: SetFile | None = None) -> Plan:
    """The directories and sets of the mount for what a listing found, and with
    ``beside`` each set's file next to it."""
    result = Plan()
    claims: dict[str, list[Found]] = {}
    for item in found:
        parts = item.source.split("/")
        name = set_name(parts[-1], parquet=item.parquet)
        if name is None:
            continue
        bad = next(filter(None, (name_problem(part) for part in [*parts[:-1], name])), None)
        if bad is not None:
            result.problems.append(f"{item.source}: skipped: {bad}")
            continue
        claims.setdefault("/".join([*parts[:-1], name]), []).append(item)
    directories = {path.rpartition("/")[0] for path in claims}
    for path in list(directories):
        while path:
            path = path.rpartition("/")[0]
            directories.add(path)
    for path, items in sorted(claims.items()):
        if len(items) > 1:
            sources = ", ".join(sorted(item.source for item in items))
            result.problems.append(
                f"{path}: skipped: {len(items)} sets would have this name ({sources})"
            )
        elif path in directories:
            result.problems.append(
                f"{items[0].source}: skipped: a directory of the source has the name {path!r}"
            )
        else:
            result.sets[path] = SetEntry(path, items[0])
    kept = {""}
    for path in result.sets:
        parent = path.rpartition("/")[0]
        while parent not in kept:
            kept.add(parent)
            parent = parent.rpartition("/")[0]
    result.dirs = {path: [] for path in sorted(kept)}
    for path in [*sorted(kept - {""}), *result.sets]:
        parent, _, name = path.rpartition("/")
        result.dirs[parent].append(name)
    if beside is not None:
        _add_files(result, beside)
    for children in result.dirs.values():
        children.sort()
    return result


def _add_files(result: Plan, beside: SetFile) -> None:
    """Each set's file beside it, unless its name is taken or cannot be a name."""
    taken = {*result.sets, *result.dirs}
    for path, entry in result.sets.items():
        name = beside.name(entry.name)
        file = f"{entry.parent}/{name}" if entry.parent else name
        bad = name_problem(name) or ("the name of another entry" if file in taken else None)
        if bad is not None:
            result.problems.append(f"{file}: the file of set {path} is left out: {bad}")
            continue
        result.files[file] = path
        result.dirs[entry.parent].append(name)
        result.file_counts[entry.parent] = result.file_counts.get(entry.parent, 0) + 1
