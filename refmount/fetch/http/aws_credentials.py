"""S3 credentials from botocore's chain, for refmount's SigV4 signer, renewed before
they expire.

Where no key is given (``--remote-options`` ``key``/``secret``, ``AWS_ACCESS_KEY_ID``),
S3 users have their credentials where AWS's SDKs find them: a profile of
``~/.aws/config`` (static keys, ``credential_process``, SSO, assume-role), web identity
(``AWS_WEB_IDENTITY_TOKEN_FILE``, as Kubernetes' IRSA sets), a container's endpoint
(``AWS_CONTAINER_CREDENTIALS_*_URI``) or the instance's metadata service.  botocore
(installed with s3fs) walks that chain; refmount takes what it finds as botocore's
frozen credentials (a key, secret and token that belong together) and signs with them.

Temporary credentials are renewed ahead of their expiry, one renewal at a time, by a
task of their own: botocore's calls block (a process to run, an HTTP request), so they
run in a worker thread under a deadline, never on the serving loop.  Readers sign with
the credentials they have while a renewal runs, until shortly before those expire
(:data:`SAFETY`); past that they wait for it, and are never signed with an expired key.
A renewal that fails is retried after a back-off that doubles (:data:`BACKOFF_FIRST` to
:data:`BACKOFF_MOST`); meanwhile readers that have no usable credentials get EIO naming
the source and the failure at once, so a broken ``credential_process`` runs once per
back-off, not once per read.

botocore renews its refreshable credentials itself when asked within 15 minutes of
their expiry (its "advisory" window): the renewal here asks at most that early
(:data:`EARLY`, or half the credentials' lifetime for short ones), so each ask renews.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import trio

from refmount.backoff import Backoff
from refmount.errors import FetchError
from refmount.fetch.http.sigv4 import Credentials, Signer

log = logging.getLogger(__name__)

#: Renew this many seconds before expiry at the latest (botocore's advisory window).
EARLY = 15 * 60
#: Stop signing with credentials this many seconds before they expire: a request signed
#: just before the end would reach the store after it.
SAFETY = 60
BACKOFF_FIRST = 1.0
BACKOFF_MOST = 60.0

#: botocore's name of each source (its providers' ``METHOD``), as a user knows it.
SOURCES = {
    "env": "the environment (AWS_ACCESS_KEY_ID)",
    "shared-credentials-file": "the shared credentials file (~/.aws/credentials)",
    "config-file": "the AWS config file (~/.aws/config)",
    "custom-process": "credential_process",
    "sso": "AWS SSO (IAM Identity Center)",
    "login": "AWS console login",
    "assume-role": "assume-role",
    "assume-role-with-web-identity": "web identity (AWS_WEB_IDENTITY_TOKEN_FILE)",
    "container-role": "the container credentials endpoint (AWS_CONTAINER_CREDENTIALS_*_URI)",
    "iam-role": "the instance metadata service (IMDS)",
    "ec2-credentials-file": "the EC2 credentials file",
    "boto-config": "the boto config file",
}


def describe_source(method: str | None, profile: str | None) -> str:
    """A source of botocore's as a user knows it, with the profile where one is named."""
    shown = SOURCES.get(method or "", method or "botocore's credential chain")
    if profile and method not in ("env", "container-role", "iam-role"):
        shown += f" (AWS profile {profile!r})"
    return shown


@dataclass(frozen=True)
class _Found:
    """One set of credentials and when to stop trusting it (epoch seconds)."""

    signer: Signer
    expires: float | None
    renew_at: float  # a renewal starts from here on
    usable_until: float  # readers wait for the renewal from here on


def _found(signer: Signer, expires: float | None, now: float) -> _Found:
    if expires is None:
        return _Found(signer, None, math.inf, math.inf)
    lifetime = max(expires - now, 0.0)
    return _Found(
        signer,
        expires,
        expires - min(EARLY, lifetime / 2),
        expires - min(SAFETY, lifetime / 4),
    )


