"""A JSON reference set and the same set converted to Parquet, both mounted for real."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.data_builders import kerchunk_refs, ref_map, write_netcdf
from tests.support.parquet_sets import refs_to_parquet, write_record, write_set, zarray


def tree_of(root: Path) -> dict[str, tuple[str, int]]:
    """Every entry below ``root``: kind and size, as ``find`` and ``stat`` see them."""
    listing = subprocess.run(
        ["find", str(root), "-mindepth", "1", "-printf", "%P\\t%y\\t%s\\n"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    entries = {}
    for line in listing.splitlines():
        path, kind, size = line.split("\t")
        entries[path] = (kind, int(size) if kind == "f" else 0)
    return entries


def test_json_and_parquet_mounts_are_identical(tmp_path: Path, mount) -> None:
    nc = write_netcdf(tmp_path / "data.nc")
    refs = kerchunk_refs(nc, f"file://{nc}")
    json_path = tmp_path / "refs.json"
    json_path.write_text(json.dumps(refs))
    parquet_dir = tmp_path / "refs.parq"
    refs_to_parquet(refs, parquet_dir, record_size=7)
    assert len(list(parquet_dir.rglob("refs.*.parq"))) > 3  # several records per array

    from_json = mount(json_path).mountpoint
    from_parquet = mount(parquet_dir).mountpoint
    json_tree, parquet_tree = tree_of(from_json), tree_of(from_parquet)
    # the Parquet set also serves its consolidated metadata
    assert parquet_tree.pop(".zmetadata")[0] == "f"
    assert json_tree.keys() == parquet_tree.keys()
    assert sum(kind == "f" for kind, _ in json_tree.values()) == len(refs["refs"])
    metadata = json.loads((from_parquet / ".zmetadata").read_bytes())
    assert metadata["zarr_consolidated_format"] == 1
    for path, (kind, size) in json_tree.items():
        assert parquet_tree[path][0] == kind, path
        if kind != "f":
            continue
        data = (from_json / path).read_bytes()
        assert len(data) == size
        if os.path.basename(path).startswith(".z"):
            # Parquet keeps metadata as JSON objects, not kerchunk's text (which escapes
            # "/" as "\/"): the documents are equal, their spelling may differ.
            assert json.loads((from_parquet / path).read_bytes()) == json.loads(data), path
            assert metadata["metadata"][path] == json.loads(data)
        else:
            assert parquet_tree[path] == (kind, size), path
            assert (from_parquet / path).read_bytes() == data, path


def test_records_load_on_demand_and_never_pandas(tmp_path: Path, mount) -> None:
    """Until a chunk is looked up the daemon has mapped neither numpy nor pyarrow (so it
    answers sooner), and it never loads pandas, which pyarrow would import for nothing."""
    nc = write_netcdf(tmp_path / "data.nc")
    refs = kerchunk_refs(nc, f"file://{nc}")
    parquet_dir = tmp_path / "refs.parq"
    refs_to_parquet(refs, parquet_dir, record_size=7)
    mounted = mount(parquet_dir)
    root = mounted.mountpoint
    maps = Path(f"/proc/{mounted.process.pid}/maps")

    for name in os.listdir(root):  # a listing and a stat of every entry, arrays included
        os.stat(root / name)
    loaded = maps.read_text()
    assert "pyarrow" not in loaded and "numpy" not in loaded

    key, (_, offset, length) = next(
        (k, v) for k, v in ref_map(refs).items() if isinstance(v, list) and len(v) == 3
    )
    with open(nc, "rb") as f:
        f.seek(offset)
        expected = f.read(length)
    assert os.stat(root / key).st_size == length
    assert (root / key).read_bytes() == expected
    loaded = maps.read_text()
    assert "libarrow" in loaded and "/pandas/" not in loaded


def test_missing_chunks_are_enoent_and_broken_records_eio(tmp_path: Path, mount) -> None:
    """Through the mount: a chunk with neither path nor data, or in a record file that is
    absent from its listed directory, is "no such file" (zarr's fill value); a chunk in a
    record file that does not decode is EIO; the rest reads."""
    data = bytes(range(256)) * 4
    (tmp_path / "data.bin").write_bytes(data)
    root = tmp_path / "sparse.parq"
    write_set(
        root,
        {
            "a/.zarray": zarray([8], [1]),
            "broken/.zarray": zarray([2], [1]),
        },
        record_size=4,
    )
    target = str(tmp_path / "data.bin")
    write_record(
        root / "a" / "refs.0.parq", [target, None, target, target], [0, 0, 9, 0], [4, 0, 3, 4]
    )
    (root / "broken").mkdir()
    (root / "broken" / "refs.0.parq").write_bytes(b"PAR1 not parquet at all PAR1")
    mnt = mount(root, "--allow-local").mountpoint
    assert (mnt / "a" / "0").read_bytes() == data[:4]
    assert (mnt / "a" / "2").read_bytes() == data[9:12]
    assert (mnt / "a" / "3").read_bytes() == data[:4]
    assert sorted(os.listdir(mnt / "a")) == [".zarray", "0", "2", "3"]
    for key in ["a/1", "a/4", "a/7"]:  # null row; record 1 has no file (listing agrees)
        result = subprocess.run(["cat", str(mnt / key)], capture_output=True, text=True)
        assert "No such file or directory" in result.stderr, key
    for key in ["broken/0", "broken/1"]:  # an unreadable record
        result = subprocess.run(["cat", str(mnt / key)], capture_output=True, text=True)
        assert "Input/output error" in result.stderr, key
    assert (mnt / "a" / "0").read_bytes() == data[:4]
