"""Walks along an array's chunk grid, and the chunks they earn to be read ahead.

Pure bookkeeping, no trio and no I/O (like :mod:`refmount.cache.streams` for the bytes of
one URL): :class:`GridWalks` is told of every read of a chunk key (an array, the chunk's
index, the array's chunk counts per dimension, the chunk's size) and answers with the
chunk indices to fetch ahead, if any.  The caller resolves them to references and
fetches what its budget allows, and says where it stopped (:meth:`Ahead.fell_short`).

A combined reference set keeps each chunk in its own object (one granule file per time
step): no stream forms on any URL, and a reader walking the grid pays a round trip per
chunk.  The views know the grid, so the walk is seen here instead:

- *C order* (zarr, NCZarr and ``cat`` of the keys in order): the next chunk is the index
  plus one in the last dimension, carrying into the ones before;
- *along one axis* (a time series at one point): the next chunk is one further along
  that axis, every other index the same.

An array keeps a few walks (concurrent readers each get one), least recently used first.
A read of the chunk a walk expects next, or of one it has read ahead, continues it; any
other read starts a new walk.  A walk earns read-ahead after ``MIN_STEPS`` steps in one
direction (random readers almost never make three in a row), starting at
``initial_window`` bytes' worth of chunks and doubling each time the reader gets through
half of it, up to ``max_window`` (and ``MAX_WINDOW_CHUNKS``), never past the walk's end.
A reader of a box of the grid (a selection) walks its rows in C order too, but its rows
end before the grid's: until a C-order walk has gone on from one row of the grid to the
next, it reads ahead only to the end of its row, and not at all if it began inside a row
(a box that starts there: it would waste a window per row).  Each walk's window is
also capped at its fair share of the read-ahead budget: the budget
divided among the walks with read-ahead seen within ``ACTIVE_SECONDS``.  A walk that
breaks leaves at most its window read ahead unused.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

INITIAL_WINDOW = 1 << 20
MAX_WINDOW = 64 << 20
#: Chunks a window holds at most, and at first, however small the chunks: each is a
#: lookup and a request, and this many already hide a round trip many times over.
MAX_WINDOW_CHUNKS = 1024
INITIAL_WINDOW_CHUNKS = 64
MIN_STEPS = 3  # steps in one direction before read-ahead starts (random readers: ~never)
WALKS_PER_ARRAY = 32  # 16 concurrent walkers, and room for random readers beside them
MAX_ARRAYS = 1024
ACTIVE_SECONDS = 2.0  # a walk with read-ahead unseen this long has no share of the budget

C_ORDER = -1  # a walk's direction: C order, else the axis it walks along

_INDEX = re.compile(r"0|[1-9][0-9]*")


@dataclass(frozen=True, slots=True)
class ChunkKey:
    """A chunk key split into its array's prefix, separator and index: ``v/3.0.0`` is
    ``("v/", ".", (3, 0, 0))``, ``v/c/3/0/0`` (Zarr v3) is ``("v/c/", "/", (3, 0, 0))``."""

    prefix: str
    separator: str
    index: tuple[int, ...]

    def key(self, index: tuple[int, ...]) -> str:
        return self.prefix + self.separator.join(map(str, index))

    @property
    def array(self) -> str:
        """The array's path, the prefix less a v3 ``c`` component."""
        path = self.prefix[:-1]
        if path == "c" or path.endswith("/c"):
            return path[:-2]
        return path


def parse_chunk_key(key: str) -> ChunkKey | None:
    """The chunk key ``key`` is, or ``None`` (metadata, or not an index).  Indices must
    be written as zarr writes them (``0``, ``12``; not ``012``), so that the key made
    for the next chunk is the one the set holds."""
    last = key.rpartition("/")[2]
    if "." in last:
        parts = last.split(".")
        prefix = key[: len(key) - len(last)]
        if parts[0] == "c":  # Zarr v3 with the "." separator: c.3.0.0
            parts = parts[1:]
            prefix += "c."
        if parts and all(_INDEX.fullmatch(p) for p in parts):
            return ChunkKey(prefix, ".", tuple(int(p) for p in parts))
        return None
    parts = key.split("/")
    n = len(parts)
    while n > 0 and _INDEX.fullmatch(parts[n - 1]):
        n -= 1
    if n == len(parts) or n == 0:
        return None
    prefix = "/".join(parts[:n]) + "/"
    return ChunkKey(prefix, "/", tuple(int(p) for p in parts[n:]))


def _c_ordinal(index: tuple[int, ...], counts: tuple[int, ...]) -> int:
    ordinal = 0
    for i, n in zip(index, counts, strict=True):
        ordinal = ordinal * n + i
    return ordinal


