"""A catalog through the netCDF view, mounted for real: a flat directory of ``.nc`` files,
one per set (``run01.nc`` beside the set's directory ``run01/``), listed without loading
a set, each sized exactly on ``stat``, read by ``ncdump`` and globbed by ``cdo
mergetime``; a set that cannot be loaded is EIO under its listed name."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import netCDF4
import numpy as np

from tests.conftest import REFMOUNT, Mounted
from tests.data_builders import kerchunk_refs
from tests.test_catalog import eventually, loads, run, status
from tests.test_netcdf import data_section, ncdump

SLICES = 3
STEPS = 4  # time steps per set: the sets are consecutive slices of one series


def write_slice(path: Path, n: int) -> None:
    """A netCDF4 file of ``STEPS`` hours starting at hour ``n * STEPS``."""
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", STEPS)
        ds.createDimension("lat", 3)
        ds.createDimension("lon", 5)
        time = ds.createVariable("time", "f8", ("time",))
        time.units = "hours since 2000-01-01 00:00:00"
        time.calendar = "standard"
        time[:] = np.arange(n * STEPS, (n + 1) * STEPS, dtype="f8")
        lat = ds.createVariable("lat", "f4", ("lat",))
        lat.units = "degrees_north"
        lat[:] = [10.0, 20.0, 30.0]
        lon = ds.createVariable("lon", "f4", ("lon",))
        lon.units = "degrees_east"
        lon[:] = [0.0, 1.0, 2.0, 3.0, 4.0]
        temp = ds.createVariable("temp", "f4", ("time", "lat", "lon"), zlib=True)
        temp.units = "K"
        temp[:] = 250 + np.arange(n * STEPS * 15, (n + 1) * STEPS * 15, dtype="f4").reshape(
            STEPS, 3, 5
        )


def time_slices(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A catalog ``run01.json``... of kerchunk sets, each a slice of the series, and the
    slices' netCDF files."""
    catalog, data = tmp_path / "catalog", tmp_path / "data"
    catalog.mkdir()
    data.mkdir()
    sources = []
    for n in range(SLICES):
        source = data / f"run{n + 1:02d}.nc"
        write_slice(source, n)
        refs = kerchunk_refs(source, str(source))
        (catalog / f"run{n + 1:02d}.json").write_text(json.dumps(refs))
        sources.append(source)
    return catalog, sources


