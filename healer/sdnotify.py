"""systemd's notify protocol (``Type=notify``, ``WatchdogSec=``): one datagram to ``$NOTIFY_SOCKET``.

``READY=1`` once the service is ready, ``WATCHDOG=1`` from the event loop's heartbeat, ``STOPPING=1``
when a stop begins. Without ``$NOTIFY_SOCKET`` (not under systemd) every call does nothing.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import structlog

log = structlog.get_logger(__name__)


def notify(state: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (``READY=1`` ...); True when a socket took it."""
    path = (os.environ if env is None else env).get("NOTIFY_SOCKET")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path  # "@": Linux abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as e:
        if path not in _warned:  # once per socket: the heartbeat calls this every second
            _warned.add(path)
            log.warning("sdnotify.failed", socket=path, state=state, error=str(e))
        return False
    return True


_warned: set[str] = set()
