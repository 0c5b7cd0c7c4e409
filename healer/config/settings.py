"""The settings of every process, and their one merge of defaults, file, environment and flags.

Precedence, lowest first: the defaults below, a YAML file (``--config``, or ``HEALER_CONFIG``), then
environment variables named ``HEALER_<GROUP>_<FIELD>`` (``HEALER_NATS_URL``, ``HEALER_AGENT_INTERVAL_S``,
``HEALER_RETRY_MAX_DELAY_S`` ...), then command-line flags. Every field says what it is for; ``healer
config show`` prints the effective values.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

import pydantic
import yaml

from healer import errors
from healer.config import actuator_settings, agent_settings, base, controller_settings, services, transport


class Settings(base.Group):
    nats: transport.NatsSettings = pydantic.Field(default_factory=transport.NatsSettings)
    retry: transport.RetrySettings = pydantic.Field(default_factory=transport.RetrySettings)
    agent: agent_settings.AgentSettings = pydantic.Field(default_factory=agent_settings.AgentSettings)
    feed: services.FeedSettings = pydantic.Field(default_factory=services.FeedSettings)
    controller: controller_settings.ControllerSettings = pydantic.Field(
        default_factory=controller_settings.ControllerSettings
    )
    anomaly: services.AnomalySettings = pydantic.Field(default_factory=services.AnomalySettings)
    log: services.LogSettings = pydantic.Field(default_factory=services.LogSettings)
    actuators: actuator_settings.ActuatorSettings = pydantic.Field(
        default_factory=actuator_settings.ActuatorSettings
    )
    ui: services.UiSettings = pydantic.Field(default_factory=services.UiSettings)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: where, and what."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"line {mark.line + 1} column {mark.column + 1}: {problem}" if mark is not None else problem


def load(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Mapping[str, Any]] | None = None,
) -> Settings:
    """The one merge of every source, lowest first: defaults, the YAML file (``path``, else
    ``HEALER_CONFIG``), ``HEALER_<GROUP>_<FIELD>`` variables, then ``flags`` (group → field → value; a
    ``None`` value is a flag not given and changes nothing)."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    path = path or env.get("HEALER_CONFIG")
    if path:
        try:
            loaded = yaml.safe_load(pathlib.Path(path).read_text()) or {}
        except OSError as e:
            raise errors.PermanentError(f"cannot read config {path}: {e.strerror or e}") from e
        except yaml.YAMLError as e:
            raise errors.PermanentError(f"cannot read config {path}: {_yaml_problem(e)}") from e
        if not isinstance(loaded, dict):
            raise errors.PermanentError(f"config {path}: top level must be a mapping of groups")
        raw = loaded
    for group_name, field in Settings.model_fields.items():
        group_model = field.annotation
        assert isinstance(group_model, type)
        assert issubclass(group_model, base.Group)
        for name in group_model.model_fields:
            var = f"HEALER_{group_name}_{name}".upper()
            if var in env:
                raw.setdefault(group_name, {})[name] = env[var]
    for group_name, values in (flags or {}).items():
        for name, value in values.items():
            if value is not None:
                raw.setdefault(group_name, {})[name] = value
    try:
        return Settings.model_validate(raw)
    except pydantic.ValidationError as e:
        raise errors.PermanentError(f"bad settings: {describe(e)}") from e


def describe(e: pydantic.ValidationError) -> str:
    """A validation error as one line that names each setting (``nats.url: ...; agent.interval_s: ...``)."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" + (f" (got {err['input']!r})" if err["type"] != "value_error" else ""))
    return "; ".join(parts)
