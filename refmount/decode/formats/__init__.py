"""Codecs of the formats kerchunk references besides HDF5 and netCDF: GRIB2 messages
(``grib``), TIFF tiles and strips (``tiff``), FITS images and tables (``fits``).  Each
parses untrusted bytes with a large C library, so each runs only in the daemon's worker
processes."""
