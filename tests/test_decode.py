"""The decoded view without a mount: codecs, bounds, metadata rewriting, the view's keys."""

from __future__ import annotations

import gzip
import json
import math
import zlib
from functools import cache
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import trio

from refmount.decode import (
    SCHEME,
    ArrayRefused,
    CodecError,
    DecodedRef,
    DecodedRefSet,
    DecodeError,
    build_stage,
    parse_zarray,
)
from refmount.decode.arrays import MAX_CHUNK_BYTES
from refmount.decode.codecs import Stage, _libdeflate, _streaming_stage
from refmount.decode.jsontext import dump_json, repair_document
from refmount.refs import open_refset

VALUES = np.linspace(-50, 50, 1000, dtype="<f8")


def zarray(**fields: object) -> bytes:
    meta = {
        "zarr_format": 2,
        "shape": [1000],
        "chunks": [1000],
        "dtype": "<f8",
        "fill_value": None,
        "order": "C",
        "compressor": None,
        "filters": None,
    }
    meta.update(fields)
    return json.dumps(meta).encode()


def decode_with(compressor: dict | None, filters: list | None, encoded: bytes, **fields: object):
    array = parse_zarray(zarray(compressor=compressor, filters=filters, **fields))
    assert array.decoder.error is None, array.decoder.error
    return array.decoder.decode(encoded)


@pytest.mark.parametrize(
    "codec",
    [
        numcodecs.Zlib(level=5),
        numcodecs.GZip(level=3),
        numcodecs.BZ2(),
        numcodecs.LZMA(),
        numcodecs.Zstd(level=3),
        numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE),
        numcodecs.Blosc(cname="zstd", shuffle=numcodecs.Blosc.BITSHUFFLE),
        numcodecs.LZ4(),
    ],
    ids=lambda c: c.codec_id,
)
def test_each_compressor_decodes_to_the_exact_bytes(codec: numcodecs.abc.Codec) -> None:
    encoded = bytes(codec.encode(VALUES))
    assert decode_with(codec.get_config(), None, encoded) == VALUES.tobytes()


@pytest.mark.parametrize(
    ("filters", "values"),
    [
        ([numcodecs.Shuffle(elementsize=8)], VALUES),
        ([numcodecs.Delta(dtype="<i8", astype="<i2")], np.arange(1000, dtype="<i8")),
        (
            [numcodecs.FixedScaleOffset(offset=0, scale=100, dtype="<f8", astype="<i4")],
            np.round(VALUES, 2),
        ),
        ([numcodecs.Quantize(digits=3, dtype="<f8")], VALUES),
        ([numcodecs.AsType(encode_dtype="<f4", decode_dtype="<f8")], VALUES),
        ([numcodecs.BitRound(keepbits=10)], VALUES),
        ([numcodecs.Fletcher32()], VALUES),
        ([numcodecs.CRC32()], VALUES),
        ([numcodecs.Adler32()], VALUES),
        ([numcodecs.Shuffle(elementsize=8), numcodecs.Zlib()], VALUES),
    ],
    ids=lambda f: "+".join(c.codec_id for c in f) if isinstance(f, list) else "",
)
def test_filters_are_undone_in_zarr_order(filters: list, values: np.ndarray) -> None:
    encoded = values
    for codec in filters:
        encoded = codec.encode(encoded)
    expected = values
    for codec in reversed(filters):
        expected = codec.decode(expected) if codec is not filters[-1] else codec.decode(encoded)
    expected = np.frombuffer(bytes(numcodecs.compat.ensure_contiguous_ndarray(expected)), "u1")
    decoded = decode_with(
        None, [c.get_config() for c in filters], bytes(encoded), dtype=values.dtype.str
    )
    assert decoded == expected.tobytes()
    assert len(decoded) == 1000 * values.dtype.itemsize


def test_packbits_decodes_booleans() -> None:
    values = np.arange(1000) % 3 == 0
    encoded = bytes(numcodecs.PackBits().encode(values))
    decoded = decode_with(None, [{"id": "packbits"}], encoded, dtype="|b1")
    assert decoded == values.tobytes()


