"""nats-server authorization for healer: one account, one NKey user per identity, least privilege.

DESIGN §8 asks that a node may publish only its own telemetry and events and receive only its own
commands, that only the controller may publish commands and incidents, and that feed consumers may
only read incidents. nats-server enforces that itself when every identity is a user with explicit
``allow`` lists (anything not allowed is denied), so a stolen node credential cannot impersonate another
node, command one, or forge an incident. This module turns an inventory (the nodes file) into:

- ``auth.conf``: the ``accounts`` block (public NKeys and permissions only, nothing secret), plus a
  ``tls`` block when certificates are given; include it from the server configuration;
- one NKey seed per identity (``creds/<role>s/<name>.nk``, mode 0600) and a healer settings fragment
  beside it (``<name>.yaml``: seed file, inbox prefix) that the identity's ``--config`` can load.

Replies: nats-py receives request replies (including JetStream publish acks) on an inbox. Each identity
gets its own inbox prefix (``Subjects.inbox``) and may subscribe only below it, so no identity can read
another's replies. Commands are answered through ``allow_responses`` (a node may publish once to the
reply subject of a command it received, and nowhere else).

Existing seeds are kept when the command runs again (adding a node does not rotate everyone's keys);
``rotate=True`` makes new ones.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from typing import Any, Literal

import nkeys
import pydantic
import yaml

from healer import errors
from healer.bus import subjects

Role = Literal["node", "controller", "feed"]

_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")
"""Kubernetes node names, host names and FQDNs; also safe as a file name."""

_ACCOUNT = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


class Inventory(pydantic.BaseModel):
    """The nodes file: the identities to create. A plain YAML list is read as ``nodes``."""

    model_config = pydantic.ConfigDict(extra="forbid", use_attribute_docstrings=True)

    nodes: list[str] = pydantic.Field(min_length=1)
    """Node names as the agent's ``--node`` gives them (the scheduler's name for the host)."""
    controllers: list[str] = pydantic.Field(default_factory=lambda: ["controller"])
    """Controller identities (replicas may share one; separate ones make revocation finer)."""
    feeds: list[str] = pydantic.Field(default_factory=list)
    """Read-only incident feed consumers (webhook forwarder, ``healer incidents tail``, SIEM)."""
    prefix: str = subjects.DEFAULT_PREFIX
    """Subject prefix of this fleet (``NatsSettings.prefix``)."""
    account: str = "HEALER"
    """NATS account every healer identity lives in (JetStream enabled)."""

    @pydantic.field_validator("nodes", "controllers", "feeds")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        bad = [n for n in names if not isinstance(n, str) or not _NAME.match(n)]
        if bad:
            raise ValueError(f"bad identity names (letters, digits, '.', '_', '-'): {bad}")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate names: {dupes}")
        return names

    @pydantic.field_validator("account")
    @classmethod
    def _account(cls, account: str) -> str:
        if not _ACCOUNT.match(account):
            raise ValueError(f"bad account name {account!r}")
        return account


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    try:
        raw = yaml.safe_load(pathlib.Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise errors.PermanentError(f"cannot read nodes file {path}: {e}") from e
    if isinstance(raw, list):
        raw = {"nodes": raw}
    if not isinstance(raw, dict):
        raise errors.PermanentError(f"nodes file {path}: expected a list of node names or a mapping")
    try:
        inv = Inventory.model_validate(raw)
        subjects.Subjects(inv.prefix)
    except (pydantic.ValidationError, ValueError) as e:
        raise errors.PermanentError(f"nodes file {path}: {e}") from e
    return inv


@dataclasses.dataclass(frozen=True)
class Permissions:
    """What one identity may do; everything else is denied by the server."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False

    def to_conf(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "publish": {"allow": list(self.publish)},
            "subscribe": {"allow": list(self.subscribe)},
        }
        if self.allow_responses:
            out["allow_responses"] = True
        return out


# JetStream's own API subjects (``$JS.API``, ``$JS.ACK``, ``$KV``) are NATS's namespace, not healer's;
# these helpers are the only place they are spelled, always from the stream/bucket names in Subjects.
def _js_api(*tokens: str) -> str:
    return ".".join(("$JS.API", *tokens))


