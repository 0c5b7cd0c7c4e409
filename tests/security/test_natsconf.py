"""`healer nats config` without a server: inventory parsing, files and their modes, seeds kept or
rotated, the permissions each role gets, the TLS block, and the CLI action."""

from __future__ import annotations

import argparse
import pathlib
import stat

import pytest

from healer import cli, config, errors
from healer.bus import subjects
from healer.cli import natsconf_cmd
from healer.security import natsconf

SUBJ = subjects.Subjects()


def _mode(path: pathlib.Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_plain_list_is_read_as_nodes_with_one_default_controller(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "nodes.yaml"
    f.write_text("- gpu-1\n- gpu-2.example.com\n")
    inv = natsconf.load_inventory(f)
    assert inv.nodes == ["gpu-1", "gpu-2.example.com"]
    assert inv.controllers == ["controller"]
    assert inv.feeds == []


def test_a_mapping_names_controllers_feeds_and_prefix(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "nodes.yaml"
    f.write_text("nodes: [a]\ncontrollers: [ctl-0, ctl-1]\nfeeds: [siem]\nprefix: fleet2\n")
    inv = natsconf.load_inventory(f)
    assert (inv.controllers, inv.feeds, inv.prefix) == (["ctl-0", "ctl-1"], ["siem"], "fleet2")


@pytest.mark.parametrize(
    "text",
    [
        "nodes: []\n",
        "- ok\n- has space\n",
        "- ok\n- '../etc/passwd'\n",
        "- a\n- a\n",
        "nodes: [a]\nprefix: 'bad prefix'\n",
        "nodes: [a]\nsurprise: 1\n",
        "just a string\n",
        "nodes: [a\n",
    ],
)
def test_a_bad_nodes_file_is_a_permanent_error(tmp_path: pathlib.Path, text: str) -> None:
    f = tmp_path / "nodes.yaml"
    f.write_text(text)
    with pytest.raises(errors.PermanentError):
        natsconf.load_inventory(f)


def test_node_permissions_name_only_its_own_subjects() -> None:
    p = natsconf.node_permissions(SUBJ, "gpu-7.dc1")
    assert p.publish == (
        SUBJ.telemetry("gpu-7.dc1"),
        SUBJ.events("gpu-7.dc1"),
        "$JS.API.STREAM.MSG.GET.KV_healer-leases",  # reads a lease, to check a new fencing token
    )
    assert p.subscribe == (SUBJ.command("gpu-7.dc1"), SUBJ.inbox("node", "gpu-7.dc1") + ".>")
    assert p.allow_responses is True
    assert not any("*" in s or ">" in s for s in p.publish)


def test_feed_permissions_touch_only_the_incidents_stream() -> None:
    p = natsconf.feed_permissions(SUBJ, "siem")
    api = [
        s for s in p.publish if s.startswith("$JS.API.") and s not in {"$JS.API.INFO", "$JS.API.STREAM.NAMES"}
    ]
    assert api
    assert all(SUBJ.stream_incidents in s for s in api)
    assert p.subscribe == (SUBJ.inbox("feed", "siem") + ".>",)


def test_generate_writes_private_seeds_and_loadable_settings(tmp_path: pathlib.Path) -> None:
    inv = natsconf.Inventory(nodes=["gpu-1", "gpu-2.example.com"], feeds=["siem"])
    result = natsconf.generate(inv, tmp_path / "out")
    assert _mode(tmp_path / "out" / "creds") == 0o700
    assert len(result.identities) == 4
    for key, seed_path in result.seed_files.items():
        assert _mode(seed_path) == 0o600
        assert _mode(result.settings_files[key]) == 0o600
        assert seed_path.read_bytes().startswith(b"SU")
    settings = config.load(result.settings_files[("node", "gpu-2.example.com")], env={})
    assert settings.agent.node == "gpu-2.example.com"
    assert settings.nats.inbox_prefix == SUBJ.inbox("node", "gpu-2.example.com")
    assert settings.nats.nkey_seed_file == str(result.seed_files[("node", "gpu-2.example.com")].resolve())
    auth = result.auth_conf.read_text()
    for ident in result.identities:
        assert ident.public_key in auth
    for seed_path in result.seed_files.values():
        assert seed_path.read_text().strip() not in auth  # no seed ever lands in the server config
    assert 'include "auth.conf"' in result.server_conf.read_text()


def test_seeds_survive_a_rerun_and_change_on_rotate(tmp_path: pathlib.Path) -> None:
    first = natsconf.generate(natsconf.Inventory(nodes=["a"]), tmp_path)
    second = natsconf.generate(natsconf.Inventory(nodes=["a", "b"]), tmp_path)
    keys1 = {(i.role, i.name): i.public_key for i in first.identities}
    keys2 = {(i.role, i.name): i.public_key for i in second.identities}
    assert keys2[("node", "a")] == keys1[("node", "a")]
    assert keys2[("controller", "controller")] == keys1[("controller", "controller")]
    rotated = natsconf.generate(natsconf.Inventory(nodes=["a", "b"]), tmp_path, rotate=True)
    keys3 = {(i.role, i.name): i.public_key for i in rotated.identities}
    assert keys3[("node", "a")] != keys2[("node", "a")]


def test_seed_dir_is_where_identities_look_at_run_time(tmp_path: pathlib.Path) -> None:
    result = natsconf.generate(natsconf.Inventory(nodes=["a"]), tmp_path, seed_dir="/etc/healer/nats")
    settings = config.load(result.settings_files[("node", "a")], env={})
    assert settings.nats.nkey_seed_file == "/etc/healer/nats/nodes/a.nk"


def test_a_corrupt_existing_seed_is_reported(tmp_path: pathlib.Path) -> None:
    natsconf.generate(natsconf.Inventory(nodes=["a"]), tmp_path)
    (tmp_path / "creds" / "nodes" / "a.nk").write_text("not a seed\n")
    with pytest.raises(errors.PermanentError):
        natsconf.generate(natsconf.Inventory(nodes=["a"]), tmp_path)


def test_tls_block_names_files_and_verification() -> None:
    block = natsconf.render_tls(natsconf.Tls("/c/server.pem", "/c/server.key", "/c/ca.pem", verify=True))
    assert 'cert_file: "/c/server.pem"' in block
    assert 'key_file: "/c/server.key"' in block
    assert 'ca_file: "/c/ca.pem"' in block
    assert "verify: true" in block


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="healer")
    nats_sub = parser.add_subparsers(dest="command").add_parser("nats").add_subparsers(dest="nats_command")
    natsconf_cmd.add_config_parser(nats_sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_cli_writes_the_config_with_a_tls_block(tmp_path: pathlib.Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("- gpu-1\n")
    argv = ["nats", "config", "--nodes", str(nodes), "--out", str(tmp_path / "out")]
    rc = _cli([*argv, "--tls-cert", "s.pem", "--tls-key", "s.key", "--tls-ca", "ca.pem", "--tls-verify"])
    assert rc == 0
    auth = (tmp_path / "out" / "auth.conf").read_text()
    assert "tls {" in auth
    assert "verify: true" in auth


def test_cli_reports_a_bad_nodes_file_with_exit_1(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("- 'no spaces allowed'\n")
    assert _cli(["nats", "config", "--nodes", str(nodes), "--out", str(tmp_path / "out")]) == 1
    assert "bad identity names" in capsys.readouterr().err


def test_cli_refuses_half_a_tls_setup(tmp_path: pathlib.Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("- gpu-1\n")
    with pytest.raises(SystemExit) as exc:
        _cli(["nats", "config", "--nodes", str(nodes), "--out", str(tmp_path), "--tls-cert", "s.pem"])
    assert exc.value.code == 2


def test_healer_nats_config_is_a_real_command(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("nodes: [gpu-1, gpu-2]\nfeeds: [siem]\n")
    assert cli.main(["nats", "config", "--nodes", str(nodes), "--out", str(tmp_path / "out")]) == 0
    assert "2 nodes, 1 controllers, 1 feeds" in capsys.readouterr().out
    assert (tmp_path / "out" / "creds" / "feeds" / "siem.nk").exists()
