"""The data types of the decoded view (:mod:`refmount.decode.dtypes`) for kerchunk (Zarr
v2) sets, read by every reader of the matrix; and string chunks decoded in the worker
processes (``decode-strings``, ``measure-strings``).

What each reader does, found by running them: Debian's ncdump (netCDF-C 4.9.0) reads a
tree of ``|u1`` flags and ``<i8`` times with CF units, and dies (SIGSEGV) on a tree
holding any ``|b1``, complex, ``|S`` or ``<U`` array; so those are served as numbers or
left out (strings served with ``--decode-strings fixed``, for GDAL and zarr).
"""

from __future__ import annotations

import base64
import errno
import json
import os
import re
import struct
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import trio
import xarray as xr
import zarr

from refmount.decode import ArrayRefused, DecodeError, parse_zarray
from refmount.decode.dtypes import NAT, served, utf8_fixed
from refmount.workers import JobFailed, PoolConfig, WorkerPool
from tests.conftest import Mounted
from tests.support import reader_runs
from tests.support.direct import read_once, stats
from tests.support.mounting import REFMOUNT, child_env

CHUNK = 3
TIMES = np.array(["2020-01-01T00:00:00", "NaT", "2021-06-30T12:34:56", "1969-07-20T20:17:40",
                  "2024-02-29T23:59:59"], dtype="<M8[s]")  # fmt: skip
NUMERIC = {
    "level": np.array([1.5, 2.5, -3.25, 4.0, 1e-3], dtype="<f4"),
    "count": np.array([1, -2, 300000, 4, -5], dtype=">i4"),  # big-endian: served little
    "flags": np.array([True, False, True, True, False]),
    "times": TIMES,
    "span": np.array([0, 1500, -250, 86400000, 7], dtype=">m8[ms]"),
}
LEFT_OUT = {
    "waves": np.array([1 + 2j, 3 - 4j, 0, 1j, -1], dtype="<c8"),
    "months": np.array(["2020-01", "2020-02", "2021-12", "1970-01", "2000-06"], dtype="<M8[M]"),
}
STRINGS = {
    "codes": np.array([b"AB", b"C", b"", b"DEF", b"G"], dtype="S3"),
    "names": np.array(["Zürich", "Ås", "", "Genève", "東京"], dtype="<U6"),
}
#: Each array's fill value in its .zarray, as zarr v2 writes it.
FILLS = {"level": "NaN", "count": 0, "flags": False, "times": "NaT", "span": "NaT",
         "waves": None, "months": None, "codes": "", "names": ""}  # fmt: skip
#: Each served array's fill value as a number (what ncdump prints as ``_``).
FILLED = {"level": np.nan, "count": 0, "flags": 0, "times": NAT, "span": NAT}
#: What each served array's values are in the decoded view.
SERVED = {
    "level": NUMERIC["level"],
    "count": NUMERIC["count"].astype("<i4"),
    "flags": NUMERIC["flags"].astype("u1"),
    "times": TIMES.view("<i8"),
    "span": NUMERIC["span"].astype("<m8[ms]").view("<i8"),
}


def zarray(values: np.ndarray, fill: object) -> dict:
    return {
        "zarr_format": 2, "shape": [len(values)], "chunks": [CHUNK], "dtype": values.dtype.str,
        "fill_value": fill, "order": "C", "filters": None,
        "compressor": {"id": "zlib", "level": 1},
    }  # fmt: skip


def kerchunk_set(arrays: dict[str, np.ndarray], tmp_path: Path) -> Path:
    """A kerchunk-style set: metadata inline (with a consolidated ``.zmetadata``), each
    chunk zlib-compressed into one data file, referenced by offset and length."""
    data, blob = tmp_path / "data.bin", bytearray()
    refs: dict[str, object] = {".zgroup": json.dumps({"zarr_format": 2})}
    metadata: dict[str, object] = {".zgroup": {"zarr_format": 2}}
    for name, values in arrays.items():
        meta = zarray(values, FILLS[name])
        attributes = {"_ARRAY_DIMENSIONS": ["n"], "long_name": name}
        refs[f"{name}/.zarray"], refs[f"{name}/.zattrs"] = json.dumps(meta), json.dumps(attributes)
        metadata[f"{name}/.zarray"], metadata[f"{name}/.zattrs"] = meta, attributes
        for index, start in enumerate(range(0, len(values), CHUNK)):
            chunk = np.zeros(CHUNK, dtype=values.dtype)
            chunk[: len(values[start : start + CHUNK])] = values[start : start + CHUNK]
            packed = zlib.compress(chunk.tobytes(), 1)
            refs[f"{name}/{index}"] = [data.as_uri(), len(blob), len(packed)]
            blob += packed
    refs[".zmetadata"] = json.dumps({"zarr_consolidated_format": 1, "metadata": metadata})
    data.write_bytes(blob)
    path = tmp_path / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path