def test_big_endian_fortran_order_becomes_little_endian_c_order() -> None:
    values = np.arange(12, dtype=">i4").reshape(3, 4)
    raw = values.tobytes(order="F")
    array = parse_zarray(zarray(shape=[3, 4], chunks=[3, 4], dtype=">i4", order="F"))
    decoded = array.decoder.decode(raw)
    assert decoded == values.astype("<i4").tobytes(order="C")
    rewritten = json.loads(array.rewritten())
    assert rewritten["dtype"] == "<i4" and rewritten["order"] == "C"
    assert rewritten["compressor"] is None and rewritten["filters"] is None


def test_rewritten_metadata_is_strict_json_with_the_spec_fill_values() -> None:
    for value, text in ((math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity")):
        source = zarray(fill_value=value, dtype=">f4", compressor={"id": "zlib", "level": 1})
        rewritten = parse_zarray(source).rewritten()
        meta = json.loads(rewritten, parse_constant=lambda c: pytest.fail(f"bare {c}"))
        assert meta["fill_value"] == text
        assert meta["dtype"] == "<f4"
    assert json.loads(parse_zarray(zarray(dtype="|u1")).rewritten())["dtype"] == "|u1"
    assert json.loads(parse_zarray(zarray(dtype=">u1")).rewritten())["dtype"] == "|u1"


def test_attributes_are_repaired_as_netcdf_c_and_gdal_read_them() -> None:
    document = {
        "missing_value": math.nan,
        "valid_range": [0.0, math.inf],
        "bad_range": [math.nan, 1.0],
        "nested": {"x": -math.inf},
        "title": "café",
    }
    repaired = repair_document(document, "x/.zattrs")
    assert repaired == {
        "missing_value": "NaN",
        "valid_range": [0.0, "Infinity"],
        "nested": {"x": "-Infinity"},
        "title": "café",
    }
    text = dump_json(repaired)
    assert "café".encode() in text and b"\\u" not in text


def test_a_chunk_that_decodes_to_more_than_its_size_is_an_error() -> None:
    bomb = zlib.compress(bytes(100 << 20))  # 100 MiB of zeros in ~100 KiB
    with pytest.raises(DecodeError, match="more than"):
        decode_with({"id": "zlib"}, None, bomb)


def test_a_chunk_that_decodes_to_less_than_its_size_is_an_error() -> None:
    short = zlib.compress(VALUES.tobytes()[:-8])
    with pytest.raises(DecodeError):
        decode_with({"id": "zlib"}, None, short)
    with pytest.raises(DecodeError):
        decode_with(None, None, VALUES.tobytes()[:-1])  # uncompressed, one byte short
    with pytest.raises(DecodeError):
        decode_with({"id": "zlib"}, None, zlib.compress(VALUES.tobytes())[:-10])  # truncated


@cache
def zlib_inputs() -> dict[str, bytes]:
    """Good, hostile and damaged zlib chunks of ``VALUES``."""
    good = zlib.compress(VALUES.tobytes(), 6)
    damaged, wrong_sum = bytearray(good), bytearray(good)
    damaged[len(good) // 2] ^= 0x55
    wrong_sum[-1] ^= 1
    return {
        "good": good,
        "bytes after the stream": good + b"after the stream",
        "bomb": zlib.compress(bytes(100 << 20)),
        "one byte more": zlib.compress(VALUES.tobytes() + b"x"),
        "8 bytes short": zlib.compress(VALUES.tobytes()[:-8]),
        **{f"cut by {n}": good[:-n] for n in (1, 2, 4, 10, len(good) // 2)},
        "damaged": bytes(damaged),
        "wrong Adler-32": bytes(wrong_sum),
        "raw deflate": good[2:-4],
        "gzip": gzip.compress(VALUES.tobytes()),
        "empty": b"",
        "header only": good[:2],
    }


@pytest.mark.parametrize("case", sorted(zlib_inputs()))
def test_libdeflate_decodes_zlib_chunks_as_the_streaming_decoder_does(case: str) -> None:
    """Where imagecodecs is installed, ``zlib`` chunks are decoded by libdeflate: the same
    bytes as zlib's streaming decoder, and an error wherever it gives one."""
    if _libdeflate() is None:
        pytest.skip("imagecodecs (libdeflate) is not installed")
    data, size = zlib_inputs()[case], VALUES.nbytes

    def outcome(stage: Stage) -> bytes | type[DecodeError]:
        try:
            return bytes(stage.decode(data, size))
        except DecodeError:
            return DecodeError

    streamed = _streaming_stage("zlib", lambda: zlib.decompressobj(15))
    expected = VALUES.tobytes() if case in ("good", "bytes after the stream") else DecodeError
    assert outcome(streamed) == expected
    assert outcome(build_stage({"id": "zlib"})) == expected


@pytest.mark.parametrize(
    "codec",
    [numcodecs.Zstd(), numcodecs.Blosc(), numcodecs.LZ4()],
    ids=lambda c: c.codec_id,
)
def test_a_frame_declaring_another_size_is_refused_before_decoding(codec) -> None:
    bigger = bytes(codec.encode(np.zeros(2000, "<f8")))
    with pytest.raises(DecodeError, match=r"declares|more"):
        decode_with(codec.get_config(), None, bigger)


@pytest.mark.parametrize(
    "config",
    [
        {"id": "pickle"},
        {"id": "json2"},
        {"id": "vlen-utf8"},
        {"id": "categorize", "labels": ["a"], "dtype": "<U1"},
        {"id": "imagecodecs_jpegxl"},
        {"id": "no-such-codec"},
        {"level": 1},
        "zlib",
        {"id": "delta", "dtype": "|O"},
        {"id": "fixedscaleoffset", "dtype": "<f8", "scale": 0, "offset": 0},
        {"id": "shuffle", "elementsize": "4; import os"},
        {"id": "lzma", "format": 3, "filters": [{"id": 33}]},
    ],
)
def test_codecs_outside_the_allowlist_or_with_bad_parameters_are_refused(config) -> None:
    with pytest.raises(CodecError):
        build_stage(config)


def test_an_unknown_codec_leaves_the_array_readable_as_errors_naming_it() -> None:
    array = parse_zarray(zarray(compressor={"id": "imagecodecs_jpegxl", "level": 90}))
    assert "imagecodecs_jpegxl" in (array.decoder.error or "")
    with pytest.raises(DecodeError, match="imagecodecs_jpegxl"):
        array.decoder.decode(b"anything")
    pickled = parse_zarray(zarray(filters=[{"id": "pickle", "protocol": 5}]))
    assert "pickle" in (pickled.decoder.error or "")


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"chunks": [1 << 40, 1 << 40], "shape": [10, 10]}, "over the bound"),
        ({"chunks": [MAX_CHUNK_BYTES // 8 + 1]}, "over the bound"),
        ({"chunks": [0]}, "positive"),
        ({"chunks": [-1]}, "dimensions"),
        ({"chunks": [10, 10]}, "dimensions"),
        ({"chunks": [True]}, "dimensions"),
        ({"dtype": "|O"}, "variable-length"),
        ({"dtype": [["a", "|O"]]}, "dtype"),  # records are served; of objects not
        ({"dtype": "<f3"}, "dtype"),
        ({"order": "X"}, "order"),
        ({"zarr_format": 3}, "Zarr v2"),
        ({"dimension_separator": "-"}, "dimension_separator"),
    ],
)
def test_arrays_the_view_cannot_present_are_refused_with_a_reason(fields, reason) -> None:
    with pytest.raises(ArrayRefused, match=reason):
        parse_zarray(zarray(**fields))
    with pytest.raises(ArrayRefused, match="JSON"):
        parse_zarray(b"{not json")


def test_same_codecs_and_layout_share_a_decoder_key() -> None:
    a = parse_zarray(zarray(compressor={"id": "zlib", "level": 1}))
    b = parse_zarray(zarray(compressor={"id": "zlib", "level": 1}, shape=[5000]))
    c = parse_zarray(zarray(compressor={"id": "zlib", "level": 2}))
    assert a.decoder.key == b.decoder.key != c.decoder.key


# -- the view's keys ---------------------------------------------------------------------


def write_refs(path: Path, refs: dict) -> Path:
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path


def test_the_view_presents_decoded_sizes_rewritten_metadata_and_leaves_out_strings(
    tmp_path: Path,
) -> None:
    chunk = zlib.compress(VALUES.tobytes())
    meta = zarray(compressor={"id": "zlib"}, shape=[2000], fill_value=math.nan).decode()
    strings = zarray(dtype="|O", filters=[{"id": "vlen-utf8"}]).decode()
    consolidated = {
        "zarr_consolidated_format": 1,
        "metadata": {
            ".zgroup": {"zarr_format": 2},
            "v/.zarray": json.loads(meta),
            "v/.zattrs": {"_ARRAY_DIMENSIONS": ["x"], "missing": math.nan},
            "s/.zarray": json.loads(strings),
            "s/.zattrs": {"_ARRAY_DIMENSIONS": ["x"]},
        },
    }
    refs = {
        ".zgroup": '{"zarr_format":2}',
        ".zmetadata": json.dumps(consolidated),
        "v/.zarray": meta,
        "v/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["x"], "title": "caf\u00e9"}),
        "v/0": "base64:" + __import__("base64").b64encode(chunk).decode(),
        "v/1": ["http://127.0.0.1:9/data.bin", 100, len(chunk)],
        "s/.zarray": strings,
        "s/0": "base64:AAAA",
        "notes.txt": "plain",
    }
    raw = open_refset(str(write_refs(tmp_path / "refs.json", refs)), allow_local=True)
    view = DecodedRefSet(raw, 7)

    assert [c.name for c in view.children("")] == [".zgroup", ".zmetadata", "notes.txt", "v"]
    assert not view.is_dir("s") and view.file_id("s/.zarray") is None
    assert view.file_id("s/0") is None
    for name in ("0", "1"):
        file_id = view.file_id(f"v/{name}")
        ref = view.ref(file_id)
        assert isinstance(ref, DecodedRef) and ref.url == f"{SCHEME}7/{file_id}"
        assert ref.length == view.file_size(file_id) == 8000
    zarray_text = view.ref(view.file_id("v/.zarray")).data
    assert json.loads(zarray_text)["fill_value"] == "NaN"
    zattrs = view.ref(view.file_id("v/.zattrs")).data
    assert "café".encode() in zattrs
    zmetadata = json.loads(view.ref(view.file_id(".zmetadata")).data)
    assert sorted(zmetadata["metadata"]) == [".zgroup", "v/.zarray", "v/.zattrs"]
    assert zmetadata["metadata"]["v/.zattrs"]["missing"] == "NaN"
    assert zmetadata["metadata"]["v/.zarray"]["compressor"] is None
    assert view.ref(view.file_id("notes.txt")).data == b"plain"
    assert view.file_size(view.file_id("v/.zattrs")) == len(zattrs)


def test_check_decode_lists_what_the_view_cannot_decode_or_leaves_out(tmp_path: Path) -> None:
    from tests.conftest import refmount_cli

    refs = {
        ".zgroup": '{"zarr_format":2}',
        "good/.zarray": zarray(compressor={"id": "zlib"}).decode(),
        "odd/.zarray": zarray(compressor={"id": "imagecodecs_jpegxl"}).decode(),
        "g/text/.zarray": zarray(dtype="|O", filters=[{"id": "vlen-utf8"}]).decode(),
        "g/text/0": "base64:AAAA",
    }
    path = write_refs(tmp_path / "refs.json", refs)
    plain = refmount_cli("check", str(path))
    assert plain.returncode == 0, plain.stdout + plain.stderr
    result = refmount_cli("check", "--decode", "--json", str(path))
    assert result.returncode == 1
    notes = {note["array"]: note for note in json.loads(result.stdout)["arrays"]}
    assert {name: note["status"] for name, note in notes.items()} == {
        "good": "decoded",
        "odd": "not decoded",
        "g/text": "left out",
    }
    assert "imagecodecs_jpegxl" in notes["odd"]["reason"]
    assert "variable-length" in notes["g/text"]["reason"]
    text = refmount_cli("check", "--decode", str(path)).stdout
    assert "1 arrays decoded, 1 not decoded (EIO), 1 left out" in text


def test_nested_chunk_keys_and_overflowing_arrays_in_the_view(tmp_path: Path) -> None:
    nested = zarray(shape=[4, 4], chunks=[2, 2], dimension_separator="/").decode()
    huge = zarray(shape=[10], chunks=[1 << 40]).decode()
    refs = {
        "n/.zarray": nested,
        "n/0/0": "base64:" + "A" * 44,
        "n/1/1": "base64:" + "A" * 44,
        "n/0/notes": "text",
        "huge/.zarray": huge,
        "huge/0": "base64:AAAA",
    }
    raw = open_refset(str(write_refs(tmp_path / "refs.json", refs)), allow_local=True)
    view = DecodedRefSet(raw, 0)
    for key in ("n/0/0", "n/1/1"):
        ref = view.ref(view.file_id(key))
        assert isinstance(ref, DecodedRef) and ref.length == 2 * 2 * 8
    assert not isinstance(view.ref(view.file_id("n/0/notes")), DecodedRef)
    assert view.file_id("huge/0") is None and not view.is_dir("huge")
    assert [c.name for c in view.children("")] == ["n"]
    assert "over the bound" in str(view.array_at("huge"))


def test_decode_is_a_flag_and_a_mount_option() -> None:
    from refmount.options import parse_args

    assert not parse_args(["refs.json", "mnt"]).decode
    assert parse_args(["--decode", "refs.json", "mnt"]).decode
    assert parse_args(["-o", "ro,decode", "refs.json", "mnt"]).decode


def test_metadata_nested_too_deep_is_refused_or_served_as_it_is(tmp_path: Path) -> None:
    deep = "[" * 50_000 + "]" * 50_000
    deep_zarray = zarray().decode().replace('"fill_value": null', f'"fill_value": {deep}')
    with pytest.raises(ArrayRefused, match="deep"):
        parse_zarray(deep_zarray.encode())
    compressor = zarray().decode().replace('"compressor": null', f'"compressor": {deep}')
    with pytest.raises(ArrayRefused, match="deep"):
        parse_zarray(compressor.encode())
    attrs = '{"a": ' + deep + "}"
    refs = {"v/.zarray": zarray().decode(), "v/.zattrs": attrs, "v/0": "base64:AAAA"}
    raw = open_refset(str(write_refs(tmp_path / "refs.json", refs)), allow_local=True)
    view = DecodedRefSet(raw, 0)
    assert view.ref(view.file_id("v/.zattrs")).data == attrs.encode()
    assert [c.name for c in view.children("v")] == [".zarray", ".zattrs", "0"]


# -- rank-0 arrays: one element along _scalar_ ------------------------------------------


def test_a_rank0_zarray_is_rewritten_as_one_element_decoding_to_one_value() -> None:
    array = parse_zarray(
        zarray(shape=[], chunks=[], dtype=">i4", compressor={"id": "zlib"}, fill_value=-1)
    )
    assert array.scalar and array.is_chunk_name("0") and not array.is_chunk_name("0.0")
    rewritten = json.loads(array.rewritten())
    assert (rewritten["shape"], rewritten["chunks"]) == ([1], [1])
    assert (rewritten["dtype"], rewritten["compressor"], rewritten["fill_value"]) == (
        "<i4",
        None,
        -1,
    )
    assert array.decoder.size == 4
    assert array.decoder.decode(zlib.compress(np.array(-123456, ">i4").tobytes())) == (
        np.array(-123456, "<i4").tobytes()
    )
    one = parse_zarray(zarray(shape=[1], chunks=[1]))
    assert not one.scalar and json.loads(one.rewritten())["shape"] == [1]


def scalar_set(tmp_path: Path, **extra: str) -> DecodedRefSet:
    """A group with a rank-0 ``crs`` (attributes, VirtualiZarr's chunk key ``crs/``), a
    rank-0 ``bare`` without attributes, and a 1-D ``v``, consolidated or not."""
    crs = zarray(shape=[], chunks=[], dtype="<i4", fill_value=0).decode()
    bare = zarray(shape=[], chunks=[], dtype="<f8", fill_value=None).decode()
    refs = {
        ".zgroup": '{"zarr_format":2}',
        "crs/.zarray": crs,
        "crs/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": [], "grid_mapping_name": "lcc"}),
        "crs/": "base64:" + __import__("base64").b64encode(np.int32(7).tobytes()).decode(),
        "bare/.zarray": bare,
        "bare/0": "base64:" + __import__("base64").b64encode(np.float64(2.5).tobytes()).decode(),
        "v/.zarray": zarray(shape=[3], chunks=[3]).decode(),
        "v/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["x"]}),
        **extra,
    }
    path = write_refs(tmp_path / "refs.json", refs)
    return DecodedRefSet(open_refset(str(path), allow_local=True), 1)


def test_rank0_arrays_are_served_along_scalar_with_attributes_made_where_missing(
    tmp_path: Path,
) -> None:
    view = scalar_set(tmp_path)
    for name in ("crs", "bare"):
        meta = json.loads(view.ref(view.file_id(f"{name}/.zarray")).data)
        assert (meta["shape"], meta["chunks"]) == ([1], [1])
    crs_attrs = json.loads(view.ref(view.file_id("crs/.zattrs")).data)
    assert crs_attrs == {"_ARRAY_DIMENSIONS": ["_scalar_"], "grid_mapping_name": "lcc"}
    assert json.loads(view.ref(view.file_id("v/.zattrs")).data) == {"_ARRAY_DIMENSIONS": ["x"]}

    # bare has no .zattrs in the set: the view makes one, listed once, after its own keys
    listed = list(view.children("bare"))
    assert [c.name for c in listed] == [".zarray", "0", ".zattrs"]
    made = view.file_id("bare/.zattrs")
    assert made is not None and listed[-1].file_id == made
    assert made >= view.raw.file_id("v/.zattrs") + 1000
    assert view.key(made) == "bare/.zattrs"
    text = view.ref(made).data
    assert json.loads(text) == {"_ARRAY_DIMENSIONS": ["_scalar_"]}
    assert view.file_size(made) == len(text)
    assert [c.name for c in view.children("bare", listed[-2].cursor)] == [".zattrs"]
    assert list(view.children("bare", listed[-1].cursor)) == []
    assert [c.name for c in view.children("crs")] == [".zarray", ".zattrs", "0"]
    assert view.file_id("v/.zattrs") == view.raw.file_id("v/.zattrs")
    assert view.file_id("nothing/.zattrs") is None and view.file_id("v/nothing") is None

    # the one chunk is key 0 (VirtualiZarr's "crs/" included), one value decoded
    for name, value in (("crs", np.int32(7)), ("bare", np.float64(2.5))):
        chunk = view.ref(view.file_id(f"{name}/0"))
        assert isinstance(chunk, DecodedRef) and chunk.length == value.itemsize
        assert chunk.decoder.decode(chunk.source.data) == value.tobytes()
        assert view.file_size(view.file_id(f"{name}/0")) == value.itemsize


def test_rank0_arrays_in_zmetadata_name_their_dimension(tmp_path: Path) -> None:
    consolidated = {
        "zarr_consolidated_format": 1,
        "metadata": {
            ".zgroup": {"zarr_format": 2},
            "crs/.zarray": json.loads(zarray(shape=[], chunks=[], dtype="<i4")),
            "crs/.zattrs": {"grid_mapping_name": "lcc"},
            "bare/.zarray": json.loads(zarray(shape=[], chunks=[])),
            "v/.zarray": json.loads(zarray(shape=[3], chunks=[3])),
            "v/.zattrs": {"_ARRAY_DIMENSIONS": ["x"]},
        },
    }
    view = scalar_set(tmp_path, **{".zmetadata": json.dumps(consolidated)})
    entries = json.loads(view.ref(view.file_id(".zmetadata")).data)["metadata"]
    assert entries["crs/.zattrs"] == {"grid_mapping_name": "lcc", "_ARRAY_DIMENSIONS": ["_scalar_"]}
    assert entries["bare/.zattrs"] == {"_ARRAY_DIMENSIONS": ["_scalar_"]}
    assert entries["v/.zattrs"] == {"_ARRAY_DIMENSIONS": ["x"]}
    for name in ("crs", "bare"):
        assert (entries[f"{name}/.zarray"]["shape"], entries[f"{name}/.zarray"]["chunks"]) == (
            [1],
            [1],
        )
    assert entries["v/.zarray"]["shape"] == [3]
    assert sorted(entries) == sorted([*consolidated["metadata"], "bare/.zattrs"])


def test_a_made_zattrs_is_found_and_read_through_the_async_interface(tmp_path: Path) -> None:
    view = scalar_set(tmp_path)

    async def main() -> None:
        made = await view.find_file("bare/.zattrs")
        assert made is not None and made == view.file_id("bare/.zattrs")
        made_text = (await view.file_ref(made)).data
        assert json.loads(made_text) == {"_ARRAY_DIMENSIONS": ["_scalar_"]}
        assert await view.find_file("v/.zattrs") == view.raw.file_id("v/.zattrs")

    trio.run(main)
