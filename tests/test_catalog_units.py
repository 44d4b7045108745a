"""The catalog's parts that need no mount: naming, inode ranges, the LRU of loaded sets,
the listing's TTL, listing a local source, and loading a set once for many callers."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import trio

from refmount import backoff as backoff_module
from refmount.backoff import Backoff
from refmount.catalog.catalog import Catalog
from refmount.catalog.inodes import RANGE_BITS, CatalogDirs, InodeSpaceFull, Ranges, SetInodes
from refmount.catalog.lru import LoadedSets
from refmount.catalog.names import Found, SetFile, plan, set_name
from refmount.catalog.source import is_catalog, list_sets
from refmount.catalog.ttl import Expiring
from refmount.catalog.view import CatalogTree
from refmount.errors import FetchError
from refmount.refs import RefSet, open_refset
from refmount.tree import FILE_BASE, GENERATION_SPAN, ROOT_INODE, Owner, StaleInode, Tree


def found(source: str, parquet: bool = False) -> Found:
    return Found(source, f"/src/{source}", parquet)


# -- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "parquet", "name"),
    [
        ("run01.json", False, "run01"),
        ("run01.json.zst", False, "run01"),
        ("run01.json.gz", False, "run01"),
        ("a.b.json.bz2", False, "a.b"),
        ("notes.txt", False, None),
        ("run02.parq", True, "run02"),
        ("run03", True, "run03"),
    ],
)
def test_set_names_lose_their_suffixes(filename: str, parquet: bool, name: str | None) -> None:
    assert set_name(filename, parquet=parquet) == name


def test_plan_nests_directories_and_skips_clashes() -> None:
    result = plan(
        [
            found("run01.json"),
            found("run02.json.gz"),
            found("run02.json"),  # clashes with run02.json.gz
            found("2024/jan.json.zst"),
            found("2024/feb", parquet=True),
            found("x.json"),
            found("x/inner.json"),  # the directory x clashes with the set x
            found(".json"),  # no name left
            found("readme.txt"),
        ]
    )
    assert sorted(result.sets) == ["2024/feb", "2024/jan", "run01", "x/inner"]
    assert result.dirs == {"": ["2024", "run01", "x"], "2024": ["feb", "jan"], "x": ["inner"]}
    assert len(result.problems) == 3
    assert any("run02: skipped: 2 sets" in p for p in result.problems)
    assert any(p.startswith("x.json: skipped: a directory") for p in result.problems)
    assert any(p.startswith(".json: skipped") for p in result.problems)
    assert result.sets["2024/feb"].found.parquet


def test_a_file_beside_each_set_unless_its_name_is_taken() -> None:
    result = plan(
        [
            found("run01.json"),
            found("run01.nc.json"),  # a set named as run01's file: run01 gets none
            found("2024/jan.json"),
            found("a" * 253 + ".json"),  # its file's name would be 256 bytes
        ],
        SetFile(".nc", 0),
    )
    assert result.files == {"2024/jan.nc": "2024/jan", "run01.nc.nc": "run01.nc"}
    assert result.dirs == {
        "": ["2024", "a" * 253, "run01", "run01.nc", "run01.nc.nc"],
        "2024": ["jan", "jan.nc"],
    }
    assert result.subdirectories("") == 4 and result.subdirectories("2024") == 1
    assert sorted(p.split(":")[0] for p in result.problems) == ["a" * 253 + ".nc", "run01.nc"]
    assert all("is left out" in p for p in result.problems)


def test_a_name_longer_than_a_directory_entry_is_skipped() -> None:
    result = plan([found("a" * 256 + ".json"), found("ok.json")])
    assert list(result.sets) == ["ok"]
    assert "longer than 255" in result.problems[0]


# -- inodes ---------------------------------------------------------------------------------


def test_inodes_of_sets_never_collide_and_translate_both_ways() -> None:
    ranges, dirs = Ranges(), CatalogDirs()
    a = SetInodes(ranges, "a", dirs.inode("a"))
    b = SetInodes(ranges, "b", dirs.inode("b"))
    assert dirs.inode("a") == 2 and dirs.inode("b") == 3 and dirs.path(3) == "b"
    locals_ = [ROOT_INODE, 2, 7, FILE_BASE, FILE_BASE + 5, FILE_BASE + 3 * GENERATION_SPAN + 9]
    seen = set()
    for inodes in (a, b):
        for local in locals_:
            inode = inodes.to_global(local)
            assert inode < 1 << 63
            assert inodes.to_local(inode) == local
            assert inodes.is_dir(inode) == (local < FILE_BASE)
            seen.add(inode)
    assert len(seen) == 2 * len(locals_)
    assert a.to_local(b.to_global(FILE_BASE)) is None
    assert ranges.owner(a.to_global(FILE_BASE + 1)) == ("a", 0)
    assert ranges.owner(b.to_global(4)) == ("b", None)
    assert ranges.owner(5) is None  # range 0: the catalog's own


def test_ranges_are_never_handed_out_twice_and_run_out_loudly() -> None:
    ranges = Ranges(limit=4)
    assert [ranges.allocate(n) for n in "xyz"] == [1, 2, 3]
    with pytest.raises(InodeSpaceFull):
        ranges.allocate("w")
    assert ranges.owner(3 << RANGE_BITS) == "z"


# -- LRU and TTL ----------------------------------------------------------------------------


def test_least_recently_used_idle_sets_go_first() -> None:
    loaded: LoadedSets[str] = LoadedSets(2)
    for key in "abc":
        loaded.touch(key)
    loaded.touch("a")  # b is now the least recently used
    assert loaded.over_limit(busy=lambda k: False) == ["b"]
    assert list(loaded) == ["c", "a"]
    loaded.touch("d")
    assert loaded.over_limit(busy=lambda k: k == "c") == ["a"]  # c is busy: a goes
    loaded.touch("e")
    assert loaded.over_limit(busy=lambda k: False, keep="c") == ["d"]
    assert len(loaded) == 2 and "c" in loaded and "e" in loaded


def test_sets_are_unloaded_past_the_bytes_their_indexes_hold() -> None:
    loaded: LoadedSets[str] = LoadedSets(10, max_bytes=100)
    loaded.touch("a", 60)
    loaded.touch("b", 30)
    assert loaded.over_limit(busy=lambda k: False) == []
    loaded.touch("c", 50)
    assert loaded.over_limit(busy=lambda k: False, keep="c") == ["a"]
    assert loaded.nbytes == 80
    loaded.touch("b")  # used again: its size stays
    loaded.touch("d", 40)
    assert loaded.over_limit(busy=lambda k: k == "c") == ["b"]
    assert loaded.nbytes == 90 and list(loaded) == ["c", "d"]


def test_a_json_set_tells_the_bytes_its_index_holds(tmp_path: Path) -> None:
    small = open_refset(str(write_set(tmp_path / "s.json", {"k": "v"})), timeout=10)
    keys = {f"a/{n}": [f"s3://b/f{n % 7}", n, 10] for n in range(10_000)}
    large = open_refset(str(write_set(tmp_path / "l.json", keys)), timeout=10)
    small_bytes, large_bytes = small.memory_bytes(), large.memory_bytes()
    assert small_bytes is not None and large_bytes is not None
    assert 0 < small_bytes < 10_000 < 10_000 * 20 < large_bytes < 10_000 * 200


def test_a_listing_is_fresh_for_its_ttl() -> None:
    now = [100.0]
    listing: Expiring[str] = Expiring(5.0, clock=lambda: now[0])
    assert not listing.fresh
    listing.set("v1")
    now[0] += 4.9
    assert listing.fresh
    now[0] += 0.2
    assert not listing.fresh
    listing.set("v2")
    assert listing.fresh


# -- the source and loading -------------------------------------------------------------------


def write_set(path: Path, refs: dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path


def test_listing_a_local_source_finds_json_and_parquet_sets(tmp_path: Path) -> None:
    write_set(tmp_path / "run01.json", {"a": "1"})
    write_set(tmp_path / "deep" / "er" / "run02.json", {"a": "2"})
    (tmp_path / "pq.parq").mkdir()
    (tmp_path / "pq.parq" / ".zmetadata").write_text("{}")
    (tmp_path / "pq.parq" / "inner.json").write_text("{}")  # inside a set: not walked
    (tmp_path / "other.txt").write_text("x")
    sets = {f.source: f for f in list_sets(str(tmp_path), {}, timeout=10)}
    assert sorted(sets) == ["deep/er/run02.json", "pq.parq", "run01.json"]
    assert sets["pq.parq"].parquet and not sets["run01.json"].parquet
    assert sets["run01.json"].url == str(tmp_path / "run01.json")
    assert sets["run01.json"].mtime == pytest.approx((tmp_path / "run01.json").stat().st_mtime)
    assert any(part.startswith("size=") for part in sets["run01.json"].signature)
    assert is_catalog(str(tmp_path), {}, 10)
    assert not is_catalog(str(tmp_path / "pq.parq"), {}, 10)
    assert not is_catalog(str(tmp_path / "run01.json"), {}, 10)


def test_a_listing_past_its_bound_fails(tmp_path: Path) -> None:
    for n in range(5):
        write_set(tmp_path / f"s{n}.json", {"a": "1"})
    with pytest.raises(Exception, match="more than 3 entries"):
        list_sets(str(tmp_path), {}, timeout=10, max_entries=3)


def make_catalog(source: Path, max_loaded: int, loads: list[str]) -> tuple[Catalog, CatalogTree]:
    owner = Owner(0, 0)

    async def no_size(url: str) -> int:
        raise AssertionError("no remote sizes here")

    def load(url: str, name: str) -> RefSet:  # the real loader; counted
        loads.append(url)
        return open_refset(url, timeout=10)

    def tree(refset: RefSet, generation: int, directories: dict[int, str] | None) -> Tree:
        return Tree(refset, owner, no_size, generation=generation, dir_paths=directories)

    catalog = Catalog(
        str(source),
        lambda: list_sets(str(source), {}, timeout=10),
        load,
        tree,
        ttl=60,
        max_loaded=max_loaded,
    )
    catalog.start()
    return catalog, CatalogTree(catalog, owner, no_size)


def test_many_first_requests_load_a_set_once(tmp_path: Path) -> None:
    for n in range(3):
        write_set(tmp_path / f"s{n}.json", {"k": f"bytes of {n}", "d/x": "x"})
    loads: list[str] = []
    catalog, view = make_catalog(tmp_path, 2, loads)

    async def main() -> list[bytes]:
        root_entries = list(await view.listing(ROOT_INODE))
        assert [e.name for e in root_entries] == ["s0", "s1", "s2"]
        assert loads == []  # listing the root loads nothing
        s1 = await view.lookup(ROOT_INODE, "s1")
        assert s1 is not None and (await view.node(s1)).nlink == 2 and loads == []
        got: list[bytes] = []

        async def read() -> None:
            inode = await view.lookup(s1, "k")
            assert inode is not None
            ref = await view.ref(inode)
            got.append(ref.data or b"")

        async with trio.open_nursery() as nursery:
            for _ in range(200):
                nursery.start_soon(read)
        return got

    got = trio.run(main)
    assert got == [b"bytes of 1"] * 200
    assert loads == [str(tmp_path / "s1.json")]
    assert catalog.loads == 1


def test_unloaded_sets_come_back_with_the_same_inodes(tmp_path: Path) -> None:
    for n in range(4):
        write_set(tmp_path / f"s{n}.json", {"k": f"{n}", "d/x": f"x{n}"})
    loads: list[str] = []
    catalog, view = make_catalog(tmp_path, 2, loads)

    async def inodes_of(name: str) -> tuple[int, int, int]:
        root = await view.lookup(ROOT_INODE, name)
        assert root is not None
        d = await view.lookup(root, "d")
        assert d is not None
        x = await view.lookup(d, "x")
        assert x is not None
        assert (await view.ref(x)).data == f"x{name[1]}".encode()
        return root, d, x

    async def main() -> None:
        first = {name: await inodes_of(name) for name in ("s0", "s1", "s2", "s3")}
        assert len(catalog.loaded) == 2  # s0 and s1 unloaded
        assert catalog.sets["s0"].tree is None
        assert (await view.ref(first["s0"][2])).data == b"x0"  # loads s0 again
        assert await inodes_of("s0") == first["s0"]
        all_inodes = [i for triple in first.values() for i in triple]
        assert len(set(all_inodes)) == len(all_inodes)

    trio.run(main)
    assert loads.count(str(tmp_path / "s0.json")) == 2


def test_a_broken_set_fails_alone_and_waits_before_trying_again(tmp_path: Path) -> None:
    write_set(tmp_path / "good.json", {"k": "fine"})
    (tmp_path / "bad.json").write_text("{nope")
    loads: list[str] = []
    _, view = make_catalog(tmp_path, 5, loads)

    async def main() -> None:
        bad = await view.lookup(ROOT_INODE, "bad")
        assert bad is not None
        for _ in range(3):
            with pytest.raises(FetchError, match="bad cannot be loaded"):
                await view.lookup(bad, "k")
        good = await view.lookup(ROOT_INODE, "good")
        assert good is not None
        k = await view.lookup(good, "k")
        assert k is not None and (await view.ref(k)).data == b"fine"

    trio.run(main)
    assert loads.count(str(tmp_path / "bad.json")) == 1  # within its back-off: not again


def test_a_failure_is_remembered_for_a_back_off_that_doubles(monkeypatch) -> None:
    """The mechanism behind a catalog's broken set and an Icechunk array's failed
    manifests: the same failure at once within the back-off, a try after it, each
    failure in a row twice as long up to the bound; a success forgets."""
    now = [100.0]
    monkeypatch.setattr(backoff_module.time, "monotonic", lambda: now[0])
    remembered = Backoff(30.0, 100.0)
    remembered.check()  # nothing failed yet
    waits = []
    for attempt in range(4):
        waits.append(remembered.failed(f"failure {attempt}"))
        now[0] += waits[-1] - 0.001
        with pytest.raises(FetchError, match=f"failure {attempt}"):
            remembered.check()
        now[0] += 0.001
        remembered.check()  # the back-off has passed: try again
    assert waits == [30.0, 60.0, 100.0, 100.0]
    remembered.failed("again")
    remembered.forget()  # what failed changed: at once, the back-off still grown
    remembered.check()
    assert remembered.failed("once more") == 100.0
    remembered.succeeded()
    assert remembered.error is None and remembered.failed("new") == 30.0


def test_a_refresh_adds_removes_and_reloads_changed_sets(tmp_path: Path) -> None:
    write_set(tmp_path / "a.json", {"k": "old", "same": "s"})
    write_set(tmp_path / "b.json", {"k": "b"})
    write_set(tmp_path / "c.json", {"k": "c"})
    loads: list[str] = []
    catalog, view = make_catalog(tmp_path, 1, loads)

    async def main() -> None:
        a = await view.lookup(ROOT_INODE, "a")
        assert a is not None
        k, same = await view.lookup(a, "k"), await view.lookup(a, "same")
        assert k is not None and same is not None
        assert (await view.ref(k)).data == b"old"
        b = await view.lookup(ROOT_INODE, "b")  # loading b unloads a (one loaded at most)
        assert b is not None and await view.lookup(b, "k") is not None
        assert catalog.sets["a"].tree is None
        c = await view.lookup(ROOT_INODE, "c")
        assert c is not None and await view.lookup(c, "k") is not None  # c loaded, b not

        write_set(tmp_path / "a.json", {"k": "new", "same": "s"})  # a: unloaded, changed
        write_set(tmp_path / "c.json", {"k": "c2"})  # c: loaded, changed
        write_set(tmp_path / "d.json", {"k": "d"})
        (tmp_path / "b.json").unlink()
        await catalog.refresh()
        assert sorted(e.name for e in await view.listing(ROOT_INODE)) == ["a", "c", "d"]
        assert await view.lookup(ROOT_INODE, "b") is None
        with pytest.raises(StaleInode):
            await view.lookup(b, "k")
        c_k = await view.lookup(c, "k")
        assert c_k is not None and (await view.ref(c_k)).data == b"c2"  # reloaded in place
        assert catalog.sets["c"].generation == 1
        # a was unloaded when it changed: loaded again as its next generation, its old
        # file inodes stale, its directories kept.
        new_k = await view.lookup(a, "k")
        assert new_k is not None and new_k != k and (await view.ref(new_k)).data == b"new"
        assert (await view.ref(k)).data == b"old"  # a request begun before: the old tree
        catalog._close_retired(time.monotonic() + 3600)  # once the old trees are closed
        with pytest.raises(StaleInode):
            await view.ref(k)
        assert (await view.ref(new_k)).data == b"new"

    trio.run(main)


def test_a_set_changed_while_unloaded_is_a_new_generation_unseen_by_the_listing(
    tmp_path: Path,
) -> None:
    write_set(tmp_path / "a.json", {"k": "old"})
    write_set(tmp_path / "b.json", {"k": "b"})
    catalog, view = make_catalog(tmp_path, 1, [])

    async def main() -> None:
        a = await view.lookup(ROOT_INODE, "a")
        b = await view.lookup(ROOT_INODE, "b")
        assert a is not None and b is not None
        k = await view.lookup(a, "k")
        assert k is not None and (await view.ref(k)).data == b"old"
        assert await view.lookup(b, "k") is not None  # unloads a
        write_set(tmp_path / "a.json", {"k": "new"})
        os.utime(tmp_path / "a.json", (1, 1))  # no refresh: only the load sees it
        new_k = await view.lookup(a, "k")
        assert new_k is not None and new_k != k and (await view.ref(new_k)).data == b"new"
        assert catalog.sets["a"].generation == 1

    trio.run(main)
