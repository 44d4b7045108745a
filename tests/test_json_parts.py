"""Loading large JSON sets fast: the parse in two processes, the bulk rows, the index.

Every test that parses in parts compares with the plain one-process parse: the result,
the error and the warnings must be the same, whatever the input.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from array import array
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from refmount.errors import RefsError
from refmount.refs import arrays, jsonsplit, open_refset
from refmount.refs.rows import encode_texts, rows_of
from refmount.refs.table import TableRefSet, _directories


def ranges(count: int, prefix: str = "v/") -> dict[str, list]:
    return {f"{prefix}{i}.0": [f"s3://bucket/data_{i % 3}.nc", i * 100, 100] for i in range(count)}


def expand(parts: jsonsplit.Parts) -> dict:
    """The mapping the pieces stand for, later entries winning, as json.loads gives it."""
    mapping: dict = {}
    for rows in parts.pieces:
        keys = [k.decode("utf-8", "surrogatepass") for k in rows.keys.items()]
        for row, key in enumerate(keys):
            url = rows.urls[rows.url_ids[row]]
            mapping[key] = [url, rows.offsets[row], rows.lengths[row]]
        mapping.update(rows.others)
    return mapping


@pytest.fixture
def split_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse any document in parts, on any machine."""
    monkeypatch.setattr(jsonsplit, "MIN_BYTES", 0)
    monkeypatch.setattr(jsonsplit, "_cpus", lambda: 2)


def outcome(path: Path, caplog: pytest.LogCaptureFixture) -> tuple[object, list[str]]:
    """Every file of the set at ``path`` (or the error), and the warnings logged."""
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        try:
            refset = open_refset(str(path))
            assert isinstance(refset, TableRefSet)
            result: object = {refset.key(i): refset.ref(i) for i in range(len(refset))}
        except RefsError as exc:
            result = str(exc)
    return result, [r.getMessage() for r in caplog.records]


def same_as_one_parse(
    tmp_path: Path,
    text: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    *,
    splits: bool | None = None,
) -> object:
    """Load ``text`` in parts and in one go; assert the outcomes are equal; return it.
    ``splits``: whether the parse in parts is expected to succeed (None: either way)."""
    path = tmp_path / "refs.json"
    path.write_text(text)
    with monkeypatch.context() as patch:
        patch.setattr(jsonsplit, "MIN_BYTES", 0)
        patch.setattr(jsonsplit, "_cpus", lambda: 2)
        if splits is not None:
            assert (jsonsplit.parse_in_parts(text.encode()) is not None) == splits
        in_parts = outcome(path, caplog)
    with monkeypatch.context() as patch:
        patch.setattr(jsonsplit, "MIN_BYTES", 1 << 62)
        at_once = outcome(path, caplog)
    assert in_parts == at_once
    return in_parts[0]


# --- the parse in parts --------------------------------------------------------------


@pytest.mark.usefixtures("split_small")
@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": "), (",\n", ":")])
def test_version_0_in_parts_is_exactly_one_parse(separators: tuple[str, str]) -> None:
    document = {".zgroup": '{"zarr_format": 2}', "v/.zarray": "{}", **ranges(500)}
    document["inline"] = {"a": [1, {"b": ']},"c": ['}]}
    text = json.dumps(document, separators=separators)
    parts = jsonsplit.parse_in_parts(text.encode())
    assert parts is not None and len(parts.pieces) == 2 and parts.fields == {}
    assert expand(parts) == json.loads(text)


@pytest.mark.usefixtures("split_small")
def test_version_1_in_parts_keeps_the_other_fields_exactly() -> None:
    document = {
        "version": 1,
        "templates": {"u": "s3://bucket", "f": "{{c}}"},
        "refs": {"k": ["{{u}}/x", 0, 1], **ranges(500)},
        "gen": [{"key": "g{{i}}", "url": "u", "dimensions": {"i": [1, 2]}}],
        "other": [1.5, None, True, "\u00e9\\"],
    }
    raw = json.dumps(document, ensure_ascii=False).encode()
    parts = jsonsplit.parse_in_parts(raw)
    assert parts is not None
    assert parts.fields == {**document, "refs": {}}
    assert expand(parts) == document["refs"]


def hostile_middles() -> list[str]:
    """Entries to put in the middle of a document, where the cut is looked for."""
    long = "a" * 4000  # no cut inside it: the first candidate after the middle is next
    return [
        json.dumps({"m": long + "],"})[1:-1],  # a cut candidate that ends a string
        json.dumps({"m": long + '",'})[1:-1],  # an escaped quote and a comma
        json.dumps({"m": long, 'k", "x": [': ["u", 1, 2]})[1:-1],
        json.dumps({"m": {"a": long, "b": ["x", "y"], "c": {"d": "e"}}})[1:-1],  # nested
        json.dumps({"m": [long, "x", "y", "z"]})[1:-1],  # a long list of strings
        json.dumps({"m": long + "\\", "n\\\\": '\\"', "o": "\u2028\ud800"})[1:-1],
    ]


