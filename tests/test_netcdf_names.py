"""Groups whose file names meet (``a.b`` and ``a/b`` are both ``NAME.a.b.nc``), through
real mounts and ``refmount check --netcdf``: each group's data under its own name, or the
group left out and named; never one group's data under another's name (issue 37)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import netCDF4
import numpy as np

from refmount.netcdf.names import file_keys
from tests.support.mounting import REFMOUNT, Mounted, child_env


def grouped_set(directory: Path, groups: dict[str, list[float]]) -> Path:
    """A set whose groups each hold an array ``v`` of the values given, inline."""
    refs: dict[str, str] = {".zgroup": '{"zarr_format": 2}'}
    for group, values in groups.items():
        meta = {
            "zarr_format": 2, "shape": [len(values)], "chunks": [len(values)], "dtype": "<f8",
            "compressor": None, "filters": None, "order": "C", "fill_value": None,
        }  # fmt: skip
        prefix = f"{group}/" if group else ""
        parts = group.split("/") if group else []
        for depth in range(1, len(parts) + 1):
            refs["/".join(parts[:depth]) + "/.zgroup"] = '{"zarr_format": 2}'
        refs[f"{prefix}v/.zarray"] = json.dumps(meta)
        refs[f"{prefix}v/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": ["n"], "from_group": group})
        data = np.array(values, "<f8").tobytes()
        refs[f"{prefix}v/0"] = "base64:" + base64.b64encode(data).decode()
    path = directory / "set.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path


def values(path: Path) -> tuple[str, list[float]]:
    with netCDF4.Dataset(path) as ds:
        return ds["v"].from_group, ds["v"][:].tolist()


def test_a_dotted_group_and_a_nested_one_are_each_their_own_file(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    refs = grouped_set(tmp_path, {"": [0.0], "a.b": [1.0, 2.0], "a/b": [10.0, 20.0, 30.0]})
    mounted = mount(refs, "--netcdf")
    root = mounted.mountpoint
    assert sorted(os.listdir(root)) == ["set.a%2Eb.nc", "set.a.b.nc", "set.nc"]
    assert values(root / "set.a.b.nc") == ("a/b", [10.0, 20.0, 30.0])
    assert values(root / "set.a%2Eb.nc") == ("a.b", [1.0, 2.0])
    assert values(root / "set.nc") == ("", [0.0])
    assert "group 'a.b' is file set.a%2Eb.nc: set.a.b.nc is also group a/b's" in mounted.log()


def test_a_group_no_name_is_left_for_is_left_out_and_named(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    groups = {"": [0.0], "a.b": [1.0], "a/b": [2.0], "a%2Eb": [3.0]}
    refs = grouped_set(tmp_path, groups)
    mounted = mount(refs, "--netcdf")
    root = mounted.mountpoint
    assert sorted(os.listdir(root)) == ["set.a%2Eb.nc", "set.a.b.nc", "set.nc"]
    assert values(root / "set.a.b.nc") == ("a/b", [2.0])
    assert values(root / "set.a%2Eb.nc") == ("a%2Eb", [3.0])
    assert "group 'a.b' is left out of the netCDF view" in mounted.log()
    done = subprocess.run(
        [*REFMOUNT, "check", "--netcdf", "--json", str(refs)],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    names = sorted(made["name"] for made in report["netcdf"]["files"])
    assert names == ["set.a%2Eb.nc", "set.a.b.nc", "set.nc"]
    assert list(report["netcdf"]["left_out"]) == ["a.b"]
    (problem,) = report["problems"]
    assert problem["message"].startswith("a.b: left out of the file: a group whose file names")


def test_names_no_other_group_takes_are_kept() -> None:
    keys, left_out = file_keys("x", ["", "a.b", "c/d", "e.f/g"])
    assert keys == {"": "x.nc", "a.b": "x.a.b.nc", "c/d": "x.c.d.nc", "e.f/g": "x.e.f.g.nc"}
    keys, left_out = file_keys("x", ["a.b/c", "a/b.c", "a/b/c"])
    assert keys == {"a/b/c": "x.a.b.c.nc", "a.b/c": "x.a%2Eb.c.nc", "a/b.c": "x.a.b%2Ec.nc"}
    assert not left_out
