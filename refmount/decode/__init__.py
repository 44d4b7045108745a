"""The decoded view (``--decode``): arrays' chunks served decompressed and unfiltered,
metadata rewritten to match, so readers without the codecs read exact values.

``codecs`` (the allowlist, bounded decoding), ``arrays`` (a ``.zarray`` checked and
rewritten, a chunk's decoding), ``dtypes`` (what each data type is served as, for v2
and v3 sets alike), ``chunkjob`` (the decoding jobs of the worker processes),
``jsontext`` (JSON repairs), ``view`` (the reference set as the tree sees it) and
``reads`` (decoding off the serving thread, cached under the block cache's budget).
A Zarr v3 tree is first presented as a v2 tree: ``v3`` (a ``zarr.json`` as v2
metadata), ``v3codecs`` (a v3 codec pipeline as v2 codecs), ``v3tree`` (the keys),
``shards`` and ``v3inner`` (inner chunks of sharded arrays).  ``strings`` and
``widths``: ``--decode-strings fixed``.
"""

from refmount.decode.arrays import Array, ArrayRefused, ChunkDecoder, parse_zarray
from refmount.decode.codecs import BUILDERS, CodecError, DecodeError, build_stage
from refmount.decode.reads import DecodedReads
from refmount.decode.view import SCHEME, DecodedRef, DecodedRefSet

__all__ = [
    "BUILDERS",
    "SCHEME",
    "Array",
    "ArrayRefused",
    "ChunkDecoder",
    "CodecError",
    "DecodeError",
    "DecodedReads",
    "DecodedRef",
    "DecodedRefSet",
    "build_stage",
    "parse_zarray",
]
