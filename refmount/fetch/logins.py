"""Logins over HTTP(S), as curl, wget, GDAL and netCDF-C users set them up: HTTP Basic
credentials from ``~/.netrc`` (or the file ``NETRC`` names) and a cookie jar.

NASA's Earthdata Login is the common case: a read of an archive host without a session
is redirected to the login host, which takes HTTP Basic credentials and redirects back;
the archive then sets a session cookie.  :class:`Logins` holds, for one process (a mount;
with a ``.netrc``, its ``http(s)`` reads stay in that process even with fetch workers),
what makes that work once and not once per chunk:

* the ``.netrc`` entries: a host's credentials are sent to that host only (a
  ``machine`` line naming it exactly; a ``default`` line is never used, since it would
  send a password to every host a reference set names), up front on every request to
  it, and never on a redirect elsewhere (:mod:`refmount.fetch.redirects`);
* the cookie jar (:class:`http.cookiejar.CookieJar`: host-only and domain cookies,
  ``Path``, ``Secure``, expiry), which every HTTP backend of the process reads before a
  request and fills from every answer, redirects included.  An expired session cookie
  is no longer sent; the archive then redirects to the login again, which renews it;
* a lock the fetcher takes around a read that is sent to a login host (a host with
  credentials), so that concurrent readers without a session open one, not one each
  (see ``Fetcher._follow``).
"""

from __future__ import annotations

import base64
import email.message
import functools
import http.cookiejar
import logging
import netrc
import os
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import trio

log = logging.getLogger(__name__)

#: Seconds a host that refused its .netrc credentials is not asked again: the answer
#: would be the same (the file is read once), and a login host must not see one
#: attempt per chunk read.
REFUSED_SECONDS = 300.0


def netrc_path() -> Path:
    """The ``.netrc`` file curl reads: ``NETRC``, else ``~/.netrc``."""
    named = os.environ.get("NETRC")
    return Path(named) if named else Path.home() / ".netrc"


def read_netrc(path: Path) -> dict[str, tuple[str, str]]:
    """``host -> (login, password)`` of the ``machine`` lines of ``path`` (hosts
    lower-cased); none when the file is missing.  A file that cannot be parsed is
    logged once and gives none: refmount then sends no credentials at all."""
    try:
        parsed = netrc.netrc(str(path))
    except FileNotFoundError:
        return {}
    except (netrc.NetrcParseError, OSError) as exc:
        log.warning("%s: not read, no credentials from it: %s", path, exc)
        return {}
    return {
        host.lower(): (login or "", password or "")
        for host, (login, _, password) in parsed.hosts.items()
    }


class _Answer:
    """What :meth:`CookieJar.extract_cookies` reads of an answer: its headers."""

    def __init__(self, set_cookies: Iterable[str]) -> None:
        self._headers = email.message.Message()
        for value in set_cookies:
            self._headers["Set-Cookie"] = value

    def info(self) -> email.message.Message:
        return self._headers


class Logins:
    """One process's ``.netrc`` credentials, cookie jar and login lock."""

    def __init__(self, credentials: dict[str, tuple[str, str]] | None = None) -> None:
        self.credentials = read_netrc(netrc_path()) if credentials is None else credentials
        self.jar = http.cookiejar.CookieJar()
        self.login_lock = trio.Lock()
        #: logins completed (a read through a login host that ended in data): a reader
        #: that waited for the lock reads again from its first URL when this moved on
        self.completed = 0
        self._said: set[str] = set()
        self._refused: dict[str, tuple[float, str]] = {}

    def beside(self) -> Logins:
        """The same credentials, cookie jar and refusals, with a login lock of its own:
        for a trio run in another thread (a reference set read while the mount serves),
        whose tasks cannot wait on this run's lock."""
        twin = Logins(self.credentials)
        twin.jar, twin._refused, twin._said = self.jar, self._refused, self._said
        return twin

    def has_credentials(self, host: str) -> bool:
        return host.lower() in self.credentials

    def basic(self, host: str) -> str | None:
        """The ``Authorization`` value for ``host``, if ``.netrc`` names it."""
        found = self.credentials.get(host.lower())
        if found is None:
            return None
        if host not in self._said:
            self._said.add(host)
            log.info("%s: HTTP Basic credentials from .netrc, sent to that host only", host)
        token = base64.b64encode(f"{found[0]}:{found[1]}".encode()).decode("ascii")
        return f"Basic {token}"

    def refusal(self, host: str) -> str | None:
        """Why ``host`` refused its credentials, if it did within ``REFUSED_SECONDS``:
        then no request is sent to it."""
        found = self._refused.get(host.lower())
        if found is None or time.monotonic() - found[0] > REFUSED_SECONDS:
            return None
        return found[1]

    def refused(self, host: str, why: str) -> None:
        self._refused[host.lower()] = (time.monotonic(), why)

    def cookie(self, url: str) -> str | None:
        """The ``Cookie`` value the jar holds for ``url`` (none while the jar is
        empty: no work for the hosts that set none)."""
        if not len(self.jar):
            return None
        request = urllib.request.Request(url)
        self.jar.add_cookie_header(request)
        return request.get_header("Cookie")

    def keep(self, url: str, set_cookies: list[str]) -> None:
        """Store the cookies an answer to ``url`` set (the jar's rules decide which)."""
        if set_cookies:
            self.jar.extract_cookies(_Answer(set_cookies), urllib.request.Request(url))  # type: ignore[arg-type]


@functools.cache
def for_process() -> Logins:
    """The process's :class:`Logins` (a mount's daemon, or one fetch worker), made from
    ``.netrc`` on first use."""
    return Logins()