def check_decode(refs: Path, *args: str) -> dict[str, str]:
    """``refmount check --decode``'s left-out arrays and why."""
    done = subprocess.run(
        [*REFMOUNT, "check", "--decode", *args, str(refs)],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    found = {}
    for line in done.stdout.splitlines():
        if ": left out:" in line:
            name, _, reason = line.partition(": left out:")
            found[name.split()[-1]] = reason.strip()
    return found


# -- the policy -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "dtype", "attributes"),
    [
        ("|b1", "|u1", {}),
        ("<M8[s]", "<i8",
         {"units": "seconds since 1970-01-01T00:00:00", "calendar": "proleptic_gregorian"}),
        (">M8[ns]", ">i8",
         {"units": "nanoseconds since 1970-01-01T00:00:00", "calendar": "proleptic_gregorian"}),
        ("<m8[D]", "<i8", {"units": "days"}),
        (">f8", ">f8", {}),
    ],
)  # fmt: skip
def test_each_stored_dtype_is_served_as_a_number_readers_read(
    stored: str, dtype: str, attributes: dict
) -> None:
    serving = served(np.dtype(stored), fixed_strings=False)
    assert (serving.dtype.str, serving.attributes) == (dtype, attributes)


@pytest.mark.parametrize(
    ("stored", "reason"),
    [
        ("<c16", "complex values"),
        ("<M8[M]", "unit 1M"),
        ("<M8[Y]", "unit 1Y"),
        ("<M8[10s]", "unit 10s"),
        ("<m8[ps]", "unit 1ps"),
        ("|S4", "--decode-strings fixed"),
        ("<U4", "--decode-strings fixed"),
    ],
)
def test_what_no_reader_reads_exactly_is_left_out_with_its_reason(stored: str, reason: str) -> None:
    meta = zarray(np.zeros(4, dtype=stored), None)
    with pytest.raises(ArrayRefused, match=re.escape(reason)):
        parse_zarray(json.dumps(meta).encode())


def test_utf32_strings_become_their_utf8_four_bytes_a_character_wide() -> None:
    meta = zarray(STRINGS["names"], "Ås")
    array = parse_zarray(json.dumps(meta).encode(), fixed_strings=True)
    rewritten = json.loads(array.rewritten())
    assert rewritten["dtype"] == "|S24"
    assert base64.b64decode(rewritten["fill_value"]) == "Ås".encode()
    expected = b"".join(s.encode().ljust(24, b"\0") for s in ("Zürich", "Ås", ""))
    assert array.decoder.job is not None and array.decoder.job[0] == "decode"
    assert array.decoder.decode(zlib.compress(STRINGS["names"][:3].tobytes())) == expected
    big = STRINGS["names"].astype(">U6")
    big_endian = parse_zarray(json.dumps(zarray(big, "")).encode(), fixed_strings=True)
    assert big_endian.decoder.decode(zlib.compress(big[:3].tobytes())) == expected


@pytest.mark.parametrize("point", [0xD800, 0x110000, 0xFFFFFFFF])
def test_a_code_point_that_is_not_text_is_a_decode_error(point: int) -> None:
    data = np.array([65, point, 66, 0], dtype="<u4").tobytes()
    with pytest.raises(DecodeError, match="not text"):
        utf8_fixed(data, 2)


