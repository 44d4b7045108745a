"""One mounted reference set: its parts wired together, mounted, and served under trio.

Until the mount answers, any failure (the first stat through the mount failing or not
answering within :data:`READY_DEADLINE`, a task dying) is a failed start: the message
goes to the caller, the mount is taken down, and the daemon exits with status 1.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyfuse3
import trio

from refmount.cache import BlockCache
from refmount.cache.chunkahead import ChunkReadAhead
from refmount.cache.disk import DiskCache, DiskCacheConfig, DiskTier
from refmount.cache.disk.cache import QUEUE_BYTES
from refmount.cache.disk.tier import UNIT
from refmount.catalog import is_catalog
from refmount.catalog.catalog import Catalog
from refmount.catalog.serving import open_catalog
from refmount.errors import RefsError
from refmount.fetch import Fetcher, FetchPolicy
from refmount.fuse_ops import Operations
from refmount.icechunk import is_repository, open_configured
from refmount.options import Config
from refmount.redaction import Scrubber, display_url, shown
from refmount.refs import RefSet, open_refset
from refmount.request_timing import RequestTimer
from refmount.service.control import ControlServer, MountState, socket_path
from refmount.service.notify import notify
from refmount.service.progress import LoadProgress
from refmount.service.reload import Reloader, refs_signature
from refmount.tree import Owner, Tree
from refmount.tuning import log_fuse_features, tune_kernel
from refmount.workers import PoolConfig, WorkerPool
from refmount.workers.fetching import FetchWorkers

if TYPE_CHECKING:
    from refmount.decode import DecodedReads
    from refmount.netcdf.reads import NetcdfReads

log = logging.getLogger(__name__)

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_GRACE = 1.0  # seconds requests in flight may finish in after SIGTERM
READY_DEADLINE = 60.0  # seconds the first stat through the new mount may take


class StartError(Exception):
    """The mount was made but does not work; the message says why."""


def mount_options(config: Config) -> set[str]:
    """What pyfuse3 passes to libfuse.  Always read-only, no devices, no setuid."""
    source = config.fsname or shown(config.refs)
    fsname = source.replace("\\", "\\\\").replace(",", "\\,")
    options = {
        f"fsname={fsname}",
        "subtype=refmount",
        "ro",
        "nodev",
        "nosuid",
        "default_permissions",
        "auto_unmount",
    }
    if config.allow_other:
        options.add("allow_other")
    elif config.allow_root:
        options.add("allow_root")
    return options


@dataclass
class Daemon:
    config: Config
    operations: Operations
    cache: BlockCache
    control: ControlServer
    #: Loads REFS for a reload: the decoded view wraps what it loads.
    load_set: Callable[[Config], RefSet] = lambda config: load_refset(config)
    catalog: Catalog | None = None
    disk: DiskCache | None = None
    #: What the store said of REFS before it was loaded (``--reload-interval`` only).
    signature: tuple[str, ...] | None = None
    #: The worker processes decoding chunks (``--decode``).
    workers: WorkerPool | None = None
    #: The worker processes remote requests run in (``--fetch-workers``).
    fetch_workers: FetchWorkers | None = None
    #: The netCDF view's reads (``--netcdf``), whose read-ahead runs in the daemon's nursery.
    netcdf: NetcdfReads | None = None

    @classmethod
    def load(cls, config: Config) -> Daemon:
        if (
            not config.icechunk
            and not config.catalog
            and is_repository(config.refs, config.refs_options)
        ):
            config = dataclasses.replace(config, icechunk=True)
        if config.icechunk:
            return cls.load_catalog(config) if config.versions else cls.load_one(config)
        if config.catalog or is_catalog(config.refs, config.refs_options, config.timeout):
            return cls.load_catalog(config)
        return cls.load_one(config)

    @classmethod
    def load_one(cls, config: Config) -> Daemon:
        """REFS is one reference set (or one Icechunk repository)."""
        notify("STATUS=loading the reference set")
        signature = _signature_before_load(config)
        with LoadProgress.for_command(config.refs) as progress:
            refset = load_refset(config, progress)
        fetcher, fetch_workers = _fetcher(config)
        fetcher.confine_flat_options(refset.target_urls())
        cache, disk = _block_cache(config, fetcher, refset.url_extent)
        reads, view, workers = _reads(config, cache)
        owner = Owner(config.uid, config.gid, config.umask)
        tree = Tree(view(refset, config, None), owner, fetcher.size, fetcher.known_size)
        operations = Operations(tree, reads, fetcher.stats, xattrs=config.xattrs)  # type: ignore[arg-type]
        _read_ahead_grids(operations, config, cache, reads)
        state = _mount_state(config, fetcher, reads, lambda: _key_count(operations.tree.refset))
        state.version = lambda: _raw(operations.tree.refset).source_version()
        control = _serve_state(operations, state, config)
        load = lambda config: view(load_refset(config), config, None)  # noqa: E731
        return cls(
            config,
            operations,
            cache,
            control,
            load,
            disk=disk,
            signature=signature,
            workers=workers,
            fetch_workers=fetch_workers,
            netcdf=reads if config.netcdf else None,  # type: ignore[arg-type]
        )

    @classmethod
    def load_catalog(cls, config: Config) -> Daemon:
        """REFS is a catalog (:mod:`refmount.catalog`): list it; sets load when used."""
        notify("STATUS=listing the catalog")
        if config.netcdf_name is not None:
            raise RefsError(
                "--netcdf-name names the file of a single set: a catalog's files are named "
                "after their sets (run01.nc)"
            )
        fetcher, fetch_workers = _fetcher(config)
        fetcher.confine_flat_options(None)  # flat options: no one host to bind them to
        owner = Owner(config.uid, config.gid, config.umask)
        # Sets load only once the mount is served, after ``view`` is bound below.
        catalog, tree = open_catalog(
            config,
            fetcher,
            owner,
            lambda config, name: view(load_refset(config), config, name),
        )
        cache, disk = _block_cache(config, fetcher, catalog.url_extent)
        reads, view, workers = _reads(config, cache)
        operations = Operations(tree, reads, fetcher.stats, xattrs=config.xattrs)  # type: ignore[arg-type]
        _read_ahead_grids(operations, config, cache, reads)
        catalog.kernel = operations
        state = _mount_state(config, fetcher, reads, catalog.key_count, catalog.status)
        catalog.record = state.record_reload
        control = _serve_state(operations, state, config)
        return cls(
            config,
            operations,
            cache,
            control,
            catalog=catalog,
            disk=disk,
            workers=workers,
            fetch_workers=fetch_workers,
            netcdf=reads if config.netcdf else None,  # type: ignore[arg-type]
        )

    def run(self, ready: Callable[[], None], on_error: Callable[[str], None] | None) -> int:
        mountpoint = self.config.mountpoint
        scrub = Scrubber(self.config.refs)

        def fail(message: str) -> None:
            if on_error is None:
                log.error("%s", scrub(message))
            else:
                on_error(scrub(message))

        # A signal between the mount appearing and trio's receiver existing would end the
        # process by its default action: hold them until ``_on_signals`` takes them.
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
        try:
            log_fuse_features()
            pyfuse3.init(self.operations, mountpoint, mount_options(self.config))
        except RuntimeError as exc:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED_SIGNALS)
            fail(f"refmount: cannot mount {mountpoint}: {exc}")
            return 1
        self._ready = False
        try:
            trio.run(self._main, ready)
            return 0
        except Exception as exc:
            start_error = _find(exc, StartError)
            if start_error is not None:
                fail(f"refmount: {start_error}")
                return 1
            log.exception("the daemon failed")
            if not self._ready:
                fail(f"refmount: the daemon failed while starting: {type(exc).__name__}: {exc}")
            return 1
        finally:
            pyfuse3.close(unmount=True)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED_SIGNALS)
            if self.catalog is not None:
                self.catalog.close()
            else:
                self.operations.tree.refset.close()
            self.cache.fetcher.close()
            if self.disk is not None:
                self.disk.close()
            if self.workers is not None:
                self.workers.close()
            if self.fetch_workers is not None:
                self.fetch_workers.close()
            log.info("unmounted %s", mountpoint)

    async def _main(self, ready: Callable[[], None]) -> None:
        reloader = Reloader(
            self.config,
            self.operations,
            self.cache,
            self.load_set,
            self.control.state.record_reload,
            self.control.state.record_check,
        )
        async with trio.open_nursery() as nursery:
            if self.disk is not None:
                await nursery.start(self.disk.run)
            await nursery.start(self.cache.run)
            self.cache.fetcher.start(nursery)
            if self.netcdf is not None:
                await nursery.start(self.netcdf.run)
            await nursery.start(self.control.run)
            # SIGHUP refreshes a catalog (which reloads its changed sets), else reloads.
            reload = reloader.request if self.catalog is None else self.catalog.request_refresh
            nursery.start_soon(self._on_signals, nursery.cancel_scope, reload)
            nursery.start_soon(self._announce_when_ready, ready)
            if self.workers is not None:
                nursery.start_soon(self.workers.warm_up)
            if self.fetch_workers is not None:  # started now: reads need not wait for them
                nursery.start_soon(self.fetch_workers.run)
            if self.catalog is not None:
                await nursery.start(self.catalog.run)
            else:
                nursery.start_soon(reloader.run)
                if self.config.reload_interval is not None:
                    interval = self.config.reload_interval
                    nursery.start_soon(reloader.poll, interval, self.signature)
            # Requests in flight may exceed the kernel's background limit (reads) plus
            # foreground ones (lookups): leave room for both.
            await pyfuse3.main(max_tasks=self.config.max_background * 2 + 16)
            nursery.cancel_scope.cancel()

    async def _announce_when_ready(self, ready: Callable[[], None]) -> None:
        """Signal readiness once the mount answers (a stat through FUSE, from a thread so
        that this loop can serve it), after tuning the kernel's read-ahead.  A stat that
        fails, or has no answer within the deadline, is a failed start."""
        mountpoint = self.config.mountpoint
        deadline = min(READY_DEADLINE, self.config.ready_timeout)
        with trio.move_on_after(deadline) as waited:
            try:
                await trio.to_thread.run_sync(os.stat, mountpoint, abandon_on_cancel=True)
            except OSError as exc:
                raise StartError(f"the new mount on {mountpoint} fails: {exc.strerror}") from None
        if waited.cancelled_caught:
            raise StartError(f"the new mount on {mountpoint} did not answer within {deadline:g} s")
        await trio.to_thread.run_sync(
            lambda: tune_kernel(
                mountpoint,
                read_ahead_kb=self.config.read_ahead_kb,
                max_background=self.config.max_background,
            )
        )
        if self.fetch_workers is not None:  # so that the first reads need not wait for them
            await self.fetch_workers.started()
        log.info("mounted %s on %s", shown(self.config.refs), mountpoint)
        notify(f"READY=1\nSTATUS=serving {shown(self.config.refs)}")
        self._ready = True
        ready()
        if self.catalog is None:  # a catalog's sets prepare theirs as they load
            await self.cache.fetcher.prepare(sorted(self.operations.tree.refset.protocols()))

    async def _on_signals(self, scope: trio.CancelScope, reload: Callable[[], None]) -> None:
        """Reload on SIGHUP.  Unmount on SIGINT or SIGTERM: requests in flight get a short
        grace, then are cancelled, so a read waiting on a stalled store does not hold up
        the stop."""
        with trio.open_signal_receiver(*HANDLED_SIGNALS) as signals:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED_SIGNALS)  # held since the mount
            async for signum in signals:
                if signum == signal.SIGHUP:
                    log.info("received SIGHUP: reloading")
                    reload()
                    continue
                log.info("received %s: unmounting", signal.Signals(signum).name)
                notify("STOPPING=1")
                pyfuse3.terminate()
                await trio.sleep(STOP_GRACE)
                log.warning("requests still in flight after %g s: cancelling them", STOP_GRACE)
                scope.cancel()
                return


def _block_cache(
    config: Config, fetcher: Fetcher, extent: Callable[[str], int | None]
) -> tuple[BlockCache, DiskCache | None]:
    """The memory cache, fetching through the disk cache when there is one."""
    disk = open_disk_cache(config)
    source = None if disk is None else DiskTier(disk, fetcher)
    return BlockCache(fetcher, budget=config.cache_size, extent=extent, source=source), disk


def open_disk_cache(config: Config) -> DiskCache | None:
    """The process's disk cache (``--disk-cache``), or None; DiskCacheError when its
    directory cannot be used: a cache asked for and not there is a failed start."""
    if config.disk_cache is None:
        return None
    return DiskCache(
        DiskCacheConfig(
            directory=config.disk_cache,
            max_bytes=config.disk_cache_size,
            min_free=config.disk_cache_min_free,
            immutable=config.disk_cache_immutable,
            check_interval=config.disk_cache_check_interval,
            queue_bytes=disk_queue_bytes(config.cache_size),
        )
    )


def disk_queue_bytes(cache_size: int) -> int:
    """The disk cache's write queue: an eighth of the memory budget, at most
    :data:`QUEUE_BYTES` (the default 1 GiB budget keeps the full queue).  Queued pieces
    may hold parts the memory cache has let go, so the queue is memory beyond the
    budget: bounded by it.  ``bench/soak.py --cache-size 64M --disk-cache DIR``, peak
    RSS: 261 MiB with a 64 MiB queue, 206 and 211 MiB with 16 MiB (2 and 10 minutes), 205
    MiB with 8 MiB (10 minutes), against 207 MiB allowed (the budget + 150 MB)."""
    return min(QUEUE_BYTES, max(cache_size // 8, UNIT))


def load_refset(config: Config, progress: Callable[[str, int, int], None] | None = None) -> RefSet:
    """Read REFS with the configured options and bounds (raises RefsError)."""
    if config.icechunk:
        return open_configured(config)
    options: dict[str, Any] = {}
    if config.max_refs_size is not None:
        options["max_refs_bytes"] = config.max_refs_size
    return open_refset(
        config.refs,
        storage_options=config.refs_options,
        remote_protocol=config.remote_protocol,
        allow_local=config.allow_local,
        timeout=config.timeout,
        progress=progress,
        **options,
    )


def _reads(
    config: Config, cache: BlockCache
) -> tuple[
    BlockCache | DecodedReads | NetcdfReads,
    Callable[[RefSet, Config, str | None], RefSet],
    WorkerPool | None,
]:
    """What reads serve, and what a loaded set is presented as: the raw set through the
    block cache, or with ``--decode`` its decoded view through a decoder on top of it,
    decoding in the daemon's worker processes, or with ``--netcdf`` the netCDF view's
    files assembled from the decoded view's chunks.  What a set is presented as may
    depend on its configuration (``config.refs`` names a catalog's set, or a version)
    and its name in a catalog (None for a single set)."""
    if not (config.decode or config.netcdf):
        return cache, lambda refset, config, name: refset, None
    from refmount.decode import DecodedReads  # numpy and numcodecs: only when asked

    workers = decode_workers(config)
    fixed = config.netcdf or config.decode_strings == "fixed"  # netCDF: char arrays
    decoded = DecodedReads(cache, workers, fixed_strings=fixed)
    if not config.netcdf:
        return decoded, lambda refset, config, name: decoded.view(refset), workers
    from refmount.netcdf.options import root_name
    from refmount.netcdf.reads import NetcdfReads

    files = NetcdfReads(decoded, config.netcdf_format, config.netcdf_record_dim)

    def view(refset: RefSet, config: Config, name: str | None) -> RefSet:
        return files.view(refset, name or root_name(config))

    return files, view, workers


def _read_ahead_grids(
    operations: Operations,
    config: Config,
    cache: BlockCache,
    reads: BlockCache | DecodedReads | NetcdfReads,
) -> None:
    """Read ahead along arrays' chunk grids (not in the netCDF view: its files are not
    chunk keys, and it reads ahead within them itself)."""
    if config.grid_read_ahead and not config.netcdf:
        budget = cache.memory.ahead_limit
        operations.ahead = ChunkReadAhead(cache, reads, ahead_budget=budget)  # type: ignore[arg-type]


def decode_workers(config: Config) -> WorkerPool:
    """The daemon's worker processes that decode chunks (started on first use)."""
    workers = config.decode_workers or max(1, os.cpu_count() or 1)
    return WorkerPool(PoolConfig(workers, config.decode_deadline, config.decode_memory))


