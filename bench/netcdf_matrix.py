"""The reader matrix through ``--netcdf`` against real classic files of the same data
(issue 37's bar: "0 WRONG cells and at least as many exact ones as real classic files of
the same data give").

    .venv/bin/python bench/netcdf_matrix.py [--sets kerchunk-cf,...] [--work DIR]

Sets: the reader matrix's files (tests/support/reader_datasets.py: ``cf``, ``classic``,
``plugins``, and ``packed``), each referenced by kerchunk and by VirtualiZarr
(tests/test_decode_readers.py's makers), and the bundled example ``examples/air``.  Each
set is mounted with ``--netcdf``; its classic twin is ``nccopy -k '64-bit offset'`` of
the original file (``-k cdf5`` when CDF-2 cannot hold it: unsigned types; a string
variable, which no classic format holds, left out with ``-V``; netCDF4-python writes the
copy of a file Debian's netCDF-C cannot read, the HDF5 one with blosc and zstd).

Readers, each on the view's ``.nc`` and on the classic twin, every variable of the
original: ``netCDF4`` (stored values), ``scipy.io.netcdf_file``, ``ncdump -p 9,17``,
``ncks -4`` (read back), Debian GDAL's ``gdal_translate -ot Float64`` (bands as stored),
CDO ``-b F64 copy`` (unpacked, fill values masked), Octave's ``ncread`` and R's
``ncvar_get`` (unpacked, NaN/NA for fill values), xarray ``open_dataset`` with CF
decoding.  A cell is ``exact`` when the reader's values equal the truth, ``WRONG`` when
it read other values without an error, ``refused`` when it failed (or the variable is
not in the file).  The truth for a reader that reads stored values is netCDF4-python's
reading of the original; for one that unpacks (CDO, Octave, R, xarray) it is the same
reader on the original file, or netCDF4-python's masked and scaled values when that
reader cannot open the original.  Printed: the counts per reader and file, and every
WRONG cell.
"""

from __future__ import annotations

import argparse
import codecs
import json
import re
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import netCDF4
import numpy as np
import scipy.io
import xarray as xr

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.mounting import Mounted  # noqa: E402
from tests.support.reader_datasets import (  # noqa: E402
    Dataset,
    write_datasets,
    write_packed_netcdf4,
)
from tests.test_decode_readers import MAKERS, SCANNER_LEAVES_OUT  # noqa: E402

TIMEOUT = 300
Values = np.ndarray | list[str] | str  # numbers, texts, or why the reader failed
RAW, UNPACKED = "raw", "unpacked"  # truth: netCDF4's stored values; the reader on the original


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)


def failure(done: subprocess.CompletedProcess[str]) -> str | None:
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:160]
    return None


def texts(values: np.ndarray) -> list[str]:
    if values.dtype.kind == "S" and values.ndim >= 1 and values.dtype.itemsize == 1:
        values = np.array([b"".join(row) for row in values.reshape(-1, values.shape[-1])])
    return [
        v.decode("utf-8").rstrip("\0") if isinstance(v, bytes) else str(v).rstrip("\0")
        for v in np.asarray(values, dtype=object).ravel()
    ]


def numbers(values: object) -> np.ndarray:
    """Values as float64, masked ones NaN, datetimes as integer nanoseconds."""
    array = np.ma.asarray(values)
    if array.dtype.kind in "mM":
        return np.ma.getdata(array).astype("M8[ns]").astype("i8").astype("f8").ravel()
    filled = np.ma.getdata(array).astype("f8")
    filled[np.ma.getmaskarray(array)] = np.nan
    return filled.ravel()


def is_text(values: np.ndarray) -> bool:
    return values.dtype == object or values.dtype.kind in "SU"


# -- readers: path -> {variable: values or why not} ----------------------------------------


def read_netcdf4(path: Path, names: list[str], *, unpack: bool = False) -> dict[str, Values]:
    out: dict[str, Values] = {}
    try:
        with netCDF4.Dataset(path) as ds:
            ds.set_auto_maskandscale(unpack)
            for name in names:
                if name not in ds.variables:
                    out[name] = "not in the file"
                    continue
                var = ds[name]
                values = np.asarray(var[...]) if not unpack else var[...]
                if is_text(np.asarray(values)):
                    out[name] = texts(np.asarray(values))
                elif unpack:
                    out[name] = numbers(values)
                else:
                    out[name] = np.asarray(values).ravel()
    except OSError as e:
        return dict.fromkeys(names, str(e))
    return out