def test_times_fill_nat_and_bool_fill_as_numbers() -> None:
    times = json.loads(parse_zarray(json.dumps(zarray(TIMES, "NaT")).encode()).rewritten())
    flags = json.loads(
        parse_zarray(json.dumps(zarray(NUMERIC["flags"], True)).encode()).rewritten()
    )
    assert (times["dtype"], times["fill_value"]) == ("<i8", NAT)
    assert (flags["dtype"], flags["fill_value"]) == ("|u1", 1)


# -- through mounts ---------------------------------------------------------------------------


@pytest.fixture
def dtypes_set(tmp_path: Path) -> Path:
    return kerchunk_set({**NUMERIC, **LEFT_OUT, **STRINGS}, tmp_path)


def test_every_dtype_of_a_kerchunk_set_through_the_decoded_mount(
    mount: Callable[..., Mounted], dtypes_set: Path
) -> None:
    """ncdump reads the whole tree (exit 0) and every served variable exactly, as do
    Debian's GDAL 3.6 and zarr; xarray decodes the times from their CF units; complex,
    months and strings are left out, each logged once and named by ``check --decode``."""
    mounted = mount(dtypes_set, "--decode")
    root = mounted.mountpoint
    assert sorted(os.listdir(root)) == sorted([".zgroup", ".zmetadata", *NUMERIC])
    failure, printed = reader_runs.ncdump_whole(root)
    assert failure is None, printed
    assert 'times:units = "seconds since 1970-01-01T00:00:00" ;' in printed
    assert 'span:units = "milliseconds" ;' in printed and 'span:long_name = "span" ;' in printed
    outcomes = {
        name: (
            str(reader_runs.ncdump(root, name, values, FILLED[name])),
            str(reader_runs.gdalmdiminfo(root, name, values)),
            str(reader_runs.zarr3(root, name, values)),
        )
        for name, values in SERVED.items()
    }
    assert outcomes == dict.fromkeys(SERVED, ("equal", "equal", "equal"))
    with xr.open_zarr(str(root), consolidated=True) as ds:
        assert np.array_equal(ds["times"].values.astype("<M8[s]"), TIMES, equal_nan=True)
        assert ds["span"].values.astype("<m8[ms]").tolist() == NUMERIC["span"].tolist()
    consolidated = json.loads((root / ".zmetadata").read_text())["metadata"]
    assert consolidated["flags/.zarray"]["dtype"] == "|u1"
    assert consolidated["times/.zattrs"]["units"] == "seconds since 1970-01-01T00:00:00"
    assert not any(key.startswith(("waves", "months", "codes", "names")) for key in consolidated)
    reasons = check_decode(dtypes_set)
    assert sorted(reasons) == ["codes", "months", "names", "waves"]
    assert "complex values (<c8)" in reasons["waves"] and "unit 1M" in reasons["months"]
    assert "--decode-strings fixed" in reasons["codes"] and "(<U6)" in reasons["names"]
    for name in reasons:
        assert mounted.log().count(f"array {name!r} is left out") == 1, name


READ_STRINGS = ("equal", "equal", "crash: signal 11")


def test_fixed_width_strings_of_a_kerchunk_set_with_decode_strings_fixed(
    mount: Callable[..., Mounted], dtypes_set: Path
) -> None:
    """``|S3`` as it is, ``<U6`` as ``|S24`` UTF-8 (decoded in a worker); GDAL 3.6 and
    zarr read both, Debian's ncdump 4.9.0 dies on the tree (why the default leaves them
    out); the numbers read as without the option."""
    mounted = mount(dtypes_set, "--decode", "--decode-strings", "fixed", "--xattrs")
    root = mounted.mountpoint
    assert sorted(os.listdir(root)) == sorted([".zgroup", ".zmetadata", *NUMERIC, *STRINGS])
    assert json.loads((root / "names" / ".zarray").read_text())["dtype"] == "|S24"
    assert json.loads((root / "codes" / ".zarray").read_text())["dtype"] == "|S3"
    before = stats(mounted)["worker_jobs"]
    assert (root / "names" / "1").read_bytes() == b"".join(
        s.encode().ljust(24, b"\0") for s in ("Genève", "東京", "")
    )
    assert stats(mounted)["worker_jobs"] == before + 1
    for name, values in STRINGS.items():
        texts = np.array([v.decode() if isinstance(v, bytes) else v for v in values], dtype=object)
        outcome = (
            str(reader_runs.gdalmdiminfo(root, name, texts)),
            str(reader_runs.zarr3(root, name, texts)),
            str(reader_runs.ncdump(root, name, texts, None)),
        )
        assert outcome == READ_STRINGS, name
    for name, values in SERVED.items():
        assert str(reader_runs.zarr3(root, name, values)) == "equal", name
    assert sorted(check_decode(dtypes_set, "--decode-strings", "fixed")) == ["months", "waves"]


