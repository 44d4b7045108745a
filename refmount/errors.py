"""Errors that carry what a user needs to fix the input or understand a failed read."""

import errno


class RefsError(Exception):
    """A reference set that cannot be mounted: the message names the key, line or field."""


class FetchError(Exception):
    """A remote read that failed for good; ``errno`` is what the reader sees."""

    def __init__(self, message: str, err: int = errno.EIO) -> None:
        super().__init__(message)
        self.errno = err