def _mount_state(
    config: Config,
    fetcher: Fetcher,
    reads: BlockCache | DecodedReads | NetcdfReads,
    keys: Callable[[], int | None],
    catalog: Callable[[], dict[str, Any]] | None = None,
) -> MountState:
    return MountState(
        refs=display_url(config.refs),
        mountpoint=os.path.realpath(config.mountpoint),
        fetch=fetcher.stats,
        cache=reads,
        keys=keys,
        catalog=catalog,
    )


def _serve_state(operations: Operations, state: MountState, config: Config) -> ControlServer:
    """Count reads for ``refmount status`` (and time them when asked), and make the
    control socket that answers it."""
    timer = RequestTimer.from_environment()  # off unless asked for (profiling)
    if timer is not None:
        timer.install(operations)
    operations.read = state.reads.counting(operations.read)  # type: ignore[method-assign]
    state.kernel_files = lambda: len(operations.known)
    return ControlServer(socket_path(state.mountpoint, os.geteuid()), state)


def _signature_before_load(config: Config) -> tuple[str, ...] | None:
    """With ``--reload-interval``, what the store says of REFS before it is read, so that
    a change made while the daemon starts is seen by the first poll."""
    if config.reload_interval is None:
        return None
    found: list[tuple[str, ...]] = []

    def look() -> None:
        try:
            found.append(refs_signature(config))
        except Exception as exc:  # the poll asks again; the load reports what is wrong
            log.warning("cannot look at %s for changes: %s", shown(config.refs), exc)

    # A store that does not answer is left to the load's own deadline: the look is
    # abandoned after ``--timeout`` (its thread ends with its request).
    looking = threading.Thread(target=look, name="refs-signature", daemon=True)
    looking.start()
    looking.join(config.timeout)
    return found[0] if found else None