# -- string chunks in the worker processes ----------------------------------------------------


def vlen_chunk(values: list[bytes]) -> bytes:
    return struct.pack("<I", len(values)) + b"".join(struct.pack("<I", len(v)) + v for v in values)


VLEN_META = {"dtype": "|O", "filters": [{"id": "vlen-utf8"}], "compressor": {"id": "zlib"},
             "chunks": [3]}  # fmt: skip


def bomb(count: int, mib: int = 200) -> bytes:
    """A valid-looking variable-length chunk of ``count`` values whose last one is ``mib``
    MiB of zeros: a KiB compressed per MiB."""
    head = struct.pack("<II", count, 1) + b"a" + struct.pack("<I", 0) * (count - 2)
    packer = zlib.compressobj(9)
    body = packer.compress(head + struct.pack("<I", mib << 20))
    zeros = bytes(1 << 20)
    for _ in range(mib):
        body += packer.compress(zeros)
    return body + packer.flush()


def test_string_jobs_in_worker_processes_refuse_hostile_chunks() -> None:
    """Random bytes and a compression bomb fail their job (bounded: the bomb stops at the
    values' room), the worker serves the next job, none dies."""
    good = zlib.compress(vlen_chunk([b"ab", "Å".encode(), b""]))
    decode_params = {"meta": VLEN_META, "width": 2}
    rng = np.random.default_rng(7)

    async def test(pool: WorkerPool) -> None:
        assert bytes(await pool.submit("decode-strings", decode_params, good, 6)) == (
            b"ab" + "Å".encode() + b"\0\0"
        )
        longest = await pool.submit("measure-strings", {"meta": VLEN_META}, good, 8)
        assert int.from_bytes(longest, "little") == 2
        for hostile in (rng.bytes(5000), zlib.compress(rng.bytes(5000)), bomb(3)):
            for kind, params, size in (
                ("decode-strings", decode_params, 6),
                ("measure-strings", {"meta": VLEN_META}, 8),
            ):
                with pytest.raises(JobFailed):
                    await pool.submit(kind, params, hostile, size)
        with pytest.raises(JobFailed, match="width"):
            await pool.submit("decode-strings", {"meta": VLEN_META, "width": 1 << 40}, good, 6)
        with pytest.raises(JobFailed, match="variable-length string array"):
            await pool.submit("decode-strings", {"meta": {"dtype": "<f8"}, "width": 2}, good, 6)
        assert bytes(await pool.submit("decode-strings", decode_params, good, 6))[:2] == b"ab"
        stats = pool.stats()
        assert (stats["worker_jobs"], stats["worker_job_errors"], stats["worker_deaths"]) == (
            11,
            8,
            0,
        )

    pool = WorkerPool(PoolConfig(workers=1))
    try:
        trio.run(test, pool)
    finally:
        pool.close()


