"""One mounted reference set: its parts wired together, mounted, and served under trio."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

import pyfuse3
import trio

from refmount.cache import BlockCache
from refmount.fetch import Fetcher, FetchPolicy
from refmount.fuse_ops import Operations
from refmount.notify import notify
from refmount.options import Config
from refmount.refs import open_refset
from refmount.tree import Owner, Tree
from refmount.tuning import tune_kernel

log = logging.getLogger(__name__)

STOP_GRACE = 1.0  # seconds requests in flight may finish in after SIGTERM


def mount_options(config: Config) -> set[str]:
    """What pyfuse3 passes to libfuse.  Always read-only, no devices, no setuid."""
    fsname = (config.fsname or config.refs).replace("\\", "\\\\").replace(",", "\\,")
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

    @classmethod
    def load(cls, config: Config) -> Daemon:
        notify("STATUS=loading the reference set")
        refset = open_refset(
            config.refs,
            storage_options=config.refs_options,
            remote_protocol=config.remote_protocol,
            allow_local=config.allow_local,
            timeout=config.timeout,
        )
        fetcher = Fetcher(
            remote_options=config.remote_options,
            backend=config.fetch_backend,
            policy=FetchPolicy(
                timeout=config.timeout,
                retries=config.retries,
                max_requests=config.max_requests,
                max_requests_per_host=config.max_requests_per_host,
            ),
        )
        cache = BlockCache(fetcher, budget=config.cache_size, extent=refset.url_extent)
        owner = Owner(config.uid, config.gid, config.umask)
        tree = Tree(refset, owner, fetcher.size, fetcher.known_size)
        operations = Operations(tree, cache, fetcher.stats, xattrs=config.xattrs)
        return cls(config, operations, cache)

    def run(self, ready: Callable[[], None], on_error: Callable[[str], None] | None) -> int:
        mountpoint = self.config.mountpoint
        try:
            pyfuse3.init(self.operations, mountpoint, mount_options(self.config))
        except RuntimeError as exc:
            message = f"refmount: cannot mount {mountpoint}: {exc}"
            if on_error is None:
                log.error("%s", message)
            else:
                on_error(message)
            return 1
        try:
            trio.run(self._main, ready)
        finally:
            pyfuse3.close(unmount=True)
            self.operations.tree.refset.close()
            self.cache.fetcher.close()
            log.info("unmounted %s", mountpoint)
        return 0

    async def _main(self, ready: Callable[[], None]) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.cache.run)
            nursery.start_soon(self._stop_on_signals, nursery.cancel_scope)
            nursery.start_soon(self._announce_when_ready, ready)
            # Requests in flight may exceed the kernel's background limit (reads) plus
            # foreground ones (lookups): leave room for both.
            await pyfuse3.main(max_tasks=self.config.max_background * 2 + 16)
            nursery.cancel_scope.cancel()

    async def _announce_when_ready(self, ready: Callable[[], None]) -> None:
        """Signal readiness once the mount answers (a stat through FUSE, from a thread so
        that this loop can serve it), after tuning the kernel's read-ahead."""
        mountpoint = self.config.mountpoint
        await trio.to_thread.run_sync(os.stat, mountpoint)
        await trio.to_thread.run_sync(
            lambda: tune_kernel(
                mountpoint,
                read_ahead_kb=self.config.read_ahead_kb,
                max_background=self.config.max_background,
            )
        )
        log.info("mounted %s on %s", self.config.refs, mountpoint)
        notify(f"READY=1\nSTATUS=serving {self.config.refs}")
        ready()
        await self.cache.fetcher.prepare(sorted(self.operations.tree.refset.protocols()))

    async def _stop_on_signals(self, scope: trio.CancelScope) -> None:
        """Unmount on SIGINT or SIGTERM: requests in flight get a short grace, then are
        cancelled, so a read waiting on a stalled store does not hold up the stop."""
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("received %s: unmounting", signal.Signals(signum).name)
                notify("STOPPING=1")
                pyfuse3.terminate()
                await trio.sleep(STOP_GRACE)
                log.warning("requests still in flight after %g s: cancelling them", STOP_GRACE)
                scope.cancel()
                return
