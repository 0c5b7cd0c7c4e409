"""Settings: defaults < file < HEALER_<GROUP>_<FIELD> environment; bad settings are a clear error."""

from __future__ import annotations

import pathlib

import pytest

from healer import config, errors


def test_environment_overrides_file_overrides_defaults(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "healer.yaml"
    f.write_text("nats:\n  url: nats://file:4222\n  replicas: 3\nagent:\n  interval_s: 2\n")
    s = config.load(f, env={"HEALER_AGENT_INTERVAL_S": "0.5"})
    assert s.nats.url == "nats://file:4222"
    assert s.nats.replicas == 3
    assert s.agent.interval_s == 0.5
    assert s.retry.max_delay_s == config.RetrySettings().max_delay_s


def test_bad_values_and_unknown_fields_are_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(errors.PermanentError, match="interval_s"):
        config.load(env={"HEALER_AGENT_INTERVAL_S": "-1"})
    f = tmp_path / "typo.yaml"
    f.write_text("agent:\n  intervall_s: 2\n")
    with pytest.raises(errors.PermanentError, match="intervall_s"):
        config.load(f, env={})


def test_every_setting_is_documented() -> None:
    for group_field in config.Settings.model_fields.values():
        group = group_field.annotation
        assert isinstance(group, type)
        assert issubclass(group, config.Group)
        for name, field in group.model_fields.items():
            assert field.description, f"{group.__name__}.{name} has no docstring"


def test_configuration_reference_is_current() -> None:
    doc = pathlib.Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
    assert doc.read_text() == config.reference_markdown(), "run: healer config docs > docs/configuration.md"