def test_string_chunks_are_measured_and_decoded_by_the_workers(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    """Each chunk of a zlib string array is measured by a worker job when the set is
    first used and decoded by one when read; an array with a hostile chunk (random
    bytes, a bomb) is left out, naming the array and why; the daemon lives on."""
    data = tmp_path / "strings.bin"
    chunks = [zlib.compress(vlen_chunk([b"ab", "Å".encode(), b"xyz"])),
              zlib.compress(vlen_chunk([b"q", b"", b""])),
              np.random.default_rng(3).bytes(3000), bomb(3)]  # fmt: skip
    data.write_bytes(b"".join(chunks))
    offsets = np.cumsum([0, *map(len, chunks)]).tolist()
    meta = {
        "zarr_format": 2, "shape": [6], "chunks": [3], "dtype": "|O", "fill_value": None,
        "order": "C", "filters": [{"id": "vlen-utf8"}], "compressor": {"id": "zlib"},
    }  # fmt: skip
    refs: dict[str, object] = {".zgroup": json.dumps({"zarr_format": 2})}
    for name, used in (("good", (0, 1)), ("noise", (2, 1)), ("bombed", (0, 3))):
        refs[f"{name}/.zarray"] = json.dumps(meta)
        refs[f"{name}/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": ["n"]})
        for index, at in enumerate(used):
            refs[f"{name}/{index}"] = [data.as_uri(), offsets[at], len(chunks[at])]
    path = tmp_path / "strings.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    mounted = mount(path, "--decode", "--decode-strings", "fixed", "--xattrs")
    root = mounted.mountpoint
    assert sorted(os.listdir(root)) == [".zgroup", "good"]
    # Measured: good's two chunks, noise's first (random bytes: it stops there), bombed's
    # two (the bomb stops at 64 MiB, the most a measured chunk may decompress to).
    counters = stats(mounted)
    assert (counters["worker_jobs"], counters["worker_job_errors"]) == (5, 2)
    assert (root / "good" / "0").read_bytes() == b"ab\0" + "Å".encode() + b"\0xyz"
    assert (root / "good" / "1").read_bytes() == b"q\0\0" + b"\0" * 6
    counters = stats(mounted)
    assert (counters["worker_jobs"], counters["worker_deaths"]) == (7, 0)
    log = mounted.log()
    assert "string array 'noise' cannot be measured" in log
    assert "string array 'bombed' cannot be measured" in log and "more than" in log
    assert mounted.process.poll() is None
    opened = zarr.open_group(str(root), mode="r", zarr_format=2)
    assert opened["good"][...].tolist() == [b"ab", "Å".encode(), b"xyz", b"q", b"", b""]


def test_a_string_chunk_turned_hostile_after_measuring_is_eio(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    """A string chunk that became random bytes or a compression bomb after its array was
    measured (its raw bytes gone from the 1 MiB cache, pushed out by the 38 chunks
    measured after it) fails its decoding job: EIO, no worker dies, the daemon lives,
    the next chunk reads right."""
    region = 60000  # each chunk padded to this (zlib ignores what follows its stream)
    good = zlib.compress(vlen_chunk([b"ab", b"c", b"xyz"])).ljust(region, b"\0")
    data = tmp_path / "strings.bin"
    data.write_bytes(good * 52)
    # Keys 0 and 1 in regions 44 and 50: no other key's 256 KiB cache block holds them.
    regions = {0: 44, 1: 50} | {key: key for key in range(2, 40)}
    meta = {
        "zarr_format": 2, "shape": [120], "chunks": [3], "dtype": "|O", "fill_value": None,
        "order": "C", "filters": [{"id": "vlen-utf8"}], "compressor": {"id": "zlib"},
    }  # fmt: skip
    refs: dict[str, object] = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        "s/.zarray": json.dumps(meta),
        "s/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["n"]}),
    }
    for key, at in regions.items():
        refs[f"s/{key}"] = [data.as_uri(), at * region, region]
    path = tmp_path / "strings.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    args = ("--decode", "--decode-strings", "fixed", "--xattrs", "--cache-size", "1M")
    mounted = mount(path, *args)
    root = mounted.mountpoint
    assert sorted(os.listdir(root)) == [".zgroup", "s"]
    assert stats(mounted)["worker_jobs"] == 40  # every chunk measured by a worker
    with data.open("r+b") as f:
        f.seek(44 * region)
        f.write(np.random.default_rng(5).bytes(region))
        f.seek(50 * region)
        f.write(bomb(3, 50).ljust(region, b"\0"))
    decoded = b"ab\0c\0\0xyz"
    for key in ("0", "1"):
        with pytest.raises(OSError) as failed:
            read_once(root / "s" / key)
        assert failed.value.errno == errno.EIO, key
        assert read_once(root / "s" / "2") == decoded
    assert mounted.process.poll() is None
    counters = stats(mounted)
    assert (counters["worker_jobs"], counters["worker_job_errors"]) == (43, 2)
    assert counters["worker_deaths"] == 0
    log = mounted.log()
    assert "read of 's/1' failed: array 's': a chunk does not decode" in log
    assert "decodes to more than" in log
