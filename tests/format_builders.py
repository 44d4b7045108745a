"""GRIB2, TIFF and FITS files the format tests make, and the values their own libraries
read from them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: The grid every GRIB message here has: 9 latitudes by 16 longitudes.
GRID = (9, 16)
MISSING = 9999.0


def grib_message(
    short_name: str,
    level_type: str,
    level: int,
    packing: str,
    values: np.ndarray,
    *,
    bitmap: bool = False,
    date: int = 20240102,
) -> bytes:
    """One GRIB2 message written with ecCodes."""
    import eccodes

    message = eccodes.codes_grib_new_from_samples("regular_ll_pl_grib2")
    try:
        eccodes.codes_set_long(message, "Nj", GRID[0])
        eccodes.codes_set_long(message, "Ni", GRID[1])
        for key, value in (
            ("latitudeOfFirstGridPointInDegrees", 60.0),
            ("longitudeOfFirstGridPointInDegrees", 0.0),
            ("latitudeOfLastGridPointInDegrees", 20.0),
            ("longitudeOfLastGridPointInDegrees", 75.0),
            ("iDirectionIncrementInDegrees", 5.0),
            ("jDirectionIncrementInDegrees", 5.0),
        ):
            eccodes.codes_set_double(message, key, value)
        eccodes.codes_set(message, "dataDate", date)
        eccodes.codes_set(message, "dataTime", 600)
        eccodes.codes_set(message, "step", 3)
        eccodes.codes_set_string(message, "typeOfLevel", level_type)
        eccodes.codes_set_long(message, "level", level)
        eccodes.codes_set_string(message, "shortName", short_name)
        if bitmap:
            eccodes.codes_set_long(message, "bitmapPresent", 1)
            eccodes.codes_set_double(message, "missingValue", MISSING)
        eccodes.codes_set_string(message, "packingType", packing)
        eccodes.codes_set_values(message, values.ravel())
        return eccodes.codes_get_message(message)
    finally:
        eccodes.codes_release(message)


def field(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(200.0, 310.0, GRID).round(2)


def write_grib(path: Path, date: int = 20240102) -> Path:
    """Five messages: temperature at two pressure levels (simple and complex packing),
    wind with complex packing and spatial differencing, 2 m temperature with a bitmap
    (every 7th point missing), and relative humidity with CCSDS packing (libaec)."""
    with_gaps = field(4)
    with_gaps.ravel()[::7] = MISSING
    messages = [
        grib_message("t", "isobaricInhPa", 500, "grid_simple", field(date + 1), date=date),
        grib_message("t", "isobaricInhPa", 850, "grid_complex", field(date + 2), date=date),
        grib_message(
            "u",
            "isobaricInhPa",
            500,
            "grid_complex_spatial_differencing",
            field(3) - 260,
            date=date,
        ),
        grib_message(
            "2t", "heightAboveGround", 2, "grid_simple", with_gaps, bitmap=True, date=date
        ),
        grib_message("r", "isobaricInhPa", 700, "grid_ccsds", field(5) / 4, date=date),
    ]
    path.write_bytes(b"".join(messages))
    return path


def grib_fields(path: Path) -> list[dict[str, object]]:
    """What ecCodes reads from each message of ``path``: values (missing as NaN) and keys."""
    import eccodes

    fields = []
    with path.open("rb") as f:
        while (message := eccodes.codes_grib_new_from_file(f)) is not None:
            try:
                values = eccodes.codes_get_array(message, "values")
                missing = eccodes.codes_get_double(message, "missingValue")
                if eccodes.codes_get_long(message, "bitmapPresent"):
                    values[values == missing] = np.nan
                fields.append(
                    {
                        "values": values.reshape(GRID),
                        "level": eccodes.codes_get_double(message, "level"),
                        "latitudes": eccodes.codes_get_array(message, "latitudes"),
                        "longitudes": eccodes.codes_get_array(message, "longitudes"),
                    }
                )
            finally:
                eccodes.codes_release(message)
    return fields


#: TIFF files the TIFF tests write: name -> (data, tifffile.imwrite options).
def tiff_cases() -> dict[str, tuple[np.ndarray, dict[str, object]]]:
    rng = np.random.default_rng(7)
    gradient = np.add.outer(np.arange(70), np.arange(90)).astype("<u2") * 37
    rgb = rng.integers(0, 255, (70, 90, 3), dtype=np.uint8)
    rgb16 = (rng.integers(0, 4000, (64, 90, 3)) + np.arange(90)[:, None]).astype("<u2")
    floats = (np.sin(np.arange(70 * 90) / 50.0).reshape(70, 90) * 1000).astype("<f4")
    doubles = np.cumsum(rng.normal(size=(64, 48)), axis=1)
    return {
        "deflate_tiled": (gradient, {"compression": "zlib", "tile": (32, 32)}),
        "lzw_horizontal_strips": (
            rgb16,
            {"compression": "lzw", "predictor": "horizontal", "rowsperstrip": 16},
        ),
        "zstd_float_predictor_tiled": (
            floats,
            {"compression": "zstd", "predictor": "floatingpoint", "tile": (32, 48)},
        ),
        "zstd_float64_predictor_strips": (
            doubles,
            {"compression": "zstd", "predictor": "floatingpoint", "rowsperstrip": 8},
        ),
        "deflate_horizontal_separate_planes": (
            np.moveaxis(rgb16, -1, 0).copy(),
            {
                "compression": "zlib",
                "predictor": "horizontal",
                "planarconfig": "separate",
                "tile": (16, 32),
            },
        ),
        "packbits_rgb_strips": (rgb[:64], {"compression": "packbits", "rowsperstrip": 16}),
        "jpeg_rgb_tiled": (rgb, {"compression": "jpeg", "tile": (16, 16)}),
    }


def write_tiffs(directory: Path) -> dict[str, Path]:
    import tifffile

    paths = {}
    for name, (data, options) in tiff_cases().items():
        path = directory / f"{name}.tif"
        tifffile.imwrite(path, data, **options)
        paths[name] = path
    return paths


def message_values(message: bytes) -> np.ndarray:
    """The field ecCodes decodes from one message (packing rounds what was written)."""
    import eccodes

    handle = eccodes.codes_new_from_message(message)
    try:
        return eccodes.codes_get_array(handle, "values")
    finally:
        eccodes.codes_release(handle)


def write_fits(path: Path) -> Path:
    """An image, a scaled image (BSCALE/BZERO), a float image, a binary table and an
    ASCII table, written with astropy."""
    from astropy.io import fits

    image = np.arange(30 * 40, dtype=">i2").reshape(30, 40) - 600
    scaled = fits.ImageHDU(np.arange(12, dtype=">i2").reshape(3, 4), name="SCALED")
    scaled.header["BSCALE"] = 0.5
    scaled.header["BZERO"] = 10.0
    floats = fits.ImageHDU(np.linspace(0, 1, 20, dtype=">f4").reshape(4, 5), name="FLOATS")
    table = fits.BinTableHDU.from_columns(
        [
            fits.Column(name="id", format="J", array=np.arange(5) * 1000 - 7),
            fits.Column(name="flux", format="D", array=np.linspace(1, 2, 5)),
            fits.Column(name="name", format="6A", array=["a", "bb", "ccc", "dddd", "e"]),
        ],
        name="TABLE",
    )
    text = fits.TableHDU.from_columns(
        [
            fits.Column(name="x", format="F8.3", array=[1.5, 2.25, -3.0]),
            fits.Column(name="n", format="I5", array=[1, 22, 333]),
        ],
        name="ASCII",
    )
    fits.HDUList([fits.PrimaryHDU(image), scaled, floats, table, text]).writeto(path)
    return path
