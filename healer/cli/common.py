"""Options and helpers shared by command groups."""

from __future__ import annotations

import argparse
import os

DEFAULT_NATS = "nats://127.0.0.1:4222"


def add_nats_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nats",
        default=os.environ.get("HEALER_NATS_URL", DEFAULT_NATS),
        help="NATS URL (default: $HEALER_NATS_URL or %(default)s)",
    )
    parser.add_argument(
        "--prefix", default=os.environ.get("HEALER_NATS_PREFIX", "healer"), help="subject prefix"
    )


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=os.environ.get("HEALER_CONFIG"), help="settings YAML file")
