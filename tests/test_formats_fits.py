"""FITS through ``--decode``: images (plain; BSCALE/BZERO-scaled ones are EIO) and binary and
ASCII tables written with astropy, referenced by ``kerchunk.fits``, read through a real
mount by zarr: equal to astropy."""

from __future__ import annotations

import errno
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.format_builders import write_fits
from tests.support.mounting import Mounted

fits = pytest.importorskip("astropy.io.fits")
kerchunk_fits = pytest.importorskip("kerchunk.fits")


def test_images_and_tables_read_as_astropy_reads_them(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    path = write_fits(tmp_path / "data.fits")
    refs = kerchunk_fits.process_file(str(path), extension=[0, 1, 2, 3, 4])
    refs = {k: v.decode() if isinstance(v, bytes) else v for k, v in refs.items()}
    # kerchunk 0.2.10 gives each ASCII field its span plus one byte (rows of 15 bytes where
    # the file has 13): its own reading fails.  A copy with the file's widths reads right.
    fixed = json.loads(refs["ASCII/.zarray"])
    fixed["filters"][0]["indtypes"] = [["x", "S8"], ["n", "S5"]]
    url, offset, _ = refs["ASCII/0"]
    refs.update(
        {
            "FIXED/.zarray": json.dumps(fixed),
            "FIXED/.zattrs": refs["ASCII/.zattrs"],
            "FIXED/0": [url, offset, 13 * 3],
        }
    )
    refs_path = tmp_path / "data.json"
    refs_path.write_text(json.dumps(refs))
    decoded = mount(refs_path, "--decode", "--allow-local")
    group = zarr.open_group(decoded.mountpoint, mode="r", zarr_format=2)
    with fits.open(path) as hdus:
        for name in ("PRIMARY", "FLOATS"):
            expected = hdus[name].data
            values = group[name][...]
            assert values.dtype == expected.dtype.newbyteorder("<"), name
            assert np.array_equal(values, expected), name
        table = group["TABLE"][...]
        assert table.dtype.names == ("id", "flux", "name")
        for column in table.dtype.names:
            expected = np.asarray(hdus["TABLE"].data[column])
            if expected.dtype.kind == "U":  # astropy gives text as str
                expected = np.char.encode(expected, "ascii")
            assert np.array_equal(table[column], expected), column
        text = group["FIXED"][...]
        assert np.array_equal(text["x"], hdus["ASCII"].data["x"])
        assert np.array_equal(text["n"], hdus["ASCII"].data["n"])
    # kerchunk declares a scaled image's dtype as the stored integers, though its filter
    # decodes to float64: no size fits both, so its chunk is EIO, never wrong numbers.
    # kerchunk's ASCII widths: fields that are not numbers, EIO too.
    for chunk in ("SCALED/0.0", "ASCII/0"):
        with pytest.raises(OSError) as failed:
            (decoded.mountpoint / chunk).read_bytes()
        assert failed.value.errno == errno.EIO
    meta = json.loads((decoded.mountpoint / "TABLE" / ".zarray").read_text())
    assert meta["dtype"] == [["id", "<i4"], ["flux", "<f8"], ["name", "|S6"]]
    assert (decoded.mountpoint / "TABLE" / "0").read_bytes() == (
        np.asarray(table).astype(meta_dtype(meta)).tobytes()
    )


def meta_dtype(meta: dict) -> np.dtype:
    return np.dtype([tuple(field) for field in meta["dtype"]])
