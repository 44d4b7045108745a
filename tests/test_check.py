"""``refmount check REFS``: a reference set validated without mounting, as a CI job runs it.

Every case runs ``python -m refmount check`` as a separate process and looks at its exit
status and what it printed; probes go to the range server on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from fsspec.implementations.reference import LazyReferenceMapper

from tests.conftest import REFMOUNT, is_mounted, refmount_cli, unmount
from tests.support.servers import RangeServer


def write_json(directory: Path, document: object, name: str = "refs.json") -> Path:
    path = directory / name
    path.write_text(json.dumps(document))
    return path


def check_json(*args: str) -> tuple[int, dict]:
    result = refmount_cli("check", "--json", *args)
    return result.returncode, json.loads(result.stdout)


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(1000))
    return path


@pytest.fixture
def good_refs(tmp_path: Path, data_file: Path) -> Path:
    return write_json(tmp_path, {"version": 1, "refs": {
        ".zgroup": {"zarr_format": 2},
        "temp/.zarray": "0123456789",
        "temp/0.0": [str(data_file), 0, 100],
        "temp/0.1": [str(data_file), 100, 300],
        "temp/sub/x": [str(data_file)],
        "http/a": ["https://example.org:8443/f.nc?sig=secret", 10, 20],
        "http/b": ["https://example.org:8443/f.nc", 30, 20],
        "http/c": ["https://example.org:8443/g.nc", 0, 5],
        "s3/a": ["s3://bucket/key.nc", 0, 7],
    }})  # fmt: skip


def test_a_good_set_is_counted_and_passes(good_refs: Path, data_file: Path) -> None:
    code, report = check_json(str(good_refs))
    assert code == 0, report
    assert report["ok"] is True and report["loaded"] is True and report["problems"] == []
    assert report["format"] == "JSON"
    assert report["keys"] == 9
    assert report["directories"] == 4  # temp, temp/sub, http, s3
    # .zgroup is {"zarr_format":2} written compactly; .zarray ten bytes
    assert report["inline_keys"] == 2
    assert report["inline_bytes"] == len(b'{"zarr_format":2}') + 10
    assert report["range_keys"] == 6 and report["whole_file_keys"] == 1
    assert report["range_bytes"] == 100 + 300 + 20 + 20 + 5 + 7
    assert report["targets"] == {
        "file": {"local": {"files": 1, "keys": 3}},
        "https": {"example.org:8443": {"files": 2, "keys": 3}},
        "s3": {"bucket": {"files": 1, "keys": 1}},
    }
    assert report["probes"] is None
    assert "secret" not in json.dumps(report)


def test_the_human_report(good_refs: Path) -> None:
    result = refmount_cli("check", str(good_refs))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith(f"file://{good_refs}: JSON reference set, loaded\n")
    assert "keys              9 (2 inline, 6 byte ranges, 1 whole files)" in out
    assert "directories       4" in out
    assert "targets           4 files for 7 keys" in out
    assert "https://example.org:8443" in out and "s3://bucket" in out
    assert out.rstrip().endswith("problems: none")
    assert result.stderr == ""


def test_skipped_keys_are_problems_with_their_reason(tmp_path: Path) -> None:
    refs = write_json(tmp_path, {"version": 1, "refs": {
        "ok": "fine",
        "a//b": "empty component",
        "../up": "escapes",
        "f": "file and directory",
        "f/g": "inside",
    }})  # fmt: skip
    code, report = check_json(str(refs))
    assert code == 1
    assert report["loaded"] is True and report["ok"] is False
    assert report["keys"] == 2  # ok, f/g
    messages = [p["message"] for p in report["problems"]]
    kinds = {p["kind"] for p in report["problems"]}
    assert kinds == {"skipped"}
    assert len(messages) == 3
    assert any("'a//b'" in m and "not a usable path" in m for m in messages)
    assert any("'../up'" in m for m in messages)
    assert any("'f'" in m and "also a directory" in m for m in messages)

    human = refmount_cli("check", str(refs))
    assert human.returncode == 1
    assert "problems: 3" in human.stdout and "skipped: " in human.stdout
    assert human.stderr == ""  # warnings are in the report, not repeated on stderr


def test_many_skipped_keys_hit_the_warning_bound(tmp_path: Path) -> None:
    refs = write_json(tmp_path, {f"bad{i}/": "x" for i in range(150)} | {"good": "y"})
    code, report = check_json(str(refs))
    assert code == 1 and report["keys"] == 1
    messages = [p["message"] for p in report["problems"]]
    assert len(messages) == 101  # 100 one by one, then a count
    assert "skipped 50 more keys" in messages[-1]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"version": 1, "refs": {"a": ', "line 1"),
        ('{"version": 1, "refs": {"a": ["x.bin", -5, 10]}}', "a"),
        ("[1, 2, 3]", "refs.json"),
    ],
)
def test_a_set_that_does_not_load_fails(tmp_path: Path, content: str, expected: str) -> None:
    refs = tmp_path / "refs.json"
    refs.write_text(content)
    code, report = check_json(str(refs))
    assert code == 1
    assert report["loaded"] is False and report["ok"] is False
    assert [p["kind"] for p in report["problems"]] == ["load"]
    assert expected in report["problems"][0]["message"]
    human = refmount_cli("check", str(refs))
    assert human.returncode == 1 and "not loaded" in human.stdout


def test_a_missing_set_fails(tmp_path: Path) -> None:
    code, report = check_json(str(tmp_path / "nothing.json"))
    assert code == 1 and report["loaded"] is False
    assert "no such file" in report["problems"][0]["message"]


def test_a_parquet_set_is_walked(tmp_path: Path, data_file: Path) -> None:
    root = tmp_path / "parq"
    root.mkdir()
    out = LazyReferenceMapper.create(str(root), record_size=2)
    out[".zgroup"] = json.dumps({"zarr_format": 2}).encode()
    out["v/.zarray"] = json.dumps({
        "shape": [4], "chunks": [1], "dtype": "<i8", "compressor": None, "fill_value": 0,
        "filters": None, "order": "C", "zarr_format": 2,
    }).encode()  # fmt: skip
    for i in range(3):  # chunk 3 is never written
        out[f"v/{i}"] = [str(data_file), i * 10, 10]
    out.flush()
    code, report = check_json(str(root))
    assert code == 0, report
    assert report["format"] == "Parquet"
    # .zgroup, v/.zarray, the synthesized .zmetadata, three chunks
    assert report["keys"] == 6 and report["range_keys"] == 3 and report["range_bytes"] == 30
    assert report["targets"] == {"file": {"local": {"files": 1, "keys": 3}}}


def test_usage_errors_exit_2(good_refs: Path) -> None:
    assert refmount_cli("check").returncode == 2
    assert refmount_cli("check", str(good_refs), "--probe", "-1").returncode == 2
    bad = refmount_cli("check", str(good_refs), "--no-such-option")
    assert bad.returncode == 2 and "usage: refmount check" in bad.stderr
    helped = refmount_cli("check", "--help")
    assert helped.returncode == 0 and "--probe" in helped.stdout


# -- probing targets -----------------------------------------------------------------------


def test_probe_reports_the_missing_and_the_short(tmp_path: Path, http: RangeServer) -> None:
    (http.root / "check-whole.bin").write_bytes(b"x" * 4000)
    (http.root / "check-short.bin").write_bytes(b"x" * 100)
    url = http.url
    refs = write_json(tmp_path, {"version": 1, "refs": {
        "fine": [f"{url}/check-whole.bin", 1000, 3000],
        "whole": [f"{url}/check-whole.bin"],
        "missing": [f"{url}/check-missing.bin", 0, 10],
        "short": [f"{url}/check-short.bin", 50, 100],
        "inline": "not a target",
    }})  # fmt: skip
    code, report = check_json(str(refs), "--probe", "10", "--retries", "0")
    assert code == 1
    probes = {p["key"]: p for p in report["probes"]}
    assert set(probes) == {"fine", "whole", "missing", "short"}  # only keys with targets
    assert probes["fine"]["ok"] and probes["fine"]["size"] == 4000
    assert probes["whole"]["ok"] and probes["whole"]["needs"] == 0
    assert not probes["missing"]["ok"] and probes["missing"]["size"] is None
    assert probes["short"]["size"] == 100 and probes["short"]["needs"] == 150
    problems = {p["kind"]: p["message"] for p in report["problems"]}
    assert set(problems) == {"unreachable", "short"}
    assert problems["unreachable"].startswith(f"missing: {url}/check-missing.bin: ")
    assert "has 100 bytes, the key needs 150" in problems["short"]
    # the server was asked: the sizes came from it
    asked = http.stats()["requests"]
    assert asked >= 3

    human = refmount_cli("check", str(refs), "--probe", "10", "--retries", "0")
    assert human.returncode == 1
    assert "4 targets asked (seed 0): 2 fine, 2 not" in human.stdout
    assert "unreachable: missing:" in human.stdout
    assert human.stderr == ""


def test_probe_of_reachable_targets_passes(tmp_path: Path, http: RangeServer) -> None:
    (http.root / "check-ok.bin").write_bytes(b"y" * 500)
    refs = write_json(tmp_path, {f"k{i}": [f"{http.url}/check-ok.bin", i, 10] for i in range(20)})
    code, report = check_json(str(refs), "--probe", "5")
    assert code == 0, report
    assert len(report["probes"]) == 5 and all(p["ok"] for p in report["probes"])


def test_probe_draws_are_seeded(tmp_path: Path, data_file: Path) -> None:
    refs = write_json(tmp_path, {f"k{i:03}": [str(data_file), i, 1] for i in range(200)})

    def drawn(*seed: str) -> list[str]:
        code, report = check_json(str(refs), "--probe", "5", *seed)
        assert code == 0, report
        return sorted(p["key"] for p in report["probes"])

    first = drawn("--seed", "7")
    assert len(set(first)) == 5
    assert drawn("--seed", "7") == first
    assert drawn() == drawn("--seed", "0")
    assert any(drawn("--seed", str(seed)) != first for seed in (1, 2, 3))


def test_probe_of_a_stalled_target_keeps_its_deadline(tmp_path: Path, http: RangeServer) -> None:
    (http.root / "check-stall.bin").write_bytes(b"z" * 10)
    refs = write_json(tmp_path, {"k": [f"{http.url}/check-stall.bin", 0, 5]})
    http.fault("/check-stall.bin", "stall", count=-1)
    # 3 s, not less: on a loaded machine a deadline of 1 s can end in the connection
    # (another message), not in the stalled answer this test is about.
    code, report = check_json(str(refs), "--probe", "1", "--timeout", "3", "--retries", "1")
    assert code == 1
    assert report["problems"][0]["kind"] == "unreachable", report
    assert "no answer within 3 s (after 2 attempts)" in report["problems"][0]["message"], report


# -- the subcommand rule -------------------------------------------------------------------


def test_a_refs_file_named_check_still_mounts(tmp_path: Path, mountpoint: Path) -> None:
    """``refmount check MOUNTPOINT`` with a file ``check`` here is the old mount command."""
    write_json(tmp_path, {"a": "from the file named check"}, name="check")
    result = subprocess.run(
        [*REFMOUNT, "check", str(mountpoint)], cwd=tmp_path, capture_output=True, text=True,
        timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert result.returncode == 0, result.stderr
        assert is_mounted(mountpoint)
        assert (mountpoint / "a").read_text() == "from the file named check"
    finally:
        unmount(mountpoint)


def test_check_is_a_subcommand_when_no_mount_is_meant(tmp_path: Path, good_refs: Path) -> None:
    write_json(tmp_path, {"a": "x"}, name="check")  # a file named check, but REFS is a file
    result = subprocess.run(
        [*REFMOUNT, "check", str(good_refs)], cwd=tmp_path, capture_output=True, text=True,
        timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "JSON reference set, loaded" in result.stdout
