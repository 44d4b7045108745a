"""The zarr v3 shard index parser (refmount/decode/v3/shards.py) against hostile indexes.

An index entry is two little-endian uint64 (offset, length), both all ones for an inner
chunk not written.  Whatever the 16 bytes say, an inner chunk is located only inside the
shard: the sum ``offset + length`` never wraps (it did on numpy's uint64), an entry with
only one field all ones is refused, and a run of neighbours is served as one request only
when each lies exactly where the one before it ends.  Hypothesis (derandomized) builds
indexes from values near the edges.
"""

from __future__ import annotations

import struct

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, example, given, settings

from refmount.decode.arrays import chunk_decoder
from refmount.decode.codecs import DecodeError
from refmount.decode.v3.shards import ShardDecoder, ShardLayout, shard_decoder

MISSING = (1 << 64) - 1
CHUNK = 4  # bytes of an inner chunk (uint8, 4 values, no codec)


def decoder(count: int, position: int = 0) -> ShardDecoder:
    inner = chunk_decoder(
        {"compressor": None, "filters": [], "dtype": "|u1", "chunks": [CHUNK], "order": "C"}
    )
    return shard_decoder(inner, ShardLayout((count,), True, False), position, 0)


def index_of(entries: list[tuple[int, int]]) -> bytes:
    return b"".join(struct.pack("<QQ", offset, length) for offset, length in entries)


@pytest.mark.parametrize(
    "entry",
    [
        (MISSING, 2),  # offset all ones: the uint64 sum wraps to 1
        (2, MISSING),  # length all ones: half missing
        ((1 << 64) - 100, 200),  # the sum wraps to 100, inside a 1000-byte shard
    ],
)
def test_an_entry_past_the_shard_or_half_missing_is_refused(entry: tuple[int, int]) -> None:
    with pytest.raises(DecodeError, match=r"missing one field|past the shard's end"):
        decoder(1).locate(index_of([entry]), 1000)


def test_an_entry_of_a_chunk_not_written_and_a_good_one() -> None:
    index = index_of([(MISSING, MISSING), (10, 4)])
    assert decoder(2, 0).locate(index, 1000) is None
    assert decoder(2, 1).locate(index, 1000) == (10, 4)


def test_a_run_whose_sums_agree_but_whose_chunks_overlap_is_no_run() -> None:
    """Offsets 0, 5, 9 and lengths 1, 8, 1: 10 bytes from 0 to 10 as the lengths add up,
    but the second chunk overlaps the third and the first leaves a gap."""
    index = index_of([(0, 1), (5, 8), (9, 1)])
    assert decoder(3, 0).run(index, 1000) is None
    fine = index_of([(0, 1), (1, 3), (4, 1)])
    run = decoder(3, 0).run(fine, 1000)
    assert run is not None and (run.start, run.end) == (0, 5)
    assert run.spans == ((0, 0, 1), (1, 1, 3), (2, 4, 1))


EDGES = st.sampled_from([0, 1, 3, 4, 5, 8, 64, 999, 1000, 1 << 32, 1 << 63, MISSING - 1, MISSING])
VALUES = st.one_of(EDGES, st.integers(0, 1200), st.integers(0, MISSING))
ENTRIES = st.lists(st.tuples(VALUES, VALUES), min_size=1, max_size=6)


def _contiguous(count: int) -> st.SearchStrategy[list[tuple[int, int]]]:
    lengths = st.lists(st.integers(0, 8), min_size=count, max_size=count)
    return lengths.map(lambda ns: [(sum(ns[:i]), n) for i, n in enumerate(ns)])


@settings(
    max_examples=400,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    entries=st.one_of(ENTRIES, st.integers(1, 6).flatmap(_contiguous)),
    shard_size=st.one_of(st.integers(0, 1100), EDGES),
)
@example(entries=[(MISSING, 2)], shard_size=1000)
@example(entries=[(0, 1), (5, 8), (9, 1)], shard_size=1000)
def test_any_index_locates_inside_the_shard_or_refuses(
    entries: list[tuple[int, int]], shard_size: int
) -> None:
    index = index_of(entries)
    for position, (offset, length) in enumerate(entries):
        shard = decoder(len(entries), position)
        try:
            found = shard.locate(index, shard_size)
        except DecodeError:
            found = "refused"
        if (offset, length) == (MISSING, MISSING):
            assert found is None
        elif MISSING in (offset, length) or offset + length > shard_size:
            assert found == "refused"
        elif length <= shard.inner.max_raw_size:
            assert found == (offset, length)
        run = shard.run(index, shard_size)
        if run is None:
            continue
        assert 0 <= run.start <= run.end <= shard_size
        at = run.start
        for member, within, size in run.spans:
            # Each lies where the one before ends, and is its own entry, as located.
            assert run.start + within == at
            assert shard.at(member).locate(index, shard_size) == (at, size)
            at += size
        assert at == run.end
        assert position in [member for member, _, _ in run.spans]