def read_scipy(path: Path, names: list[str]) -> dict[str, Values]:
    out: dict[str, Values] = {}
    try:
        f = scipy.io.netcdf_file(path, mmap=False)
    except Exception as e:  # what scipy raises is the outcome
        return dict.fromkeys(names, f"{type(e).__name__}: {e}")
    with f:
        for name in names:
            if name not in f.variables:
                out[name] = "not in the file"
                continue
            try:
                values = np.asarray(f.variables[name][...])
                out[name] = texts(values) if values.dtype.kind == "S" else values.ravel()
            except Exception as e:  # what scipy raises is the outcome
                out[name] = f"{type(e).__name__}: {e}"
    return out


NCDUMP_ITEM = re.compile(r'"(?:[^"\\]|\\.)*"|[^,\s;]+')


def read_ncdump(path: Path, names: list[str], fills: dict[str, object]) -> dict[str, Values]:
    done = run(["ncdump", "-p", "9,17", str(path)])
    if why := failure(done):
        return dict.fromkeys(names, why)
    data = done.stdout.split("\ndata:\n", 1)[-1]
    out: dict[str, Values] = {}
    for name in names:
        match = re.search(rf"^ {re.escape(name)} =(.*?);\s*$", data, re.M | re.S)
        if match is None:
            out[name] = "not in the file"
            continue
        items = NCDUMP_ITEM.findall(match.group(1))
        if items and items[0].startswith('"'):
            out[name] = [codecs.escape_decode(i[1:-1])[0].decode("utf-8") for i in items]
            continue
        fill = fills.get(name)
        out[name] = np.array(
            [float(fill) if i == "_" else float(i.rstrip("bsLUf")) for i in items]  # type: ignore[arg-type]
        )
    return out


def read_ncks(path: Path, names: list[str], work: Path) -> dict[str, Values]:
    out_path = work / f"ncks-{path.stem}.nc"
    done = run(["ncks", "-O", "-4", str(path), str(out_path)])
    if why := failure(done):
        return dict.fromkeys(names, why)
    return read_netcdf4(out_path, names)


def read_cdo(path: Path, names: list[str], work: Path) -> dict[str, Values]:
    out_path = work / f"cdo-{path.stem}.nc"
    done = run(["cdo", "-s", "-b", "F64", "-f", "nc4", "copy", str(path), str(out_path)])
    if why := failure(done):
        return dict.fromkeys(names, why)
    return read_netcdf4(out_path, names, unpack=True)


def read_gdal(path: Path, names: list[str], work: Path) -> dict[str, Values]:
    out: dict[str, Values] = {}
    for name in names:
        target = work / f"gdal-{path.stem}-{name}.envi"
        done = run(["gdal_translate", "-q", "-ot", "Float64", "-of", "ENVI",
                    f'NETCDF:"{path}":{name}', str(target)])  # fmt: skip
        out[name] = failure(done) or np.fromfile(target, "<f8")
    return out


OCTAVE = """pkg load netcdf
names = strsplit('{names}', ',');
for i = 1:numel(names)
  out = ['{work}/octave-' names{{i}}];
  try
    v = ncread('{path}', names{{i}});
    if ischar(v) || iscell(v)
      if ischar(v)
        v = cellstr(v');
      end
      f = fopen([out '.txt'], 'w'); fprintf(f, '%s\\n', v{{:}}); fclose(f);
    else
      f = fopen([out '.f8'], 'w'); fwrite(f, double(v(:)), 'double', 0, 'ieee-le'); fclose(f);
    end
  catch err
    f = fopen([out '.err'], 'w'); fprintf(f, '%s', err.message); fclose(f);
  end
end
"""

R = """library(ncdf4)
f <- nc_open("{path}")
for (name in strsplit("{names}", ",")[[1]]) {{
  out <- paste0("{work}/r-", name)
  tryCatch({{
    v <- ncvar_get(f, name)
    if (is.character(v)) {{
      writeLines(v, paste0(out, ".txt"), useBytes = TRUE)
    }} else {{
      writeBin(as.double(v), paste0(out, ".f8"), size = 8, endian = "little")
    }}
  }}, error = function(e) writeLines(conditionMessage(e), paste0(out, ".err")))
}}
"""


def read_files(
    work: Path, prefix: str, names: list[str], done: subprocess.CompletedProcess[str]
) -> dict[str, Values]:
    if why := failure(done):
        return dict.fromkeys(names, why)
    out: dict[str, Values] = {}
    for name in names:
        base = work / f"{prefix}-{name}"
        values, text, error = (base.with_suffix(s) for s in (".f8", ".txt", ".err"))
        if error.exists():
            out[name] = error.read_text().strip()[:160] or "error"
        elif values.exists():
            out[name] = np.fromfile(values, "<f8")
        elif text.exists():  # text: one value a line (Octave's char matrix by column)
            out[name] = [line.rstrip(" \0") for line in text.read_bytes().decode().splitlines()]
        else:
            out[name] = "nothing written"
    return out


