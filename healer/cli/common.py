"""What every command shares: one way to resolve settings, one way to connect, one way to stop.

Settings: flags default to ``None`` ("not given"); ``settings(args, ...)`` hands them to ``config.load``,
the one merge (flag > environment > file > default). Every command that talks to NATS takes ``--nats``,
``--prefix`` and ``--config``, so credentials and TLS from the file reach every command.

Connecting: ``connect(s, name)`` uses ``s.nats`` (URL, credentials, TLS). A command tries a few times,
bounded (about 10 s at most), then fails with one line naming the setting to fix; a service
(``service=True``) retries as ``retry`` says, logging every attempt, and a stop request interrupts it.

Stopping: ``run(main)`` runs ``main(stop)`` and turns SIGTERM/SIGINT into ``stop.set()``; if ``main`` has
not returned ``STOP_GRACE_S`` later (or on a second signal) it is cancelled, whatever it waits on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from healer import config, errors, health, sdnotify, tasks
from healer.bus import nats as natsbus

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILED = 1
"""The command found a problem, or could not do its work: NATS unreachable, credentials or TLS refused."""
EXIT_USAGE = 2
"""Bad usage or settings, found before any work: a malformed URL, an impossible flag combination, a busy
port, an unwritable path, an unreadable config file."""
EXIT_INTERRUPTED = 130
"""Ctrl-C in a one-shot command."""

STOP_GRACE_S = 10.0
"""After SIGTERM/SIGINT a service has this long to flush and return before it is cancelled."""

COMMAND_RETRY = config.RetrySettings(attempts=3, initial_delay_s=0.2, max_delay_s=1.0)
"""First-contact retries of one-shot commands (admin, read): bounded, so a wrong URL fails fast."""


class SettingsError(errors.PermanentError):
    """A setting or flag to fix before running again (exit 2)."""


class ConnectError(errors.PermanentError):
    """NATS could not be reached, or refused this identity (exit 1)."""


class Stopped(Exception):
    """A stop was requested while waiting (``until_stopped``)."""


def add_nats_option(parser: argparse.ArgumentParser) -> None:
    """``--nats``, ``--prefix`` and ``--config``: every command that talks to NATS takes all three."""
    parser.add_argument(
        "--nats",
        help="NATS URL(s), comma-separated (default: nats.url, $HEALER_NATS_URL, nats://127.0.0.1:4222)",
    )
    parser.add_argument("--prefix", help="subject prefix (default: nats.prefix, $HEALER_NATS_PREFIX, healer)")
    add_config_option(parser)


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="settings YAML file (default: $HEALER_CONFIG)")


def settings(args: argparse.Namespace, **groups: Mapping[str, Any]) -> config.Settings:
    """The command's settings: ``config.load`` with ``--config``, the environment, ``--nats``/``--prefix``
    (when the command has them) and ``groups`` (group → field → flag value, ``None`` = not given)."""
    flags: dict[str, dict[str, Any]] = {name: dict(values) for name, values in groups.items()}
    nats_flags = flags.setdefault("nats", {})
    nats_flags.setdefault("url", getattr(args, "nats", None))
    nats_flags.setdefault("prefix", getattr(args, "prefix", None))
    try:
        return config.load(getattr(args, "config", None), flags=flags)
    except errors.PermanentError as e:
        raise SettingsError(str(e)) from e


async def connect(s: config.Settings, name: str, *, service: bool = False) -> natsbus.NatsBus:
    """Connect with ``s.nats`` (URL, credentials, TLS). See the module docstring for the retries."""
    try:
        return await natsbus.NatsBus.connect(
            s.nats.url, name=name, nats_settings=s.nats, retry=s.retry if service else COMMAND_RETRY
        )
    except errors.TemporaryError as e:
        raise ConnectError(f"{e}; {_hint(str(e))}") from e
    except errors.PermanentError as e:
        raise ConnectError(str(e)) from e


def _hint(message: str) -> str:
    text = message.lower()
    if "authorization" in text or "authentication" in text or "permissions" in text:
        return "the server refused these credentials: check nats.creds_file / nats.nkey_seed_file"
    if "ssl" in text or "tls" in text or "certificate" in text:
        return "TLS failed: check the URL scheme (tls://) and nats.tls_ca_file / nats.tls_cert_file"
    return "is the server up? check --nats, nats.url or HEALER_NATS_URL"


async def until_stopped(aw: Awaitable[T], stop: asyncio.Event) -> T:
    """``await aw`` unless ``stop`` is set first: then ``aw`` is cancelled and ``Stopped`` raised."""
    work = asyncio.ensure_future(aw)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if work.done():
        return work.result()
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await work
    raise Stopped


def run(
    main: Callable[[asyncio.Event], Coroutine[Any, Any, T]], *, grace_s: float = STOP_GRACE_S
) -> T | None:
    """Run ``main(stop)`` on a new event loop until it returns; SIGTERM/SIGINT set ``stop``. ``None``
    when it was cancelled or raised ``Stopped`` because of a stop request."""

    async def runner() -> T | None:
        stop = asyncio.Event()
        task = asyncio.create_task(main(stop), name="main")
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set():
                task.cancel()  # a second signal: now
                return
            stop.set()
            sdnotify.notify("STOPPING=1")
            loop.call_later(grace_s, task.cancel)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        try:
            return await task
        except (asyncio.CancelledError, Stopped):
            if stop.is_set():
                return None
            raise
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    return asyncio.run(runner())


@contextlib.asynccontextmanager
async def heartbeat(
    scope: str,
    beat: health.Health,
    ready: Callable[[], health.Verdict],
    failures: Any,
    served: Callable[[health.Verdict], None] | None = None,
) -> AsyncIterator[None]:
    """The process's heartbeat (``/livez``, ``/readyz``, systemd's watchdog) while the block runs, as an
    owned task: a heartbeat that fails is logged once (``<scope>.task_failed``), counted
    (``task_failures_total{task="health"}``) and restarted, never silently gone (#25)."""
    jobs = tasks.Scheduler(scope, failures)
    jobs.supervise("health", lambda: beat.keep(ready, served=served))
    try:
        yield
    finally:
        await jobs.close()
