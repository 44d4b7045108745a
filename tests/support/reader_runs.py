"""Reading one variable of a mounted Zarr tree with each reader of the matrix
(tests/test_decode_readers.py), and comparing what it got with the original's values.

Every reader runs as users run it: ``ncdump`` (Debian's netCDF-C), Debian's GDAL
(``gdalmdiminfo -detailed``, ``gdal_translate``), the GDAL bundled in the rasterio wheel
(in a child process of this Python: rasterio 1.5 ships neither GDAL's command-line tools
nor its ``osgeo`` bindings, so its raster API is what it offers), zarr 3 and xarray.  Each
gives an ``Outcome``: the values equal the original's, differ ("wrong": read without an
error, so a user would not know), refused with the reader's message, or the reader died
of a signal.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr
import zarr

from tests.support.mounting import REFMOUNT, child_env

TIMEOUT = 120


@dataclass(frozen=True)
class Outcome:
    kind: str  # "equal", "wrong", "refused", "crash", or "absent" (not in the tree)
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


EQUAL = Outcome("equal")


def compare(got: np.ndarray, expected: np.ndarray) -> Outcome:
    """Equal values (NaN equal to NaN, strings as text), in the original's shape: what a
    reader got is reshaped to it (so the decoded view's one-element ``_scalar_`` arrays
    compare with rank-0 originals; tests/test_decode_readers.py checks that shape), and a
    different number of values is wrong."""
    if expected.dtype == object or expected.dtype.kind in "SU":
        texts = [
            v.decode("utf-8").rstrip("\0") if isinstance(v, bytes) else str(v).rstrip("\0")
            for v in np.asarray(got, dtype=object).ravel()
        ]
        same = got.size == expected.size and texts == [str(v) for v in expected.ravel()]
        return EQUAL if same else Outcome("wrong", f"{texts[:3]}")
    try:
        got = np.asarray(got).reshape(expected.shape)
    except ValueError:
        return Outcome("wrong", f"shape {np.shape(got)} for {expected.shape}")
    if got.dtype.kind not in "iufb":
        return Outcome("wrong", f"dtype {got.dtype}")
    if np.array_equal(got, expected, equal_nan=expected.dtype.kind == "f"):
        return EQUAL
    differ = np.flatnonzero(~np.isclose(got, expected, rtol=0, atol=0, equal_nan=True))
    return Outcome("wrong", f"{differ.size} values differ, first {got.flat[differ[0]]!r}")


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    path = shutil.which(argv[0])
    assert path, f"{argv[0]} is needed (.ci/setup installs it)"
    return subprocess.run([path, *argv[1:]], capture_output=True, text=True, timeout=TIMEOUT)


def failed(done: subprocess.CompletedProcess[str]) -> Outcome | None:
    if done.returncode < 0:
        return Outcome("crash", f"signal {-done.returncode}")
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    if done.returncode != 0 or errors:
        return Outcome("refused", " | ".join(errors or done.stderr.strip().splitlines()[-1:]))
    return None


# -- netCDF-C ---------------------------------------------------------------------------------

NCDUMP_ITEM = re.compile(r'"(?:[^"\\]|\\.)*"|[^,\s;]+')


def ncdump_whole(mnt: Path) -> tuple[Outcome | None, str]:
    """``ncdump`` of the whole tree, every variable's data: its failure (``None`` when
    it read everything) and what it printed."""
    done = run(["ncdump", "-p", "9,17", f"file://{mnt}#mode=zarr,file"])
    return failed(done), done.stdout


def ncdump(mnt: Path, name: str, expected: np.ndarray, fill: object) -> Outcome:
    """``ncdump -p 9,17 -v NAME`` (floats and doubles printed to round-trip exactly);
    ``_`` is the fill value, and reads as the original's ``fill``."""
    done = run(["ncdump", "-p", "9,17", "-v", name, f"file://{mnt}#mode=zarr,file"])
    if outcome := failed(done):
        return outcome
    data = done.stdout.split("\ndata:\n", 1)[-1]
    match = re.search(rf"^ {re.escape(name)} =(.*?);\s*$", data, re.M | re.S)
    if match is None:
        return Outcome("refused", f"no data for {name}")
    items = NCDUMP_ITEM.findall(match.group(1))
    if expected.dtype == object:
        return compare(np.array([json.loads(i) for i in items], dtype=object), expected)
    values = [fill if i == "_" else float(i.rstrip("bsLUf")) for i in items]
    return compare(np.array(values, dtype=expected.dtype), expected)


