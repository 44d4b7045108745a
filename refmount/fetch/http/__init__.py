"""refmount's own HTTP/1.1 client for byte ranges of ``http://``, ``https://`` and
``s3://`` URLs (see :mod:`refmount.fetch.http.backend`)."""

from refmount.fetch.http.backend import HttpBackend, HttpStatus

__all__ = ["HttpBackend", "HttpStatus"]
