"""refmount's own HTTP/1.1 client for byte ranges of plain ``http://`` URLs (see
:mod:`refmount.fetch.http.backend`)."""

from refmount.fetch.http.backend import HttpBackend, HttpStatus

__all__ = ["HttpBackend", "HttpStatus"]
