"""Redirects of HTTP(S) reads, followed the way data platforms use them: a header or
credential keyed to a host (``--remote-options``, a ``.netrc`` entry, a cookie) is sent
to that host only, whoever follows the redirect.

NASA Earthdata, S3 pre-signed URLs and CloudFront answer a read of the archive with a
redirect to another host (a login host, then a pre-signed URL); S3 refuses a request
that carries both a pre-signed query and an ``Authorization`` header.  So a backend
never follows a redirect itself: it raises :class:`Redirected`, and the fetcher asks the
new URL through *that* URL's own backend (:meth:`refmount.fetch.fetcher.Fetcher.fetch`),
made from the options keyed to the new origin, with the cookies and ``.netrc``
credentials of the new host (:mod:`refmount.fetch.logins`).  Nothing keyed to the first
origin travels: not its ``Authorization``, not the user's other headers, not its Basic
credentials, not its cookies.

Refused (EIO, one log line naming both URLs without their secrets): a redirect to
anything but ``http://`` or ``https://``, from ``https://`` to ``http://`` (what was
asked over TLS is not asked in the clear), to a URL whose host parsers read differently
(:func:`refmount.authority.authority_problem`), and past ``MAX_REDIRECTS`` hops.

obstore (reqwest), where it serves a read of its own (``--fetch-backend obstore``
without headers of the user's), follows redirects by itself and strips only
``Authorization`` and cookies across hosts; with headers of the user's a scope is never
read through obstore (see ``obstore_backend.make_backend``).
"""

from __future__ import annotations

import calendar
import errno
import time
from collections import OrderedDict
from urllib.parse import parse_qs, urljoin, urlsplit

from refmount import header_text
from refmount.authority import authority_problem
from refmount.errors import FetchError
from refmount.redaction import redact_url

STATUSES = frozenset({301, 302, 303, 307, 308})
#: Hops a read follows: Earthdata's login takes four (archive, login host, archive's
#: login, archive again) before the pre-signed URL's.
MAX_REDIRECTS = 5


class Redirected(Exception):
    """A backend's answer to a read: ``url`` is at ``location`` (as the answer spelled
    it; :func:`follow` decides whether and where to go)."""

    def __init__(self, url: str, status: int, location: str | None) -> None:
        super().__init__(f"{redact_url(url)}: HTTP {status} redirect")
        self.url = url
        self.status = status
        self.location = location


def follow(url: str, location: str | None) -> str:
    """The URL a redirect from ``url`` to ``location`` leads to, if it may be followed
    (see the module's docstring); FetchError (EIO) if not."""
    if location is None or header_text.url_problem(location) is not None:
        raise FetchError(f"{redact_url(url)}: a redirect without a usable Location", errno.EIO)
    target = urljoin(url, location.strip())
    scheme = urlsplit(target).scheme
    if scheme not in ("http", "https"):
        raise FetchError(
            f"{redact_url(url)}: redirected to {redact_url(target)}: not HTTP: refused", errno.EIO
        )
    if scheme == "http" and urlsplit(url).scheme == "https":
        raise FetchError(
            f"{redact_url(url)}: redirected from https:// to {redact_url(target)}: refused, "
            "since what was asked over TLS is not asked in the clear",
            errno.EIO,
        )
    problem = authority_problem(target)
    if problem is not None:
        raise FetchError(
            f"{redact_url(url)}: redirected to a URL that {problem}: refused", errno.EIO
        )
    return target


#: Seconds a redirect's target is asked directly, at most (less where the target's own
#: query says it expires sooner); URLs remembered at once.
REMEMBERED_SECONDS = 60.0
REMEMBERED = 4096


class Remembered:
    """Where reads of a URL were last redirected, asked there directly for a while.

    An archive answers each read of a granule with a redirect to a pre-signed URL valid
    for up to an hour: asking the archive for every chunk doubles the requests (W3d over
    https through a redirect ran at 0.53 of the direct row, ``bench/redirect_throughput.py``).
    A target is remembered for ``REMEMBERED_SECONDS`` or until the expiry its query
    states (``X-Amz-Date`` + ``X-Amz-Expires``, or ``Expires``), whichever comes first;
    a read of a remembered target that fails in any way forgets it and follows the
    redirects again (an expired or revoked signature)."""

    def __init__(self) -> None:
        self._targets: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def get(self, url: str) -> str | None:
        found = self._targets.get(url)
        if found is None:
            return None
        if found[1] <= time.monotonic():
            del self._targets[url]
            return None
        return found[0]

    def keep(self, url: str, target: str) -> None:
        seconds = min(REMEMBERED_SECONDS, valid_for(target))
        if seconds <= 0:
            return
        self._targets[url] = (target, time.monotonic() + seconds)
        self._targets.move_to_end(url)
        if len(self._targets) > REMEMBERED:
            self._targets.popitem(last=False)

    def forget(self, url: str) -> None:
        self._targets.pop(url, None)


def valid_for(url: str, margin: float = 5.0) -> float:
    """Seconds a pre-signed URL stays valid, less ``margin``, by its query (SigV4's
    ``X-Amz-Date`` and ``X-Amz-Expires``; SigV2's or CloudFront's ``Expires``); infinity
    when the query does not say."""
    query = {k.lower(): v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    now = time.time()
    try:
        if "x-amz-date" in query and "x-amz-expires" in query:
            signed = calendar.timegm(time.strptime(query["x-amz-date"], "%Y%m%dT%H%M%SZ"))
            return signed + int(query["x-amz-expires"]) - now - margin
        if "expires" in query:
            return int(query["expires"]) - now - margin
    except (ValueError, OverflowError):
        return 0.0
    return float("inf")


def too_many(url: str) -> FetchError:
    return FetchError(f"{redact_url(url)}: more than {MAX_REDIRECTS} redirects", errno.EIO)
