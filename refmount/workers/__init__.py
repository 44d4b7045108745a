"""Worker processes owned by the daemon, for work that must not take the mount down.

Decoding bytes from remote files with large C libraries (ecCodes, imagecodecs, blosc...)
can crash, hang or allocate without bound.  Such work runs as *jobs* in worker
processes (:class:`WorkerPool`): a job names a handler from a fixed table
(:mod:`refmount.workers.jobs`), carries JSON parameters and a payload, and returns
exactly the number of bytes it promised, or fails.  Whoever asks for work sees one
narrow interface, :class:`JobRunner`; :class:`InProcessRunner` runs the same handlers in
threads of the calling process (tests, in-process benches).
"""

from refmount.workers.jobs import JOBS, InProcessRunner, JobFailed, JobRunner
from refmount.workers.pool import PoolConfig, WorkerPool

__all__ = ["JOBS", "InProcessRunner", "JobFailed", "JobRunner", "PoolConfig", "WorkerPool"]
