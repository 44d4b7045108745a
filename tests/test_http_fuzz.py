"""Generated answers against refmount's own HTTP client, through a real mount: only two
outcomes are allowed, exactly the right bytes or EIO.

Hypothesis (derandomized: the same examples on every run) builds each answer from a
correct 206 and a choice of what a hostile or sloppy server does to its head and body
framing (status line, Content-Range, Content-Length, Transfer-Encoding,
Content-Encoding, interim answers, broken header lines, a body too short or too long, an
answer nobody asked for after it, the connection kept or closed).  A raw socket server
of this file's sends it for one key of a mounted set; ``cat`` reads the key.  An answer
left untouched must give the bytes.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Callable
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, example, given, settings

from tests.conftest import Mounted
from tests.support.rawserver import RawServer, Reply, asked_range, partial
from tests.support.remote_files import write_refs

DATA = bytes((i * 89 + (i >> 5)) % 239 for i in range(1 << 17))
OTHER = bytes(255 - b for b in DATA)
CASES = 150
LENGTH = 100_000  # longer than the client's head buffer: what follows stays unread
STEP = 7  # key i starts STEP * i bytes after key 0

MUTATIONS: dict[str, list[str]] = {
    "status": ["206", "200", "203", "HTTP/1.0 206", "HTTP/2 206", "interim", "many-interim"],
    "range": ["right", "first+1", "last+1", "last-1", "total-small", "missing", "items", "twice"],
    "length": ["right", "+1", "-1", "missing", "twice-same", "twice-other", "plus-sign", "huge"],
    "encoding": ["none", "te-chunked", "te-gzip", "te-identity", "ce-gzip", "ce-identity"],
    "junk": ["none", "bare-lf", "fold", "nul", "no-colon", "space-before-colon"],
    "body": ["right", "short", "long", "empty", "unasked-answer-after"],
    "connection": ["keep", "close", "close-header"],
}
UNTOUCHED = {
    "status": "206", "range": "right", "length": "right", "encoding": "none",
    "junk": "none", "body": "right", "connection": "keep",
}  # fmt: skip


def build(first: int, last: int, case: dict[str, str]) -> tuple[Reply, bool]:
    """The answer to a request for ``first-last`` that ``case`` describes."""
    body = DATA[first : last + 1]
    size = len(body)
    statuses = {"200": "HTTP/1.1 200 OK", "203": "HTTP/1.1 203 Non-Authoritative",
                "HTTP/1.0 206": "HTTP/1.0 206 Partial", "HTTP/2 206": "HTTP/2 206"}  # fmt: skip
    lines = [statuses.get(case["status"], "HTTP/1.1 206 Partial Content")]
    total = len(DATA)
    content_range = {
        "right": f"bytes {first}-{last}/{total}", "first+1": f"bytes {first + 1}-{last}/{total}",
        "last+1": f"bytes {first}-{last + 1}/{total}",
        "last-1": f"bytes {first}-{last - 1}/{total}",
        "total-small": f"bytes {first}-{last}/{last}", "items": f"items {first}-{last}/{total}",
        "twice": f"bytes {first}-{last}/{total}, bytes {first}-{last}/{total}", "missing": None,
    }[case["range"]]  # fmt: skip
    if content_range is not None:
        lines.append(f"Content-Range: {content_range}")
    length = {"right": [str(size)], "+1": [str(size + 1)], "-1": [str(size - 1)], "missing": [],
              "twice-same": [str(size), str(size)], "twice-other": [str(size), str(size + 1)],
              "plus-sign": [f"+{size}"], "huge": ["9" * 19]}[case["length"]]  # fmt: skip
    lines += [f"Content-Length: {value}" for value in length]
    encoding = {"none": None, "te-chunked": "Transfer-Encoding: chunked",
                "te-gzip": "Transfer-Encoding: gzip", "te-identity": "Transfer-Encoding: identity",
                "ce-gzip": "Content-Encoding: gzip", "ce-identity": "Content-Encoding: identity",
                }[case["encoding"]]  # fmt: skip
    if encoding is not None:
        lines.append(encoding)
    junk = {"none": None, "bare-lf": "X-A: 1\nX-B: 2", "fold": "X-A: 1\r\n folded",
            "nul": "X-A: 1\x00", "no-colon": "X-A 1", "space-before-colon": "X-A : 1",
            }[case["junk"]]  # fmt: skip
    if junk is not None:
        lines.append(junk)
    if case["connection"] == "close-header":
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    if case["status"] in ("interim", "many-interim"):
        count = 2 if case["status"] == "interim" else 20
        head = b"HTTP/1.1 100 Continue\r\n\r\n" * count + head
    if case["encoding"] == "te-chunked":  # the body chunked, its length the Content-Length
        body = f"{size:x}\r\n".encode() + body[: size - 20]
    payload = {"right": body, "short": body[:-7], "long": body + OTHER[:100], "empty": b"",
               "unasked-answer-after": body}[case["body"]]  # fmt: skip
    if case["body"] == "unasked-answer-after":
        payload += partial(first + STEP, last + STEP, OTHER)  # the next key's range
    return head + payload, case["connection"] == "keep"


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, str]:
    """A correct answer with one to three of its parts done wrong."""
    parts = draw(st.sets(st.sampled_from(sorted(MUTATIONS)), min_size=1, max_size=3))
    wrong = {part: draw(st.sampled_from(MUTATIONS[part][1:])) for part in sorted(parts)}
    return {**UNTOUCHED, **wrong}


def test_generated_answers_give_the_right_bytes_or_eio(
    mount: Callable[..., Mounted], tmp_path: Path, raw_server: Callable[..., RawServer]
) -> None:
    cases: dict[str, dict[str, str]] = {}

    def answer(head: bytes) -> tuple[Reply, bool]:
        first, last = asked_range(head)
        return build(first, last, cases[head.split(b" ")[1].decode()])

    server = raw_server(answer)
    refs = {f"k{i}": [server.url(f"/case/{i}"), 1000 + STEP * i, LENGTH] for i in range(CASES)}
    m = mount(write_refs(tmp_path, refs), "--timeout", "1", "--retries", "0")
    numbers = itertools.count()
    outcomes = {"bytes": 0, "EIO": 0}

    @settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(mutated())
    @example(UNTOUCHED)
    @example({**UNTOUCHED, "encoding": "te-chunked"})
    @example({**UNTOUCHED, "body": "unasked-answer-after"})
    def one(case: dict[str, str]) -> None:
        i = next(numbers)
        if i >= CASES:
            return
        cases[f"/case/{i}"] = case
        expected = DATA[1000 + STEP * i : 1000 + STEP * i + LENGTH]
        got = subprocess.run(["cat", str(m.mountpoint / f"k{i}")], capture_output=True, timeout=60)
        if got.returncode == 0:
            assert got.stdout == expected, (case, len(got.stdout))
            outcomes["bytes"] += 1
        else:
            assert b"Input/output error" in got.stderr and got.stdout == b"", (case, got)
            assert case != UNTOUCHED, got
            outcomes["EIO"] += 1

    one()
    assert m.process.poll() is None, m.log()[-3000:]
    print(f"generated answers: {outcomes}")
    assert outcomes["bytes"] and outcomes["EIO"], outcomes
