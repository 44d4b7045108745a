"""One parse decides a URL's scope (which ``--remote-options`` it gets) and where its
request goes: a reference URL whose host parsers read differently
(``http://OTHER?@VICTIM/x``, ``#@``, a backslash, user information, a percent-encoded
host) is refused when the reference set loads, naming the key, and the other host
receives nothing keyed to the victim.  Two raw socket servers on 127.0.0.1, two ports:
the victim (options keyed to it) and the other host."""

from __future__ import annotations

import errno
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from refmount.authority import authority_problem, place_of
from refmount.errors import FetchError
from refmount.fetch.fetcher import scope_of
from refmount.icechunk.containers import Containers
from tests.conftest import Mounted
from tests.support.rawserver import RawServer, asked_range, header_lines, partial
from tests.support.remote_files import write_refs

DATA = bytes((i * 37 + 11) % 251 for i in range(1 << 14))
SECRETS = (b"authorization: bearer for-the-victim-only", b"x-api-key: victim-key")

FORMS = {
    "query-at": "http://127.0.0.1:{other}?@127.0.0.1:{victim}/data.bin",
    "fragment-at": "http://127.0.0.1:{other}#@127.0.0.1:{victim}/data.bin",
    "backslash-at": "http://127.0.0.1:{other}\\@127.0.0.1:{victim}/data.bin",
    "userinfo": "http://127.0.0.1:{victim}@127.0.0.1:{other}/data.bin",
    "percent-host": "http://127.0.0.1%3a{victim}@127.0.0.1:{other}/data.bin",
    "percent-only": "http://127.0.0%2e1:{other}/data.bin",
}


@pytest.fixture
def victim_and_other(raw_server: Callable[..., RawServer]) -> tuple[RawServer, RawServer]:
    def answer(head: bytes) -> tuple[bytes, bool]:
        return partial(*asked_range(head), DATA), True

    return raw_server(answer), raw_server(answer)


def received_secrets(server: RawServer) -> list[bytes]:
    return [s for head in server.requests for s in SECRETS if s in header_lines(head)]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_an_ambiguous_reference_url_is_refused_when_the_set_loads(
    mount: Callable[..., Mounted],
    tmp_path: Path,
    victim_and_other: tuple[RawServer, RawServer],
    form: str,
) -> None:
    victim, other = victim_and_other
    url = FORMS[form].format(victim=victim.port, other=other.port)
    refs = write_refs(tmp_path, {"good": [victim.url("/data.bin"), 0, 100], "bad": [url, 0, 100]})
    options = {
        victim.url(""): {
            "headers": {"Authorization": "Bearer for-the-victim-only", "X-Api-Key": "victim-key"}
        }
    }
    args = ("--remote-options", json.dumps(options), "--timeout", "5", "--retries", "0")
    try:
        m = mount(refs, *args)
    except RuntimeError as exc:
        refused, loaded = str(exc), False
    else:  # not refused: what would the other host have received?
        subprocess.run(["cat", str(m.mountpoint / "bad")], capture_output=True, timeout=60)
        refused, loaded = m.log(), True
    assert received_secrets(other) == []
    assert other.requests == []
    assert not loaded, refused[-2000:]  # refused when the set loads, not when read
    assert "key 'bad'" in refused and "refused" in refused, refused[-2000:]


def test_the_scope_is_the_place_the_connection_goes() -> None:
    """The options' key and the connection's host come from the same parse, the host
    lower-cased and the scheme's port left implicit, whatever the URL's spelling."""
    assert scope_of("https://Data.Example.ORG:443/x") == "https://data.example.org"
    assert scope_of("http://data.example.org:8080/x?y") == "http://data.example.org:8080"
    assert scope_of("s3://Bucket/key") == "s3://bucket"
    place = place_of("https://DATA.example.org/x")
    assert (place.host, place.port) == ("data.example.org", 443)
    for form, url in FORMS.items():
        url = url.format(victim=1, other=2)
        assert authority_problem(url) is not None, url
        if form in ("userinfo", "percent-host"):
            # A login before the host: refused in a set, but where the user's own URL
            # holds one, its scope is the host the connection goes to.
            assert scope_of(url) == "http://127.0.0.1:2"
        else:
            with pytest.raises(ValueError):
                scope_of(url)
    assert authority_problem("https://h./x") is not None
    assert authority_problem("abfs://container@account.dfs.core.windows.net/p") is None
    assert authority_problem("s3://bucket/key?with@odd#chars") is None


@pytest.mark.parametrize("form", sorted(FORMS))
def test_an_ambiguous_icechunk_chunk_url_is_refused_naming_the_key(form: str) -> None:
    """A manifest is untrusted too: a container declared with an ambiguous host (the
    repository's own config) does not make its chunks' URLs readable."""
    url = FORMS[form].format(victim=2, other=1)
    container = url.rpartition("/")[0] + "/"
    containers = Containers([container], local_allowed=False)
    with pytest.raises(FetchError, match=r"temp/c/0/0: virtual chunk URL .*: refused") as found:
        containers.target(url, "temp/c/0/0")
    assert found.value.errno == errno.EIO