def node_permissions(subj: subjects.Subjects, node: str) -> Permissions:
    """Publish its own frames (core) and events (JetStream publish: a request whose ack comes back on
    the node's inbox), receive its own commands, answer them, and read the leases bucket's messages (to
    check a higher fencing token against the real lease before persisting it)."""
    return Permissions(
        publish=(subj.telemetry(node), subj.events(node), subj.lease_read_api),
        subscribe=(subj.command(node), subj.inbox("node", node) + ".>"),
        allow_responses=True,
    )


def controller_permissions(subj: subjects.Subjects, name: str) -> Permissions:
    """Read everything healer publishes; publish commands and incidents; own the JetStream assets
    (provisioning, consumers, KV state and leases); answer power-budget requests (``healer.power.*``)."""
    return Permissions(
        publish=(
            subj.all_commands,
            subj.all_incidents,
            subj.all_power,  # `healer power shed|status` run with the controller's credential
            _js_api(">"),
            "$JS.ACK.>",
            "$JS.FC.>",
            f"$KV.{subj.kv_state}.>",
            f"$KV.{subj.kv_leases}.>",
        ),
        subscribe=(
            subj.all_telemetry,
            subj.all_steps,
            subj.all_events,
            subj.all_commands,
            subj.all_incidents,
            subj.all_power,
            subj.inbox("controller", name) + ".>",
        ),
        allow_responses=True,  # the leader answers healer.power.shed / .status requests
    )


def feed_permissions(subj: subjects.Subjects, name: str) -> Permissions:
    """Read the incident feed through a JetStream consumer on the incidents stream, and nothing else:
    no core subscription on any healer subject, no API call on another stream."""
    stream = subj.stream_incidents
    return Permissions(
        publish=(
            _js_api("INFO"),
            _js_api("STREAM", "NAMES"),  # clients look the stream up by subject; reveals names only
            _js_api("STREAM", "INFO", stream),
            _js_api("CONSUMER", "CREATE", stream),
            _js_api("CONSUMER", "CREATE", stream, ">"),
            _js_api("CONSUMER", "DURABLE", "CREATE", stream, "*"),
            _js_api("CONSUMER", "INFO", stream, "*"),
            _js_api("CONSUMER", "DELETE", stream, "*"),
            _js_api("CONSUMER", "MSG", "NEXT", stream, "*"),
            f"$JS.ACK.{stream}.>",
            f"$JS.FC.{stream}.>",
        ),
        subscribe=(subj.inbox("feed", name) + ".>",),
    )


_PERMISSIONS = {"node": node_permissions, "controller": controller_permissions, "feed": feed_permissions}


@dataclasses.dataclass(frozen=True)
class Identity:
    role: Role
    name: str
    public_key: str
    inbox_prefix: str
    permissions: Permissions


@dataclasses.dataclass(frozen=True)
class Tls:
    """Server-side TLS. With ``verify`` clients must also present a certificate signed by ``ca_file``."""

    cert_file: str
    key_file: str
    ca_file: str | None = None
    verify: bool = False
    timeout_s: float = 2.0


def new_seed() -> bytes:
    """A fresh user NKey seed (``SU...``)."""
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))


def public_key(seed: bytes) -> str:
    try:
        kp = nkeys.from_seed(bytearray(seed.strip()))
    except nkeys.NkeysError as e:
        raise errors.PermanentError(f"not a valid NKey seed: {e}") from e
    return bytes(kp.public_key).decode()


def _q(value: str) -> str:
    return json.dumps(value)


def _conf_list(values: list[str]) -> str:
    return "[" + ", ".join(_q(v) for v in values) + "]"


def render_auth(account: str, identities: list[Identity], tls: Tls | None = None) -> str:
    """The ``accounts`` block (and ``tls`` block) of the server configuration."""
    lines = [
        "# Generated by `healer nats config`: healer identities and their permissions.",
        "# Public keys only; the seeds stay with each identity. Regenerate rather than edit.",
        "accounts {",
        f"  {_q(account)}: {{",
        "    jetstream: enabled",
        "    users: [",
    ]
    for ident in identities:
        p = ident.permissions.to_conf()
        lines.append(f"      # {ident.role} {ident.name} (inbox {ident.inbox_prefix})")
        lines.append(f"      {{ nkey: {_q(ident.public_key)}, permissions: {{")
        lines.append(f"          publish: {{ allow: {_conf_list(p['publish']['allow'])} }}")
        lines.append(f"          subscribe: {{ allow: {_conf_list(p['subscribe']['allow'])} }}")
        if ident.permissions.allow_responses:
            lines.append("          allow_responses: true")
        lines.append("      } }")
    lines += ["    ]", "  }", "}"]
    if tls is not None:
        lines.append(render_tls(tls))
    return "\n".join(lines) + "\n"


