"""Scale benchmark: refmount against fsspec's ReferenceFileSystem on the same large sets.

    python bench/scale.py [--keys 1000000] [--parquet-keys 10000000] [--workdir DIR]

Builds (once per workdir and size) a JSON reference set whose big array has ``--keys``
chunk keys with kerchunk-like values (~100-character S3 URLs into 40 files that need not
exist), and a Parquet set (LazyReferenceMapper layout, written directly with pyarrow) of
``--parquet-keys`` chunk references over three arrays into 40 sparse local files.  Then,
in one run, it measures each figure for a refmount mount (the ``refmount`` CLI, which
daemonizes and returns once the mount answers) and for fsspec in a fresh process, and
prints a table.  Mounts are always unmounted, and only daemons this script started (found
by their mount point argument) are ever signalled (``tests/support/mounting.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.mounting import REFMOUNT, child_env, mount_background, rss_kib  # noqa: E402

FILES = 40
URL = (
    "s3://some-bucket/very/long/prefix/for/a/realistic/kerchunk/reference/set/output/file_{:02d}.nc"
)
JSON_CHUNK = 180_000  # bytes per chunk in the JSON set (the files need not exist)
PARQUET_CHUNK = 4096  # bytes per chunk in the Parquet set's local (sparse) files
SMALL_ARRAYS = {"lat": 100, "lon": 100}
CLI_TIMEOUT = 900.0


class BenchError(Exception):
    """One measurement that could not be made; the table says why."""


# --- results --------------------------------------------------------------------------


@dataclass
class Row:
    figure: str
    refmount: float | None
    fsspec: float | None
    unit: str
    target: str
    #: "ratio" (refmount/fsspec no higher than) or "max" (refmount no higher than)
    rule: tuple[str, float] | None = None
    note: str = ""


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "s":
        return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
    if unit == "MiB":
        return f"{value:.0f} MiB"
    return f"{value:.0f} {unit}".strip()


def verdict(row: Row) -> str:
    if row.rule is None or row.refmount is None:
        return ""
    kind, limit = row.rule
    if kind == "max":
        return "ok" if row.refmount <= limit else "MISSED"
    if row.fsspec:
        return "ok" if row.refmount / row.fsspec <= limit else "MISSED"
    return ""


def print_table(rows: list[Row]) -> None:
    header = ("figure", "refmount", "fsspec", "ratio", "target", "")
    table = [header]
    for row in rows:
        ratio = (
            f"{row.refmount / row.fsspec:.2f}x"
            if row.refmount is not None and row.fsspec
            else "n/a"
        )
        table.append(
            (
                row.figure,
                fmt(row.refmount, row.unit),
                fmt(row.fsspec, row.unit),
                ratio,
                row.target,
                verdict(row),
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for i, line in enumerate(table):
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    notes = [f"- {row.figure}: {row.note}" for row in rows if row.note]
    if notes:
        print("\nnotes:")
        print("\n".join(notes))


# --- building the sets ----------------------------------------------------------------


def zarray(shape: list[int], chunks: list[int]) -> dict[str, Any]:
    return {
        "shape": shape,
        "chunks": chunks,
        "dtype": "<f4",
        "compressor": {"id": "zlib", "level": 4},
        "fill_value": "NaN",
        "filters": None,
        "order": "C",
        "zarr_format": 2,
    }


def json_big_shape(keys: int) -> list[int]:
    return [math.ceil(keys / 10), 10]


def build_json(path: Path, keys: int) -> int:
    """A version-0 JSON set: big/ with ``keys`` chunks, two small arrays; file count."""
    rows, cols = json_big_shape(keys)
    offsets = [0] * FILES
    count = 0
    with path.open("w") as f:
        f.write("{")
        meta = {
            ".zgroup": {"zarr_format": 2},
            ".zattrs": {"title": "refmount scale benchmark"},
            "big/.zarray": zarray([rows, cols], [1, 1]),
            "big/.zattrs": {"_ARRAY_DIMENSIONS": ["time", "member"]},
        }
        for name, n in SMALL_ARRAYS.items():
            meta[f"{name}/.zarray"] = zarray([n], [1])
            meta[f"{name}/.zattrs"] = {"_ARRAY_DIMENSIONS": [name]}
        items = [f"{json.dumps(k)}:{json.dumps(json.dumps(v))}" for k, v in meta.items()]
        count += len(items)
        for name, n in SMALL_ARRAYS.items():
            for i in range(n):
                items.append(f'"{name}/{i}":"base64:AAAAAA=="')
        count += sum(SMALL_ARRAYS.values())
        f.write(",\n".join(items))
        for index in range(keys):
            k = index % FILES
            value = [URL.format(k), offsets[k], JSON_CHUNK]
            offsets[k] += JSON_CHUNK
            f.write(f',\n"big/{index // cols}.{index % cols}":{json.dumps(value)}')
        count += keys
        f.write("}\n")
    return count


PARQUET_SPLIT = {"a": 0.1, "b": 0.3, "c": 0.6}


def parquet_shapes(keys: int) -> dict[str, tuple[int, int]]:
    """Three 2-D arrays of 1000 columns holding about ``keys`` chunks together."""
    return {
        name: (max(1, round(keys * share / 1000)), 1000) for name, share in PARQUET_SPLIT.items()
    }


def build_parquet(root: Path, data_dir: Path, keys: int, record_size: int) -> dict[str, Any]:
    """The LazyReferenceMapper layout written with pyarrow: every chunk is a 4 KiB range
    of one of 40 sparse local files (chunk i of all arrays together -> file i % 40)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    shapes = parquet_shapes(keys)
    total = sum(r * c for r, c in shapes.values())
    data_dir.mkdir(parents=True, exist_ok=True)
    paths = [str(data_dir / f"file_{k:02d}.bin") for k in range(FILES)]
    per_file = math.ceil(total / FILES) * PARQUET_CHUNK
    for p in paths:
        with open(p, "wb") as f:
            f.truncate(per_file)
            f.seek(0)
            f.write(p.encode())  # a little real data at the start of each file
    dictionary = pa.array(paths)
    meta: dict[str, Any] = {".zgroup": {"zarr_format": 2}}
    first = 0
    for name, (rows, cols) in shapes.items():
        meta[f"{name}/.zarray"] = zarray([rows, cols], [1, 1])
        meta[f"{name}/.zattrs"] = {"_ARRAY_DIMENSIONS": ["y", "x"]}
        (root / name).mkdir(parents=True, exist_ok=True)
        n = rows * cols
        for record in range(math.ceil(n / record_size)):
            lo, hi = record * record_size, min(n, (record + 1) * record_size)
            glob = np.arange(first + lo, first + hi, dtype=np.int64)
            codes = pa.array((glob % FILES).astype(np.int32))
            table = pa.table(
                {
                    "path": pa.DictionaryArray.from_arrays(codes, dictionary),
                    "offset": (glob // FILES) * PARQUET_CHUNK,
                    "size": np.full(hi - lo, PARQUET_CHUNK, dtype=np.int64),
                    "raw": pa.nulls(hi - lo, pa.binary()),
                }
            )
            pq.write_table(table, root / name / f"refs.{record}.parq", compression="zstd")
        first += n
    (root / ".zmetadata").write_text(json.dumps({"metadata": meta, "record_size": record_size}))
    return {"shapes": shapes, "total": total}


def build(workdir: Path, keys: int, parquet_keys: int, record_size: int) -> dict[str, Any]:
    """Build both sets unless this workdir already holds them at these sizes."""
    marker = workdir / "built.json"
    params = {"keys": keys, "parquet_keys": parquet_keys, "record_size": record_size, "v": 1}
    if marker.exists():
        built = json.loads(marker.read_text())
        if built["params"] == params:
            return built
    for sub in ("refs.json", "refs.parq", "data"):
        target = workdir / sub
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    t = time.perf_counter()
    files = build_json(workdir / "refs.json", keys)
    print(f"built JSON set: {files} files in {time.perf_counter() - t:.1f} s", flush=True)
    t = time.perf_counter()
    info = build_parquet(workdir / "refs.parq", workdir / "data", parquet_keys, record_size)
    print(f"built Parquet set: {info['total']} chunks in {time.perf_counter() - t:.1f} s")
    built = {"params": params, "json_files": files, "parquet": info}
    marker.write_text(json.dumps(built))
    return built


# --- processes, mounts, memory --------------------------------------------------------


def rss_mib(pid: int) -> float:
    return rss_kib(pid) / 1024


def refmount_command(explicit: str | None) -> list[str]:
    return [explicit] if explicit else REFMOUNT


def run_python(code: str, *args: str, timeout: float = 3600) -> dict[str, Any]:
    """Run a measurement in a fresh interpreter (its own RSS); it prints one JSON line."""
    spawned = time.time()
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(),
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        raise BenchError(f"fsspec measurement failed: {' | '.join(tail)}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # like a mount's ready time: from spawning the interpreter to the set being loaded
    result["ready"] = result["loaded_at"] - spawned
    return result


RSS_HELPER = """
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
"""

FSSPEC_JSON = (
    RSS_HELPER
    + """
import json, sys, time
import fsspec, fsspec.implementations.reference, s3fs
base = rss()
t = time.perf_counter()
fs = fsspec.filesystem("reference", fo=sys.argv[1], remote_protocol="s3",
                       remote_options={"anon": True}, skip_instance_cache=True)
load = time.perf_counter() - t
loaded_at = time.time()
loaded = rss()
t = time.perf_counter()
files = len(fs.find(""))
find = time.perf_counter() - t
t = time.perf_counter()
entries = len(fs.ls(sys.argv[2], detail=True))
ls = time.perf_counter() - t
print(json.dumps({"load": load, "loaded_at": loaded_at, "rss_increase": loaded - base,
                  "rss": loaded, "find": find, "files": files, "ls": ls, "entries": entries}))
"""
)

FSSPEC_PARQUET = (
    RSS_HELPER
    + """
import json, sys, time
import fsspec, fsspec.implementations.reference, pandas, fastparquet
keys = json.load(open(sys.argv[2]))
base = rss()
t = time.perf_counter()
fs = fsspec.filesystem("reference", fo=sys.argv[1], remote_protocol="file",
                       skip_instance_cache=True)
load = time.perf_counter() - t
loaded_at = time.time()
t = time.perf_counter()
nbytes = 0
for key in keys:
    fs.info(key)
    nbytes += len(fs.cat_file(key))
reads = time.perf_counter() - t
print(json.dumps({"load": load, "loaded_at": loaded_at, "reads": reads, "bytes": nbytes,
                  "rss": rss(), "rss_increase": rss() - base}))
"""
)


# --- the measurements -----------------------------------------------------------------


def timed_shell(command: str, timeout: float = 3600) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(
        ["sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "LC_ALL": "C"},
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise BenchError(f"{command!r} exited {done.returncode}: {done.stderr.strip()[-200:]}")
    return elapsed, done.stdout


def bench_json(command: list[str], workdir: Path, built: dict[str, Any], rows: list[Row]) -> None:
    refs = workdir / "refs.json"
    keys = built["params"]["keys"]
    mib = refs.stat().st_size / 2**20
    print(f"JSON: {built['json_files']} files, {mib:.0f} MiB of JSON", flush=True)
    try:
        fss = run_python(FSSPEC_JSON, str(refs), "big")
    except (BenchError, subprocess.TimeoutExpired) as exc:
        fss = {}
        print(f"  fsspec: {exc}", flush=True)
    ref: dict[str, float | None] = {"ready": None, "rss": None, "find": None, "ls": None}
    note = ""
    try:
        with mount_background(
            refs, workdir / "mnt-json", command=command, timeout=CLI_TIMEOUT
        ) as m:
            ref["ready"] = m.ready
            ref["rss"] = rss_mib(m.pid) if m.pid else None
            elapsed, out = timed_shell(f"find {m.path} -type f | wc -l")
            ref["find"] = elapsed
            if int(out.strip()) != built["json_files"]:
                note = f"find counted {out.strip()} files, expected {built['json_files']}"
            elapsed, out = timed_shell(f"ls -l {m.path}/big | wc -l")
            ref["ls"] = elapsed
            if int(out.strip()) - 1 != keys:  # less the "total" line; no dot files
                note += f"; ls -l listed {int(out.strip()) - 1} entries, expected {keys}"
            ref["rss_after"] = rss_mib(m.pid) if m.pid else None
    except (BenchError, OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        note = f"refmount: {exc}"
        print(f"  {note}", flush=True)
    if fss and fss["files"] != built["json_files"]:
        note += f"; fsspec found {fss['files']} files"
    # The targets, scaled to the set's size: find of 1M files in 5 s, ls -l of a
    # directory of 1M entries in 10 s.
    find_limit, ls_limit = built["json_files"] / 200_000, keys / 100_000
    rows += [
        Row(f"JSON {keys:,} keys: ready (from process start)", ref["ready"], fss.get("ready"),
            "s", "<= 1x fsspec", ("ratio", 1.0), note.lstrip("; ")),
        Row("JSON: fsspec load alone (in-process)", None, fss.get("load"), "s", ""),
        Row("JSON: daemon RSS / fsspec process RSS", ref["rss"], fss.get("rss"), "MiB",
            "<= 1x fsspec", ("ratio", 1.0)),
        Row("JSON: daemon RSS / fsspec RSS increase", ref["rss"], fss.get("rss_increase"),
            "MiB", "(as asked)"),
        Row("JSON: daemon RSS after find + ls -l", ref.get("rss_after"), None, "MiB", ""),
        Row("JSON: find MNT -type f | wc -l / fs.find", ref["find"], fss.get("find"), "s",
            f"< {find_limit:.1f} s", ("max", find_limit)),
        Row(f"JSON: ls -l big/ ({keys:,} entries) / fs.ls", ref["ls"], fss.get("ls"), "s",
            f"< {ls_limit:.1f} s", ("max", ls_limit)),
    ]  # fmt: skip


def sample_keys(built: dict[str, Any], samples: int) -> list[str]:
    shapes = {k: tuple(v) for k, v in built["parquet"]["shapes"].items()}
    names = list(shapes)
    weights = [r * c for r, c in shapes.values()]
    rng = random.Random(20260922)
    keys = []
    for name in rng.choices(names, weights, k=samples):
        rows, cols = shapes[name]
        index = rng.randrange(rows * cols)
        keys.append(f"{name}/{index // cols}.{index % cols}")
    return keys


def library_open_time(root: Path) -> float:
    """ParquetRefSet.open alone, in this process: the mount's share of the ready time."""
    from fsspec.implementations.local import LocalFileSystem

    from refmount.refs.parquet import ParquetRefSet

    start = time.perf_counter()
    ParquetRefSet.open(LocalFileSystem(), str(root), resolve=str, mtime=0).close()
    return time.perf_counter() - start


def bench_parquet(
    command: list[str], workdir: Path, built: dict[str, Any], samples: int, rows: list[Row]
) -> None:
    root = workdir / "refs.parq"
    total = built["parquet"]["total"]
    keys = sample_keys(built, samples)
    keys_file = workdir / "sample-keys.json"
    keys_file.write_text(json.dumps(keys))
    print(f"Parquet: {total:,} chunk refs, {samples:,} random chunks", flush=True)
    try:
        fss = run_python(FSSPEC_PARQUET, str(root), str(keys_file))
    except (BenchError, subprocess.TimeoutExpired) as exc:
        fss = {}
        print(f"  fsspec: {exc}", flush=True)
    try:
        open_time: float | None = library_open_time(root)
    except Exception as exc:  # the library may be mid-change: report, keep measuring
        open_time = None
        print(f"  ParquetRefSet.open: {exc}", flush=True)
    ref: dict[str, float | None] = {"ready": None, "reads": None, "rss": None}
    note = ""
    try:
        with mount_background(
            root, workdir / "mnt-parquet", command=command, timeout=CLI_TIMEOUT
        ) as m:
            ref["ready"] = m.ready
            ref["rss_ready"] = rss_mib(m.pid) if m.pid else None
            start = time.perf_counter()
            nbytes = 0
            for key in keys:
                path = m.path / key
                os.stat(path)
                with open(path, "rb") as f:
                    nbytes += len(f.read())
            ref["reads"] = time.perf_counter() - start
            ref["rss"] = rss_mib(m.pid) if m.pid else None
            if nbytes != samples * PARQUET_CHUNK:
                note = f"read {nbytes} bytes, expected {samples * PARQUET_CHUNK}"
    except (BenchError, OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        note = f"refmount: {exc}"
        print(f"  {note}", flush=True)
    rows += [
        Row(f"Parquet {total:,} refs: ready (from process start)", ref["ready"],
            fss.get("ready"), "s", "< 0.5 s", ("max", 0.5), note),
        Row("Parquet: ParquetRefSet.open / fsspec load (in-process)", open_time,
            fss.get("load"), "s", "< 0.5 s", ("max", 0.5)),
        Row(f"Parquet: stat+read {samples:,} random chunks", ref["reads"], fss.get("reads"),
            "s", "<= 1x fsspec", ("ratio", 1.0)),
        Row("Parquet: daemon RSS at ready", ref.get("rss_ready"), None, "MiB", ""),
        Row("Parquet: daemon RSS after reads / fsspec RSS", ref["rss"], fss.get("rss"), "MiB",
            "<= 1x fsspec", ("ratio", 1.0)),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="JSON chunk keys")
    parser.add_argument("--parquet-keys", type=int, default=10_000_000)
    parser.add_argument("--record-size", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=10_000, help="random Parquet reads")
    parser.add_argument("--workdir", type=Path, help="kept (and reused) when given")
    parser.add_argument("--refmount", help="refmount command (default: the venv's)")
    parser.add_argument("--skip-json", action="store_true")
    parser.add_argument("--skip-parquet", action="store_true")
    args = parser.parse_args(argv)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="refmount-bench-"))
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    command = refmount_command(args.refmount)
    rows: list[Row] = []
    try:
        built = build(workdir, args.keys, args.parquet_keys, args.record_size)
        if not args.skip_json:
            bench_json(command, workdir, built, rows)
        if not args.skip_parquet:
            bench_parquet(command, workdir, built, args.samples, rows)
    finally:
        if rows:
            print()
            print_table(rows)
        mounts = [p for p in workdir.glob("mnt-*") if os.path.ismount(p)]
        if args.workdir is None and not mounts:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
