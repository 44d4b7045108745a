"""A small HTTP file server with byte ranges, latency and runtime fault injection.

Run it as a script::

    python tests/support/rangeserver.py --root DIR [--host 127.0.0.1] [--port 0] [--delay S]
                                        [--watch-stdin]

Once listening it prints one line ``PORT <n>`` to stdout.  Files under DIR are served for
GET and HEAD, with single byte ranges (``bytes=a-b``, ``bytes=a-``, ``bytes=-n``).
``--delay`` sleeps (without blocking other requests) before answering each data request;
``--watch-stdin`` makes the server exit when its stdin closes, so it cannot outlive a
parent that held the other end of a pipe.

Control endpoints (never counted as data requests, never delayed, never faulted):

* ``POST /_faults`` with JSON ``{"path": "/f" | "*", "mode": M, "count": N, "method": opt}``
  appends a rule.  ``count`` is how many matching requests it affects (default 1, -1 means
  forever); the optional ``method`` ("GET" or "HEAD") narrows the rule to one method.
* ``GET /_faults`` lists the rules left; ``DELETE /_faults`` clears them all.
* ``GET /_stats`` returns ``{"requests", "ranges", "faults_left", "max_inflight",
  "headers"}``; ``ranges`` lists ``[path, start, end_exclusive]`` of each body the server
  started to send, as its headers describe it (a truncated body is listed whole, a short
  one as sent).  ``requests`` counts GET and HEAD of data paths, faulted or not, 404
  included; ``headers`` holds the request headers of the last data requests (lower-case
  names), oldest first.
* ``DELETE /_stats`` resets the counters.

With ``--validators`` every answer for a file carries an ``ETag`` (from its inode, mtime
and size) and a ``Last-Modified``, as most servers send; without, neither.

Fault modes: ``503``, ``500``, ``429``, ``403``, ``404`` (that status), ``stall`` (never
answer), ``truncate`` (full-length headers, half the body, then close), ``short`` (a
self-consistent 206 one byte shorter than asked), ``ignore-range`` (200 with the whole
file) and ``reset`` (abort the TCP connection with RST, no response at all).

Hostile modes, for stores that lie in ways that cost memory: ``huge`` (ignore Range: a 200
whose body is the file followed by generated zeros, 10 GiB in all), ``endless`` (a 206 with
the asked Content-Range and bytes, then zeros without end, chunked), ``gzip-bomb`` (a 206
with the asked Content-Range but ``Content-Encoding: gzip`` of 1 GiB of zeros), ``exact-200``
(a 200 carrying exactly the asked bytes, as if it were the range), ``wrong-range`` (a 206
for the range one byte further on, saying so in Content-Range), ``long`` (a 206 with the
asked Content-Range but one byte more body) and ``huge-size`` (a HEAD answering a
Content-Length of 2**63).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import email.utils
import os
import re
import signal
import socket
import struct
import sys
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

CHUNK = 1 << 20  # bytes per write when streaming a body
INLINE_READ = 256 << 10  # reads up to this size skip the thread pool
STALL_SECONDS = 3600.0
STATUS_MODES = frozenset({"503", "500", "429", "403", "404"})
BODY_MODES = frozenset({"stall", "truncate", "short", "ignore-range", "reset"})
HOSTILE_MODES = frozenset(
    {"huge", "endless", "gzip-bomb", "exact-200", "wrong-range", "long", "huge-size"}
)
MODES = STATUS_MODES | BODY_MODES | HOSTILE_MODES
HUGE_BODY = 10 << 30  # bytes a "huge" answer claims and would send
BOMB_ZEROS = 1 << 30  # bytes a "gzip-bomb" body inflates to
KEPT_HEADERS = 1000  # request headers remembered for /_stats

_RANGE_RE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)


@dataclass
class FaultRule:
    path: str
    mode: str
    count: int = 1
    method: str | None = None

    def matches(self, path: str, method: str) -> bool:
        if self.method is not None and self.method != method:
            return False
        return self.path in ("*", path)


@dataclass
class ServerState:
    root: Path
    delay: float = 0.0
    rules: list[FaultRule] = field(default_factory=list)
    requests: int = 0
    ranges: list[tuple[str, int, int]] = field(default_factory=list)
    inflight: int = 0
    max_inflight: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)
    validators: bool = False

    def take_fault(self, path: str, method: str) -> str | None:
        """The mode of the first matching rule, consuming one use of it."""
        for rule in self.rules:
            if rule.count != 0 and rule.matches(path, method):
                if rule.count > 0:
                    rule.count -= 1
                if rule.count == 0:
                    self.rules.remove(rule)
                return rule.mode
        return None

    def reset_stats(self) -> None:
        self.requests = 0
        self.ranges.clear()
        self.headers.clear()
        self.max_inflight = self.inflight


STATE_KEY = web.AppKey("state", ServerState)


class Unsatisfiable(Exception):
    """The Range header is well formed but selects no byte of the file."""


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(start, end_exclusive)`` for a single byte range, or None to send the whole file.

    Malformed or multi-range headers are ignored (whole file), as RFC 9110 allows.
    Raises Unsatisfiable when the range selects nothing.
    """
    if header is None:
        return None
    match = _RANGE_RE.match(header)
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # suffix range: the last n bytes
        suffix = int(last)
        if suffix == 0 or size == 0:
            raise Unsatisfiable
        return max(0, size - suffix), size
    start = int(first)
    if last and int(last) < start:
        return None
    if start >= size:
        raise Unsatisfiable
    end = size if not last else min(int(last) + 1, size)
    return start, end


