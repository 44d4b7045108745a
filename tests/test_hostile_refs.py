"""Hostile reference sets: each is refused with a message naming what is wrong, or loads as
a bounded, consistent tree, within stated seconds and megabytes.

Loads run in a child process (``open_refset`` there, nothing mounted), which reports its
own peak resident size (``VmHWM``; ``ru_maxrss`` would include what the forked test
process held before ``exec``), so that a bound on memory is a bound on what the
loader really took.  A few go through the real command line.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import zstandard

from tests.conftest import REFMOUNT, is_mounted
from tests.support.servers import RangeServer

#: What the child process takes before it reads anything (Python, pyarrow, jinja2), and
#: what loading a small set adds, on this machine: bounds are stated above this.
BASE_MB = 200
SECONDS = 20  # CPU seconds: every hostile load ends well within this

_CHILD = textwrap.dedent(
    r"""
    import importlib, json, re, sys, time
    from refmount.errors import RefsError
    from refmount.refs import open_refset

    request = json.loads(sys.argv[1])
    for name, value in request.get("patch", {}).items():
        module, _, attribute = name.rpartition(".")
        setattr(importlib.import_module(module), attribute, value)
    started = time.process_time()  # CPU, not wall: other work on the machine adds none
    try:
        refset = open_refset(request["url"], **request.get("options", {}))
        outcome = {"keys": len(refset)}
    except RefsError as exc:
        outcome = {"error": str(exc)}
    outcome["seconds"] = time.process_time() - started
    with open("/proc/self/status") as status:  # this program's peak, not its parent's
        outcome["peak_mb"] = int(re.search(r"VmHWM:\s*(\d+)", status.read())[1]) / 1024
    print(json.dumps(outcome))
    """
)


def load_in_child(
    url: str | Path, timeout: float = 120, patch: dict[str, Any] | None = None, **options: Any
) -> dict[str, Any]:
    """``open_refset(url, **options)`` in a fresh process: ``{"keys"}`` or ``{"error"}``,
    with ``seconds`` (the load alone) and ``peak_mb`` (the process's peak RSS)."""
    request = {"url": str(url), "options": options, "patch": patch or {}}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(request)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def refused(outcome: dict[str, Any], *, seconds: float = SECONDS, mb: float = BASE_MB) -> str:
    assert "error" in outcome, f"loaded: {outcome}"
    assert outcome["seconds"] < seconds, outcome
    assert outcome["peak_mb"] < mb, outcome
    return str(outcome["error"])


def write_json(tmp_path: Path, document: object, name: str = "refs.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def test_the_baseline_is_what_the_bounds_assume(tmp_path: Path) -> None:
    outcome = load_in_child(write_json(tmp_path, {"a": "x"}))
    assert outcome["keys"] == 1
    assert outcome["peak_mb"] < BASE_MB - 50, outcome


# --- templates and gen ------------------------------------------------------------------


def fanning_templates(levels: int = 6, fan: int = 10) -> dict[str, str]:
    """Each template calls the next ``fan`` times: ``fan ** levels`` calls in all."""
    templates = {f"t{n}": "{{" + " ~ ".join([f"t{n + 1}()"] * fan) + "}}" for n in range(levels)}
    templates[f"t{levels}"] = "{{ 'x' }}"
    return templates


def test_templates_calling_templates(tmp_path: Path) -> None:
    document = {
        "version": 1,
        "templates": fanning_templates(),
        "refs": {f"k{n}": [f"http://h/{{{{t0()}}}}/{n}", 0, 1] for n in range(20)},
    }
    path = write_json(tmp_path, document)
    assert path.stat().st_size < 1500
    message = refused(load_in_child(path), seconds=10)
    assert "key 'k0': template 't0': template 't1'" in message
    assert "more than 64 template calls" in message


def test_the_call_budget_is_for_the_whole_set(tmp_path: Path) -> None:
    """Each key stays within its own bounds; together they pass the set's."""
    document = {
        "version": 1,
        "templates": fanning_templates(levels=2, fan=5),  # 31 evaluations per key
        "refs": {f"k{n}": [f"http://h/{{{{t0()}}}}/{n}", 0, 1] for n in range(200)},
    }
    path = write_json(tmp_path, document)
    patch = {"refmount.refs.templates.MAX_EVALUATIONS": 3000}
    message = refused(load_in_child(path, patch=patch))
    assert "need more than 3000 jinja evaluations" in message
    assert load_in_child(path)["keys"] == 200


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("{{ lipsum(n=100000, min=100000, max=100000) }}", "not safely callable"),
        ("{{ cycler(1).next() }}", "not safely callable"),
        ("{{ 'a'.center(2000000000) }}", "not safely callable"),
        ("{{ (['a' * 8000] * 8000) | join }}", "more than 8192 characters"),
        ("{{ (['a' * 4000, 'b' * 4000]) | join('c' * 8000) }}", "filter input exceeds"),
        ("{{ ('a' * 8000) ~ ('a' * 8000) ~ ('a' * 8000) }}" * 3, "exceeds 65536 characters"),
        ("{{ 'a' * 10 ** 9 }}", "more than 8192 characters"),
    ],
    ids=["lipsum", "cycler", "method", "repeat-join", "join-separator", "concat", "repeat"],
)
def test_growing_template_values(tmp_path: Path, url: str, message: str) -> None:
    path = write_json(tmp_path, {"version": 1, "refs": {"k": [url, 0, 1]}})
    assert message in refused(load_in_child(path), seconds=10)


