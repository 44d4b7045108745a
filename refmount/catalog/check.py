"""``refmount check REFS_DIR``: every set of a catalog checked as ``refmount check`` checks
one (:mod:`refmount.check`), then a summary.  Names the mount would skip (clashes, names
that cannot be names) and a source that cannot be listed are problems too."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from refmount.catalog.names import plan
from refmount.catalog.serving import beside
from refmount.catalog.source import list_sets
from refmount.check import CheckOptions, Report, check
from refmount.errors import RefsError
from refmount.icechunk import is_repository
from refmount.redaction import display_url


@dataclass
class CatalogReport:
    refs: str
    sets: dict[str, Report] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(report.ok for report in self.sets.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "refs": self.refs,
            "catalog": True,
            "ok": self.ok,
            "problems": self.problems,
            "sets": {path: report.as_dict() for path, report in self.sets.items()},
        }


def check_catalog(options: CheckOptions, progress: Any = None) -> CatalogReport:
    report = CatalogReport(display_url(options.refs))
    try:
        found = list_sets(options.refs, options.refs_options, timeout=options.timeout)
    except RefsError as exc:
        report.problems.append(f"cannot list the catalog: {exc}")
        return report
    listing = plan(found, beside(options.netcdf))
    report.problems += listing.problems
    for path, entry in listing.sets.items():
        url = entry.found.url
        one = dataclasses.replace(  # a set's netCDF file is named after it, as mounted
            options,
            refs=url,
            icechunk=is_repository(url, options.refs_options),
            netcdf_name=entry.name,
        )
        report.sets[path] = check(one, progress)
    return report


def render(report: CatalogReport) -> str:
    lines = [f"{report.refs}: catalog of {len(report.sets):,} reference sets"]
    width = max((len(path) for path in report.sets), default=0)
    for path, one in report.sets.items():
        if one.ok:
            verdict = f"ok, {one.format}, {one.keys:,} keys"
        elif not one.loaded:
            verdict = f"NOT LOADED: {one.problems[0].message if one.problems else '?'}"
        else:
            verdict = f"{len(one.problems):,} problems, first: {one.problems[0].message}"
        lines.append(f"  {path:<{width}}  {verdict}")
    good = sum(one.ok for one in report.sets.values())
    keys = sum(one.keys for one in report.sets.values())
    lines.append(
        f"summary: {good:,} of {len(report.sets):,} sets fine, {keys:,} keys in all; "
        f"{len(report.problems):,} problems of the catalog"
    )
    lines += [f"  {problem}" for problem in report.problems]
    return "\n".join(lines)
