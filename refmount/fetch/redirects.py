"""Which redirects of an HTTP(S) read are followed: a header or credential keyed to a
host (``--remote-options``) is sent to that host only, whoever follows the redirect.

A redirect within one origin (scheme, host and port) is followed.  A redirect to another
origin is followed only when the read carries nothing keyed to the first (no header of
the user's, no credential); otherwise it is refused (EIO, one log line naming both
hosts): a header such as ``X-Api-Key`` is not the kind a client may know to strip, and
the server that redirects need not be trusted with where its users' tokens go.  A
redirect to anything but ``http://`` or ``https://``, or past ``MAX_REDIRECTS`` hops,
is refused too.

obstore (reqwest) follows redirects by itself and strips only ``Authorization`` and
cookies across hosts, so an HTTP(S) scope with headers of the user's is never read
through obstore (see ``obstore_backend.make_backend``); refmount's own client hands its
redirects to the scope's fallback, and fsspec's reads follow them here
(:mod:`refmount.fetch.bounded`).
"""

from __future__ import annotations

import errno
from urllib.parse import urljoin, urlsplit

from refmount import header_text
from refmount.errors import FetchError
from refmount.redaction import redact_url

STATUSES = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 5


def origin(url: str) -> tuple[str, str, int | None]:
    """``(scheme, host, port)`` of a URL, the port made explicit."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port or default


def follow(url: str, location: str | None, *, keyed: bool) -> str:
    """The URL a redirect from ``url`` to ``location`` leads to, if it may be followed
    (see the module's docstring); FetchError (EIO) if not."""
    if location is None or header_text.url_problem(location) is not None:
        raise FetchError(f"{redact_url(url)}: a redirect without a usable Location", errno.EIO)
    target = urljoin(url, location.strip())
    if urlsplit(target).scheme not in ("http", "https"):
        raise FetchError(
            f"{redact_url(url)}: redirected to {redact_url(target)}: not HTTP: refused", errno.EIO
        )
    if keyed and origin(target) != origin(url):
        raise FetchError(
            f"{redact_url(url)}: redirected to another host ({redact_url(target)}): refused, "
            "since headers or credentials given for the first host must not reach another",
            errno.EIO,
        )
    return target
