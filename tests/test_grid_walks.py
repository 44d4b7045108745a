"""The grid walk tracker, without a mount: which reads of chunk keys earn read-ahead."""

from __future__ import annotations

import random

from refmount.cache.grid import (
    INITIAL_WINDOW_CHUNKS,
    MAX_WINDOW_CHUNKS,
    MIN_STEPS,
    ChunkKey,
    GridWalks,
    parse_chunk_key,
)

CHUNK = 256 << 10


def walks(budget: int = 256 << 20, initial: int = 1 << 20, top: int = 64 << 20) -> GridWalks:
    return GridWalks(ahead_budget=budget, initial_window=initial, max_window=top)


def test_chunk_keys_of_v2_and_v3_are_parsed_and_made_again() -> None:
    assert parse_chunk_key("v/3.0.12") == ChunkKey("v/", ".", (3, 0, 12))
    assert parse_chunk_key("g/v/3/0/12") == ChunkKey("g/v/", "/", (3, 0, 12))
    assert parse_chunk_key("v/c/3/0/12") == ChunkKey("v/c/", "/", (3, 0, 12))
    assert parse_chunk_key("v/c.3.0") == ChunkKey("v/c.", ".", (3, 0))
    assert parse_chunk_key("v/7") == ChunkKey("v/", "/", (7,))
    assert parse_chunk_key("v/c/3/0/12").array == "v"  # type: ignore[union-attr]
    assert parse_chunk_key("v/3.0.12").array == "v"  # type: ignore[union-attr]
    for key in ("v/.zarray", "v/zarr.json", "v/01.0", "v/1.x", "v/c", "v/-1.0"):
        assert parse_chunk_key(key) is None, key
    assert parse_chunk_key("0.1") == ChunkKey("", ".", (0, 1))  # an array at the root
    chunk = parse_chunk_key("a/b/2.5")
    assert chunk is not None and chunk.key((3, 0)) == "a/b/3.0"


def test_a_walk_in_c_order_earns_read_ahead_after_three_steps_and_grows() -> None:
    tracker = walks()
    counts = (10, 2, 3)
    order = [(t, y, x) for t in range(10) for y in range(2) for x in range(3)]
    fetched: list[tuple[int, ...]] = []
    for n, index in enumerate(order):
        ahead = tracker.observe("v", index, counts, CHUNK, now=0.0)
        if n < MIN_STEPS:
            assert ahead is None
        elif ahead is not None:
            fetched += ahead.indices
    assert fetched == order[MIN_STEPS + 1 :]  # each chunk after the third once, in order
    # The window grew past the initial 4 chunks: some answer asked for more than one.
    tracker2 = walks()
    sizes = [
        len(a.indices)
        for index in order
        if (a := tracker2.observe("v", index, counts, CHUNK, now=0.0)) is not None
    ]
    assert sizes[0] == (1 << 20) // CHUNK and max(sizes) > sizes[0]


def test_a_time_series_at_one_point_walks_along_one_axis() -> None:
    tracker = walks()
    counts = (50, 4, 4)
    fetched: list[tuple[int, ...]] = []
    for t in range(50):
        ahead = tracker.observe("v", (t, 1, 2), counts, CHUNK, now=0.0)
        if ahead is not None:
            fetched += ahead.indices
    assert fetched == [(t, 1, 2) for t in range(MIN_STEPS + 1, 50)]


def test_several_reads_of_one_chunk_are_one_step() -> None:
    tracker = walks()
    counts = (20, 1, 1)
    answers = []
    for t in range(6):
        for _ in range(3):  # a chunk read in three READs
            answers.append(tracker.observe("v", (t, 0, 0), counts, CHUNK, now=0.0))
    first = next(a for a in answers if a is not None)
    assert first.indices[0] == (MIN_STEPS + 1, 0, 0)


def test_random_readers_earn_no_read_ahead() -> None:
    # Readers of distinct random chunks (16 interleaved readers are one random order).
    # Only a run of four consecutive chunks, each read within the 32 tracked walks of
    # the one before, looks like a walk: over 100 orders of 2,000 chunks, a handful.
    answers = 0
    for seed in range(100):
        tracker = walks()
        order = list(range(2000))
        random.Random(seed).shuffle(order)
        answers += sum(
            tracker.observe("v", (t, 0, 0), (2000, 1, 1), CHUNK, now=0.0) is not None for t in order
        )
    assert answers <= 10


def test_a_broken_walk_stops_reading_ahead_and_costs_at_most_its_window() -> None:
    tracker = walks(initial=1 << 20, top=1 << 20)
    counts = (1000, 1, 1)
    fetched = 0
    for t in range(100):
        ahead = tracker.observe("v", (t, 0, 0), counts, CHUNK, now=0.0)
        fetched += len(ahead.indices) if ahead else 0
    for t in (500, 300, 700):  # the reader jumps about
        assert tracker.observe("v", (t, 0, 0), counts, CHUNK, now=0.0) is None
    read = 100
    assert fetched - (read - MIN_STEPS - 1) <= (1 << 20) // CHUNK


