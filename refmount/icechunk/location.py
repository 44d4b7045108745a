"""Where a repository is: recognising one, and the icechunk storage that reads it.

A repository is recognised by its own objects: ``repo`` (format 2) or ``refs/`` (format
1) at its root.  Its native chunks are whole objects ``chunks/<id>`` beside them, read by
refmount's own fetcher like any other URL, so the chunk base URL is kept here too.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec.core

from refmount.errors import RefsError
from refmount.fetch.obstore_options import (
    AZURE_PROTOCOLS,
    GCS_PROTOCOLS,
    Untranslatable,
    translate,
)
from refmount.protocols import LOCAL_PROTOCOLS
from refmount.redaction import redact_url
from refmount.refs.source import json_named


@dataclass(frozen=True)
class Location:
    """A repository's root: ``url`` as given, ``protocol`` (``file`` for a path) and
    ``root`` (an absolute path, or the URL without a trailing slash)."""

    url: str
    protocol: str
    root: str

    @classmethod
    def of(cls, url: str) -> Location:
        protocol, path = fsspec.core.split_protocol(url)
        protocol = protocol or "file"
        if protocol in LOCAL_PROTOCOLS:
            return cls(url, "file", os.path.abspath(path))
        return cls(url, protocol, url.rstrip("/"))

    @property
    def local(self) -> bool:
        return self.protocol == "file"

    @property
    def name(self) -> str:
        return redact_url(self.url)

    def child(self, name: str) -> str:
        return posixpath.join(self.root, name) if self.local else f"{self.root}/{name}"

    def chunk_url(self, chunk_id: str) -> str:
        """The URL refmount's fetcher reads native chunk ``chunk_id`` from."""
        return self.child(f"chunks/{chunk_id}")


def is_repository(url: str, options: Mapping[str, Any]) -> bool:
    """Whether ``url`` is the root of an Icechunk repository (asks the store once or
    twice, unless its name says it is a JSON file; any failure to tell means no)."""
    if json_named(url):
        return False
    location = Location.of(url)
    if location.local:
        root = location.root
        return os.path.isfile(os.path.join(root, "repo")) or (
            os.path.isdir(os.path.join(root, "refs"))
            and os.path.isdir(os.path.join(root, "snapshots"))
        )
    try:
        fs, path = fsspec.core.url_to_fs(location.root, **options)
        if fs.isfile(f"{path.rstrip('/')}/repo"):
            return True
        return location.protocol not in ("http", "https") and bool(
            fs.isdir(f"{path.rstrip('/')}/refs")
        )
    except Exception:  # a store that cannot answer holds no repository we can read
        return False


def storage(location: Location, options: Mapping[str, Any]) -> Any:
    """The icechunk ``Storage`` for a repository, from the fsspec-style options refmount
    takes for REFS (``--refs-options``): ``endpoint_url``, ``key``/``secret``, ``anon``,
    ``client_kwargs.region_name`` for S3; gcsfs's ``token`` and ``endpoint_url`` for GCS;
    adlfs's ``account_name``, ``account_key``, ``sas_token``, ``connection_string`` for
    Azure; ``headers`` for HTTP."""
    import icechunk

    if location.local:
        return icechunk.local_filesystem_storage(location.root)
    if location.protocol in ("http", "https"):
        headers = options.get("headers")
        return icechunk.http_storage(location.root, headers=dict(headers) if headers else None)
    if location.protocol in ("s3", "s3a"):
        return _s3(location, options)
    if location.protocol in GCS_PROTOCOLS:
        return _gcs(location, options)
    if location.protocol in AZURE_PROTOCOLS:
        return _azure(location, options)
    raise RefsError(f"{location.name}: icechunk cannot read {location.protocol}:// repositories")


def _translated(location: Location, options: Mapping[str, Any]) -> tuple[dict[str, str], Any]:
    """icechunk's ``config`` (object_store's keys, as strings) for a GCS or Azure
    repository, and the whole translation; the options are translated as obstore's are
    (:mod:`refmount.fetch.obstore_options`), so one set of options serves both."""
    try:
        translated = translate(location.protocol, options)
    except Untranslatable as exc:
        raise RefsError(
            f"{location.name}: icechunk has no equivalent for the option {exc}"
        ) from None
    config = {key: str(value).lower() if isinstance(value, bool) else str(value)
              for key, value in translated.config.items()}  # fmt: skip
    if translated.client_options.get("allow_http"):
        config["allow_http"] = "true"
    return config, translated


def _gcs(location: Location, options: Mapping[str, Any]) -> Any:
    import icechunk

    bucket, _, prefix = location.root.partition("://")[2].partition("/")
    config, translated = _translated(location, options)
    anonymous = config.get("skip_signature") == "true"
    token = translated.bearer_token
    return icechunk.gcs_storage(
        bucket=bucket,
        prefix=prefix or None,
        bearer_token=token,
        anonymous=anonymous or None,
        from_env=None if (token or anonymous) else True,
        config=config,
    )


def _azure(location: Location, options: Mapping[str, Any]) -> Any:
    """``az://container/prefix``, or ``abfs[s]://container@account.host/prefix``."""
    import icechunk

    where, _, prefix = location.root.partition("://")[2].partition("/")
    container, _, host = where.partition("@")
    config, _ = _translated(location, options)
    account = config.pop("account_name", None) or host.split(".", 1)[0]
    if not account:
        raise RefsError(
            f"{location.name}: no Azure account: give account_name or connection_string"
        )
    key, sas = config.pop("account_key", None), config.pop("sas_key", None)
    anonymous = config.get("skip_signature") == "true"
    return icechunk.azure_storage(
        account=account,
        container=container,
        prefix=prefix,
        access_key=key,
        sas_token=sas,
        anonymous=anonymous or None,
        from_env=None if (key or sas or anonymous) else True,
        config=config,
    )


def _s3(location: Location, options: Mapping[str, Any]) -> Any:
    import icechunk

    bucket, _, prefix = location.root.partition("://")[2].partition("/")
    client = options.get("client_kwargs") or {}
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    key, secret = options.get("key"), options.get("secret")
    anonymous = bool(options.get("anon"))
    return icechunk.s3_storage(
        bucket=bucket,
        prefix=prefix or None,
        region=client.get("region_name") or options.get("region"),
        endpoint_url=endpoint,
        allow_http=bool(endpoint and endpoint.startswith("http://")),
        force_path_style=bool(endpoint),
        access_key_id=key,
        secret_access_key=secret,
        session_token=options.get("token"),
        anonymous=anonymous or None,
        from_env=None if (key or anonymous) else True,
    )
