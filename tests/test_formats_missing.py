"""A decoder library that is not installed: its arrays' chunks are EIO naming what to
install, the daemon says so in one log line, and ``refmount check --decode`` lists it.
"Not installed" is made as Python's import system knows it: ``sys.modules[name] = None``
in the process before refmount runs."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.format_builders import GRID, field, grib_message
from tests.support.mounting import REPO, Mounted, child_env

pytest.importorskip("eccodes")

WITHOUT_ECCODES = [
    sys.executable,
    "-c",
    "import sys; sys.modules['eccodes'] = None; from refmount.cli import main; sys.exit(main())",
]


def grib_refs(tmp_path: Path) -> Path:
    message = grib_message("t", "isobaricInhPa", 500, "grid_simple", field(1))
    data = tmp_path / "one.grib2"
    data.write_bytes(message)
    zarray = {
        "zarr_format": 2, "shape": [*GRID], "chunks": [*GRID], "dtype": "<f8",
        "fill_value": None, "order": "C", "compressor": None,
        "filters": [{"id": "grib", "var": "t", "dtype": "float64"}],
    }  # fmt: skip
    refs = {".zgroup": json.dumps({"zarr_format": 2})}
    for name in ("a", "b"):
        refs[f"{name}/.zarray"] = json.dumps(zarray)
        refs[f"{name}/0.0"] = [str(data), 0, len(message)]
    path = tmp_path / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path


def test_check_decode_names_what_to_install(tmp_path: Path) -> None:
    path = grib_refs(tmp_path)
    result = subprocess.run(
        [*WITHOUT_ECCODES, "check", "--decode", "--json", str(path)],
        capture_output=True, text=True, timeout=120, env=child_env(), cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    notes = {note["array"]: note for note in json.loads(result.stdout)["arrays"]}
    assert {name: note["status"] for name, note in notes.items()} == {
        "a": "not decoded",
        "b": "not decoded",
    }
    assert "pip install 'refmount[grib]'" in notes["a"]["reason"]


def test_a_mount_without_eccodes_reads_eio_and_says_so_once(tmp_path: Path) -> None:
    path = grib_refs(tmp_path)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    args = ["--decode", "--allow-local"]
    with Mounted(path, mountpoint, args, tmp_path / "log", command=WITHOUT_ECCODES) as mounted:
        for name in ("a", "b"):
            with pytest.raises(OSError) as failed:
                (mounted.mountpoint / name / "0.0").read_bytes()
            assert failed.value.errno == errno.EIO
        assert mounted.process.poll() is None
        hints = [
            line
            for line in mounted.log().splitlines()
            if "refmount.decode.stage" in line and "pip install 'refmount[grib]'" in line
        ]
        assert len(hints) == 1