def read_octave(path: Path, names: list[str], work: Path) -> dict[str, Values]:
    work = work / f"octave-{path.stem}"
    work.mkdir(exist_ok=True)
    script = OCTAVE.format(names=",".join(names), work=work, path=path)
    done = run(["octave", "--no-gui", "--no-window-system", "-q", "--eval", script])
    return read_files(work, "octave", names, done)


def read_r(path: Path, names: list[str], work: Path) -> dict[str, Values]:
    work = work / f"r-{path.stem}"
    work.mkdir(exist_ok=True)
    done = run(["Rscript", "-e", R.format(names=",".join(names), work=work, path=path)])
    return read_files(work, "r", names, done)


def read_xarray(path: Path, names: list[str]) -> dict[str, Values]:
    out: dict[str, Values] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with xr.open_dataset(path) as ds:
                for name in names:
                    if name not in ds.variables:
                        out[name] = "not in the file"
                        continue
                    values = ds[name].values
                    out[name] = texts(values) if is_text(values) else numbers(values)
    except Exception as e:  # what xarray raises is the outcome
        return dict.fromkeys(names, f"{type(e).__name__}: {e}")
    return out


READERS: dict[str, tuple[str, Callable[..., dict[str, Values]]]] = {
    "netCDF4": (RAW, lambda p, n, _w, _f: read_netcdf4(p, n)),
    "scipy": (RAW, lambda p, n, _w, _f: read_scipy(p, n)),
    "ncdump": (RAW, lambda p, n, _w, f: read_ncdump(p, n, f)),
    "ncks": (RAW, lambda p, n, w, _f: read_ncks(p, n, w)),
    "GDAL": (UNPACKED, lambda p, n, w, _f: read_gdal(p, n, w)),
    "CDO": (UNPACKED, lambda p, n, w, _f: read_cdo(p, n, w)),
    "Octave": (UNPACKED, lambda p, n, w, _f: read_octave(p, n, w)),
    "R": (UNPACKED, lambda p, n, w, _f: read_r(p, n, w)),
    "xarray": (UNPACKED, lambda p, n, _w, _f: read_xarray(p, n)),
}


def outcome(got: Values, truth: Values, stored: np.ndarray | None) -> str:
    """``exact``, ``WRONG: ...`` or ``refused: ...`` (truth a string: not comparable)."""
    if isinstance(got, str):
        return f"refused: {got}"
    if isinstance(truth, list) != isinstance(got, list):
        return "refused: text read as numbers (or numbers as text)"
    if isinstance(truth, list) and isinstance(got, list):
        return "exact" if got == truth else f"WRONG: {got[:3]} for {truth[:3]}"
    if stored is not None and stored.dtype.kind in "iub":  # as the stored type says
        try:
            as_stored = got.astype("i8").astype(stored.dtype)
        except ValueError:
            return "WRONG: not integers"
        same = as_stored.size == stored.size and np.array_equal(as_stored, stored.ravel())
    elif stored is not None:
        as_stored = got.astype(stored.dtype)
        same = as_stored.size == stored.size and np.array_equal(
            as_stored, stored.ravel(), equal_nan=True
        )
    else:
        same = got.size == truth.size and np.array_equal(got, truth, equal_nan=True)
    if same:
        return "exact"
    expected = stored.ravel() if stored is not None else truth
    if got.size != np.size(expected):
        return f"WRONG: {got.size} values for {np.size(expected)}"
    differ = np.flatnonzero(~np.isclose(got.astype("f8"), np.asarray(expected, "f8"),
                                        rtol=0, atol=0, equal_nan=True))  # fmt: skip
    first = differ[0] if differ.size else 0
    return f"WRONG: {differ.size} differ, first {got[first]!r} for {expected[first]!r}"


# -- the files --------------------------------------------------------------------------------