def test_walks_stop_at_the_end_of_the_grid() -> None:
    tracker = walks()
    counts = (8, 1, 1)
    fetched = []
    for t in range(8):
        ahead = tracker.observe("v", (t, 0, 0), counts, CHUNK, now=0.0)
        fetched += ahead.indices if ahead else []
    assert fetched == [(t, 0, 0) for t in range(MIN_STEPS + 1, 8)]


def test_concurrent_walkers_share_the_budget() -> None:
    budget = 16 << 20
    tracker = walks(budget=budget)
    counts = (16 * 1000, 1, 1)
    outstanding = [0] * 16
    for step in range(200):
        for w in range(16):
            t = w * 1000 + step
            ahead = tracker.observe("v", (t, 0, 0), counts, CHUNK, now=step * 0.01)
            if ahead is not None:
                outstanding[w] = ahead.indices[-1][0] - t
    # Each walker reads ahead at most its share: the budget over the walkers.
    assert max(outstanding) * CHUNK <= budget // 16
    assert min(outstanding) > 0
    assert tracker.count() == 16


def test_a_lone_walker_has_the_whole_budget_once_the_others_are_gone() -> None:
    tracker = walks(budget=8 << 20, top=64 << 20)
    counts = (100_000, 1, 1)
    for w in range(8):
        for t in range(w * 100, w * 100 + 5):
            tracker.observe("v", (t, 0, 0), counts, CHUNK, now=0.0)
    reach = 0
    for t in range(50_000, 50_200):
        ahead = tracker.observe("v", (t, 0, 0), counts, CHUNK, now=100.0)
        if ahead is not None:
            reach = ahead.indices[-1][0] - t
    assert reach == (8 << 20) // CHUNK


def test_fell_short_asks_again() -> None:
    tracker = walks()
    counts = (100, 1, 1)
    for t in range(MIN_STEPS):
        tracker.observe("v", (t, 0, 0), counts, CHUNK, now=0.0)
    ahead = tracker.observe("v", (MIN_STEPS, 0, 0), counts, CHUNK, now=0.0)
    assert ahead is not None and len(ahead.indices) >= 2
    ahead.fell_short(1)  # only the first was fetched
    again = tracker.observe("v", (MIN_STEPS + 1, 0, 0), counts, CHUNK, now=0.0)
    assert again is not None and again.indices[0] == ahead.indices[1]


def test_out_of_grid_reads_are_ignored() -> None:
    tracker = walks()
    assert tracker.observe("v", (5, 0), (4, 1), CHUNK, now=0.0) is None
    assert tracker.observe("v", (1, 0, 0), (4, 1), CHUNK, now=0.0) is None


def test_tiny_chunks_do_not_make_a_window_of_a_million_chunks() -> None:
    tracker = walks()
    counts = (10_000_000,)
    sizes = []
    for t in range(5000):
        ahead = tracker.observe("v", (t,), counts, 1, now=0.0)
        if ahead is not None:
            sizes.append(ahead.indices[-1][0] - t)
    assert sizes[0] == INITIAL_WINDOW_CHUNKS
    assert max(sizes) == MAX_WINDOW_CHUNKS


def test_a_reader_of_a_box_inside_rows_earns_no_read_ahead() -> None:
    tracker = walks()
    counts = (20, 16)
    box = [(y, x) for y in range(20) for x in range(4, 10)]  # C order over a selection
    assert all(tracker.observe("v", i, counts, CHUNK, now=0.0) is None for i in box)


def test_a_box_from_the_row_start_reads_ahead_only_to_the_end_of_its_row() -> None:
    tracker = walks()
    counts = (20, 16)
    box = [(y, x) for y in range(20) for x in range(0, 10)]
    fetched: list[tuple[int, ...]] = []
    for index in box:
        ahead = tracker.observe("v", index, counts, CHUNK, now=0.0)
        if ahead is not None:
            assert all(y == index[0] for y, _ in ahead.indices)  # never the next row
            fetched += ahead.indices
    wasted = len(set(fetched) - set(box))
    assert wasted <= 20 * (16 - 10)


def test_a_walk_of_the_whole_grid_reads_ahead_across_rows_once_it_crossed_one() -> None:
    tracker = walks()
    counts = (20, 16)
    order = [(y, x) for y in range(20) for x in range(16)]
    reach = []
    for index in order:
        ahead = tracker.observe("v", index, counts, CHUNK, now=0.0)
        if ahead is not None:
            reach.append(ahead.indices[-1][0] - index[0])
    assert max(reach) >= 1  # some read-ahead reached into later rows