def test_gen_with_long_rendered_keys(tmp_path: Path) -> None:
    """A 59 KB file that would render 1.6 TB of keys: refused at the set's budget."""
    long = "u" * 8000
    entry = {
        "key": "{{u}}" * 7 + "/{{i}}",
        "url": "http://h/{{i}}",
        "dimensions": {"i": {"stop": 5_000_000}},
    }
    document = {"version": 1, "templates": {"u": long}, "gen": [entry] * 6}
    path = write_json(tmp_path, document)
    assert path.stat().st_size < 60_000
    message = refused(load_in_child(path), mb=BASE_MB + 700)
    assert message.startswith(f"{path}: gen[0] with {{'i': ")
    assert "render more than 256 MiB in all" in message


def test_gen_key_count_and_huge_ranges(tmp_path: Path) -> None:
    def gen(dimensions: dict) -> dict:
        return {"version": 1, "gen": [{"key": "k{{i}}", "url": "u", "dimensions": dimensions}]}

    huge = write_json(tmp_path, gen({"i": {"stop": 10**30}}), "huge.json")
    assert "gen[0]: generates more than 10000000 keys" in refused(load_in_child(huge))
    many = write_json(tmp_path, gen({f"d{n}": {"stop": 10} for n in range(8)}), "many.json")
    assert "gen[0]: generates more than" in refused(load_in_child(many))


# --- compressed bombs and sizes ---------------------------------------------------------


def zeros_compressed(kind: str, size: int) -> bytes:
    """``size`` bytes of a JSON string's inside, compressed: a small file, a big output."""
    if kind == "zstd":
        compressor = zstandard.ZstdCompressor(level=3).compressobj()
        chunk = b"0" * (1 << 20)
        parts = [compressor.compress(b'{"k": "')]
        parts += [compressor.compress(chunk) for _ in range(size >> 20)]
        return b"".join([*parts, compressor.compress(b'"}'), compressor.flush()])
    out = gzip.compress(b"0" * (1 << 20), compresslevel=9)
    return out * (size >> 20)  # gzip members, concatenated, are one stream


@pytest.mark.parametrize(("kind", "size"), [("zstd", 4 << 30), ("gzip", 1 << 30)])
def test_decompression_bombs_stop_at_the_budget(tmp_path: Path, kind: str, size: int) -> None:
    path = tmp_path / f"bomb.json.{'zst' if kind == 'zstd' else 'gz'}"
    path.write_bytes(zeros_compressed(kind, size))
    assert path.stat().st_size < 1_200_000
    budget = 64 << 20
    message = refused(load_in_child(path, max_refs_bytes=budget), mb=BASE_MB + 2 * 64 + 40)
    assert f"expands ({kind}) over the limit of 64 MiB for a reference set" in message
    assert "(--max-refs-size)" in message


def test_a_plain_file_over_the_budget_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = write_json(tmp_path, {f"k{n}": "x" * 1000 for n in range(20_000)})
    message = refused(load_in_child(path, max_refs_bytes=1 << 20), mb=BASE_MB)
    assert message == (
        f"{path}: {path.stat().st_size} bytes, over the limit of 1 MiB for a reference set "
        "(--max-refs-size)"
    )


# --- JSON structure ---------------------------------------------------------------------


@pytest.mark.parametrize("depth", [2_000, 100_000])
@pytest.mark.parametrize("container", ["[]", "{}"])
def test_deep_nesting_is_refused_cleanly(tmp_path: Path, depth: int, container: str) -> None:
    opening = '{"a":' if container == "{}" else "["
    inner = opening * depth + "1" + container[1] * depth
    path = tmp_path / "deep.json"
    path.write_text('{"k": ' + inner + "}")
    outcome = load_in_child(path)
    if parses(inner):  # Python >= 3.12 parses depths its recursion limit used to refuse
        assert outcome["keys"] == 1, outcome
        assert outcome["seconds"] < SECONDS and outcome["peak_mb"] < BASE_MB, outcome
        return
    message = refused(outcome)
    assert "maximum recursion depth" in message or "key 'k'" in message