def render_tls(tls: Tls) -> str:
    lines = ["tls {", f"  cert_file: {_q(tls.cert_file)}", f"  key_file: {_q(tls.key_file)}"]
    if tls.ca_file:
        lines.append(f"  ca_file: {_q(tls.ca_file)}")
    lines.append(f"  verify: {'true' if tls.verify else 'false'}")
    lines.append(f"  timeout: {tls.timeout_s:g}")
    lines.append("}")
    return "\n".join(lines)


def render_server_example(auth_name: str = "auth.conf") -> str:
    """A minimal single-server configuration that includes the generated authorization."""
    return (
        "# Single nats-server for healer; see deploy/nats/ for the 3-node JetStream cluster.\n"
        'listen: "0.0.0.0:4222"\n'
        'http: "127.0.0.1:8222"\n'
        'jetstream { store_dir: "/var/lib/nats/jetstream" }\n'
        f'include "{auth_name}"\n'
    )


@dataclasses.dataclass(frozen=True)
class Result:
    auth_conf: pathlib.Path
    server_conf: pathlib.Path
    identities: list[Identity]
    seed_files: dict[tuple[str, str], pathlib.Path]
    settings_files: dict[tuple[str, str], pathlib.Path]


def _write_private(path: pathlib.Path, data: bytes) -> None:
    """Write with mode 0600 from the first byte (and fix the mode of a file that already exists)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def generate(
    inventory: Inventory,
    out_dir: str | os.PathLike[str],
    *,
    tls: Tls | None = None,
    seed_dir: str | None = None,
    rotate: bool = False,
) -> Result:
    """Write auth.conf, an example server config, and per-identity seeds and settings into ``out_dir``.

    ``seed_dir`` is where identities will find their seed at run time (written into their settings
    fragment); by default the seed's path in ``out_dir``.
    """
    subj = subjects.Subjects(inventory.prefix)
    out = pathlib.Path(out_dir)
    creds = out / "creds"
    creds.mkdir(parents=True, exist_ok=True)
    creds.chmod(0o700)
    roles: list[tuple[Role, list[str]]] = [
        ("controller", inventory.controllers),
        ("feed", inventory.feeds),
        ("node", inventory.nodes),
    ]
    identities: list[Identity] = []
    seed_files: dict[tuple[str, str], pathlib.Path] = {}
    settings_files: dict[tuple[str, str], pathlib.Path] = {}
    for role, names in roles:
        role_dir = creds / f"{role}s"
        role_dir.mkdir(exist_ok=True)
        role_dir.chmod(0o700)
        for name in names:
            seed_path = role_dir / f"{name}.nk"
            seed = seed_path.read_bytes().strip() if seed_path.exists() and not rotate else new_seed()
            pub = public_key(seed)
            _write_private(seed_path, seed + b"\n")
            inbox = subj.inbox(role, name)
            runtime_seed = str(pathlib.Path(seed_dir) / f"{role}s" / seed_path.name) if seed_dir else None
            fragment = {
                "nats": {
                    "prefix": inventory.prefix,
                    "nkey_seed_file": runtime_seed or str(seed_path.resolve()),
                    "inbox_prefix": inbox,
                }
            }
            if role == "node":
                fragment["agent"] = {"node": name}
            settings_path = role_dir / f"{name}.yaml"
            _write_private(settings_path, yaml.safe_dump(fragment, sort_keys=False).encode())
            identities.append(Identity(role, name, pub, inbox, _PERMISSIONS[role](subj, name)))
            seed_files[(role, name)] = seed_path
            settings_files[(role, name)] = settings_path
    auth = out / "auth.conf"
    auth.write_text(render_auth(inventory.account, identities, tls))
    server = out / "nats-server.conf"
    server.write_text(render_server_example(auth.name))
    return Result(auth, server, identities, seed_files, settings_files)