def _fetcher(config: Config) -> tuple[Fetcher, FetchWorkers | None]:
    """The fetcher, and the worker processes its remote requests run in, if any."""
    policy = FetchPolicy(
        timeout=config.timeout,
        retries=config.retries,
        max_requests=config.max_requests,
        max_requests_per_host=config.max_requests_per_host,
    )
    fetcher = Fetcher(
        remote_options=config.remote_options, backend=config.fetch_backend, policy=policy
    )
    if not config.fetch_workers:
        return fetcher, None
    workers = FetchWorkers(config.fetch_workers, per_worker=config.max_requests_per_host)
    fetcher.make_remote = workers.backend
    fetcher.buffers = None  # bodies arrive through the workers' pipes: nothing to give back
    fetcher.stats.workers = workers.stats
    return fetcher, workers


def _key_count(refset: object) -> int | None:
    """Keys of a set held in memory; None for one loaded lazily (Parquet).  A decoded
    view counts the keys of the set it presents."""
    refset = _raw(refset)
    return len(refset) if hasattr(refset, "__len__") else None


def _raw(refset: Any) -> RefSet:
    """The set a decoded view presents, or the set itself."""
    return getattr(refset, "raw", refset)


def _find(exc: BaseException, kind: type[StartError]) -> StartError | None:
    """``exc`` if it is a ``kind``, or the first one in a (nested) exception group."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _find(inner, kind)) is not None:
                return found
    return None
