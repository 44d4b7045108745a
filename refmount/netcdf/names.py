"""The file names of a view's groups: ``<name>.nc`` for the root, ``<name>.<a>.<b>.nc``
for group ``a/b``.

Two groups may map to one name: ``a.b`` (a dot in a group's name) and ``a/b`` are both
``<name>.a.b.nc``.  Then a group without a dot in its names keeps it (at most one does:
for those, the mapping is one to one), and a group with one is named with its dots
written ``%2E`` (``<name>.a%2Eb.nc``); a name still taken (a group ``a%2Eb`` as well)
leaves that group out, logged and listed by ``refmount check --netcdf``.  Never one
group's data under another's name; a name no other group takes is kept as it was.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from refmount.netcdf.options import SUFFIX

log = logging.getLogger(__name__)

DOT = "%2E"


def file_key(name: str, group: str) -> str:
    """The file of a group: ``<name>.nc`` for the root, ``<name>.<a>.<b>.nc`` for ``a/b``."""
    return f"{name}.{group.replace('/', '.')}{SUFFIX}" if group else f"{name}{SUFFIX}"


def file_keys(name: str, groups: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Each group's file name, and the groups left out (group -> why)."""
    claims: defaultdict[str, list[str]] = defaultdict(list)
    for group in groups:
        claims[file_key(name, group)].append(group)
    keys: dict[str, str] = {}
    renamed: list[str] = []
    for key, claimants in claims.items():
        for group in claimants:
            if len(claimants) == 1 or "." not in group:
                keys[group] = key
            else:
                renamed.append(group)
    taken = set(keys.values())
    left_out: dict[str, str] = {}
    for group in renamed:
        plain = file_key(name, group)
        key = file_key(name, group.replace(".", DOT))
        others = [g for g in claims[plain] if g != group]
        if key in taken or key in claims:
            why = f"a group whose file names {plain} and {key} are other groups'"
            left_out[group] = why
            log.warning("group %r is left out of the netCDF view: %s", group, why)
            continue
        taken.add(key)
        keys[group] = key
        log.warning(
            "group %r is file %s: %s is also group %s's", group, key, plain, " and ".join(others)
        )
    return keys, left_out


__all__ = ["file_key", "file_keys"]
