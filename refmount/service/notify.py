"""systemd's readiness protocol: one datagram per message to ``$NOTIFY_SOCKET``."""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def notify(message: str) -> None:
    """Send ``READY=1``, ``STATUS=...``, ``STOPPING=1`` ... when run under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message.encode(), address)
    except OSError as exc:
        log.warning("cannot notify systemd at %s: %s", address, exc)
