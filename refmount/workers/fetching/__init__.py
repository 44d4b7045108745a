"""Fetch worker processes: remote byte ranges read outside the daemon's GIL.

With ``--fetch-workers N`` the fetcher's remote backends are :class:`ProcessBackend`\\ s:
each call (a read, a size, a version) runs in one of ``N`` worker processes
(:mod:`~refmount.workers.fetching.child`), which build their backends with the same
``make_backend`` as the daemon does in-process.  The fetcher's policy stays in the
daemon.
"""

from refmount.workers.fetching.client import FetchWorkers, ProcessBackend

__all__ = ["FetchWorkers", "ProcessBackend"]
