"""refmount: mount kerchunk / fsspec reference sets as a read-only directory tree."""

import os

__version__ = "0.1.0"

# numpy (which pyarrow, icechunk and the decoders import) starts OpenBLAS's thread pool,
# whose threads spin on a core after they start: 3-4 % of the daemon's CPU in a cold W3d
# (perf record), for matrix products the daemon never computes.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
