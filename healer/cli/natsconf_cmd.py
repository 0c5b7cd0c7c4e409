"""``healer nats config``: generate nats-server accounts, NKey users and permissions for a fleet.

The ``nats`` command group lives elsewhere (``healer nats serve``); it calls ``add_config_parser`` with
its subparsers so that this action sits beside ``serve``.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

from healer import errors
from healer.security import natsconf


def add_config_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``config`` action to the ``nats`` group's subparsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "config",
        help="generate nats-server accounts, per-identity NKeys and permissions",
        description=(
            "Write DIR/auth.conf (accounts, public NKeys, permissions; include it from the server config), "
            "DIR/nats-server.conf (a single-server example) and DIR/creds/<role>s/<name>.nk + <name>.yaml "
            "(seed and settings per identity, mode 0600). Existing seeds are kept unless --rotate."
        ),
    )
    p.add_argument(
        "--nodes",
        required=True,
        type=pathlib.Path,
        help="YAML: a list of node names, or {nodes: [...], controllers: [...], feeds: [...], prefix: ...}",
    )
    p.add_argument("--out", required=True, type=pathlib.Path, help="output directory")
    p.add_argument(
        "--seed-dir",
        default=None,
        help="where identities find their seeds at run time (e.g. /etc/healer/nats); default: DIR/creds",
    )
    p.add_argument("--rotate", action="store_true", help="make new seeds for every identity")
    p.add_argument("--tls-cert", help="server certificate (PEM); writes a tls {} block")
    p.add_argument("--tls-key", help="server private key (PEM)")
    p.add_argument("--tls-ca", help="CA bundle for verifying clients")
    p.add_argument("--tls-verify", action="store_true", help="require client certificates signed by --tls-ca")
    p.set_defaults(func=_config, parser=p)
    return p


def _config(args: argparse.Namespace) -> int:
    tls = None
    if args.tls_cert or args.tls_key or args.tls_ca or args.tls_verify:
        if not (args.tls_cert and args.tls_key):
            args.parser.error("--tls-cert and --tls-key go together")
        if args.tls_verify and not args.tls_ca:
            args.parser.error("--tls-verify needs --tls-ca")
        tls = natsconf.Tls(args.tls_cert, args.tls_key, args.tls_ca, verify=args.tls_verify)
    try:
        inventory = natsconf.load_inventory(args.nodes)
        result = natsconf.generate(inventory, args.out, tls=tls, seed_dir=args.seed_dir, rotate=args.rotate)
    except errors.PermanentError as e:
        print(f"healer nats config: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"healer nats config: cannot write {args.out}: {e}", file=sys.stderr)
        return 1
    counts = ", ".join(
        f"{sum(1 for i in result.identities if i.role == role)} {role}s"
        for role in ("node", "controller", "feed")
    )
    print(f"{result.auth_conf}  ({counts})")
    print(f"{result.server_conf}")
    print(f"{args.out / 'creds'}/  (seeds and settings, mode 0600: hand each identity only its own)")
    return 0
