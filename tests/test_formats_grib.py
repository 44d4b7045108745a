"""GRIB2 through ``--decode``: files written with ecCodes, referenced by kerchunk's
``scan_grib`` (one file, and two combined with ``MultiZarrToZarr``), read through a real
mount by zarr, Debian's ncdump and GDAL 3.6, equal to what ecCodes and cfgrib read from
the files themselves."""

from __future__ import annotations

import calendar
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.format_builders import GRID, grib_fields, write_grib
from tests.support.mounting import Mounted

pytest.importorskip("eccodes")
grib2 = pytest.importorskip("kerchunk.grib2")

TIME = calendar.timegm((2024, 1, 2, 6, 0, 0))


def scanned(path: Path, inline_threshold: int = 0) -> list[dict]:
    return grib2.scan_grib(str(path), inline_threshold=inline_threshold)


def one_set(path: Path, sets: list[dict]) -> Path:
    """The messages' sets as one: message ``i`` in group ``m<i>``."""
    refs: dict[str, object] = {".zgroup": json.dumps({"zarr_format": 2})}
    for index, message in enumerate(sets):
        for key, value in message["refs"].items():
            refs[f"m{index}/{key}"] = value
    out = path.with_suffix(".json")
    out.write_text(json.dumps({"version": 1, "templates": sets[0]["templates"], "refs": refs}))
    return out


def ncdump_values(target: str, variable: str) -> np.ndarray:
    out = subprocess.run(
        ["ncdump", "-p", "9,17", "-v", variable, f"file://{target}#mode=zarr,file"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    body = re.search(rf"\b{variable} =(.*?);", out.split("data:", 1)[1], re.S)
    assert body is not None, out[-2000:]
    return np.array([float(v) for v in body.group(1).replace("\n", " ").split(",")])


@pytest.fixture
def grib_file(tmp_path: Path) -> Path:
    return write_grib(tmp_path / "fields.grib2")


def test_zarr_reads_every_message_as_eccodes_does(
    mount: Callable[..., Mounted], grib_file: Path
) -> None:
    refs = one_set(grib_file, scanned(grib_file))
    decoded = mount(refs, "--decode", "--allow-local")
    group = zarr.open_group(decoded.mountpoint, mode="r", zarr_format=2)
    fields = grib_fields(grib_file)
    names = ["t", "t", "u", "t2m", "r"]
    levels = ["isobaricInhPa"] * 3 + ["heightAboveGround", "isobaricInhPa"]
    for index, (name, level, expected) in enumerate(zip(names, levels, fields, strict=True)):
        message = group[f"m{index}"]
        values = message[name][...]
        assert values.dtype == np.float64 and values.shape == GRID
        assert np.array_equal(values, expected["values"], equal_nan=True)
        # The rank-0 coordinates, referenced (not inlined): the keys they stand for.
        assert message[level][...].tolist() == [expected["level"]]
        assert message["time"][...].tolist() == [TIME]
        assert message["step"][...].tolist() == [3]
        assert message["valid_time"][...].tolist() == [TIME + 3 * 3600]
        assert np.array_equal(message["latitude"][...], np.unique(expected["latitudes"])[::-1])
        assert np.array_equal(message["longitude"][...], np.unique(expected["longitudes"]))
    assert np.isnan(fields[3]["values"]).sum() == -(-GRID[0] * GRID[1] // 7)
    meta = json.loads((decoded.mountpoint / "m3" / "t2m" / ".zarray").read_text())
    assert (meta["filters"], meta["compressor"], meta["dtype"]) == (None, None, "<f8")


def test_ncdump_and_gdal_read_the_fields_as_eccodes_does(
    mount: Callable[..., Mounted], grib_file: Path, tmp_path: Path
) -> None:
    refs = one_set(grib_file, scanned(grib_file))
    decoded = mount(refs, "--decode", "--allow-local")
    fields = grib_fields(grib_file)
    for index, name in ((1, "t"), (2, "u"), (3, "t2m"), (4, "r")):
        expected = fields[index]["values"].ravel()
        printed = ncdump_values(f"{decoded.mountpoint}/m{index}", name)
        assert np.array_equal(printed, expected, equal_nan=True)
        out = tmp_path / f"m{index}.img"
        source = f'ZARR:"{decoded.mountpoint}/m{index}":/{name}'
        subprocess.run(
            ["gdal_translate", "-q", "-of", "ENVI", source, str(out)], check=True, timeout=120
        )
        assert np.array_equal(np.fromfile(out, "<f8"), expected, equal_nan=True)


def test_files_combined_with_multizarrtozarr_read_as_cfgrib_reads_them(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    cfgrib = pytest.importorskip("cfgrib")
    combine = pytest.importorskip("kerchunk.combine")
    files = [write_grib(tmp_path / f"day{day}.grib2", 20240100 + day) for day in (1, 2)]
    only_t500 = {"shortName": "t", "level": 500}
    sets = [grib2.scan_grib(str(f), filter=only_t500)[0] for f in files]
    combined = combine.MultiZarrToZarr(
        sets,
        concat_dims=["time"],
        identical_dims=["latitude", "longitude", "isobaricInhPa", "step"],
    ).translate()
    refs = tmp_path / "combined.json"
    refs.write_text(json.dumps(combined))
    decoded = mount(refs, "--decode", "--allow-local")

    expected = []
    for f in files:
        (dataset,) = cfgrib.open_datasets(
            str(f), backend_kwargs={"indexpath": "", "filter_by_keys": {"level": 500}}
        )
        expected.append(dataset["t"].values)
    group = zarr.open_group(decoded.mountpoint, mode="r", zarr_format=2)
    values = group["t"][...]
    assert values.shape == (2, *GRID)
    # cfgrib reads float32: ecCodes' float64 rounded to it.
    assert np.array_equal(values.astype("<f4"), np.stack(expected).astype("<f4"))
    printed = ncdump_values(str(decoded.mountpoint), "t")
    assert np.array_equal(printed, values.ravel())


def test_gribberish_decodes_the_messages_as_eccodes_does(
    mount: Callable[..., Mounted], grib_file: Path
) -> None:
    pytest.importorskip("gribberish")
    sets = scanned(grib_file)
    refs_path = one_set(grib_file, sets)
    refs = json.loads(refs_path.read_text())
    for index, name in enumerate(["t", "t", "u", "t2m", "r"]):
        meta = json.loads(refs["refs"][f"m{index}/{name}/.zarray"])
        meta["filters"] = [{"id": "gribberish", "var": name}]
        refs["refs"][f"gribberish{index}/.zarray"] = json.dumps(meta)
        refs["refs"][f"gribberish{index}/0.0"] = refs["refs"][f"m{index}/{name}/0.0"]
    refs_path.write_text(json.dumps(refs))
    decoded = mount(refs_path, "--decode", "--allow-local")
    group = zarr.open_group(decoded.mountpoint, mode="r", zarr_format=2)
    for index, expected in enumerate(grib_fields(grib_file)):
        values = group[f"gribberish{index}"][...]
        assert np.array_equal(values, expected["values"], equal_nan=True), index
