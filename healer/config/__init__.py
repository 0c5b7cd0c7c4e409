"""Settings, grouped and documented in one place.

Precedence, lowest first: the defaults, a YAML file (``--config``, or ``HEALER_CONFIG``), then environment
variables named ``HEALER_<GROUP>_<FIELD>`` (``HEALER_NATS_URL``, ``HEALER_AGENT_INTERVAL_S``,
``HEALER_RETRY_MAX_DELAY_S`` ...), then command-line flags. Every field says what it is for; ``healer
config show`` prints the effective values.

One module per role: ``base`` (what every group shares), ``transport`` (NATS, retries), ``agent_settings``,
``controller_settings`` (with failure domains and power budgets), ``actuator_settings``, ``services`` (feed,
status page, anomaly model, logging), ``settings`` (the whole and its merge, ``load``) and ``reference``
(docs/configuration.md). The names the rest of healer uses are re-exported here: ``config.Settings``,
``config.load``, ``config.ControllerSettings`` ...
"""

from __future__ import annotations

from healer.config.actuator_settings import ActuatorName, ActuatorSettings
from healer.config.agent_settings import PORT_RESET_PLACEHOLDERS, AgentSettings
from healer.config.base import Group
from healer.config.controller_settings import (
    ControllerSettings,
    DomainLimit,
    PowerBudget,
    PowerPriority,
    SharedCauseRule,
)
from healer.config.reference import reference_markdown
from healer.config.services import AnomalySettings, FeedSettings, LogSettings, UiSettings
from healer.config.settings import Settings, describe, load
from healer.config.transport import DEFAULT_TELEMETRY_BYTES, NATS_SCHEMES, NatsSettings, RetrySettings

__all__ = [
    "DEFAULT_TELEMETRY_BYTES",
    "NATS_SCHEMES",
    "PORT_RESET_PLACEHOLDERS",
    "ActuatorName",
    "ActuatorSettings",
    "AgentSettings",
    "AnomalySettings",
    "ControllerSettings",
    "DomainLimit",
    "FeedSettings",
    "Group",
    "LogSettings",
    "NatsSettings",
    "PowerBudget",
    "PowerPriority",
    "RetrySettings",
    "Settings",
    "SharedCauseRule",
    "UiSettings",
    "describe",
    "load",
    "reference_markdown",
]