def parses(text: str) -> bool:
    """Whether this interpreter's json module parses ``text`` as an object's value."""
    try:
        value = json.loads(text)
    except RecursionError:
        return False
    return isinstance(value, dict)


def test_deep_nesting_in_a_set_parsed_in_parts(tmp_path: Path) -> None:
    """Large enough to be parsed in two processes: the fallback refuses it the same way."""
    keys = ", ".join(f'"k{n}": ["u", {n}, 1]' for n in range(400_000))
    path = tmp_path / "deep-big.json"
    path.write_text("{" + keys + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert path.stat().st_size > 8 << 20
    assert "maximum recursion depth" in refused(load_in_child(path), mb=BASE_MB + 400)


OVERFLOWING = [
    ('{"k": ["u", 9223372036854775808, 1]}', "key 'k': offset + length overflows"),
    ('{"k": ["u", 9223372036854775807, 1]}', "key 'k': offset + length overflows"),
    ('{"k": ["u", 1, 18446744073709551616]}', "key 'k': offset + length overflows"),
    ('{"k": ["u", -1, 1]}', "key 'k': negative offset or length"),
    ('{"k": ["u", 1e3, 1]}', "key 'k': offset and length must be integers"),
    ('{"k": ["u", false, 1]}', "key 'k': offset and length must be integers"),
    ('{"k": ["u", 1, ' + "9" * 5000 + "]}", "not a JSON reference set: Exceeds the limit"),
    (
        '{"version": 1, "gen": [{"key": "k{{i}}", "url": "u", "offset": "' + "9" * 30 + '",'
        ' "length": "1", "dimensions": {"i": [1]}}]}',
        "gen[0] with {'i': 1}: offset: renders '999999999999999999999999999999', which exceeds",
    ),
    (
        '{"version": 1, "gen": [{"key": "k{{i}}", "url": "u", "offset": "{{ 2 ** 62 }}",'
        ' "length": "{{ 2 ** 62 }}", "dimensions": {"i": [1]}}]}',
        "key 'k1': offset + length overflows",
    ),
    ('{"version": 1, "gen": [{"key": "k", "url": "u", "offset": true, "length": 1,'
     ' "dimensions": {"i": [1]}}]}', "offset: renders 'True', not a non-negative integer"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), OVERFLOWING)
def test_overflowing_and_mistyped_sizes_name_the_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "sizes.json"
    path.write_text(text)
    assert message in refused(load_in_child(path), seconds=10)


def test_odd_keys_give_a_bounded_consistent_tree(tmp_path: Path) -> None:
    odd = ["", "/", "/abs", "a//b", "../up", "a/../../etc", "a/./b", "t/", "nul\u0000x",
           "n" * 300, "d", "d/f", "ü/ß", "sp ace/x", "\ud800lone"]  # fmt: skip
    document = {key: "data" for key in odd}
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(document))
    outcome = load_in_child(path)
    assert outcome == {**outcome, "keys": 3}  # d/f, ü/ß, sp ace/x


# --- through the command line -----------------------------------------------------------


def test_the_command_line_refuses_a_hostile_set_and_mounts_nothing(
    tmp_path: Path, mountpoint: Path
) -> None:
    document = {
        "version": 1,
        "templates": fanning_templates(),
        "refs": {"k": ["http://h/{{t0()}}", 0, 1]},
    }
    path = write_json(tmp_path, document)
    done = subprocess.run(
        [*REFMOUNT, str(path), str(mountpoint), "-f"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1
    assert "key 'k': template 't0'" in done.stderr
    assert "more than 64 template calls" in done.stderr
    assert not is_mounted(mountpoint)


def test_the_command_line_gives_up_on_a_stalled_store(tmp_path: Path, mountpoint: Path) -> None:
    write_json(tmp_path, {"a": "x"})
    with RangeServer(tmp_path) as server:
        server.fault("*", "stall", count=-1)
        base = server.url
        url = f"{base}/refs.json?token=s3cr3t"
        done = subprocess.run(
            [*REFMOUNT, url, str(mountpoint), "-f", "--timeout", "2"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    assert done.returncode == 1
    assert f"{base}/refs.json: the store did not answer within 2 s" in done.stderr
    assert "s3cr3t" not in done.stderr
    assert not is_mounted(mountpoint)
