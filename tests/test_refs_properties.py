"""Properties of the JSON reference format, for any input: it loads or fails with a
:class:`RefsError` (never another exception), and a loaded set is a consistent tree."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refmount.errors import RefsError
from refmount.refs import open_refset
from refmount.refs.jsonrefs import WHOLE_FILE
from refmount.refs.table import MAX_NAME_BYTES, TableRefSet
from refmount.refs.templates import Templates

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Keys from few characters, so that collisions, nesting and odd components are common.
KEY_TEXT = st.text(alphabet="ab/.\x00ü\ud800", max_size=8) | st.just("n" * 260)
NUMBERS = st.integers(min_value=-3, max_value=3) | st.sampled_from(
    [2**62, 2**63 - 1, 2**63, 2**64, -(2**63)]
)
URLS = st.sampled_from(["http://h/f", "s3://b/k", "rel/f", "", "http://h/{{u}}", "{{ x }}"])
SCALARS = st.none() | st.booleans() | NUMBERS | st.floats(allow_nan=False) | st.text(max_size=5)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4)
    ),
    max_leaves=12,
)
VALUES = (
    st.tuples(URLS, NUMBERS, NUMBERS).map(list)
    | st.tuples(URLS).map(list)
    | st.text(max_size=6)
    | st.sampled_from(["base64:aGk=", "base64:!!"])
    | JSON
)
REFS = st.dictionaries(KEY_TEXT, VALUES, max_size=12)


def load(document: Any) -> TableRefSet | None:
    """The set ``document`` describes, or ``None`` when it is refused with a RefsError."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "refs.json"
        path.write_text(json.dumps(document), encoding="utf-8", errors="surrogatepass")
        try:
            refset = open_refset(str(path), allow_local=True)
        except RefsError as exc:
            assert str(exc)
            return None
    assert isinstance(refset, TableRefSet)
    return refset


def check_tree(refset: TableRefSet, document_keys: set[str]) -> None:
    """Every listed child is found again, sizes agree, keys are sorted by their UTF-8
    bytes, and no key escapes the tree."""
    keys = [refset.key(file_id) for file_id in range(len(refset))]
    encoded = [key.encode("utf-8", "surrogatepass") for key in keys]
    assert encoded == sorted(encoded)
    assert len(set(keys)) == len(keys)
    for key in keys:
        assert key in document_keys
        parts = key.split("/")
        assert all(p not in ("", ".", "..") and "\0" not in p for p in parts), key
        assert all(len(p.encode("utf-8", "surrogatepass")) <= MAX_NAME_BYTES for p in parts)
    found = walk(refset, "")
    assert sorted(found) == sorted(keys)


def walk(refset: TableRefSet, path: str) -> list[str]:
    files = []
    names = [child.name for child in refset.children(path)]
    assert len(names) == len(set(names)), names
    for child in refset.children(path):
        key = f"{path}/{child.name}" if path else child.name
        if child.file_id is None:
            assert refset.is_dir(key) and refset.file_id(key) is None
            files += walk(refset, key)
            continue
        assert refset.file_id(key) == child.file_id
        assert refset.key(child.file_id) == key
        assert not refset.is_dir(key)
        ref = refset.ref(child.file_id)
        size = refset.file_size(child.file_id)
        if ref.data is not None:
            assert size == len(ref.data)
        else:
            assert ref.url and ref.offset >= 0
            assert size == ref.length and (size is None or 0 <= ref.offset + size < 2**63)
        files.append(key)
    return files


@FAST
@given(REFS)
def test_version_0_sets_load_or_fail_cleanly(refs: dict[str, Any]) -> None:
    refset = load(refs)
    if refset is not None:
        check_tree(refset, set(refs))


@FAST
@given(
    REFS,
    st.dictionaries(st.sampled_from(["u", "x", "f"]), st.text(max_size=6) | st.just("{{c}}")),
)
def test_version_1_sets_load_or_fail_cleanly(refs: dict[str, Any], templates: dict) -> None:
    refset = load({"version": 1, "templates": templates, "refs": refs})
    if refset is not None:
        check_tree(refset, set(refs))