def resolve(root: Path, url_path: str) -> Path | None:
    """The regular file under root that url_path names, or None (missing or outside root)."""
    relative = url_path.lstrip("/")
    if not relative or "\x00" in relative:
        return None
    candidate = (root / relative).resolve()
    if not candidate.is_relative_to(root) or not candidate.is_file():
        return None
    return candidate


async def read_at(fd: int, length: int, offset: int) -> bytes:
    if length <= INLINE_READ:
        return os.pread(fd, length, offset)
    return await asyncio.get_running_loop().run_in_executor(None, os.pread, fd, length, offset)


async def stream_file(
    resp: web.StreamResponse, file: Path, start: int, end: int, stop_after: int | None = None
) -> None:
    """Write bytes [start, end) of file to resp, at most stop_after of them."""
    limit = end if stop_after is None else min(end, start + stop_after)
    fd = os.open(file, os.O_RDONLY)
    try:
        offset = start
        while offset < limit:
            data = await read_at(fd, min(CHUNK, limit - offset), offset)
            if not data:
                break
            await resp.write(data)
            offset += len(data)
    finally:
        os.close(fd)


def reset_connection(request: web.Request) -> None:
    """Close the client's connection with a TCP RST and no response."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def handle_data(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    state.requests += 1
    state.headers.append({k.lower(): v for k, v in request.headers.items()})
    del state.headers[:-KEPT_HEADERS]
    state.inflight += 1
    state.max_inflight = max(state.max_inflight, state.inflight)
    try:
        if state.delay > 0:
            await asyncio.sleep(state.delay)
        return await answer(request, state)
    finally:
        state.inflight -= 1


async def answer(request: web.Request, state: ServerState) -> web.StreamResponse:
    path = request.path
    mode = state.take_fault(path, request.method)
    if mode in STATUS_MODES:
        return web.Response(status=int(mode), text=f"injected fault {mode}\n")
    if mode == "stall":
        await asyncio.sleep(STALL_SECONDS)
    if mode == "reset":
        reset_connection(request)
        # The connection is gone; aiohttp discards whatever is returned here.
        return web.Response(status=499)
    file = resolve(state.root, path)
    if file is None:
        return web.Response(status=404, text="not found\n")
    st = file.stat()
    size = st.st_size
    if state.validators:
        request["version"] = version_headers(st)
    if request.method == "HEAD":
        return await head_response(request, 1 << 63 if mode == "huge-size" else size)
    if mode in HOSTILE_MODES:
        return await send_hostile(request, state, file, size, mode)
    return await send_body(request, state, file, size, mode)


def version_headers(st: os.stat_result) -> dict[str, str]:
    """ETag and Last-Modified of a file as it is now."""
    return {
        "ETag": f'"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"',
        "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True),
    }


async def head_response(request: web.Request, size: int) -> web.StreamResponse:
    resp = web.StreamResponse(status=200)
    resp.headers.update(request.get("version", {}))
    resp.content_type = "application/octet-stream"
    resp.headers["Accept-Ranges"] = "bytes"
    resp.headers["Content-Length"] = str(size)  # as given, even past what aiohttp allows
    await resp.prepare(request)
    await resp.write_eof()
    return resp


async def send_body(
    request: web.Request, state: ServerState, file: Path, size: int, mode: str | None
) -> web.StreamResponse:
    try:
        wanted = None if mode == "ignore-range" else parse_range(request.headers.get("Range"), size)
    except Unsatisfiable:
        return web.Response(status=416, headers={"Content-Range": f"bytes */{size}"})
    start, end = wanted if wanted is not None else (0, size)
    partial = wanted is not None
    if mode == "short":
        end = max(start, end - 1)
        partial = True
    resp = web.StreamResponse(status=206 if partial else 200)
    resp.content_type = "application/octet-stream"
    resp.headers["Accept-Ranges"] = "bytes"
    resp.headers.update(request.get("version", {}))
    if partial:
        resp.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    resp.content_length = end - start
    if mode == "truncate":
        # Closing after the response ends the body early; Content-Length still claims it all.
        resp.force_close()
    await resp.prepare(request)
    state.ranges.append((request.path, start, end))
    stop_after = (end - start) // 2 if mode == "truncate" else None
    await stream_file(resp, file, start, end, stop_after)
    await resp.write_eof()
    return resp


async def send_hostile(
    request: web.Request, state: ServerState, file: Path, size: int, mode: str
) -> web.StreamResponse:
    """An answer in one of the hostile modes (see the module's docstring)."""
    try:
        wanted = parse_range(request.headers.get("Range"), size)
    except Unsatisfiable:
        wanted = None
    start, end = wanted if wanted is not None else (0, size)
    resp = web.StreamResponse(status=206)
    resp.content_type = "application/octet-stream"
    resp.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    if mode == "huge":
        resp.set_status(200)
        del resp.headers["Content-Range"]
        resp.content_length = HUGE_BODY
        await resp.prepare(request)
        state.ranges.append((request.path, 0, HUGE_BODY))
        await stream_file(resp, file, 0, size)
        await write_zeros(resp, HUGE_BODY - size)
    elif mode == "endless":
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        state.ranges.append((request.path, start, -1))
        await stream_file(resp, file, start, end)
        await write_zeros(resp, None)
    elif mode == "gzip-bomb":
        body = gzip_bomb()
        resp.headers["Content-Encoding"] = "gzip"
        resp.content_length = len(body)
        await resp.prepare(request)
        state.ranges.append((request.path, start, end))
        for offset in range(0, len(body), CHUNK):
            await resp.write(body[offset : offset + CHUNK])
    else:
        if mode == "exact-200":
            resp.set_status(200)
            del resp.headers["Content-Range"]
        elif mode == "wrong-range":
            start, end = start + 1, min(end + 1, size)
            resp.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        resp.content_length = end - start + (mode == "long")
        await resp.prepare(request)
        state.ranges.append((request.path, start, end))
        await stream_file(resp, file, start, end)
        if mode == "long":
            await resp.write(b"!")
    await resp.write_eof()
    return resp


async def write_zeros(resp: web.StreamResponse, count: int | None) -> None:
    """Write count zero bytes (None: until the client goes away)."""
    zeros = bytes(CHUNK)
    while count is None or count > 0:
        piece = zeros if count is None or count >= CHUNK else zeros[:count]
        await resp.write(piece)
        if count is not None:
            count -= len(piece)


_bomb: list[bytes] = []


def gzip_bomb() -> bytes:
    """A gzip stream of BOMB_ZEROS zero bytes, about a thousandth of that, made once.

    After a full flush the compressor starts afresh, so every further MiB of zeros
    compresses to the same bytes: one is made and repeated, then the final empty block and
    the gzip trailer (CRC-32 and length of what the stream inflates to) close it."""
    if not _bomb:
        zeros = bytes(CHUNK)
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip framing
        first = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
        again = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
        last_block = zlib.compressobj(9, zlib.DEFLATED, -15).flush()
        count = BOMB_ZEROS // CHUNK
        crc = 0
        for _ in range(count):
            crc = zlib.crc32(zeros, crc)
        trailer = struct.pack("<II", crc, BOMB_ZEROS & 0xFFFFFFFF)
        _bomb.append(first + again * (count - 1) + last_block + trailer)
    return _bomb[0]


async def add_fault(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    try:
        body: Any = await request.json()
        rule = FaultRule(
            path=str(body["path"]),
            mode=str(body["mode"]),
            count=int(body.get("count", 1)),
            method=body.get("method"),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise web.HTTPBadRequest(text=f"bad fault rule: {exc!r}\n") from exc
    if rule.mode not in MODES:
        raise web.HTTPBadRequest(text=f"unknown mode {rule.mode!r}; known: {sorted(MODES)}\n")
    if rule.count != 0:
        state.rules.append(rule)
    return web.json_response({"faults_left": [asdict(r) for r in state.rules]})


async def list_faults(request: web.Request) -> web.Response:
    return web.json_response({"faults_left": [asdict(r) for r in request.app[STATE_KEY].rules]})


async def clear_faults(request: web.Request) -> web.Response:
    request.app[STATE_KEY].rules.clear()
    return web.json_response({"faults_left": []})


async def get_stats(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.json_response(
        {
            "requests": state.requests,
            "ranges": [list(r) for r in state.ranges],
            "faults_left": [asdict(r) for r in state.rules],
            "max_inflight": state.max_inflight,
            "headers": state.headers,
        }
    )


async def reset_stats(request: web.Request) -> web.Response:
    request.app[STATE_KEY].reset_stats()
    return web.json_response({})


def make_app(state: ServerState) -> web.Application:
    app = web.Application()
    app[STATE_KEY] = state
    app.router.add_post("/_faults", add_fault)
    app.router.add_get("/_faults", list_faults, allow_head=False)
    app.router.add_delete("/_faults", clear_faults)
    app.router.add_get("/_stats", get_stats, allow_head=False)
    app.router.add_delete("/_stats", reset_stats)
    app.router.add_get("/{tail:.*}", handle_data)  # allow_head: HEAD comes here too
    return app


def bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(512)
    sock.setblocking(False)
    return sock


def stop_on_stdin_eof(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Set stop once stdin reaches end of file, i.e. when the parent process has gone."""

    def on_readable() -> None:
        try:
            data = os.read(sys.stdin.fileno(), 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(sys.stdin.fileno())
            stop.set()

    os.set_blocking(sys.stdin.fileno(), False)
    loop.add_reader(sys.stdin.fileno(), on_readable)


async def serve(
    root: Path, host: str, port: int, delay: float, watch_stdin: bool, validators: bool = False
) -> None:
    state = ServerState(root=root.resolve(), delay=delay, validators=validators)
    # handler_cancellation: a stalled handler ends when its client hangs up.
    runner = web.AppRunner(
        make_app(state), access_log=None, handler_cancellation=True, shutdown_timeout=0.1
    )
    await runner.setup()
    sock = bind(host, port)
    await web.SockSite(runner, sock).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if watch_stdin:
        stop_on_stdin_eof(loop, stop)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="directory to serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument(
        "--watch-stdin", action="store_true", help="exit when stdin closes (parent has gone)"
    )
    parser.add_argument(
        "--validators", action="store_true", help="send ETag and Last-Modified with each file"
    )
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"--root {args.root} is not a directory")
    asyncio.run(
        serve(args.root, args.host, args.port, args.delay, args.watch_stdin, args.validators)
    )


if __name__ == "__main__":
    main()