# -- GDAL -------------------------------------------------------------------------------------


def gdalmdiminfo(mnt: Path, name: str, expected: np.ndarray) -> Outcome:
    """Debian GDAL's multidimensional API: the array's values in ``-detailed`` JSON."""
    done = run(["gdalmdiminfo", "-detailed", "-array", name, f'ZARR:"{mnt}"'])
    if outcome := failed(done):
        return outcome
    values = json.loads(done.stdout)["values"]
    if expected.dtype == object:
        return compare(np.array(values, dtype=object), expected)
    return compare(np.array(values, dtype=np.float64).astype(expected.dtype), expected)


def gdal_translate(mnt: Path, name: str, expected: np.ndarray, work: Path) -> Outcome:
    """Debian GDAL's raster API: ``gdal_translate`` to a raw ENVI file, read as bytes.  A
    3-D array is one 2-D raster per index of its first dimension (``ZARR:"MNT":/NAME:I``:
    GDAL 3.6 asks for the indices of extra dimensions)."""
    sources = [f'ZARR:"{mnt}":/{name}']
    if expected.ndim == 3:
        sources = [f"{sources[0]}:{i}" for i in range(expected.shape[0])]
    parts = []
    for i, source in enumerate(sources):
        out = work / f"{name}.{i}.bin"
        done = run(["gdal_translate", "-q", "-of", "ENVI", source, str(out)])
        if outcome := failed(done):
            return outcome
        parts.append(out.read_bytes())
    return compare(np.frombuffer(b"".join(parts), dtype=expected.dtype), expected)


RASTERIO_CHILD = r"""
import json, sys
import numpy as np
import rasterio
mnt, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
result = {"gdal": rasterio.__gdal_version__, "read": {}, "refused": {}}
for name in names:
    try:
        with rasterio.open(f'ZARR:"{mnt}":/{name}') as ds:
            np.save(f"{out}/{name}.npy", ds.read())
        result["read"][name] = f"{out}/{name}.npy"
    except rasterio.errors.RasterioIOError as e:
        result["refused"][name] = str(e.__cause__ or e)
print(json.dumps(result))
"""


def rasterio_gdal(mnt: Path, expected: dict[str, np.ndarray], work: Path) -> dict[str, Outcome]:
    """The rasterio wheel's GDAL, every variable in one child process."""
    done = subprocess.run(
        [sys.executable, "-c", RASTERIO_CHILD, str(mnt), str(work), *expected],
        capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    if done.returncode != 0:
        outcome = Outcome("crash" if done.returncode < 0 else "refused", done.stderr[-300:])
        return dict.fromkeys(expected, outcome)
    result = json.loads(done.stdout)
    outcomes = {name: Outcome("refused", why) for name, why in result["refused"].items()}
    for name, npy in result["read"].items():
        outcomes[name] = compare(np.load(npy), expected[name])
    return outcomes


# -- Python -----------------------------------------------------------------------------------


def zarr3(mnt: Path, name: str, expected: np.ndarray) -> Outcome:
    try:
        array = zarr.open_group(str(mnt), mode="r", zarr_format=2)[name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return compare(array[...], expected)
    except Exception as e:  # what zarr raises is the outcome
        return Outcome("refused", f"{type(e).__name__}: {e}")


def xarray_stored(mnt: Path, name: str, expected: np.ndarray) -> Outcome:
    """xarray's stored values (``decode_cf=False``: no masking, scaling or times)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with xr.open_zarr(str(mnt), consolidated=False, decode_cf=False) as ds:
                return compare(ds[name].values, expected)
    except Exception as e:  # what xarray raises is the outcome
        return Outcome("refused", f"{type(e).__name__}: {e}")


def assert_check_names(path: Path, missing: set[str]) -> None:
    """``refmount check --decode`` of the set at ``path`` names exactly the variables in
    ``missing`` as left out, and exits 1 when there are any."""
    done = subprocess.run(
        [*REFMOUNT, "check", "--decode", str(path)],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    named = {
        line.split(":")[1].strip()
        for line in done.stdout.splitlines()
        if line.strip().startswith("decode:") and ": left out:" in line
    }
    assert named == missing, done.stdout
    assert done.returncode == (1 if missing else 0), done.stdout
