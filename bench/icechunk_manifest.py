"""Reading the chunk references of a large Icechunk array from its manifest.

    python bench/icechunk_manifest.py [--refs 1000000] [--workdir DIR]

Builds (once, kept in ``--workdir``) an Icechunk repository with one array of ``--refs``
virtual chunks, half with an ETag checksum (one per thousand chunks, as chunks of one
file share it) and half with a modification time, then measures, each in a fresh
process: refmount's :func:`~refmount.icechunk.manifest.parse_manifest` of the manifest
file (coordinates, kinds, offsets, lengths, locations and checksums: what a mount
serves), and icechunk's own
``array_chunk_iterator`` over the same array (coordinates, kinds, locations, offsets and
lengths, no checksums).  Prints seconds and the peak RSS each process added.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BUILD = """
import datetime, sys, icechunk, zarr
icechunk.set_logs_filter("error")
path, n = sys.argv[1], int(sys.argv[2])
prefix = "file:///data/"
config = icechunk.RepositoryConfig.default()
config.set_virtual_chunk_container(
    icechunk.VirtualChunkContainer(prefix, icechunk.local_filesystem_store("/data/")))
repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path), config)
session = repo.writable_session("main")
zarr.group(session.store).create_array("v", shape=(n,), chunks=(1,), dtype="u1")
when = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
for lo in range(0, n, 100_000):
    session.store.set_virtual_refs("v", [
        icechunk.VirtualChunkSpec(
            index=[i], location=f"{prefix}f{i // 1000}.nc", offset=i * 10, length=10,
            etag_checksum=f'"etag-{i // 1000}"' if i % 2 else None,
            last_updated_at_checksum=None if i % 2 else when)
        for i in range(lo, min(n, lo + 100_000))], validate_containers=False)
session.commit("bench")
"""

MEASURE = """
import asyncio, resource, sys, time
path, how = sys.argv[1], sys.argv[2]
import numpy, zstandard, icechunk
icechunk.set_logs_filter("error")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
if how == "refmount":
    from pathlib import Path
    from refmount.icechunk.manifest import parse_manifest
    (manifest,) = Path(path, "manifests").iterdir()
    parsed = parse_manifest(manifest.read_bytes(), manifest.name)
    (array,) = parsed.arrays.values()
    rows = len(array.coords)
    extra = f"{len(parsed.checksums)} distinct checksums, {len(array.targets)} distinct URLs"
else:
    repo = icechunk.Repository.open(icechunk.local_filesystem_storage(path))
    store = repo.readonly_session("main").store
    async def count():
        n = 0
        async for batch in store.array_chunk_iterator("v"):
            n += len(batch[0])
        return n
    rows, extra = asyncio.run(count()), "no checksums"
seconds = time.perf_counter() - start
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(f"{how:9} {rows} refs in {seconds:.2f} s, peak RSS +{grown:.0f} MiB ({extra})")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refs", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    repo = args.workdir / f"refmount-bench-icechunk-{args.refs}"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if not (repo / "manifests").is_dir():
        print(f"building {repo} ...", flush=True)
        subprocess.run([sys.executable, "-c", BUILD, str(repo), str(args.refs)], check=True)
    (manifest,) = (repo / "manifests").iterdir()
    print(f"manifest {manifest.name}: {manifest.stat().st_size} bytes")
    for how in ("refmount", "icechunk"):
        subprocess.run([sys.executable, "-c", MEASURE, str(repo), how], check=True, env=env)


if __name__ == "__main__":
    main()