def classic_twin(original: Path, kind: str, work: Path) -> Path:
    """``nccopy`` of the original to CDF-2 (CDF-5 for unsigned types), strings left out."""
    twin = work / f"classic-{original.stem}.nc"
    with netCDF4.Dataset(original) as ds:
        strings = [n for n, v in ds.variables.items() if v.dtype is str]
        unsigned = any(
            np.dtype(v.dtype).kind == "u" for v in ds.variables.values() if v.dtype is not str
        )
        keep = [n for n in ds.variables if n not in strings]
    fmt = "cdf5" if unsigned else "64-bit offset"
    argv = ["nccopy", "-k", fmt]
    if strings:
        argv += ["-V", ",".join(keep)]
    done = run([*argv, str(original), str(twin)])
    if done.returncode == 0:
        return twin
    # Debian's netCDF-C without the file's filters: netCDF4-python (its wheel has them)
    with (
        netCDF4.Dataset(original) as src,
        netCDF4.Dataset(
            twin, "w", format="NETCDF3_64BIT_DATA" if unsigned else "NETCDF3_64BIT_OFFSET"
        ) as dst,
    ):
        src.set_auto_maskandscale(False)
        for name, dim in src.dimensions.items():
            dst.createDimension(name, None if dim.isunlimited() else len(dim))
        dst.setncatts({a: src.getncattr(a) for a in src.ncattrs()})
        for name in keep:
            var = src[name]
            fill = var.getncattr("_FillValue") if "_FillValue" in var.ncattrs() else None
            new = dst.createVariable(name, var.dtype, var.dimensions, fill_value=fill)
            new.set_auto_maskandscale(False)
            new.setncatts({a: var.getncattr(a) for a in var.ncattrs() if a != "_FillValue"})
            new[...] = var[...]
    return twin


def sets(work: Path) -> list[tuple[str, Path, Path, set[str]]]:
    """(name, original file, reference set, what its scanner leaves out) for every set."""
    data = work / "data"
    files = {d.name: d for d in write_datasets(data)}
    files["packed"] = Dataset("packed", write_packed_netcdf4(data / "packed.nc"), "netcdf4")
    found = []
    for maker, make in MAKERS.items():
        for name, dataset in files.items():
            directory = work / f"{maker}-{name}"
            directory.mkdir(exist_ok=True)
            refs = directory / "refs.json"
            refs.write_text(json.dumps(make(dataset, directory)))
            left_out = SCANNER_LEAVES_OUT.get((maker, name), set())
            found.append((f"{maker}-{name}", dataset.path, refs, left_out))
    air = REPO / "examples" / "air"
    found.append(("example-air", air / "air.nc", air / "refs.json", set()))
    return found


def fill_values(path: Path) -> dict[str, object]:
    with netCDF4.Dataset(path) as ds:
        return {
            name: getattr(var, "_FillValue", netCDF4.default_fillvals.get(var.dtype.str[1:], 0))
            for name, var in ds.variables.items()
            if var.dtype is not str
        }


def measure(work: Path, only: set[str]) -> tuple[Counter, list[str]]:
    counts: Counter = Counter()
    wrong: list[str] = []
    for name, original, refs, left_out in sets(work):
        if only and name not in only:
            continue
        print(name, file=sys.stderr, flush=True)
        directory = work / name
        directory.mkdir(exist_ok=True)
        with netCDF4.Dataset(original) as ds:
            names = [n for n in ds.variables if n not in left_out]
        stored = read_netcdf4(original, names)
        unpacked = read_netcdf4(original, names, unpack=True)
        twin = classic_twin(original, "", directory)
        (directory / "mnt").mkdir(exist_ok=True)
        mounted = Mounted(refs, directory / "mnt", ["--netcdf"], directory / "refmount.log")
        try:
            view = next((directory / "mnt").glob("*.nc"))
            for reader, (kind, read) in READERS.items():
                truth: dict[str, Values] = stored
                if kind == UNPACKED:
                    on_original = read(original, names, directory, {})
                    truth = {
                        n: on_original[n] if not isinstance(on_original[n], str) else unpacked[n]
                        for n in names
                    }
                for label, path in (("view", view), ("classic", twin)):
                    got = read(path, names, directory, fill_values(path))
                    for variable in names:
                        raw = stored[variable] if kind == RAW else None
                        result = outcome(got[variable], truth[variable],
                                         raw if isinstance(raw, np.ndarray) else None)  # fmt: skip
                        counts[(reader, label, result.split(":")[0])] += 1
                        if not result.startswith("exact"):
                            wrong.append(f"{name} {label} {reader} {variable}: {result}")
        finally:
            mounted.stop()
    return counts, wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default="", help="comma-separated set names (default: all)")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="refmount-ncmatrix-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        counts, cells = measure(work, set(filter(None, args.sets.split(","))))
    print(
        "| reader | view exact | view WRONG | view refused "
        "| classic exact | classic WRONG | classic refused |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    total: Counter = Counter()
    for reader in READERS:
        row = [counts[(reader, label, kind)] for label in ("view", "classic")
               for kind in ("exact", "WRONG", "refused")]  # fmt: skip
        for i, n in enumerate(row):
            total[i] += n
        print(f"| {reader} | " + " | ".join(map(str, row)) + " |")
    print("| all | " + " | ".join(str(total[i]) for i in range(6)) + " |")
    print()
    for cell in cells:
        print(cell)


if __name__ == "__main__":
    main()