class CredentialChain:
    """The credentials of one S3 scope, as botocore's chain finds them."""

    def __init__(self, region: str, profile: str | None = None, deadline: float = 30.0) -> None:
        self.region = region
        self.profile = profile
        #: seconds a lookup or renewal may take (a process, an HTTP request)
        self.deadline = deadline
        self.method: str | None = None  # botocore's name of the source, once known
        self._credentials: Any = None  # botocore's (refreshable) credentials
        self._found: _Found | None = None
        self._nothing = False  # the chain found no credentials at all
        self._renewing: trio.Event | None = None
        self._thread_busy = False  # a lookup's thread still runs (abandoned at its deadline)
        self._backoff = Backoff(BACKOFF_FIRST, BACKOFF_MOST)

    @property
    def source(self) -> str:
        return describe_source(self.method, self.profile or os.environ.get("AWS_PROFILE"))

    async def signer(self) -> Signer | None:
        """A signer with credentials valid for a while yet, or None where the chain
        found none (the caller reads through its fallback, as before).  Raises FetchError
        (EIO) naming the source when none can be had."""
        found = self._found
        if found is not None and time.time() < found.renew_at:
            return found.signer
        return await self._signer_renewing()

    async def _signer_renewing(self) -> Signer | None:
        while True:
            if self._nothing:
                return None
            now = time.time()
            found = self._found
            if found is not None and now < found.renew_at:
                return found.signer
            if self._renewing is None and time.monotonic() >= self._backoff.retry_at:
                self._renewing = trio.Event()
                trio.lowlevel.spawn_system_task(self._renew, self._renewing)
            if found is not None and now < found.usable_until:
                return found.signer
            if self._renewing is not None:
                await self._renewing.wait()
                continue
            wait = max(self._backoff.retry_at - time.monotonic(), 0.0)
            raise FetchError(
                f"S3 credentials from {self.source}: {self._backoff.error}; "
                f"tried again in {wait:.0f} s",
                errno.EIO,
            )

    async def _renew(self, done: trio.Event) -> None:
        """Look the credentials up (the first time) or renew them, in a worker thread
        under the deadline; a system task, so that no reader's cancellation ends it."""
        try:
            if self._thread_busy:
                self._failed("the previous lookup has not ended (a process or a request hangs)")
                return
            with trio.move_on_after(self.deadline):
                got = await trio.to_thread.run_sync(self._look_up, abandon_on_cancel=True)
                self._took(*got)
                return
            self._failed(f"no answer within {self.deadline:g} s")
        except Exception as exc:
            self.method = self.method or _provider_of(exc)
            self._failed(_reason(exc))
        finally:
            self._renewing = None
            done.set()

    def _look_up(self) -> tuple[Any, Credentials | None, float | None]:
        """(botocore's credentials, a frozen set, its expiry): blocking, in a thread."""
        self._thread_busy = True
        try:
            credentials = self._credentials
            if credentials is None:
                import botocore.session

                credentials = botocore.session.Session(profile=self.profile).get_credentials()
                if credentials is None:
                    return None, None, None
            frozen = credentials.get_frozen_credentials()
            # botocore keeps the expiry of refreshable credentials only here.
            expiry = getattr(credentials, "_expiry_time", None)
            expires = expiry.timestamp() if expiry is not None else None
            key = Credentials(frozen.access_key, frozen.secret_key, frozen.token or None)
            return credentials, key, expires
        finally:
            self._thread_busy = False

    def _took(self, credentials: Any, key: Credentials | None, expires: float | None) -> None:
        if credentials is None or key is None:
            self._nothing = True
            log.info("s3: botocore's credential chain found no credentials")
            return
        first = self._credentials is None
        self._credentials = credentials
        self.method = getattr(credentials, "method", None)
        old = self._found
        if old is not None and old.expires is not None and (expires or 0) <= old.expires:
            # botocore gave the same credentials back: its renewal failed (it says so
            # in its own log) or the source has nothing newer yet.
            self._failed(f"no new credentials (these expire at {_utc(old.expires)})")
            return
        now = time.time()
        self._found = _found(Signer(key, self.region), expires, now)
        self._backoff.succeeded()
        if first:
            log.info(
                "s3: credentials from %s%s", self.source,
                f", renewed before they expire ({_utc(expires)})" if expires else "",
            )  # fmt: skip
        else:
            log.debug("s3: credentials from %s renewed; they expire at %s", self.source,
                      _utc(expires))  # fmt: skip
        if expires is not None and now >= self._found.usable_until:
            self._failed(f"the credentials given expire at {_utc(expires)}, too soon to use")

    def _failed(self, reason: str) -> None:
        wait = self._backoff.failed(reason)
        log.warning(
            "s3: credentials from %s: %s (tried again in %.0f s)", self.source, reason, wait
        )


def _provider_of(exc: BaseException) -> str | None:
    """The source botocore names in its error, where it names one."""
    provider = getattr(exc, "kwargs", {}).get("provider")
    return provider if isinstance(provider, str) else None


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:300]


def _utc(epoch: float | None) -> str:
    return "never" if epoch is None else time.strftime("%H:%M:%S UTC", time.gmtime(epoch))