GOOD_KEYS = st.sampled_from(["k{{i}}", "a/{{i}}/{{j}}", "d/{{ i * 2 }}"])
ODD_FIELDS = st.sampled_from(["{{u}}", "{{ i * 2 }}", "7", "", "{{", "{{ i ** 99 }}"])
SMALL = st.integers(min_value=-2, max_value=4)
GOOD_DIMENSIONS = st.fixed_dictionaries(
    {"i": st.lists(SMALL, max_size=3) | st.fixed_dictionaries({"stop": SMALL})},
    optional={"j": st.fixed_dictionaries({"stop": SMALL}, optional={"step": st.just(2)})},
)
ODD_DIMENSIONS = st.dictionaries(
    st.sampled_from(["i", "j"]),
    st.fixed_dictionaries({"stop": NUMBERS}, optional={"start": NUMBERS, "step": NUMBERS})
    | SCALARS
    | st.lists(SCALARS, max_size=2),
    max_size=2,
)
GOOD_GEN = st.fixed_dictionaries(
    {"key": GOOD_KEYS, "url": st.sampled_from(["http://h/{{i}}", "s3://b/{{u}}"]),
     "dimensions": GOOD_DIMENSIONS},
    optional={"offset": st.just("{{ i * 10 }}"), "length": st.just("5")},
)  # fmt: skip
ODD_GEN = st.fixed_dictionaries(
    {"key": GOOD_KEYS | ODD_FIELDS, "url": ODD_FIELDS | URLS},
    optional={
        "offset": ODD_FIELDS | NUMBERS,
        "length": ODD_FIELDS | NUMBERS,
        "dimensions": GOOD_DIMENSIONS | ODD_DIMENSIONS,
    },
)
GEN = GOOD_GEN | ODD_GEN


@FAST
@given(st.lists(GEN, max_size=3))
def test_gen_loads_or_fails_cleanly(gen: list[dict]) -> None:
    refset = load({"version": 1, "templates": {"u": "x/y"}, "gen": gen})
    if refset is not None:
        check_tree(refset, {refset.key(i) for i in range(len(refset))})


@FAST
@given(st.binary(max_size=64) | st.text(alphabet='{}[]",:0123456789.e-tfnrul\\ ', max_size=40))
def test_any_bytes_load_or_fail_cleanly(raw: bytes | str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "refs.json"
        path.write_bytes(raw if isinstance(raw, bytes) else raw.encode())
        try:
            refset = open_refset(str(path))
        except RefsError:
            return
    assert isinstance(refset, TableRefSet)
    check_tree(refset, {refset.key(i) for i in range(len(refset))})


TOKENS = st.sampled_from(
    ["{{", "}}", "u", "f", "c", "i", "(", ")", "[", "]", ",", "=", "'a'", "1", "10", "**",
     "*", "+", "~", "-", "|", "join", "length", "string", "upper", "int", "first", ".",
     "__class__", "lipsum", "range", "{%", "%}", "{#", " ", "if", "else", "c=", "9"]
)  # fmt: skip


@FAST
@given(st.lists(TOKENS, max_size=16).map("".join), st.integers(0, 9))
def test_any_template_renders_or_fails_cleanly(source: str, i: int) -> None:
    templates = Templates({"u": "s3://b", "f": "{{c}}{{u}}", "g": "{{f(c=c)}}"})
    try:
        result = templates.render(source, {"i": i}, what="key 'k'")
    except RefsError as exc:
        assert str(exc).startswith("key 'k'")
        return
    assert isinstance(result, str) and len(result) <= 64 * 1024


def test_whole_file_rows_keep_their_marker() -> None:
    """``[url]`` rows have no length; the tree does not take the marker for a size."""
    refset = load({"a": ["http://h/f"], "b": ["http://h/f", 0, 0]})
    assert refset is not None
    assert refset.file_size(refset.file_id("a")) is None
    assert refset.ref(refset.file_id("a")).length is None
    assert WHOLE_FILE < 0
    assert refset.file_size(refset.file_id("b")) == 0
