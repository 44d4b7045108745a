"""refmount: mount kerchunk / fsspec reference sets as a read-only directory tree."""

import os

__version__ = "0.1.0"

# numpy (which pyarrow, icechunk and the decoders import) starts OpenBLAS's thread pool,
# whose threads spin on a core after they start: 3-4 % of the daemon's CPU in a cold W3d
# (perf record), for matrix products the daemon never computes.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# gcsfs (2026.5 and later; 2026.1 did not) asks Google's gRPC storage-control service
# what kind of bucket it reads, before every open and ranged read, and does not remember a
# failed answer: against any endpoint that is not Google's (an emulator, a GCS-compatible
# store) each read waits 25-55 s for that gRPC call to time out.  refmount reads GCS
# through the JSON/XML APIs, as obstore does; GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=true in
# the environment brings it back.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
