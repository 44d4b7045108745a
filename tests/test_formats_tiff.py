"""TIFF through ``--decode``: files written with tifffile (deflate, LZW, zstd, PackBits,
JPEG; horizontal and floating-point predictors; tiled and stripped; interleaved and
separate samples), referenced by tifffile's ``write_fsspec`` (what ``kerchunk.tiff``
wraps), read through a real mount by zarr and GDAL 3.6: equal to tifffile."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.format_builders import write_tiffs
from tests.support.mounting import Mounted

tifffile = pytest.importorskip("tifffile")


def referenced(paths: dict[str, Path], out: Path) -> Path:
    """Each file's references (tifffile's ``write_fsspec``) as group ``<name>`` of one set."""
    refs: dict[str, object] = {".zgroup": json.dumps({"zarr_format": 2})}
    for name, path in paths.items():
        one = path.with_suffix(".json")
        with tifffile.imread(path, aszarr=True) as store:
            store.write_fsspec(str(one), url=path.parent.as_uri() + "/")
        refs[f"{name}/.zgroup"] = json.dumps({"zarr_format": 2})
        for key, value in json.loads(one.read_text()).items():
            refs[f"{name}/{key}"] = value
    out.write_text(json.dumps(refs))
    return out


def test_every_compression_and_predictor_reads_as_tifffile_reads_it(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    paths = write_tiffs(tmp_path)
    decoded = mount(referenced(paths, tmp_path / "tiffs.json"), "--decode", "--allow-local")
    for name, path in paths.items():
        expected = tifffile.imread(path)
        array = zarr.open_array(decoded.mountpoint / name, mode="r", zarr_format=2)
        assert array.dtype == expected.dtype, name
        assert np.array_equal(array[...], expected), name
        meta = json.loads((decoded.mountpoint / name / ".zarray").read_text())
        assert (meta["compressor"], meta["filters"]) == (None, None)


def test_gdal_reads_deflate_tiles_and_zstd_tiles_with_the_float_predictor(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    paths = write_tiffs(tmp_path)
    decoded = mount(referenced(paths, tmp_path / "tiffs.json"), "--decode", "--allow-local")
    for name, dtype in (("deflate_tiled", "<u2"), ("zstd_float_predictor_tiled", "<f4")):
        out = tmp_path / f"{name}.img"
        source = f'ZARR:"{decoded.mountpoint}/{name}"'
        subprocess.run(
            ["gdal_translate", "-q", "-of", "ENVI", source, str(out)], check=True, timeout=120
        )
        assert np.array_equal(np.fromfile(out, dtype), tifffile.imread(paths[name]).ravel())
