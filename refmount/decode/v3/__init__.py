"""Zarr v3 trees in the decoded view: each ``zarr.json`` read (``metadata``), its codec
pipeline as v2 stages (``codecs``), the whole tree presented as a Zarr v2 tree
(``tree``), and sharded arrays served inner chunk by inner chunk (``shards``,
``inner``)."""
