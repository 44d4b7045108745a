"""The per-mount cookie jar and ``.netrc`` credentials (refmount.fetch.logins): which
host gets what.  The flows through real mounts are tests/test_earthdata.py's."""

from __future__ import annotations

import base64
from pathlib import Path

from refmount.fetch.logins import Logins, read_netrc


def test_netrc_credentials_go_to_the_host_named_and_a_default_line_to_none(
    tmp_path: Path,
) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text(
        "machine URS.example.gov login me password secret\ndefault login any password all\n"
    )
    netrc.chmod(0o600)
    logins = Logins(read_netrc(netrc))
    expected = "Basic " + base64.b64encode(b"me:secret").decode()
    assert logins.basic("urs.example.gov") == expected
    assert logins.basic("archive.example.gov") is None
    assert logins.has_credentials("urs.example.gov")
    assert not logins.has_credentials("archive.example.gov")
    assert read_netrc(tmp_path / "missing") == {}


def test_cookies_keep_to_their_host_path_scheme_and_time() -> None:
    logins = Logins({})
    assert logins.cookie("https://a.example.org/x") is None  # an empty jar: no work
    logins.keep("https://a.example.org/data/x", ["s=1; Path=/data; Secure; Max-Age=100"])
    logins.keep("https://www.example.org/", ["d=2; Domain=example.org; Path=/"])
    logins.keep("https://a.example.org/", ["gone=3; Path=/; Max-Age=0"])
    assert logins.cookie("https://a.example.org/data/y") == "s=1; d=2"
    assert logins.cookie("http://a.example.org/data/y") == "d=2"  # Secure: https only
    assert logins.cookie("https://a.example.org/other") == "d=2"  # Path
    assert logins.cookie("https://b.example.org/data/y") == "d=2"  # host-only s
    assert logins.cookie("https://example.com/data/y") is None
