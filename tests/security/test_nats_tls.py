"""TLS as `healer nats config --tls-*` writes it: a real nats-server that requires TLS, and NatsBus
connecting through it with ``tls_ca_file``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import urllib.request
from collections.abc import Iterator

import pytest

from healer import config, errors
from healer.bus import embedded, subjects
from healer.bus import nats as natsbus
from healer.security import natsconf
from tests.security import certs

pytestmark = pytest.mark.nats


@contextlib.contextmanager
def tls_server(
    tmp_path: pathlib.Path,
) -> Iterator[tuple[embedded.EmbeddedServer, config.NatsSettings, certs.TlsFiles]]:
    """A nats-server that requires TLS (certificates from a private CA), and node gpu-1's identity."""
    tls = certs.make(tmp_path / "tls")
    result = natsconf.generate(
        natsconf.Inventory(nodes=["gpu-1"]),
        tmp_path / "auth",
        tls=natsconf.Tls(str(tls.cert), str(tls.key), str(tls.ca)),
    )
    srv = embedded.EmbeddedServer(tmp_path / "nats", extra_config=result.auth_conf.read_text())
    srv.start()
    try:
        yield srv, config.load(result.settings_files[("node", "gpu-1")], env={}).nats, tls
    finally:
        srv.stop()


async def test_node_connects_over_tls_with_the_private_ca(tmp_path: pathlib.Path) -> None:
    with tls_server(tmp_path) as (srv, identity, tls):
        secured = identity.model_copy(update={"url": srv.url, "tls_ca_file": str(tls.ca)})
        bus = await natsbus.NatsBus.connect(
            srv.url, nats_settings=secured, retry=config.RetrySettings(attempts=1)
        )
        try:
            await bus.publish(subjects.Subjects().telemetry("gpu-1"), b"frame")
            await bus.flush()
            assert bus.connected
            varz = await asyncio.to_thread(_varz, srv.monitor_port)
            assert varz["tls_required"] is True
        finally:
            await bus.close()


def test_a_missing_ca_file_is_a_permanent_error(tmp_path: pathlib.Path) -> None:
    ns = config.NatsSettings(tls_ca_file=str(tmp_path / "absent.pem"))
    with pytest.raises(errors.PermanentError):
        natsbus._tls_context(ns)


def _varz(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=5) as resp:
        return dict(json.load(resp))


async def test_a_server_certificate_from_another_ca_is_a_permanent_error_at_once(
    tmp_path: pathlib.Path,
) -> None:
    """A wrong CA is a setting to fix: connecting fails at the first attempt with a PermanentError naming
    the setting (nats-py alone would keep the first connect hanging)."""
    other = certs.make(tmp_path / "other")
    with tls_server(tmp_path) as (srv, identity, _):
        wrong = identity.model_copy(update={"url": srv.url, "tls_ca_file": str(other.ca)})
        async with asyncio.timeout(20):
            with pytest.raises(errors.PermanentError, match="tls_ca_file"):
                await natsbus.NatsBus.connect(
                    srv.url, nats_settings=wrong, retry=config.RetrySettings(attempts=3)
                )
