"""The shipped NATS configurations are accepted by nats-server itself (``nats-server -t``), with the
authorization `healer nats config` generates and a throwaway PKI in place of the real files."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest
import yaml

from healer.bus import embedded
from healer.security import natsconf
from tests.deploy import manifests as m
from tests.security import certs

pytestmark = pytest.mark.nats


def _check(conf_text: str, etc: pathlib.Path, tmp: pathlib.Path, replacements: dict[str, str]) -> None:
    for old, new in replacements.items():
        conf_text = conf_text.replace(old, new)
    conf = etc / "nats.conf"
    conf.write_text(conf_text)
    proc = subprocess.run(
        [embedded.find_binary(), "-t", "-c", str(conf)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "NATS_SERVER_NAME": "nats-1", "SERVER_NAME": "healer-nats-0"},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _auth(directory: pathlib.Path) -> str:
    result = natsconf.generate(natsconf.Inventory(nodes=["gpu-1", "gpu-2"], feeds=["siem"]), directory)
    return result.auth_conf.read_text()


def test_bare_metal_cluster_config_is_valid(tmp_path: pathlib.Path) -> None:
    etc = tmp_path / "etc"
    tls = certs.make(etc / "tls")
    (etc / "auth.conf").write_text(_auth(tmp_path / "gen"))
    _check(
        (m.DEPLOY / "nats" / "nats-server.conf").read_text(),
        etc,
        tmp_path,
        {
            "/etc/nats/tls/server.pem": str(tls.cert),
            "/etc/nats/tls/server-key.pem": str(tls.key),
            "/etc/nats/tls/ca.pem": str(tls.ca),
            "/var/lib/nats/": str(tmp_path / "data") + "/",
        },
    )


def test_kubernetes_cluster_config_is_valid(tmp_path: pathlib.Path) -> None:
    cm = next(
        d
        for p in m.manifest_files()
        for d in yaml.safe_load_all(p.read_text())
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "healer-nats-config"
    )
    etc = tmp_path / "etc"
    tls = certs.make(etc / "tls")
    (etc / "auth").mkdir()
    (etc / "auth" / "auth.conf").write_text(_auth(tmp_path / "gen"))
    _check(
        cm["data"]["nats.conf"],
        etc,
        tmp_path,
        {
            "/etc/nats/tls/tls.crt": str(tls.cert),
            "/etc/nats/tls/tls.key": str(tls.key),
            "/etc/nats/tls/ca.crt": str(tls.ca),
            '"/data/': '"' + str(tmp_path / "data") + "/",
        },
    )
