"""Parquet reference sets (the LazyReferenceMapper layout) written with pyarrow alone,
row by row as a test wants them, hostile ones included: no zarr, no kerchunk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def zarray(shape: list[int], chunks: list[int], **extra: Any) -> dict[str, Any]:
    """A zarr v2 ``.zarray`` of unsigned bytes, uncompressed."""
    meta = {
        "shape": shape,
        "chunks": chunks,
        "dtype": "|u1",
        "compressor": None,
        "fill_value": 0,
        "filters": None,
        "order": "C",
        "zarr_format": 2,
    }
    return {**meta, **extra}


def write_set(root: Path, metadata: dict[str, Any], record_size: int = 4, **extra: Any) -> None:
    """``ROOT/.zmetadata`` with these metadata keys and record size."""
    root.mkdir(parents=True, exist_ok=True)
    doc = {"metadata": metadata, "record_size": record_size, **extra}
    (root / ".zmetadata").write_text(json.dumps(doc))


def write_record(
    path: Path,
    paths: list[str | None] | None,
    offsets: list[Any] | None,
    sizes: list[Any] | None,
    raws: list[bytes | None] | None = None,
    *,
    row_group_size: int | None = None,
    compression: str = "snappy",
) -> None:
    """One record file; a column given as None is left out."""
    path.parent.mkdir(parents=True, exist_ok=True)
    columns: dict[str, Any] = {}
    if paths is not None:
        columns["path"] = pa.array(paths, pa.string()).dictionary_encode()
    if offsets is not None:
        columns["offset"] = offsets
    if sizes is not None:
        columns["size"] = sizes
    if raws is not None:
        columns["raw"] = pa.array(raws, pa.binary())
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size, compression=compression)


def write_ranges(
    root: Path, name: str, data_url: str, chunk: int, nchunks: int, record_size: int
) -> None:
    """The records of array ``name``: chunk i is ``[data_url, i * chunk, chunk]``."""
    for record in range(-(-nchunks // record_size)):
        lo, hi = record * record_size, min(nchunks, (record + 1) * record_size)
        write_record(
            root / name / f"refs.{record}.parq",
            [data_url] * (hi - lo),
            [i * chunk for i in range(lo, hi)],
            [chunk] * (hi - lo),
        )


def refs_to_parquet(refs: dict[str, Any], out: Path, record_size: int) -> None:
    """A JSON reference set (version 0 or 1, no templates) written in the Parquet layout
    by fsspec's own ``LazyReferenceMapper``, as ``kerchunk.df.refs_to_dataframe`` does."""
    from fsspec.implementations.local import LocalFileSystem
    from fsspec.implementations.reference import LazyReferenceMapper

    mapper = LazyReferenceMapper.create(str(out), fs=LocalFileSystem(), record_size=record_size)
    entries = refs.get("refs", refs) if refs.get("version") == 1 else refs
    for key in sorted(entries):
        mapper[key] = entries[key]
    mapper.flush()
