"""The JSON reference format, parsed and indexed without a mount."""

from __future__ import annotations

import bz2
import gzip
import json
import logging
import lzma
from pathlib import Path
from typing import Any

import pytest
import zstandard

from refmount.errors import RefsError
from refmount.refs import Ref, open_refset, source
from refmount.refs.table import TableRefSet

SPEC_V1 = {
    "version": 1,
    "templates": {"u": "server.domain/path", "f": "{{c}}"},
    "gen": [
        {
            "key": "gen_key{{i}}",
            "url": "http://{{u}}_{{i}}",
            "offset": "{{(i + 1) * 1000}}",
            "length": "1000",
            "dimensions": {"i": {"stop": 5}},
        }
    ],
    "refs": {
        "key0": "data",
        "key1": ["http://target_url", 10000, 100],
        "key2": ["http://{{u}}", 10000, 100],
        "key3": ["http://{{f(c='text')}}", 10000, 100],
    },
}
SPEC_V0_EQUIVALENT = {
    "key0": "data",
    "key1": ["http://target_url", 10000, 100],
    "key2": ["http://server.domain/path", 10000, 100],
    "key3": ["http://text", 10000, 100],
    "gen_key0": ["http://server.domain/path_0", 1000, 1000],
    "gen_key1": ["http://server.domain/path_1", 2000, 1000],
    "gen_key2": ["http://server.domain/path_2", 3000, 1000],
    "gen_key3": ["http://server.domain/path_3", 4000, 1000],
    "gen_key4": ["http://server.domain/path_4", 5000, 1000],
}


def load(tmp_path: Path, document: object, name: str = "refs.json", **kwargs) -> TableRefSet:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    refset = open_refset(str(path), **kwargs)
    assert isinstance(refset, TableRefSet)
    return refset


def as_dict(refset: TableRefSet, path: str = "") -> dict[str, Ref]:
    """Every file below ``path`` by key, walking the tree as the filesystem does."""
    found = {}
    for child in refset.children(path):
        key = f"{path}/{child.name}" if path else child.name
        if child.file_id is None:
            assert refset.is_dir(key)
            found.update(as_dict(refset, key))
        else:
            assert refset.key(child.file_id) == key
            assert refset.file_id(key) == child.file_id
            found[key] = refset.ref(child.file_id)
    return found


def test_spec_version_1_example_equals_its_version_0_equivalent(tmp_path: Path) -> None:
    v1 = as_dict(load(tmp_path, SPEC_V1, "v1.json"))
    v0 = as_dict(load(tmp_path, SPEC_V0_EQUIVALENT, "v0.json"))
    assert v1 == v0
    assert v1["key0"] == Ref(data=b"data")
    assert v1["key3"] == Ref(url="http://text", offset=10000, length=100)
    assert v1["gen_key4"] == Ref(url="http://server.domain/path_4", offset=5000, length=1000)
    assert sorted(v1) == sorted(SPEC_V0_EQUIVALENT)


def test_every_value_kind(tmp_path: Path) -> None:
    (tmp_path / "data.bin").write_bytes(bytes(range(256)))
    refs = as_dict(
        load(
            tmp_path,
            {
                "text": "héllo ✓",
                "b64": "base64:AAEC/w==",
                "obj": {"zarr_format": 2, "name": "é"},
                "range": ["data.bin", 10, 20],
                "whole": ["data.bin"],
                "abs": [f"file://{tmp_path}/data.bin", 0, 1],
                "empty": "",
            },
        )
    )
    assert refs["text"].data == "héllo ✓".encode()
    assert refs["b64"].data == b"\x00\x01\x02\xff"
    assert refs["obj"].data == b'{"zarr_format":2,"name":"\\u00e9"}'
    assert json.loads(refs["obj"].data) == {"zarr_format": 2, "name": "é"}
    assert refs["range"] == Ref(url=str(tmp_path / "data.bin"), offset=10, length=20)
    assert refs["whole"] == Ref(url=str(tmp_path / "data.bin"), offset=0, length=None)
    assert refs["abs"] == Ref(url=str(tmp_path / "data.bin"), offset=0, length=1)
    assert refs["empty"].data == b""


