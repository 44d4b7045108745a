"""The netCDF view's parts without a mount: the header against the one scipy writes for
the same metadata, layouts each format cannot hold, and element runs as boxes."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import trio

from refmount.decode.arrays import parse_zarray
from refmount.errors import FetchError
from refmount.netcdf.boxes import boxes, chunk_indices, overlap
from refmount.netcdf.header import NC_DOUBLE, NC_INT, Header, LayoutError, Variable, lay_out
from refmount.netcdf.model import _file
from refmount.netcdf.types import attribute
from refmount.netcdf.wide import Wide, plan, time_unit


def zarray(shape: list[int], chunks: list[int], dtype: str) -> bytes:
    meta = {
        "zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dtype,
        "compressor": None, "filters": None, "order": "C", "fill_value": None,
    }  # fmt: skip
    return json.dumps(meta).encode()


def test_the_header_is_byte_for_byte_the_one_scipy_writes(tmp_path: Path) -> None:
    arrays = [
        ("mask", parse_zarray(zarray([5, 3], [2, 2], "|i1")), {"_ARRAY_DIMENSIONS": ["time", "x"]}),
        (
            "t",
            parse_zarray(zarray([5, 3], [5, 3], "<i2")),
            {"_ARRAY_DIMENSIONS": ["time", "x"], "units": "K", "scale": 0.1, "n": [1, 2]},
        ),
        ("time", parse_zarray(zarray([5], [5], "<f8")), {"_ARRAY_DIMENSIONS": ["time"]}),
    ]  # in the order scipy writes them (by shape, largest first)
    for version, choice in ((1, "classic"), (2, "64bit-offset")):
        made, left_out = _file("x.nc", {"title": "héllo", "year": 2026}, arrays, choice)
        assert not left_out
        path = tmp_path / f"scipy{version}.nc"
        with scipy.io.netcdf_file(path, "w", version=version) as f:
            f.title = "héllo".encode()
            f.year = np.int32(2026)
            f.createDimension("time", 5)
            f.createDimension("x", 3)
            f.createVariable("mask", "i1", ("time", "x"))
            t = f.createVariable("t", "i2", ("time", "x"))
            t.units = b"K"
            t.scale = np.array([0.1], "f8")  # a Python float scipy writes as float
            t.n = np.array([1, 2], "i4")
            f.createVariable("time", "f8", ("time",))
        written = path.read_bytes()
        # The values start 4 blocks in (scipy's right after the header), which no
        # reader of the header alone reaches; laid out as scipy does, the bytes are its.
        assert made.header.variables[0].begin == 4 * made.block_size == 4 * 8192
        assert made.size == len(written) - len(made.text) + 4 * 8192
        assert lay_out(made.header) == written[: len(made.text)], version
        assert made.header.size == len(written)


def test_a_format_that_cannot_hold_the_data_names_the_variable() -> None:
    big = [1 << 20, 1 << 11]  # 8 GiB of doubles
    arrays = [
        ("big", parse_zarray(zarray(big, [1024, 1024], "<f8")), {"_ARRAY_DIMENSIONS": ["a", "b"]}),
        ("after", parse_zarray(zarray([2], [2], "<f8")), {}),
    ]
    with pytest.raises(FetchError, match="variable 'big' of 17179869184 bytes needs CDF-5"):
        _file("x.nc", {}, arrays, "64bit-offset")
    made, _ = _file("x.nc", {}, arrays, "auto")
    assert made.header.version == 5 and made.size > 1 << 34
    header = Header(1, [], [], [Variable("v", (), NC_INT, (), begin=0)])
    header.variables[0].shape = (1 << 29,)  # 2 GiB: the next begin is past CDF-1's offsets
    header.variables.append(Variable("w", (), NC_DOUBLE, ()))
    with pytest.raises(LayoutError, match="variable 'w' starts at byte"):
        lay_out(header)


def test_attributes_keep_their_types() -> None:
    assert attribute("a", 3, cdf5=False).nc_type == NC_INT
    assert attribute("a", 1 << 40, cdf5=False).nc_type == NC_DOUBLE
    assert attribute("a", (1 << 53) + 1, cdf5=False).values == b"9007199254740993"
    assert attribute("a", [0.5, "NaN"], cdf5=False).values.tolist()[0] == 0.5  # type: ignore[union-attr]
    assert attribute("a", {"k": 1}, cdf5=False).values == b'{"k": 1}'


def test_a_run_of_elements_is_its_boxes_in_order() -> None:
    rng = random.Random(30)
    for _ in range(500):
        shape = tuple(rng.randint(1, 6) for _ in range(rng.randint(0, 4)))
        count = int(np.prod(shape, dtype=np.int64))
        first = rng.randrange(count)
        last = rng.randint(first + 1, count)
        numbers = np.arange(count).reshape(shape)
        found = []
        for start, stop in boxes(shape, first, last):
            where = tuple(slice(a, b) for a, b in zip(start, stop, strict=True))
            found += numbers[where].ravel().tolist()
        assert found == list(range(first, last)), (shape, first, last)
        assert len(boxes(shape, first, last)) <= max(1, 2 * len(shape) - 1)
        chunks = tuple(rng.randint(1, 4) for _ in shape)
        for box in boxes(shape, first, last):
            covered = np.zeros([b - a for a, b in zip(*box, strict=True)], bool)
            for index in chunk_indices(box, chunks):
                into, out_of = overlap(box, index, chunks)
                assert not covered[into].any()
                covered[into] = True
                assert all(s.stop - s.start > 0 for s in out_of)
            assert covered.all()


def test_a_dimension_met_with_another_length_is_renamed(caplog: pytest.LogCaptureFixture) -> None:
    arrays = [
        ("a", parse_zarray(zarray([3], [3], "<f4")), {"_ARRAY_DIMENSIONS": ["x"]}),
        ("b", parse_zarray(zarray([4, 2], [4, 2], "<f4")), {"_ARRAY_DIMENSIONS": ["x", "y"]}),
        ("c", parse_zarray(zarray([4], [4], "<f4")), {"_ARRAY_DIMENSIONS": ["x"]}),
        ("d", parse_zarray(zarray([2, 2], [2, 2], "<f4")), {}),
    ]
    made, _ = _file("x.nc", {}, arrays, "auto")
    dimensions = [(d.name, d.length) for d in made.header.dimensions]
    assert dimensions == [("x", 3), ("x_4", 4), ("y", 2), ("d_dim0", 2), ("d_dim1", 2)]
    assert [v.dimids for v in made.header.variables] == [(0,), (1, 2), (1,), (3, 4)]
    assert "dimension 'x' has another length elsewhere; here it is 'x_4'" in caplog.text


def test_the_options_name_every_format() -> None:
    from refmount.netcdf.header import FORMATS
    from refmount.netcdf.options import FORMAT_CHOICES

    assert ("auto", *FORMATS) == FORMAT_CHOICES  # options load no numpy: named twice


def test_reads_at_any_offset_equal_the_same_bytes_of_the_file_read_whole(tmp_path: Path) -> None:
    """Byte-exact offsets and lengths (a mount's page cache aligns them to pages): every
    range across the header, values and padding assembles as the whole file has it."""
    import trio

    from refmount.cache import BlockCache
    from refmount.decode.reads import DecodedReads
    from refmount.fetch import Fetcher
    from refmount.netcdf.reads import NetcdfReads
    from refmount.refs import open_refset
    from refmount.workers import InProcessRunner
    from tests.test_netcdf import typed_set

    refs, _ = typed_set(tmp_path)  # every chunk inline: nothing is fetched
    blocks = BlockCache(Fetcher(), budget=64 << 20)
    reads = NetcdfReads(DecodedReads(blocks, InProcessRunner(2), fixed_strings=True), "auto")
    view = reads.view(open_refset(str(refs)), "types")
    rng = random.Random(30)

    async def main() -> None:
        file_id = await view.find_file("types.nc")
        assert file_id is not None
        ref = view.ref(file_id)
        assert ref.url is not None and ref.length is not None
        whole = bytes(await reads.read_buffer(ref.url, 0, ref.length))
        assert len(whole) == ref.length and whole[:4] == b"CDF\x02"
        for _ in range(400):
            start = rng.randrange(ref.length)
            end = rng.randint(start + 1, ref.length)
            assert bytes(await reads.read_buffer(ref.url, start, end)) == whole[start:end]

    trio.run(main)


def decide(values: list[int], units: str, keep: int | None = None) -> Wide:
    array = np.array(values, "<i8")

    async def read() -> np.ndarray:
        return array

    return trio.run(plan, "t", {"units": units}, array.nbytes, keep, read)


def test_a_time_is_written_in_the_coarsest_unit_holding_every_value() -> None:
    nat = -(1 << 63)
    hourly = decide([0, 3600 * 10**9, 48 * 3600 * 10**9, nat], "nanoseconds since 2000-1-1", nat)
    assert (hourly.divisor, hourly.units) == (3600 * 10**9, "hours since 2000-1-1")
    assert hourly.narrow and hourly.exact and hourly.time
    millis = decide([1_577_836_800_001 * 10**6], "ns since 1970-01-01")
    assert (millis.divisor, millis.units) == (10**6, "milliseconds since 1970-01-01")
    assert millis.exact and not millis.narrow  # an exact double, but no int
    nanos = decide([1_577_836_800_000_000_001], "nanoseconds since 1970-01-01")
    assert nanos.divisor == 1 and nanos.units is None and not nanos.exact
    days = decide([0, 2 * 86400, 4 * 86400], "secs since 1970-01-01")
    assert days.units == "days since 1970-01-01" and days.divisor == 86400
    seconds = decide([0, 2, 4], "secs since 1970-01-01")
    assert seconds.units is None and seconds.divisor == 1 and seconds.narrow
    assert time_unit({"units": "fortnights since 2000-01-01"}) is None
    counter = decide([1, 2, (1 << 53) + 1], "1")
    assert not counter.time and not counter.exact and counter.divisor == 1
