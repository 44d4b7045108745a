"""refmount: mount kerchunk / fsspec reference sets as a read-only directory tree."""

__version__ = "0.1.0"