def _c_index(ordinal: int, counts: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for n in reversed(counts):
        ordinal, i = divmod(ordinal, n)
        out.append(i)
    return tuple(reversed(out))


def _strides(counts: tuple[int, ...]) -> tuple[int, ...]:
    """How far the C-order rank moves for one step along each axis."""
    out = [1] * len(counts)
    for d in range(len(counts) - 2, -1, -1):
        out[d] = out[d + 1] * counts[d + 1]
    return tuple(out)


class Walk:
    """One reader's walk along an array's grid, as seen from the chunks it reads.

    ``index`` and ``rank`` are the chunk it stands on and that chunk's C-order rank;
    ``pos`` is its ordinal along the walk: the rank in C order, the index along the
    walked axis otherwise (the other indices stay ``index``'s)."""

    __slots__ = (
        "ahead",
        "boxed",
        "crossed",
        "direction",
        "grow_at",
        "index",
        "pos",
        "rank",
        "seen",
        "steps",
        "window",
    )

    def __init__(self, index: tuple[int, ...], rank: int, now: float) -> None:
        self.index = index
        self.rank = rank
        self.direction: int | None = None  # C_ORDER, an axis, or None: not known yet
        self.pos = 0
        self.steps = 0
        self.window = 0  # chunks; 0 until read-ahead starts
        self.ahead = 0  # read-ahead has been issued up to this ordinal
        self.grow_at = 0
        self.seen = now
        #: A C-order walk went on from the end of a row of the grid to the next row: it
        #: walks the whole grid, not a box of it (see ``GridWalks._top_up``).
        self.crossed = False
        #: A C-order walk that began inside a row: maybe a reader of a box of the grid
        #: (a selection), whose rows end before the grid's; no read-ahead until crossed.
        self.boxed = False

    def at(self, ordinal: int, counts: tuple[int, ...]) -> tuple[int, ...]:
        """The chunk index at ``ordinal`` along the walk."""
        if self.direction == C_ORDER:
            return _c_index(ordinal, counts)
        axis = self.direction
        assert axis is not None
        return (*self.index[:axis], ordinal, *self.index[axis + 1 :])

    def length(self, counts: tuple[int, ...]) -> int:
        """Ordinals along the walk: its end."""
        if self.direction == C_ORDER:
            return math.prod(counts)
        assert self.direction is not None
        return counts[self.direction]

    def reach(self) -> int:
        """The furthest ordinal a read may land on and continue the walk."""
        return max(self.pos + 1, self.ahead)


@dataclass(slots=True)
class Ahead:
    """Chunks a walk wants fetched ahead of its reader, in order; the caller calls
    ``fell_short`` with the first it could not fetch (no room in the budget), so that
    the walk asks for it again later."""

    indices: list[tuple[int, ...]]
    walk: Walk
    first: int  # the ordinal of indices[0]

    def fell_short(self, n: int) -> None:
        """``indices[n]`` and those after it were not fetched."""
        self.walk.ahead = min(self.walk.ahead, self.first + n - 1)


class _Array:
    """The walks of one array, least recently used first, its grid's strides, and its
    innermost axis of more than one chunk (-1: none), along which a grid's rows run."""

    __slots__ = ("counts", "inner", "strides", "walks")

    def __init__(self, counts: tuple[int, ...]) -> None:
        self.counts = counts
        self.strides = _strides(counts)
        inner = max((d for d, n in enumerate(counts) if n > 1), default=-1)
        # A grid of one row (no axis of more than one chunk before it) has no box to
        # tell apart from a walk of the whole grid.
        self.inner = inner if any(n > 1 for n in counts[: max(inner, 0)]) else -1
        self.walks: list[Walk] = []


class GridWalks:
    """The walks of every array read lately (at most ``MAX_ARRAYS``).

    ``ahead_budget``: the bytes read-ahead may hold in all, shared among active walks."""

    def __init__(
        self,
        *,
        ahead_budget: int,
        initial_window: int = INITIAL_WINDOW,
        max_window: int = MAX_WINDOW,
    ) -> None:
        self.ahead_budget = ahead_budget
        self.initial_window = initial_window
        self.max_window = max(max_window, initial_window)
        self._arrays: OrderedDict[Hashable, _Array] = OrderedDict()
        # Walks with read-ahead seen within ACTIVE_SECONDS, least recently seen first.
        self._active: OrderedDict[Walk, None] = OrderedDict()

    def count(self) -> int:
        """Walks with read-ahead seen lately: those sharing the budget."""
        return len(self._active)

    def observe(
        self,
        array: Hashable,
        index: tuple[int, ...],
        counts: tuple[int, ...],
        chunk_bytes: int,
        now: float,
    ) -> Ahead | None:
        """Follow a read of chunk ``index`` of ``array`` (whose grid has ``counts``
        chunks per dimension, this one ``chunk_bytes`` long); the chunks to read ahead
        now, if any."""
        if len(index) != len(counts) or any(
            not 0 <= i < n for i, n in zip(index, counts, strict=True)
        ):
            return None
        state = self._arrays.get(array)
        if state is None or state.counts != counts:
            if state is not None:
                self._forget(state.walks)
            state = self._arrays[array] = _Array(counts)
            if len(self._arrays) > MAX_ARRAYS:
                self._forget(self._arrays.popitem(last=False)[1].walks)
        else:
            self._arrays.move_to_end(array)
        rank = _c_ordinal(index, counts)
        walks = state.walks
        walk = self._step(state, index, rank)
        if walk is None:
            walks.append(Walk(index, rank, now))
            if len(walks) > WALKS_PER_ARRAY:
                # The least recently used walk without read-ahead goes first.
                victim = next((w for w in walks if not w.window), walks[0])
                walks.remove(victim)
                self._active.pop(victim, None)
            return None
        walk.seen = now
        if walks[-1] is not walk:
            walks.remove(walk)
            walks.append(walk)
        if walk.steps < MIN_STEPS or (walk.boxed and not walk.crossed):
            return None
        return self._top_up(walk, state, max(chunk_bytes, 1), now)

    def _step(self, state: _Array, index: tuple[int, ...], rank: int) -> Walk | None:
        """The walk this read goes on with (moved on to it), if any.  A read of the chunk
        a walk stands on (one chunk read in several READs) changes nothing; a read one
        step from where a walk without a direction stands gives it one.  Cheap for
        random readers: a few integer comparisons per walk."""
        strides = state.strides
        for walk in reversed(state.walks):
            d = rank - walk.rank
            if d == 0:
                return walk
            if d < 0:
                continue
            direction = walk.direction
            if direction is None:
                if d == 1:
                    direction = C_ORDER
                else:
                    # One step along one axis: the rank moves by its stride (an axis
                    # whose stride is not unique moves by one: that is C order).
                    axis = strides.index(d) if d in strides else -1
                    if axis < 0 or index[axis] != walk.index[axis] + 1:
                        continue
                    direction = axis
                walk.direction = direction
                inner = state.inner
                walk.crossed = inner < 0
                walk.boxed = direction == C_ORDER and inner >= 0 and walk.index[inner] > 0
                walk.steps = 1
                walk.pos = rank if direction == C_ORDER else index[direction]
                walk.ahead = walk.pos
            elif direction == C_ORDER:
                if rank > walk.reach():
                    continue
                walk.steps += 1
                walk.pos = rank
                inner = state.inner
                if inner >= 0 and index[inner] < walk.index[inner]:
                    walk.crossed = True
            else:
                stride = strides[direction]
                if d % stride:
                    continue
                ordinal = walk.pos + d // stride
                if index[direction] != ordinal or ordinal > walk.reach():
                    continue
                walk.steps += 1
                walk.pos = ordinal
            walk.index = index
            walk.rank = rank
            return walk
        return None

    def _forget(self, walks: list[Walk]) -> None:
        for walk in walks:
            self._active.pop(walk, None)

    def _top_up(self, walk: Walk, state: _Array, chunk_bytes: int, now: float) -> Ahead | None:
        counts = state.counts
        active = self._active
        active[walk] = None
        active.move_to_end(walk)
        cutoff = now - ACTIVE_SECONDS
        while (oldest := next(iter(active))).seen < cutoff:
            del active[oldest]
        share = self.ahead_budget // len(active)
        cap = min(max(1, min(self.max_window, share) // chunk_bytes), MAX_WINDOW_CHUNKS)
        pos = walk.pos
        if walk.window == 0:
            walk.window = min(max(1, self.initial_window // chunk_bytes), INITIAL_WINDOW_CHUNKS)
            walk.grow_at = pos + max(1, walk.window // 2)
        elif pos >= walk.grow_at:
            walk.window *= 2
            walk.grow_at = pos + max(1, walk.window // 2)
        walk.window = min(walk.window, cap)
        walk.ahead = max(walk.ahead, pos)
        last = walk.length(counts) - 1
        inner = state.inner
        if walk.direction == C_ORDER and not walk.crossed and inner >= 0:
            # Until it goes on to the next row, a C-order walk may be a reader of a box
            # of the grid (a selection), whose rows end sooner: read ahead to the end of
            # the row only, so that such a reader wastes at most the rest of a row.
            last = min(last, pos + counts[inner] - 1 - walk.index[inner])
        target = min(pos + walk.window, last)
        # Refilled a quarter of the window at a time (each answer is a task and a batch
        # of lookups for the caller), to the end of the walk at once.
        if target <= walk.ahead or (target - walk.ahead < walk.window // 4 and target < last):
            return None
        first = walk.ahead + 1
        indices = [walk.at(o, counts) for o in range(first, target + 1)]
        walk.ahead = target
        return Ahead(indices, walk, first)