def test_relative_urls_resolve_against_the_refs_directory(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    refset = load(tmp_path, {"a": ["sub/../d.bin", 0, 1], "b": ["/abs/x", 0, 1]})
    assert refset.ref(refset.file_id("a")).url == str(tmp_path / "d.bin")
    assert refset.ref(refset.file_id("b")).url == "/abs/x"
    with_protocol = load(tmp_path, {"a": ["bucket/k", 0, 1]}, "p.json", remote_protocol="s3")
    assert with_protocol.ref(0).url == "s3://bucket/k"


def test_mixed_protocols_are_kept_per_url(tmp_path: Path) -> None:
    refset = load(
        tmp_path, {"a": ["s3://b/k", 0, 1], "b": ["https://h/p", 0, 1], "c": ["gs://g/o"]}
    )
    assert [refset.ref(i).url for i in range(3)] == ["s3://b/k", "https://h/p", "gs://g/o"]
    assert refset.url_extent("s3://b/k") == 1
    assert refset.url_extent("gs://g/o") is None  # a whole-file reference: no bound


def test_url_extent_is_the_furthest_referenced_byte(tmp_path: Path) -> None:
    refset = load(tmp_path, {"a": ["s3://b/k", 0, 10], "b": ["s3://b/k", 100, 5], "c": "x"})
    assert refset.url_extent("s3://b/k") == 105


def test_directories_listing_and_resume(tmp_path: Path) -> None:
    keys = {f"g/v/{i}.0": ["s3://b/k", i, 1] for i in range(50)}
    keys |= {"g/.zgroup": "{}", "g/w/0": "x", "g.x": "y", "top": "z", "g/v/.zarray": "{}"}
    refset = load(tmp_path, keys)
    # names come in the order of their keys' UTF-8 bytes ("." sorts before "/")
    assert [c.name for c in refset.children("")] == ["g.x", "g", "top"]
    names = [c.name for c in refset.children("g")]
    assert names == [".zgroup", "v", "w"]
    listing = list(refset.children("g/v"))
    assert len(listing) == 51
    cursors = [c.cursor for c in listing]
    assert cursors == sorted(set(cursors))
    resumed = list(refset.children("g/v", after=listing[20].cursor))
    assert resumed == listing[21:]
    # resuming after a subdirectory skips all of it
    root = list(refset.children(""))
    assert [c.name for c in refset.children("", after=root[1].cursor)] == ["top"]
    assert refset.subdirectory_count("") == 1
    assert refset.subdirectory_count("g") == 2
    assert refset.subdirectory_count("g/v") == 0
    assert refset.is_dir("g/v") and not refset.is_dir("g/v/0.0") and not refset.is_dir("nope")
    assert refset.file_id("g/v/7.0") is not None and refset.file_id("g/v/77.0") is None


def test_odd_keys_are_skipped_with_one_warning_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    odd = ["/abs", "a//b", "a/../b", "./c", "x/", "", "n\x00ul", "l/" + "x" * 256]
    document = {k: "bad" for k in odd} | {"k": "file", "k/v": "child", "ok": "fine"}
    with caplog.at_level(logging.WARNING):
        refset = load(tmp_path, document)
    assert sorted(as_dict(refset)) == ["k/v", "ok"]
    assert refset.is_dir("k") and refset.file_id("k") is None
    warnings = [r.getMessage() for r in caplog.records if "skipping key" in r.getMessage()]
    assert len(warnings) == len(odd) + 1
    for key in [*odd, "k"]:
        assert sum(repr(key) in w for w in warnings) == 1, key
    # skipped keys imply no directories: a//b and a/../b leave no "a"
    assert not refset.is_dir("a") and not refset.is_dir("l")


def test_a_rank0_chunk_key_name_slash_is_name_0_where_name_is_an_array(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """VirtualiZarr's ``name/`` is the key zarr asks for, ``name/0``, in every view; a key
    ending in ``/`` that is no array's (a directory marker, ``a//``) is still skipped."""
    document = {
        "s/.zarray": "{}",
        "s/": "scalar",
        "g/": "marker",
        "a/.zarray": "{}",
        "a//": "double",
    }
    with caplog.at_level(logging.WARNING):
        refset = load(tmp_path, document)
    assert as_dict(refset) == {
        "s/.zarray": Ref(data=b"{}"),
        "s/0": Ref(data=b"scalar"),
        "a/.zarray": Ref(data=b"{}"),
    }
    skipped = [r.getMessage() for r in caplog.records if "skipping key" in r.getMessage()]
    assert len(skipped) == 2 and any("'g/'" in w for w in skipped)


@pytest.mark.parametrize("explicit_first", [True, False])
def test_an_explicit_name_0_wins_over_the_rank0_stand_in_name_slash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, explicit_first: bool
) -> None:
    """``name/0`` is the key zarr asks for: where a set has it and ``name/`` too, it is
    served, whichever comes later in the file; ``name/`` is skipped and named."""
    pairs = [("s/0", "explicit"), ("s/", "stand-in")]
    document = {"s/.zarray": "{}", **dict(pairs if explicit_first else pairs[::-1])}
    with caplog.at_level(logging.WARNING):
        refset = load(tmp_path, document)
    assert as_dict(refset) == {"s/.zarray": Ref(data=b"{}"), "s/0": Ref(data=b"explicit")}
    skipped = [r.getMessage() for r in caplog.records if "skipping key" in r.getMessage()]
    assert len(skipped) == 1 and "'s/'" in skipped[0]


def test_a_later_gen_key_overrides_refs(tmp_path: Path) -> None:
    refset = load(
        tmp_path,
        {
            "version": 1,
            "refs": {"k0": "from refs", "other": "kept"},
            "gen": [
                {"key": "k{{i}}", "url": "s3://b/first", "dimensions": {"i": [0, 1]}},
                {"key": "k{{i}}", "url": "s3://b/second", "offset": "{{i}}", "length": "3",
                 "dimensions": {"i": [1]}},
            ],
        },
    )  # fmt: skip
    refs = as_dict(refset)
    assert refs["k0"] == Ref(url="s3://b/first", offset=0, length=None)
    assert refs["k1"] == Ref(url="s3://b/second", offset=1, length=3)
    assert refs["other"].data == b"kept"


def test_gen_cartesian_product_last_dimension_fastest(tmp_path: Path) -> None:
    refset = load(
        tmp_path,
        {
            "version": 1,
            "gen": [
                {
                    "key": "v/{{t}}.{{z}}",
                    "url": "s3://b/f{{t}}",
                    "offset": "{{z * 10}}",
                    "length": "10",
                    "dimensions": {"t": {"start": 1, "stop": 7, "step": 3}, "z": [5, 6]},
                }
            ],
        },
    )
    refs = as_dict(refset)
    assert refs == {
        "v/1.5": Ref(url="s3://b/f1", offset=50, length=10),
        "v/1.6": Ref(url="s3://b/f1", offset=60, length=10),
        "v/4.5": Ref(url="s3://b/f4", offset=50, length=10),
        "v/4.6": Ref(url="s3://b/f4", offset=60, length=10),
    }


@pytest.mark.parametrize("kind", ["gzip", "bz2", "xz", "zstd"])
@pytest.mark.parametrize("named", [True, False])
def test_compressed_refs_by_name_and_by_magic(tmp_path: Path, kind: str, named: bool) -> None:
    raw = json.dumps(SPEC_V0_EQUIVALENT).encode()
    packed = {
        "gzip": gzip.compress,
        "bz2": bz2.compress,
        "xz": lzma.compress,
        "zstd": zstandard.ZstdCompressor().compress,
    }[kind](raw)
    suffix = {"gzip": ".gz", "bz2": ".bz2", "xz": ".xz", "zstd": ".zst"}[kind]
    path = tmp_path / ("refs.json" + (suffix if named else ""))
    path.write_bytes(packed)
    assert as_dict(open_refset(str(path))) == as_dict(load(tmp_path, SPEC_V0_EQUIVALENT, "p.json"))


def test_refs_from_another_fsspec_filesystem(tmp_path: Path) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/sets/refs.json", json.dumps({"a": ["d.bin", 0, 4], "b": "x"}).encode())
    refset = open_refset("memory:///sets/refs.json")
    assert refset.ref(refset.file_id("a")).url == "memory:///sets/d.bin"
    with pytest.raises(RefsError, match="--allow-local"):
        fs.pipe("/sets/local.json", json.dumps({"a": ["/etc/passwd", 0, 4]}).encode())
        open_refset("memory:///sets/local.json")
    allowed = open_refset("memory:///sets/local.json", allow_local=True)
    assert allowed.ref(0).url == "/etc/passwd"


BAD_DOCUMENTS = [
    ('{"a": ["u", 1, 2],\n  "b": [}', r"malformed JSON at line 2, column 9"),
    ("[1, 2]", "must be a JSON object"),
    ('{"version": 2, "refs": {}}', "unsupported reference set version 2"),
    ('{"version": "1", "refs": {}}', "unsupported reference set version '1'"),
    ('{"k": 5}', "key 'k': expected a string, a JSON object or a list"),
    ('{"k": ["u", -1, 5]}', "key 'k': negative offset or length"),
    ('{"k": ["u", 1, -5]}', "key 'k': negative offset or length"),
    ('{"k": ["u", 1.0, 5]}', "key 'k': offset and length must be integers"),
    ('{"k": ["u", true, 5]}', "key 'k': offset and length must be integers"),
    ('{"k": ["u", 9223372036854775807, 1]}', "key 'k': offset \\+ length overflows"),
    ('{"k": ["u", 1]}', "key 'k': a reference list is"),
    ('{"k": [5, 1, 2]}', "key 'k': the URL must be a non-empty string"),
    ('{"k": "base64:!!!"}', "key 'k': invalid base64"),
    ('{"version": 1, "refs": {"k": ["{{nope}}", 0, 1]}}', "key 'k': undefined name"),
    ('{"version": 1, "refs": []}', '"refs" must be a JSON object'),
    ('{"version": 1, "gen": [{"key": "k", "url": "u"}]}',
     'gen\\[0\\]: missing required field "dimensions"'),
    ('{"version": 1, "gen": [{"key": "k", "dimensions": {"i": [1]}}]}',
     'gen\\[0\\]: missing required field "url"'),
    ('{"version": 1, "gen": [{"key": "k", "url": "u", "offset": "1", "dimensions": {"i": [1]}}]}',
     '"offset" and "length" go together'),
    ('{"version": 1, "gen": [{"key": "k", "url": "u", "dimensions": {"i": {"start": 1}}}]}',
     'needs "stop"'),
    ('{"version": 1, "gen": [{"key": "k{{i}}", "url": "u", "offset": "{{i - 5}}", "length": "1",'
     ' "dimensions": {"i": [1]}}]}', "offset: renders '-4', not a non-negative integer"),
    ('{"version": 1, "gen": [{"key": "k{{i}}", "url": "u",'
     ' "dimensions": {"i": {"stop": 100000000}}}]}',
     "generates more than"),
    ('{"version": 1, "templates": {"t": 3}, "refs": {}}', "template 't': expected a string"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), BAD_DOCUMENTS)
def test_bad_documents_are_refused_with_a_clear_message(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(RefsError, match=message):
        open_refset(str(path))


def test_missing_and_unreadable_refs(tmp_path: Path) -> None:
    with pytest.raises(RefsError, match="no such file"):
        open_refset(str(tmp_path / "missing.json"))
    (tmp_path / "broken.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(RefsError, match=r"broken\.json\.gz"):
        open_refset(str(tmp_path / "broken.json.gz"))
    (tmp_path / "dir").mkdir()
    with pytest.raises(RefsError, match=r"without \.zmetadata"):
        open_refset(str(tmp_path / "dir"))


@pytest.mark.parametrize(
    ("compress", "message"),
    [
        (None, "over the limit of 4 KiB for a reference set \\(--max-refs-size\\)"),
        (gzip.compress, "expands \\(gzip\\) over the limit of 4 KiB"),
    ],
    ids=["plain", "gzip"],
)
def test_a_refs_file_over_the_size_limit_is_refused(
    tmp_path: Path, compress: Any, message: str
) -> None:
    text = json.dumps({"version": 1, "refs": {f"k{i}": "x" * 50 for i in range(100)}})
    path = tmp_path / ("refs.json.gz" if compress else "refs.json")
    path.write_bytes(compress(text.encode()) if compress else text.encode())
    with pytest.raises(RefsError, match=message):
        open_refset(str(path), max_refs_bytes=4096)
    assert len(open_refset(str(path), max_refs_bytes=len(text))) == 100


def test_the_default_size_limit_is_named() -> None:
    assert source.DEFAULT_MAX_REFS_BYTES == 2 << 30
    assert "2 GiB" in source._over(source.DEFAULT_MAX_REFS_BYTES)


# --- reading REFS over HTTP ---------------------------------------------------------------


def data_requests(server: Any, path: str) -> tuple[int, list[list]]:
    """How many GET/HEAD requests the server answered for ``path``, and the bodies it sent."""
    stats = server.stats()
    bodies = [r for r in stats["ranges"] if r[0] == path]
    return stats["requests"], bodies


@pytest.mark.parametrize("name", ["refs.json", "refs.json.zst", "refs"])
def test_an_http_refs_file_is_downloaded_once(http: Any, http_root: Path, name: str) -> None:
    raw = json.dumps(SPEC_V0_EQUIVALENT).encode()
    if name.endswith(".zst"):
        raw = zstandard.ZstdCompressor().compress(raw)
    (http_root / name).write_bytes(raw)
    refset = open_refset(f"{http.url}/{name}?token=abc")
    assert as_dict(refset) == as_dict(open_refset(str(http_root / name)))
    requests, bodies = data_requests(http, f"/{name}")
    assert bodies == [[f"/{name}", 0, len(raw)]]  # one body, the whole file
    # a HEAD for its size; a name that is not JSON's is also asked for /NAME/.zmetadata
    assert requests == (2 if name.endswith(".json") or name.endswith(".zst") else 3)


def test_a_refs_url_with_a_query_string_is_a_json_file(http: Any, http_root: Path) -> None:
    """The server ignores the query: ``refs.json?x=/.zmetadata`` would be the JSON file
    again, and a probe that appended to the query would take it for Parquet metadata."""
    (http_root / "q.json").write_text(json.dumps({"a": "x"}))
    refset = open_refset(f"{http.url}/q.json?sig=abc&x=1")
    assert refset.ref(refset.file_id("a")) == Ref(data=b"x")
    assert source.compression_of("https://h/r.json.gz?x=1", b"{") == "gzip"
    assert source.compression_of("https://h/r.json?x=.gz", b"{") is None


def test_a_stalled_store_is_an_error_within_the_timeout(http: Any, http_root: Path) -> None:
    (http_root / "slow.json").write_text(json.dumps({"a": "x"}))
    for method in ("HEAD", "GET"):
        http.clear_faults()
        http.fault("/slow.json", "stall", count=-1, method=method)
        with pytest.raises(RefsError, match=r"slow\.json: the store did not answer within 1 s"):
            open_refset(f"{http.url}/slow.json", timeout=1)


def test_an_http_error_is_a_refs_error_without_credentials(http: Any) -> None:
    http.fault("/secret.json", "500", count=-1)
    with pytest.raises(RefsError) as error:
        open_refset(f"http://user:pa55@127.0.0.1:{http.port}/secret.json?token=s3cr3t")
    message = str(error.value)
    assert message.startswith(f"http://127.0.0.1:{http.port}/secret.json: ")
    assert "s3cr3t" not in message and "pa55" not in message
    with pytest.raises(RefsError, match="no such file") as error:
        open_refset(f"{http.url}/missing.json?token=s3cr3t")
    assert "s3cr3t" not in str(error.value)


def test_target_urls_in_messages_are_redacted(tmp_path: Path) -> None:
    document = {"version": 1, "refs": {"k": ["https://u:pw@h/x?X-Amz-Signature={{nope}}", 0, 1]}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(document))
    with pytest.raises(RefsError, match="key 'k': undefined name") as error:
        open_refset(str(path))
    assert "pw" not in str(error.value) and "Signature" not in str(error.value)
    assert "https://h/x" in str(error.value)


def test_a_directory_is_told_by_its_info_not_by_listing(tmp_path: Path) -> None:
    (tmp_path / "set.json").mkdir()
    with pytest.raises(RefsError, match=r"set\.json: a directory without \.zmetadata"):
        open_refset(str(tmp_path / "set.json"))


def test_a_stalled_parquet_probe_or_metadata_is_an_error_within_the_timeout(
    http: Any, http_root: Path
) -> None:
    from tests.test_parquet_remote import build

    (http_root / "plain").write_text(json.dumps({"a": "x"}))  # not named as JSON: probed
    http.fault("/plain/.zmetadata", "stall", count=-1)
    with pytest.raises(RefsError, match="plain: the store did not answer within 1 s"):
        open_refset(f"{http.url}/plain", timeout=1)
    http.clear_faults()
    assert len(open_refset(f"{http.url}/plain", timeout=1)) == 1

    build(http_root, "stalled.parq", f"{http.url}/data.bin")
    http.fault("/stalled.parq/.zmetadata", "stall", count=-1, method="GET")
    with pytest.raises(RefsError, match=r"stalled\.parq: the store did not answer within 1 s"):
        open_refset(f"{http.url}/stalled.parq", timeout=1)
    http.clear_faults()
    assert open_refset(f"{http.url}/stalled.parq", timeout=1).is_dir("x")


def test_the_refs_request_asks_for_no_transfer_encoding(http: Any, http_root: Path) -> None:
    """A transfer encoding would be decoded by the HTTP client before the budget saw it."""
    import fsspec

    (http_root / "enc.json").write_text("{}")
    fs = fsspec.filesystem("http", headers={"Authorization": "Bearer t"})
    with source._open(fs, f"{http.url}/enc.json", {"size": 2}) as f:
        sent = f.r.request_info.headers
        assert sent["Accept-Encoding"] == "identity"
        assert sent["Authorization"] == "Bearer t"
        assert f.read() == b"{}"


def test_relative_targets_of_a_refs_url_with_a_query_string() -> None:
    from refmount.refs.urls import UrlResolver

    resolve = UrlResolver("https://h/sets/refs.json?X-Amz-Signature=a/b&t=1")
    assert resolve("data/f.nc") == "https://h/sets/data/f.nc"
    assert resolve("../f.nc") == "https://h/f.nc"
