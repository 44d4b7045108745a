"""fsspec-style storage options translated into obstore's store configuration.

refmount takes fsspec's storage options (``--remote-options``), as s3fs, gcsfs, adlfs
and fsspec's HTTP filesystem spell them.  When a protocol's options translate, its byte
ranges are read through obstore; when any option does not, that protocol is read
through fsspec, with one log line naming the option.  Translated:

==============================  ===================================================
fsspec option                   obstore configuration
==============================  ===================================================
**s3, s3a** (s3fs)
``anon: true``                  ``skip_signature: true``
``key`` / ``secret`` / ``token``  ``access_key_id`` / ``secret_access_key`` / ``session_token``
``endpoint_url``,               ``endpoint``; an ``http://`` endpoint also sets the
``client_kwargs.endpoint_url``  client option ``allow_http``
``region``,                     ``region``
``client_kwargs.region_name``
``use_ssl: false``              client option ``allow_http: true``
``requester_pays: true``        ``request_payer: true``
``profile``                     none: refmount's own client signs with the profile's
                                credentials (botocore's chain), fsspec does the rest
``config_kwargs.max_pool_connections``  nothing: refmount bounds requests itself
**gs, gcs** (gcsfs)
``token: "anon"``               ``skip_signature: true``
``token: "<file.json>"``        ``service_account`` (the key file's path)
``token: {...}`` (a key)        ``service_account_key`` (the key as JSON)
``token: "<access token>"``     a bearer token (any other string, as gcsfs reads it)
``token: null`` / ``"google_default"``  the default credentials (environment)
``endpoint_url``                ``base_url``
**az, abfs, abfss** (adlfs)
``account_name`` / ``account_key``  ``account_name`` / ``account_key``
``sas_token``                   ``sas_key``
``connection_string``           its ``AccountName``, ``AccountKey``,
                                ``SharedAccessSignature``, ``BlobEndpoint`` parts
``account_host``                ``endpoint``: ``https://<account_host>``
``tenant_id`` / ``client_id`` / ``client_secret``  the same names
``anon: true``                  ``skip_signature: true``
**http, https** (fsspec HTTP)
``headers``,                    client option ``default_headers``
``client_kwargs.headers``
==============================  ===================================================

fsspec's own caching and listing settings (``default_block_size``, ``block_size``,
``use_listings_cache``, ``skip_instance_cache``, ``cache_type``, ...) mean nothing to a
ranged read and are ignored.  Everything else (``client_kwargs.auth``,
gcsfs's ``token: "cloud"``, adlfs's ``credential`` object, ...) keeps the protocol on
fsspec.  S3 credentials from an AWS profile (the ``profile`` option, ``AWS_PROFILE``,
``~/.aws``) when no key is given are botocore's alone: refmount's own client signs
with them (:mod:`refmount.fetch.http.aws_credentials`), and what it leaves (sizes,
URLs it cannot address) goes to fsspec, not obstore (:attr:`StoreConfig.obstore_gap`).
S3 on AWS itself with no region given or set in the environment stays on fsspec (s3fs
asks AWS for a bucket's region; obstore would sign for the wrong one).

Every store also gets refmount's client settings: no retries inside obstore (the
fetcher retries, under its own deadline), a total timeout of the fetcher's deadline plus
a second (reads run in worker threads, which a deadline abandons: the request must end
by itself; see ``obstore_backend``); and ``Accept-Encoding: identity`` on every
request (a user's own Accept-Encoding header is dropped): a byte range of a compressed
encoding is not the range.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

S3_PROTOCOLS = frozenset({"s3", "s3a"})
GCS_PROTOCOLS = frozenset({"gs", "gcs"})
AZURE_PROTOCOLS = frozenset({"az", "abfs", "abfss"})
HTTP_PROTOCOLS = frozenset({"http", "https"})
OBSTORE_PROTOCOLS = S3_PROTOCOLS | GCS_PROTOCOLS | AZURE_PROTOCOLS | HTTP_PROTOCOLS

#: Options of fsspec's caching, listing and instance machinery: nothing for a ranged read.
FSSPEC_ONLY = frozenset(
    {
        "asynchronous",
        "block_size",
        "cache_options",
        "cache_regions",
        "cache_timeout",
        "cache_type",
        "default_block_size",
        "default_cache_type",
        "default_fill_cache",
        "listings_expiry_time",
        "max_paths",
        "same_scheme",
        "simple_links",
        "size_policy",
        "skip_instance_cache",
        "use_listings_cache",
        "encoded",
        "project",  # gcsfs: only for listing buckets
    }
)

#: Client settings every store gets: the fetcher owns retries and deadlines (its backend
#: replaces this timeout with the fetcher's deadline plus a margin).
CLIENT_DEFAULTS: dict[str, Any] = {"timeout": "86400s"}
#: Headers every request carries: a ranged read is never of a compressed encoding (its
#: bytes would be the wrong ones, and a small body could inflate without bound).
IDENTITY = {"Accept-Encoding": "identity"}
RETRY_CONFIG: dict[str, Any] = {"max_retries": 0}


class Untranslatable(Exception):
    """An option obstore has no equivalent for; the message names it."""


@dataclass
class StoreConfig:
    """What one obstore store class is made with."""

    kind: str  # "s3", "gcs", "azure" or "http"
    config: dict[str, Any] = field(default_factory=dict)
    client_options: dict[str, Any] = field(
        default_factory=lambda: {**CLIENT_DEFAULTS, "default_headers": dict(IDENTITY)}
    )
    #: GCS: an access token sent as it is (obstore takes it through a credential provider).
    bearer_token: str | None = None
    #: S3: the AWS profile named in the options (s3fs's ``profile``)
    aws_profile: str | None = None
    #: What obstore cannot do of this configuration (None: nothing): refmount's own
    #: client may still serve it, with fsspec for the rest.
    obstore_gap: str | None = None


def translate(protocol: str, options: Mapping[str, Any]) -> StoreConfig:
    """The obstore configuration for fsspec storage options of ``protocol``.

    Raises :class:`Untranslatable` naming the first option (or situation) only fsspec
    understands.  A configuration obstore can take only in part says why in
    :attr:`StoreConfig.obstore_gap`."""
    options = {k: v for k, v in options.items() if k not in FSSPEC_ONLY}
    if protocol in S3_PROTOCOLS:
        return _s3(options)
    if protocol in GCS_PROTOCOLS:
        return _gcs(options)
    if protocol in AZURE_PROTOCOLS:
        return _azure(options)
    if protocol in HTTP_PROTOCOLS:
        return _http(options)
    raise Untranslatable(f"protocol {protocol!r}")


def _take_client_kwargs(options: dict[str, Any], known: set[str]) -> dict[str, Any]:
    client_kwargs = options.pop("client_kwargs", None) or {}
    if not isinstance(client_kwargs, Mapping):
        raise Untranslatable("client_kwargs")
    for key in client_kwargs:
        if key not in known:
            raise Untranslatable(f"client_kwargs.{key}")
    return dict(client_kwargs)


def _refuse_rest(options: Mapping[str, Any]) -> None:
    for key in options:
        raise Untranslatable(key)


def _endpoint(store: StoreConfig, key: str, url: Any) -> None:
    if not isinstance(url, str):
        raise Untranslatable("endpoint_url")
    store.config[key] = url
    if url.startswith("http://"):
        store.client_options["allow_http"] = True


def _s3(options: dict[str, Any]) -> StoreConfig:
    store = StoreConfig("s3")
    client_kwargs = _take_client_kwargs(options, {"endpoint_url", "region_name"})
    config_kwargs = options.pop("config_kwargs", None) or {}
    if not isinstance(config_kwargs, Mapping):
        raise Untranslatable("config_kwargs")
    for key in config_kwargs:
        if key != "max_pool_connections":
            raise Untranslatable(f"config_kwargs.{key}")
    if options.pop("anon", False):
        store.config["skip_signature"] = True
    for ours, theirs in (("key", "access_key_id"), ("secret", "secret_access_key")):
        if (value := options.pop(ours, None)) is not None:
            store.config[theirs] = str(value)
    if (token := options.pop("token", None)) is not None:
        store.config["session_token"] = str(token)
    endpoint = options.pop("endpoint_url", None) or client_kwargs.get("endpoint_url")
    if endpoint is not None:
        _endpoint(store, "endpoint", endpoint)
    region = options.pop("region", None) or client_kwargs.get("region_name")
    if region is not None:
        store.config["region"] = str(region)
    if options.pop("use_ssl", True) is False:
        store.client_options["allow_http"] = True
    if options.pop("requester_pays", False):
        store.config["request_payer"] = True
    if (profile := options.pop("profile", None)) is not None:
        store.aws_profile = str(profile)
    _refuse_rest(options)
    signs = "access_key_id" in store.config or store.config.get("skip_signature")
    if store.aws_profile and not signs:
        store.obstore_gap = f"credentials from the AWS profile {store.aws_profile!r}"
    elif not signs and not _aws_env_has_key() and _aws_profile_in_use():
        store.obstore_gap = "credentials from an AWS profile (~/.aws or AWS_PROFILE)"
    if endpoint is None and "region" not in store.config and not _aws_env_region():
        raise Untranslatable("no region for S3 on AWS (give region, or set AWS_REGION)")
    return store


def _aws_env_has_key() -> bool:
    return bool(os.environ.get("AWS_ACCESS_KEY_ID"))


def _aws_env_region() -> bool:
    return bool(os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"))


def _aws_profile_in_use() -> bool:
    if os.environ.get("AWS_PROFILE"):
        return True
    files = [
        os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials",
        os.environ.get("AWS_CONFIG_FILE") or "~/.aws/config",
    ]
    return any(Path(name).expanduser().is_file() for name in files)


def _gcs(options: dict[str, Any]) -> StoreConfig:
    store = StoreConfig("gcs")
    token = options.pop("token", None)
    if token == "anon":
        store.config["skip_signature"] = True
    elif isinstance(token, Mapping):
        store.config["service_account_key"] = json.dumps(dict(token))
    elif isinstance(token, str) and token in _GCSFS_TOKEN_METHODS:
        raise Untranslatable(f"token={token!r}")
    elif isinstance(token, str) and Path(token).expanduser().is_file():
        store.config["service_account"] = str(Path(token).expanduser())
    elif isinstance(token, str) and token and token != "google_default":
        store.bearer_token = token
    elif token not in (None, "google_default"):
        raise Untranslatable("token")
    if (endpoint := options.pop("endpoint_url", None)) is not None:
        _endpoint(store, "base_url", endpoint)
    _refuse_rest(options)
    return store


#: gcsfs's ``token`` values that name a way of finding credentials (rather than a key
#: file or an access token) that obstore has no equivalent for.
_GCSFS_TOKEN_METHODS = frozenset({"cache", "browser", "cloud"})


def _azure(options: dict[str, Any]) -> StoreConfig:
    store = StoreConfig("azure")
    if (connection := options.pop("connection_string", None)) is not None:
        _connection_string(store, str(connection))
    renames = {
        "account_name": "account_name",
        "account_key": "account_key",
        "sas_token": "sas_key",
        "tenant_id": "tenant_id",
        "client_id": "client_id",
        "client_secret": "client_secret",
    }
    for ours, theirs in renames.items():
        if (value := options.pop(ours, None)) is not None:
            store.config[theirs] = str(value)
    if options.pop("anon", False):
        store.config["skip_signature"] = True
    if (host := options.pop("account_host", None)) is not None:
        _endpoint(store, "endpoint", f"https://{host}")
    _refuse_rest(options)
    return store


def _connection_string(store: StoreConfig, connection: str) -> None:
    parts = dict(item.split("=", 1) for item in connection.split(";") if "=" in item.strip())
    renames = {
        "AccountName": "account_name",
        "AccountKey": "account_key",
        "SharedAccessSignature": "sas_key",
    }
    for key, value in parts.items():
        if key in renames:
            store.config[renames[key]] = value
        elif key == "BlobEndpoint":
            _endpoint(store, "endpoint", value)
        elif key not in ("DefaultEndpointsProtocol", "EndpointSuffix"):
            raise Untranslatable(f"connection_string part {key}")


def _http(options: dict[str, Any]) -> StoreConfig:
    store = StoreConfig("http")
    store.client_options["allow_http"] = True  # http:// URLs name plain HTTP on purpose
    client_kwargs = _take_client_kwargs(options, {"headers"})
    headers: dict[str, str] = {}
    for source in (client_kwargs.get("headers"), options.pop("headers", None)):
        if source is None:
            continue
        if not isinstance(source, Mapping):
            raise Untranslatable("headers")
        headers.update({str(k): str(v) for k, v in source.items()})
    for name in [h for h in headers if h.lower() == "accept-encoding"]:
        del headers[name]  # ranges are asked uncompressed, whatever the options say
    store.client_options["default_headers"].update(headers)
    _refuse_rest(options)
    return store
