"""The decoded view of a Zarr v3 tree (issue 21): ``zarr.json`` metadata as a Zarr v2
tree, v3 codec pipelines through the v2 decoding, data types, refusals.

The trees are what zarr 3 writes (tests/support/v3_sets.py), served from JSON reference
sets; tests/test_decode_readers_v3.py reads them, and VirtualiZarr's Icechunk metadata,
with every reader of the matrix.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import struct
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
import trio
import xarray as xr
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec

from refmount.decode import ArrayRefused, DecodedRefSet, DecodeError, parse_zarray
from refmount.decode import view as view_module
from refmount.decode.v3.codecs import v2_pipeline
from refmount.decode.v3.metadata import Array, parse_node
from refmount.decode.v3.tree import V3AsV2
from refmount.decode.view import DecodedRef
from refmount.refs import open_refset
from tests.conftest import Mounted
from tests.support.mounting import REFMOUNT, child_env
from tests.support.v3_sets import native_arrays, store_refs, write_refs


def node(**fields: object) -> bytes:
    meta: dict[str, object] = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [4, 6],
        "data_type": "float32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 3]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": "NaN",
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "attributes": {},
        "dimension_names": ["y", "x"],
    }
    meta.update(fields)
    return json.dumps(meta).encode()


def array(**fields: object) -> Array:
    found = parse_node(node(**fields))
    assert isinstance(found, Array)
    return found


# -- metadata -----------------------------------------------------------------------------


def test_virtualizarr_metadata_becomes_a_v2_zarray_with_the_same_codecs() -> None:
    """VirtualiZarr's v3 metadata of a netCDF4 zlib + shuffle variable (as its Icechunk
    repository holds it) is the .zarray kerchunk would write, plus its separator."""
    found = array(
        data_type="int16",
        fill_value=-32767,
        codecs=[
            {"name": "bytes", "configuration": {"endian": "little"}},
            {"name": "numcodecs.shuffle", "configuration": {"elementsize": 2}},
            {"name": "numcodecs.zlib", "configuration": {"level": 4}},
        ],
        attributes={"scale_factor": 0.01, "_FillValue": -32767},
        dimension_names=["y", None],
    )
    assert found.zarray == {
        "zarr_format": 2, "shape": [4, 6], "chunks": [2, 3], "dtype": "<i2",
        "compressor": {"id": "zlib", "level": 4},
        "filters": [{"id": "shuffle", "elementsize": 2}],
        "fill_value": -32767, "order": "C", "dimension_separator": "/",
    }  # fmt: skip
    assert found.attributes == {
        "scale_factor": 0.01, "_FillValue": -32767, "_ARRAY_DIMENSIONS": ["y", "_Anonymous_Dim_6"]
    }  # fmt: skip


@pytest.mark.parametrize(
    ("stored", "number"),
    [
        (base64.b64encode(struct.pack("<d", -999.0)).decode(), -999.0),
        (base64.b64encode(struct.pack("<d", 9.969209968386869e36)).decode(), 9.969209968386869e36),
    ],
)
def test_a_base64_fill_value_attribute_becomes_its_number(stored: str, number: object) -> None:
    assert array(attributes={"_FillValue": stored}).attributes["_FillValue"] == number


@pytest.mark.parametrize(
    "stored",
    [base64.b64encode(struct.pack("<d", float("nan"))).decode(), "NaN", "not base64 of a double"],
)
def test_a_float_fill_value_attribute_that_is_no_number_is_left_to_fill_value(
    tmp_path: Path, stored: str
) -> None:
    """Text would be a char ``_FillValue`` to netCDF-C on a float variable (issue 29)."""
    refs = {"zarr.json": group_json(), "a/zarr.json": node(attributes={"_FillValue": stored})}
    view = DecodedRefSet(v3_view(refs, tmp_path).raw, 0)
    attributes = json.loads(view.ref(view.file_id("a/.zattrs")).data)
    assert "_FillValue" not in attributes


@pytest.mark.parametrize(
    ("fill", "data_type", "v2"),
    [
        ("NaN", "float32", "NaN"),
        ("-Infinity", "float64", "-Infinity"),
        ("0x7fc00000", "float32", "NaN"),
        ("0x3ff8000000000000", "float64", 1.5),
        (True, "bool", 1),
        (None, "int8", None),
    ],
)
def test_fill_values_are_written_as_v2_writes_them(
    fill: object, data_type: str, v2: object
) -> None:
    zarray = array(fill_value=fill, data_type=data_type).zarray
    served = parse_zarray(json.dumps(zarray).encode())
    assert json.loads(served.rewritten())["fill_value"] == v2


@pytest.mark.parametrize(
    ("data_type", "endian", "stored", "dtype", "attributes"),
    [
        ("bool", None, "|b1", "|u1", {}),
        ("uint8", None, "|u1", "|u1", {}),
        ("int64", "big", ">i8", "<i8", {}),
        ("float16", "little", "<f2", "<f4", {}),
        ({"name": "numpy.datetime64", "configuration": {"unit": "s", "scale_factor": 1}},
         "little", "<M8[s]", "<i8",
         {"units": "seconds since 1970-01-01T00:00:00", "calendar": "proleptic_gregorian"}),
        ({"name": "numpy.timedelta64", "configuration": {"unit": "ms", "scale_factor": 1}},
         "big", ">m8[ms]", "<i8", {"units": "milliseconds"}),
    ],
)  # fmt: skip
def test_data_types_become_the_v2_dtype_then_what_every_reader_reads(
    data_type: object, endian: str | None, stored: str, dtype: str, attributes: dict
) -> None:
    """The v3 tree says the v2 dtype of the same bytes; the decoded view serves it as
    :mod:`refmount.decode.dtypes` decides, for kerchunk sets alike."""
    serializer = {"name": "bytes", "configuration": {"endian": endian} if endian else {}}
    found = array(data_type=data_type, codecs=[serializer], fill_value=0)
    assert found.zarray["dtype"] == stored
    assert found.attributes == {"_ARRAY_DIMENSIONS": ["y", "x"]}
    served = parse_zarray(json.dumps(found.zarray).encode())
    assert json.loads(served.rewritten())["dtype"] == dtype
    assert served.attributes == attributes and served.decoder.error is None


@pytest.mark.parametrize(
    ("data_type", "stored", "dtype"),
    [
        ({"name": "fixed_length_utf32", "configuration": {"length_bytes": 20}}, "<U5", "|S20"),
        ({"name": "null_terminated_bytes", "configuration": {"length_bytes": 7}}, "|S7", "|S7"),
    ],
)
def test_fixed_width_strings_are_served_only_when_asked(
    data_type: dict, stored: str, dtype: str
) -> None:
    found = parse_node(node(data_type=data_type, fill_value=""))
    assert isinstance(found, Array) and found.zarray["dtype"] == stored
    zarray = json.dumps(found.zarray).encode()
    with pytest.raises(ArrayRefused, match=r"fixed-width strings \(.*\): Debian's ncdump"):
        parse_zarray(zarray)
    served = parse_zarray(zarray, fixed_strings=True)
    assert json.loads(served.rewritten())["dtype"] == dtype


@pytest.mark.parametrize(
    ("data_type", "reason"),
    [
        ("complex64", "complex values \\(<c8\\): Debian's ncdump"),
        ({"name": "numpy.datetime64", "configuration": {"unit": "Y"}}, "CF time units"),
        ({"name": "numpy.datetime64", "configuration": {"unit": "s", "scale_factor": 10}},
         "unit 10s"),
    ],
)  # fmt: skip
def test_data_types_v2_readers_cannot_read_are_left_out_by_the_view(
    data_type: object, reason: str
) -> None:
    zarray = json.dumps(array(data_type=data_type, fill_value=0).zarray).encode()
    with pytest.raises(ArrayRefused, match=reason):
        parse_zarray(zarray, fixed_strings=True)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"data_type": "string", "codecs": [{"name": "vlen-utf8"}]}, "variable-length"),
        ({"data_type": "r16"}, "no Zarr v2 dtype"),
        ({"data_type": {"name": "numpy.datetime64", "configuration": {"unit": "eon"}}}, "unit"),
        (
            {"codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [3, 3]}}]},
            "do not divide shards",
        ),
        (
            {
                "codecs": [
                    {
                        "name": "sharding_indexed",
                        "configuration": {
                            "chunk_shape": [1, 1],
                            "index_codecs": [{"name": "bytes"}, {"name": "zstd"}],
                        },
                    }
                ]
            },
            "shard index codecs",
        ),
        (
            {
                "codecs": [
                    {
                        "name": "sharding_indexed",
                        "configuration": {
                            "chunk_shape": [1, 1],
                            "index_codecs": [{"name": "bytes"}],
                        },
                    },
                    {"name": "gzip"},
                ]
            },
            "codecs around sharding_indexed",
        ),
        ({"codecs": [{"name": "transpose", "configuration": {"order": [0, 0]}}]}, "permutation"),
        ({"chunk_grid": {"name": "rectilinear"}}, "no configuration"),
        (
            {
                "chunk_grid": {
                    "name": "rectilinear",
                    "configuration": {"kind": "inline", "chunk_shapes": [[1, 3], 3]},
                }
            },
            "irregular",
        ),
        ({"chunk_grid": {"name": "hexagonal", "configuration": {}}}, "neither regular"),
        ({"chunk_key_encoding": {"name": "custom"}}, "chunk_key_encoding"),
        ({"dimension_names": ["y"]}, "dimension_names"),
        ({"storage_transformers": [{"name": "x"}]}, "storage transformers"),
        ({"zarr_format": 2}, "not Zarr v3"),
    ],
)
def test_what_v2_cannot_say_is_refused_with_its_reason(fields: dict, reason: str) -> None:
    with pytest.raises(ArrayRefused, match=reason):
        parse_node(node(**fields))


@pytest.mark.parametrize(
    "fields",
    [
        {"shape": "4"},
        {"shape": [4, -1]},
        {"shape": [4]},  # two chunk sizes
        {"chunk_grid": {"name": "regular", "configuration": [2, 3]}},
        {"chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [0, 3]}}},
        {"data_type": {"name": "numpy.datetime64", "configuration": ["s"]}},
        {"chunk_key_encoding": {"name": "default", "configuration": "/"}},
        {"fill_value": "0x7fc"},
        {"fill_value": "nan"},
        {"codecs": [{"name": "bytes", "configuration": ["little"]}]},
        {"codecs": "bytes"},
        {"codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": "1"}}]},
        {"attributes": ["a"]},
    ],
)
def test_malformed_metadata_is_refused_not_a_crash(fields: dict) -> None:
    with pytest.raises(ArrayRefused):
        parse_node(node(**fields))


def test_transpose_is_the_order_and_unknown_codecs_keep_their_name() -> None:
    transposed = v2_pipeline(
        [{"name": "transpose", "configuration": {"order": [2, 1, 0]}}, {"name": "bytes"}], 3
    )
    assert transposed.order == "F" and transposed.compressor is None
    unknown = v2_pipeline(
        [{"name": "bytes"}, {"name": "numcodecs.pickle"}, {"name": "imagecodecs_jpeg"}], 2
    )
    assert unknown.filters == [{"id": "numcodecs.pickle"}]
    assert unknown.compressor == {"id": "imagecodecs_jpeg"}
    decoder = parse_zarray(
        json.dumps({**array().zarray, "filters": unknown.filters, "compressor": None}).encode()
    ).decoder
    assert decoder.error == "codec 'numcodecs.pickle' is not one refmount decodes"


def test_a_crc32c_after_zstd_is_checked_then_decompressed() -> None:
    """zarr 3's ``[bytes, zstd, crc32c]``: the checksum runs before the compressor's
    output size is known; the chunk is checked, and a flipped byte is an error."""
    values = np.arange(6, dtype="<f4")
    store: dict = {}
    written = zarr.create_array(
        store, shape=(6,), chunks=(6,), dtype="f4",
        serializer=BytesCodec(), compressors=[ZstdCodec(level=1), Crc32cCodec()],
    )  # fmt: skip
    written[...] = values
    meta = parse_node(store["zarr.json"].to_bytes())
    assert isinstance(meta, Array)
    assert meta.zarray["filters"] == [{"id": "zstd"}]
    assert meta.zarray["compressor"] == {"id": "crc32c"}
    decoder = parse_zarray(json.dumps(meta.zarray).encode()).decoder
    raw = store["c/0"].to_bytes()
    assert decoder.decode(raw) == values.tobytes()
    with pytest.raises(DecodeError, match="crc32c: the checksum"):
        decoder.decode(raw[:5] + bytes([raw[5] ^ 1]) + raw[6:])
    garbled = b"\0" * (len(raw) - 4)  # not zstd, with a right checksum
    with pytest.raises(DecodeError, match="zstd"):
        decoder.decode(garbled + google_crc32c.value(garbled).to_bytes(4, "little"))


# -- the tree -------------------------------------------------------------------------------


def group_json(**attributes: object) -> bytes:
    return json.dumps({"zarr_format": 3, "node_type": "group", "attributes": attributes}).encode()


def v3_view(refs: dict[str, bytes | str], tmp_path: Path) -> V3AsV2:
    text = {k: v.decode() if isinstance(v, bytes) else v for k, v in refs.items()}
    raw = open_refset(str(write_refs({"version": 1, "refs": text}, tmp_path / "refs.json")))
    assert isinstance(DecodedRefSet(raw, 0).raw, V3AsV2)
    return V3AsV2(raw)


def names(view: V3AsV2, path: str) -> list[str]:
    return [child.name for child in view.children(path)]


def test_the_v2_tree_of_a_zarr3_store(tmp_path: Path) -> None:
    """Keys as v2 readers look them up: metadata per node, no zarr.json, chunks under
    their v2 names and the same file ids as their v3 keys; ``.zmetadata`` lists every
    node; a sharded array's inner chunks are its chunks, ``i.j``, each referencing its
    shard."""
    native_arrays(tmp_path / "store.zarr")
    raw = open_refset(str(write_refs(store_refs(tmp_path / "store.zarr"), tmp_path / "r.json")))
    view = V3AsV2(raw)
    assert names(view, "")[:3] == [".zgroup", ".zattrs", ".zmetadata"]
    assert "zarr.json" not in names(view, "") and "default" in names(view, "")
    assert names(view, "default") == [".zarray", ".zattrs", "0", "1", "2"]
    assert names(view, "default/1") == ["0", "1", "2"]
    chunk = view.file_id("default/1/2")
    assert chunk == raw.file_id("default/c/1/2") and view.key(chunk) == "default/1/2"
    assert view.ref(chunk) == raw.ref(chunk)
    assert view.file_id("default/zarr.json") is None and view.file_id("default/c/1/2") is None
    assert view.is_dir("default/1") and not view.is_dir("default/c")
    zarray = json.loads(view.ref(view.file_id("default/.zarray")).data)
    assert zarray["dimension_separator"] == "/" and zarray["compressor"] == {"id": "zstd"}
    consolidated = json.loads(view.ref(view.file_id(".zmetadata")).data)["metadata"]
    assert consolidated[".zattrs"] == {"title": "zarr 3 native"}
    assert consolidated["gzip/.zattrs"] == {"_ARRAY_DIMENSIONS": ["gzip_0"]}
    assert {k.partition("/")[0] for k in consolidated if "/" in k} == {
        "default", "transposed", "checksummed", "zstd_crc32c", "gzip", "blosc", "bigendian",
        "sharded", "sharded_edge",
    }  # fmt: skip
    assert consolidated["sharded_edge/.zarray"]["chunks"] == [2, 2]
    assert consolidated["sharded_edge/.zarray"]["dimension_separator"] == "."
    # 5 x 4 inner chunks in 3 x 2 shards of 2 x 2, all written but (2, 0), whose shard is
    # there: it is listed and reads as the fill value
    inner = names(view, "sharded_edge")[2:]
    assert inner == [f"{i}.{j}" for i in range(5) for j in range(4)]
    assert not view.is_dir("sharded_edge/1")
    one = view.file_id("sharded_edge/3.1")
    assert view.key(one) == "sharded_edge/3.1"
    assert view.ref(one) == raw.ref(raw.file_id("sharded_edge/c/1/0"))
    assert view.inner_chunk(one) == (view.node("sharded_edge").shards, 3)
    assert view.file_id("sharded_edge/5.0") is None and view.file_id("sharded_edge/0/0") is None


@pytest.mark.parametrize(
    ("encoding", "chunk_key"),
    [
        ({"name": "default", "configuration": {"separator": "."}}, "a/c.1.0"),
        ({"name": "v2", "configuration": {"separator": "."}}, "a/1.0"),
        ({"name": "v2", "configuration": {"separator": "/"}}, "a/1/0"),
    ],
)
def test_other_chunk_key_encodings(encoding: dict, chunk_key: str, tmp_path: Path) -> None:
    separator = encoding["configuration"]["separator"]
    values = np.arange(6, dtype="<f4").reshape(2, 3)
    view = v3_view({
        "zarr.json": group_json(),
        "a/zarr.json": node(chunk_key_encoding=encoding),
        chunk_key: "base64:" + base64.b64encode(values.tobytes()).decode(),
    }, tmp_path)  # fmt: skip
    presented = f"a/1{separator}0"
    file_id = view.file_id(presented)
    assert file_id is not None and view.key(file_id) == presented
    listed = names(view, "a") if separator == "." else names(view, "a/1")
    assert listed == [".zarray", ".zattrs", "1.0"] if separator == "." else ["0"]
    zarray = json.loads(view.ref(view.file_id("a/.zarray")).data)
    assert zarray["dimension_separator"] == separator


def test_a_rank0_array_chunk_c_is_0(tmp_path: Path) -> None:
    view = v3_view({
        "zarr.json": group_json(),
        "s/zarr.json": node(shape=[], dimension_names=None, chunk_grid={
            "name": "regular", "configuration": {"chunk_shape": []}
        }),
        "s/c": "base64:" + base64.b64encode(np.float32(2.5).tobytes()).decode(),
    }, tmp_path)  # fmt: skip
    assert names(view, "s") == [".zarray", ".zattrs", "0"]
    assert view.file_id("s/0") == view.raw.file_id("s/c")
    decoded = DecodedRefSet(view.raw, 0)
    zarray = json.loads(decoded.ref(decoded.file_id("s/.zarray")).data)
    assert zarray["shape"] == [1] and zarray["chunks"] == [1]
    attributes = json.loads(decoded.ref(decoded.file_id("s/.zattrs")).data)
    assert attributes == {"_ARRAY_DIMENSIONS": ["_scalar_"]}


# -- through a mount ------------------------------------------------------------------------


TYPES = {
    "flags": np.array([True, False, True, True]),
    "waves": np.array([1 + 2j, -3.5j, 0, 4], dtype="c8"),
    "times": np.array(
        ["2001-01-01T00:00:00", "2001-01-01T06:00:00", "NaT", "1970-01-01"], dtype="M8[s]"
    ),
    "names": np.array(["Zürich", "Ås", "", "Genève"], dtype="U6"),
    "codes": np.array([b"AB", b"C", b"", b"DEF"], dtype="S3"),
    "level": np.array([1.5, 2.5, 3.5, 4.5], dtype="f4"),
}
VLEN = np.array(["a", "bc", "Zürich", ""], dtype=object)


@pytest.fixture
def types_refs(tmp_path: Path) -> Path:
    """A v3 store of every data type, and a variable-length string array ``text``."""
    store = tmp_path / "types.zarr"
    group = zarr.open_group(store, mode="w")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", zarr.errors.UnstableSpecificationWarning)
        for name, data in TYPES.items():
            group.create_array(name, data=data, chunks=(3,), dimension_names=["n"])
        group.create_array("text", shape=(4,), chunks=(3,), dtype=str)[...] = VLEN
    return write_refs(store_refs(store), tmp_path / "types.json")


def check_decode(refs: Path, *args: str) -> list[str]:
    done = subprocess.run(
        [*REFMOUNT, "check", "--decode", *args, str(refs)],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    return sorted(
        line.split(":")[1].strip() for line in done.stdout.splitlines() if ": left out:" in line
    )


def test_data_types_through_the_decoded_mount(
    mount: Callable[..., Mounted], types_refs: Path
) -> None:
    """Debian's ncdump reads the whole tree: bool as 0 and 1, times as integers with CF
    units (xarray decodes them to the same times); complex and strings are left out,
    named by ``check --decode``; the raw view is the v3 tree unchanged."""
    mounted = mount(types_refs, "--decode")
    root = mounted.mountpoint
    assert sorted(os.listdir(root)) == [
        ".zattrs",
        ".zgroup",
        ".zmetadata",
        "flags",
        "level",
        "times",
    ]
    done = subprocess.run(
        ["ncdump", f"file://{root}#mode=zarr,file"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert " flags = 1, 0, 1, 1 ;" in done.stdout and " level = 1.5, 2.5, 3.5, 4.5 ;" in done.stdout
    assert 'times:units = "seconds since 1970-01-01T00:00:00" ;' in done.stdout
    opened = zarr.open_group(str(root), mode="r", zarr_format=2)
    assert opened["flags"][...].tolist() == [1, 0, 1, 1] and opened["flags"].dtype == "u1"
    assert opened["times"][...].tolist() == TYPES["times"].view("i8").tolist()
    with xr.open_zarr(str(root), consolidated=True) as ds:
        assert ds["times"].values.astype("M8[s]").tolist() == TYPES["times"].tolist()
    assert check_decode(types_refs) == ["codes", "names", "text", "waves"]
    for name in ("waves", "names", "codes"):
        assert mounted.log().count(f"array {name!r} is left out") == 1
    assert f"node {'text'!r} is left out" in mounted.log()
    raw = mount(types_refs)
    assert sorted(os.listdir(raw.mountpoint)) == sorted([*TYPES, "text", "zarr.json"])
    stored = json.loads(types_refs.read_text())["refs"]["flags/zarr.json"]
    assert (raw.mountpoint / "flags" / "zarr.json").read_text() == stored


def test_a_corrupt_checksummed_chunk_is_eio(mount: Callable[..., Mounted], tmp_path: Path) -> None:
    store = tmp_path / "crc.zarr"
    data = np.arange(8, dtype="<i4")
    written = zarr.create_array(store, shape=(8,), chunks=(4,), dtype="i4",
                                compressors=[Crc32cCodec()])  # fmt: skip
    written[...] = data
    chunk = store / "c" / "1"
    chunk.write_bytes(chunk.read_bytes()[:-1] + b"\xff")
    mounted = mount(write_refs(store_refs(store), tmp_path / "crc.json"), "--decode")
    assert (mounted.mountpoint / "0").read_bytes() == data[:4].tobytes()
    with pytest.raises(OSError) as failed:
        (mounted.mountpoint / "1").read_bytes()
    assert failed.value.errno == errno.EIO
    assert "crc32c: the checksum does not match" in mounted.log()
    assert mounted.process.poll() is None


def test_inner_chunks_of_a_shard_through_the_decoded_mount(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    """Each inner chunk is the decoded bytes of its place in the shard; one never written
    reads as the fill value; a shard whose index checksum fails is EIO for its inner
    chunks alone."""
    store = tmp_path / "sharded.zarr"
    values = np.arange(32, dtype="<f8").reshape(4, 8)
    values[0:2, 2:4] = 7.5
    written = zarr.create_array(
        store, shape=(4, 8), chunks=(2, 2), shards=(2, 4), dtype="f8", fill_value=7.5,
        compressors=[ZstdCodec(level=1)],
    )  # fmt: skip
    written[...] = values
    assert sorted(os.listdir(store / "c")) == ["0", "1"]
    corrupt = store / "c" / "1" / "1"
    shard = bytearray(corrupt.read_bytes())
    shard[-1] ^= 0xFF  # the index's crc32c, at the end
    corrupt.write_bytes(bytes(shard))
    mounted = mount(write_refs(store_refs(store), tmp_path / "refs.json"), "--decode")
    root = mounted.mountpoint
    assert sorted(os.listdir(root)) == [".zarray", ".zattrs"] + [
        f"{i}.{j}" for i in range(2) for j in range(4)
    ]
    for i in range(2):
        for j in range(4):
            path = root / f"{i}.{j}"
            assert path.stat().st_size == 32
            if (i, j) in ((1, 2), (1, 3)):
                with pytest.raises(OSError) as failed:
                    path.read_bytes()
                assert failed.value.errno == errno.EIO
                continue
            block = values[2 * i : 2 * i + 2, 2 * j : 2 * j + 2]
            assert path.read_bytes() == block.tobytes(), (i, j)
    assert "the shard index's crc32c does not match" in mounted.log()
    assert mounted.process.poll() is None


def test_a_shard_index_is_fetched_once_for_all_its_inner_chunks(
    mount: Callable[..., Mounted], tmp_path: Path
) -> None:
    """20 inner chunks (one not written) in 6 shards: 6 index requests (the block cache
    holds each index for its shard's other inner chunks) and one per inner chunk
    written, 20 decodings."""
    values = native_arrays(tmp_path / "store.zarr")["sharded_edge"]
    refs = write_refs(store_refs(tmp_path / "store.zarr"), tmp_path / "refs.json")
    mounted = mount(refs, "--decode", "--xattrs")
    array = mounted.mountpoint / "sharded_edge"
    inner = sorted(n for n in os.listdir(array) if not n.startswith("."))
    assert len(inner) == 20
    for name in inner:
        i, j = (int(p) for p in name.split("."))
        block = np.full((2, 2), -1, dtype="<i2")
        part = values[2 * i : 2 * i + 2, 2 * j : 2 * j + 2]
        block[: part.shape[0], : part.shape[1]] = part
        assert (array / name).read_bytes() == block.tobytes(), name
    stats = json.loads(os.getxattr(mounted.mountpoint, "user.refmount.stats"))
    assert stats["requests"] <= 6 + 19  # readahead may join neighbouring ranges
    assert (stats["decoded_chunks"], stats["decode_errors"]) == (20, 0)


def test_resolved_inner_chunks_are_bounded_and_stay_each_ones_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A view keeps at most ``RESOLVED_CHUNKS`` chunks resolved; each inner chunk's
    reference, read first, again from what is kept, or again after being dropped, is its
    own place in its own shard, as a view that never kept any resolves it."""
    store = tmp_path / "sharded.zarr"
    zarr.create_array(
        store, shape=(4, 8), chunks=(2, 2), shards=(2, 4), dtype="f8", fill_value=0,
        compressors=[ZstdCodec(level=1)],
    )[...] = np.arange(32, dtype="<f8").reshape(4, 8)  # fmt: skip
    raw = open_refset(str(write_refs(store_refs(store), tmp_path / "refs.json")))
    monkeypatch.setattr(view_module, "RESOLVED_CHUNKS", 3)
    kept, fresh = DecodedRefSet(raw, 0), DecodedRefSet(raw, 0)
    names = [f"{i}.{j}" for i in range(2) for j in range(4)]
    ids = {name: (kept.file_id(name), fresh.file_id(name)) for name in names}

    async def resolve() -> list[tuple[object, ...]]:
        found = []
        for name in [*names, *names[::-1], *names]:
            mine, theirs = ids[name]
            assert mine is not None and theirs is not None
            ref = await kept.file_ref(mine)
            assert len(kept._resolved) <= 3
            source = await kept.chunk_source(mine)
            expected = await fresh.file_ref(theirs)
            assert source is not None and isinstance(ref, DecodedRef)
            assert isinstance(expected, DecodedRef) and expected.decoder is not None
            same = ref.source == expected.source and source[2].key == expected.decoder.key
            found.append((same, ref.url, source[0], source[1], source[2].key))
        return found

    found = trio.run(resolve)
    assert all(same for same, *_ in found)
    urls = {url for _, url, *_ in found}
    assert len(urls) == 8  # one file each, never another's
    shards = {(url, shard) for _, url, _, shard, _ in found}
    assert len({shard for _, shard in shards}) == 4 and len(shards) == 8
    decoders = {(url, key) for _, url, _, _, key in found}
    assert len(decoders) == 8 and len({key for _, key in decoders}) == 2  # 2 places per shard