@pytest.mark.parametrize("middle", hostile_middles())
def test_hostile_middles_give_exactly_one_parse(
    tmp_path: Path,
    middle: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = json.dumps(ranges(60, "a/"))[1:-1]
    after = json.dumps(ranges(60, "b/"))[1:-1]
    text = "{" + before + ", " + middle + ", " + after + "}"
    with monkeypatch.context() as patch:
        patch.setattr(jsonsplit, "MIN_BYTES", 0)
        patch.setattr(jsonsplit, "_cpus", lambda: 2)
        parts = jsonsplit.parse_in_parts(text.encode())
    assert parts is None or expand(parts) == json.loads(text)
    same_as_one_parse(tmp_path, text, monkeypatch, caplog)


@pytest.mark.usefixtures("split_small")
def test_a_cut_inside_a_string_falls_back() -> None:
    text = json.dumps({**ranges(20, "a/"), "m": "a" * 4000 + "],", **ranges(5, "b/")})
    assert jsonsplit.parse_in_parts(text.encode()) is None


@pytest.mark.usefixtures("split_small")
def test_a_child_that_does_not_answer_is_killed_and_one_parse_follows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A child stuck (at a lock a thread of the parent held at the fork) must not hang
    the load: past its deadline it is killed, and the caller parses in one go."""
    children: list[int] = []
    fork = os.fork

    def fork_a_stuck_child() -> int:
        pid = fork()
        if pid == 0:
            time.sleep(120)
            os._exit(0)
        children.append(pid)
        return pid

    monkeypatch.setattr(jsonsplit.os, "fork", fork_a_stuck_child)
    monkeypatch.setattr(jsonsplit, "CHILD_GRACE", 0.5)
    text = json.dumps(ranges(2000))
    assert jsonsplit.parse_in_parts(text.encode()) is None
    assert len(children) == 1
    with pytest.raises(ChildProcessError):  # killed and reaped: no such child left
        os.waitpid(children[0], os.WNOHANG)


def test_duplicate_keys_across_the_cut_mean_what_one_parse_means(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    head, tail = json.dumps(ranges(200, "a/"))[1:-1], json.dumps(ranges(200, "b/"))[1:-1]
    # a bad value replaced by a later good one is no error; a range replaced by data
    text = '{"d": ["u", -1, 5], "e": ["s3://b/e", 1, 2], ' + head + ", " + tail
    text += ', "d": ["s3://b/d", 1, 2], "e": "inline"}'
    files = same_as_one_parse(tmp_path, text, monkeypatch, caplog, splits=True)
    assert isinstance(files, dict)
    assert files["d"].url == "s3://b/d" and files["e"].data == b"inline"


@pytest.mark.parametrize(
    "bad",
    ['"k": ["u", 1.0, 5]', '"k": ["u", true, 5]', '"k": ["u", 9223372036854775807, 1]',
     '"k": 5', '"k": ["", 1, 2]', '"k": "base64:!!!"', '"k": ["u", 1, 2', '"k" ["u", 1, 2]',
     '"version": 1', '"version": null'],
)  # fmt: skip
@pytest.mark.parametrize("where", ["head", "tail"])
def test_errors_and_versions_in_either_part_are_those_of_one_parse(
    tmp_path: Path,
    bad: str,
    where: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    entries = [json.dumps(ranges(200, "a/"))[1:-1], json.dumps(ranges(200, "b/"))[1:-1]]
    entries.insert(0 if where == "head" else 2, bad)
    same_as_one_parse(tmp_path, "{" + ", ".join(entries) + "}\n", monkeypatch, caplog)


def test_version_1_refs_in_parts_with_templates_gen_and_unknown_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    document = {
        "version": 1,
        "templates": {"u": "s3://bucket"},
        "surprise": 1,
        "refs": {**ranges(300), "t": ["{{u}}/t", 0, 3], "v/1.0": "overridden"},
        "gen": [{"key": "v/{{i}}.0", "url": "{{u}}/g", "dimensions": {"i": [1, 2]}}],
    }
    files = same_as_one_parse(tmp_path, json.dumps(document), monkeypatch, caplog, splits=True)
    assert isinstance(files, dict)
    assert files["t"].url == "s3://bucket/t" and files["v/1.0"].url == "s3://bucket/g"
    assert any("surprise" in w for w in caplog.messages)


@pytest.mark.usefixtures("split_small")
@pytest.mark.parametrize(
    "raw",
    [
        json.dumps(ranges(100)).encode("utf-16"),  # not UTF-8: json.loads decodes it itself
        b"\xef\xbb\xbf" + json.dumps(ranges(100)).encode(),  # a byte order mark
        json.dumps(ranges(100)).encode() + b" x",  # extra data
        b'{"version": 1, "refs": {}, "refs": ' + json.dumps(ranges(100)).encode() + b"}",
        b'{"version": 1, "refs": ' + json.dumps(ranges(100)).encode() + b", }",
        b"[" + json.dumps(ranges(100)).encode() + b"]",
    ],
)
def test_documents_not_split_safely_are_left_to_one_parse(raw: bytes) -> None:
    assert jsonsplit.parse_in_parts(raw) is None


# --- rows, strings and the index -----------------------------------------------------


def test_rows_take_good_ranges_in_bulk_and_leave_the_rest_in_order() -> None:
    rows = rows_of({"a": "x", "b": ["s3://u", 1, 2], "version": None, "c": ["s3://v", 0, 0],
                    "d": {"e": 1}, "f": ["s3://u", 5, 6]}, skip_version=True)  # fmt: skip
    assert rows.keys.items() == [b"b", b"c", b"f"]
    assert rows.urls == ["s3://u", "s3://v"] and list(rows.url_ids) == [0, 1, 0]
    assert list(rows.offsets) == [1, 0, 5] and list(rows.lengths) == [2, 0, 6]
    assert rows.others == [("a", "x"), ("d", {"e": 1})]


@pytest.mark.parametrize(
    "value",
    [["u", True, 1], ["u", 1.0, 1], ["u", -1, 1], ["u", 1 << 63, 1], ["u", (1 << 62), 1 << 62],
     ["", 1, 1], [["u"], 1, 1], [5, 1, 1], ["u", 1, None]],
)  # fmt: skip
def test_any_odd_range_sends_them_all_to_the_per_key_path(value: list) -> None:
    mapping = {"a": ["s3://u", 1, 2], "odd": value, "b": "x", "c": ["s3://u", 3, 4]}
    rows = rows_of(mapping)
    assert len(rows) == 0
    assert rows.others == [("a", ["s3://u", 1, 2]), ("odd", value), ("c", ["s3://u", 3, 4]),
                           ("b", "x")]  # fmt: skip


def test_large_but_valid_offsets_stay_in_bulk() -> None:
    rows = rows_of({"a": ["s3://u", (1 << 62) + 5, (1 << 62) - 6]})
    assert list(rows.offsets) == [(1 << 62) + 5] and not rows.others


@pytest.mark.parametrize(
    "values", [[], [""], ["a", "", "b"], ["x\x00y", "z"], ["é", "a/\u2028"], ["\ud800", "k"]]
)
def test_strings_round_trip_through_either_encoding(values: list[str]) -> None:
    texts = encode_texts(values)
    assert texts.items() == [v.encode("utf-8", "surrogatepass") for v in values]
    decoded = arrays.from_texts(texts).to_pylist()
    fixed = [v.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for v in values]
    assert decoded == fixed


def test_directories_are_every_parent_and_ancestor() -> None:
    rng = random.Random(7)
    names = ["a", "b", "ab", "a.b", "é", "0", "a0", "a-"]
    keys = {"/".join(rng.choices(names, k=rng.randint(1, 4))) for _ in range(3000)}
    keys |= {"x/" + str(i) for i in range(2000)} | {"top"}
    ordered = sorted(keys, key=lambda k: k.encode())
    keep = np.array([rng.random() > 0.1 for _ in ordered])
    expected = set()
    for key in (k for k, kept in zip(ordered, keep, strict=True) if kept):
        while "/" in key:
            key = key.rpartition("/")[0]
            expected.add(key)
    assert _directories(arrays.strings(ordered), keep) == sorted(expected)
    assert _directories(arrays.strings([]), np.ones(0, bool)) == []


def test_an_empty_set_and_a_set_of_one_key(tmp_path: Path) -> None:
    for document, keys in [({}, []), ({"version": 1}, []), ({"a": "x"}, ["a"])]:
        path = tmp_path / "refs.json"
        path.write_text(json.dumps(document))
        refset = open_refset(str(path))
        assert [refset.key(i) for i in range(len(refset))] == keys
        assert refset.url_extent("s3://none") is None


def test_numbers_view_shares_the_buffer() -> None:
    values = array("q", [3, 1, 2])
    column = arrays.numbers(values, pa.int64())
    assert column.to_pylist() == [3, 1, 2]
    assert list(arrays.view(column.slice(1), np.int64)) == [1, 2]
