"""deploy/kubernetes/rules-configmap.yaml is the rule pack, whole and current: generated from
rules/*.yaml, so a rule added or changed there fails here until `make schemas` is run."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from healer.rules import configmap, loader

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "kubernetes" / "rules-configmap.yaml"
CONFIGMAP_MAX_BYTES = 1024 * 1024
"""What Kubernetes stores in one ConfigMap at most."""


def test_the_rules_configmap_matches_the_rule_files() -> None:
    expected = configmap.render(ROOT / "rules")
    assert MANIFEST.read_text() == expected, "rules-configmap.yaml drifted: run `make schemas`"


def test_the_configmap_holds_every_file_the_controller_loads_byte_for_byte() -> None:
    data = yaml.safe_load(MANIFEST.read_text())["data"]
    files = loader.expand([ROOT / "rules"])
    assert sorted(data) == sorted(p.name for p in files)
    assert all(data[p.name] == p.read_text() for p in files)
    assert len(MANIFEST.read_bytes()) < CONFIGMAP_MAX_BYTES


def test_a_pack_that_does_not_load_is_not_rendered(tmp_path: pathlib.Path) -> None:
    (tmp_path / "bad.yaml").write_text("rules:\n  - id: x\n    scope: gpu\n    when: temp_c >\n")
    with pytest.raises(ValueError, match=r"bad\.yaml"):
        configmap.render(tmp_path)


def test_a_file_a_literal_block_would_change_is_refused(tmp_path: pathlib.Path) -> None:
    rule = "rules:\n  - id: x\n    scope: gpu\n    when: temp_c > 90\n    severity: info\n"
    (tmp_path / "a.yaml").write_text(rule + "\n\n")  # trailing blank lines a `|` block would drop
    with pytest.raises(ValueError, match=r"a\.yaml"):
        configmap.render(tmp_path)
    (tmp_path / "a.yaml").write_text(rule)
    assert yaml.safe_load(configmap.render(tmp_path))["data"] == {"a.yaml": rule}