def test_a_catalog_is_a_flat_directory_of_nc_files(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    catalog, sources = time_slices(tmp_path)
    (catalog / "broken.json").write_text('{"version": 1, "refs": ')  # not JSON: cannot load
    m = mount(catalog, "--netcdf", "--allow-local")
    root = m.mountpoint
    names = ["run01", "run02", "run03"]
    expected = sorted(["broken", "broken.nc", *names, *(f"{n}.nc" for n in names)])
    assert sorted(os.listdir(root)) == expected
    listed = subprocess.run(["ls", str(root)], capture_output=True, text=True, timeout=60)
    assert listed.stdout.split() == expected
    globbed = subprocess.run(
        f"printf '%s\\n' {root}/*.nc", shell=True, capture_output=True, text=True, timeout=60
    )
    assert globbed.stdout.split() == [str(root / f"{n}.nc") for n in ["broken", *names]]
    assert loads(m) == 0 and status(m)["catalog"]["loads"] == 0  # listing loads nothing

    # stat gives the exact size: the set's own directory holds the same file
    for name in names:
        flat, inside = (root / f"{name}.nc").stat(), (root / name / f"{name}.nc").stat()
        assert flat.st_size == inside.st_size > 0 and flat.st_ino == inside.st_ino
    assert loads(m) == SLICES

    # ncdump of each prints the values of its source
    for name, source in zip(names, sources, strict=True):
        for variable in ("time", "lat", "lon", "temp"):
            served = data_section(ncdump("-v", variable, str(root / f"{name}.nc")))
            original = data_section(ncdump("-v", variable, str(source)))
            assert served.split(f" {variable} =", 1)[1] == original.split(f" {variable} =", 1)[1]

    # a glob consumer: cdo merges the slices in time order
    merged = tmp_path / "merged.nc"
    done = subprocess.run(
        f"cdo -s mergetime {root}/run*.nc {merged}",
        shell=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    with netCDF4.Dataset(merged) as ds:
        np.testing.assert_array_equal(ds["time"][:], np.arange(SLICES * STEPS))
        expected_temp = 250 + np.arange(SLICES * STEPS * 15, dtype="f4").reshape(-1, 3, 5)
        np.testing.assert_array_equal(ds["temp"][:], expected_temp)

    # the broken set: listed, EIO on stat and read (never ENOENT), the others still read
    stated = subprocess.run(
        f"ls -d {root}/*.nc", shell=True, capture_output=True, text=True, timeout=60
    )
    assert stated.stdout.split() == [str(root / f"{n}.nc") for n in names]
    assert "broken.nc" in stated.stderr and "Input/output error" in stated.stderr
    long = subprocess.run(["ls", "-ln", str(root)], capture_output=True, text=True, timeout=60)
    sizes = {line.split()[-1]: line.split()[4] for line in long.stdout.splitlines()[1:]}
    for name in names:
        assert int(sizes[f"{name}.nc"]) == (root / f"{name}.nc").stat().st_size > 0
    assert sizes["broken.nc"] == "?" and "broken.nc" in long.stderr  # ls: cannot access
    for attempt in (["stat", str(root / "broken.nc")], ["cat", str(root / "broken.nc")]):
        failed = subprocess.run(attempt, capture_output=True, text=True, timeout=60)
        assert failed.returncode != 0 and "Input/output error" in failed.stderr, failed
    assert "broken" in status(m)["catalog"]["errors"]
    assert "set broken cannot be loaded" in m.log()
    assert ncdump("-h", str(root / "run02.nc")).startswith("netcdf run02 {")


def test_listing_two_thousand_sets_loads_none(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    catalog = tmp_path / "many"
    catalog.mkdir()
    refs = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        "v/.zarray": json.dumps(
            {
                "shape": [4],
                "chunks": [4],
                "dtype": "<i4",
                "compressor": None,
                "filters": None,
                "fill_value": None,
                "order": "C",
                "zarr_format": 2,
            }
        ),
        "v/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["n"]}),
    }
    count = 2000
    for n in range(count):
        chunk = np.arange(n, n + 4, dtype="<i4").tobytes()
        doc = {**refs, "v/0": "base64:" + __import__("base64").b64encode(chunk).decode()}
        (catalog / f"s{n:04d}.json").write_text(json.dumps({"version": 1, "refs": doc}))
    m = mount(catalog, "--netcdf", "--allow-local", "--max-loaded-sets", "4")
    root = m.mountpoint
    listed = os.listdir(root)
    assert len(listed) == 2 * count
    assert sorted(n for n in listed if n.endswith(".nc")) == [f"s{n:04d}.nc" for n in range(count)]
    assert (root / "s0000").is_dir()  # a set's directory stat'ed: loads nothing either
    state = status(m)["catalog"]
    assert state["loads"] == 0 and state["loaded"] == {} and loads(m) == 0
    # a set's file: stat loads that set alone; its values are the set's
    assert (root / "s1234.nc").stat().st_size > 0
    with netCDF4.Dataset(root / "s1234.nc") as ds:
        np.testing.assert_array_equal(ds["v"][:], np.arange(1234, 1238))
    assert status(m)["catalog"]["loads"] == 1 and loads(m, "s1234") == 1


def test_a_set_file_is_named_after_the_set_and_netcdf_name_is_refused(
    mount: Callable[..., Mounted], mountpoint: Path, tmp_path: Path
) -> None:
    catalog = tmp_path / "dotted"
    catalog.mkdir()
    write_slice(tmp_path / "source.nc", 0)
    refs = kerchunk_refs(tmp_path / "source.nc", str(tmp_path / "source.nc"))
    (catalog / "run.v2.json").write_text(json.dumps(refs))
    m = mount(catalog, "--netcdf", "--allow-local")
    assert sorted(os.listdir(m.mountpoint)) == ["run.v2", "run.v2.nc"]
    assert os.listdir(m.mountpoint / "run.v2") == ["run.v2.nc"]
    checked = subprocess.run(
        [*REFMOUNT, "check", "--netcdf", "--json", "--allow-local", str(catalog)],
        capture_output=True,
        timeout=120,
    )
    files = json.loads(checked.stdout)["sets"]["run.v2"]["netcdf"]["files"]
    assert [f["name"] for f in files] == ["run.v2.nc"]
    named = ["--netcdf", "--netcdf-name", "x", "--allow-local"]
    refused = subprocess.run(
        [*REFMOUNT, str(catalog), str(mountpoint), "-f", *named],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1
    assert "--netcdf-name names the file of a single set" in refused.stderr


def test_sets_added_replaced_and_removed_swap_their_files(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    catalog, _ = time_slices(tmp_path)
    m = mount(catalog, "--netcdf", "--allow-local", "--catalog-ttl", "1")
    root = m.mountpoint

    def first_time(name: str) -> float:
        with netCDF4.Dataset(root / name) as ds:
            return float(ds["time"][0])

    assert first_time("run01.nc") == 0.0
    # run01 now refers to the third slice; run02 is removed; run04 arrives
    replaced = json.loads((catalog / "run03.json").read_text())
    partial = catalog / "run01.json.partial"
    partial.write_text(json.dumps(replaced))
    os.utime(partial, (1, 1))
    partial.rename(catalog / "run01.json")
    (catalog / "run02.json").unlink()
    (catalog / "run04.json").write_text(json.dumps(replaced))
    # the kernel's entry of run01.nc is told to go (no listing in between refreshes it)
    eventually(lambda: first_time("run01.nc") == 2.0 * STEPS, "run01.nc swapped")
    now = sorted(f"run0{n}{suffix}" for n in (1, 3, 4) for suffix in ("", ".nc"))
    eventually(lambda: sorted(os.listdir(root)) == now, "run02 removed, run04 added")
    assert first_time("run04.nc") == 2.0 * STEPS
    assert b"No such file" in run("stat", str(root / "run02.nc")).stderr
    assert "catalog: reloaded set run01" in m.log()
