"""Model files: skops round trip, the card's contents, and clear refusals for models that do not fit."""

from __future__ import annotations

import pathlib
import shutil

import pytest
import structlog.testing

from healer import errors
from healer.anomaly import model as anomaly_model
from healer.anomaly import persist, scoring


def _copy(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    shutil.copytree(src, dst)
    return dst


def test_card_names_features_versions_data_and_threshold(trained: pathlib.Path) -> None:
    card = persist.read_card(trained)
    assert card["features"] == list(anomaly_model.FEATURES)
    assert set(card["feature_units"]) == set(anomaly_model.FEATURES)
    assert card["versions"] == persist.versions()
    assert card["training_data"]["nodes"] == 8
    assert card["training_data"]["time_span"][0]["hours"] > 0.5
    assert card["score_threshold"] == 0.9
    assert (trained / persist.MODEL_FILE).stat().st_size < 5_000_000


def test_changed_feature_schema_is_refused_with_a_permanent_error(
    trained: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    path = _copy(trained, tmp_path / "m")
    card = persist.read_card(path)
    card["features"] = card["features"][:-1]
    persist.write_card(path, card)
    with pytest.raises(persist.ModelMismatchError, match="feature schema") as exc:
        persist.load(path)
    assert isinstance(exc.value, errors.PermanentError)


def test_other_sklearn_version_is_refused(trained: pathlib.Path, tmp_path: pathlib.Path) -> None:
    path = _copy(trained, tmp_path / "m")
    card = persist.read_card(path)
    card["versions"]["sklearn"] = "0.0.1"
    persist.write_card(path, card)
    with pytest.raises(persist.ModelMismatchError, match=r"sklearn 0\.0\.1"):
        persist.load(path)


def _patch_release(version: str) -> str:
    major, minor, *rest = version.split(".")
    patch = int(rest[0]) if rest and rest[0].isdigit() else 0
    return f"{major}.{minor}.{patch + 1}"


def test_a_patch_release_of_the_training_library_loads_with_a_warning(
    trained: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """A scikit-learn patch release (1.9.1 → 1.9.2) keeps the estimators' layout: the model loads and
    scores, and the difference is logged instead of silently switching the anomaly model off."""
    path = _copy(trained, tmp_path / "m")
    card = persist.read_card(path)
    running = card["versions"]["sklearn"]
    card["versions"]["sklearn"] = _patch_release(running)
    persist.write_card(path, card)
    with structlog.testing.capture_logs() as logs:
        m, _ = persist.load(path)
    assert m.forest is not None
    (warning,) = [e for e in logs if e["event"] == "model.library_patch_differs"]
    assert (warning["library"], warning["trained"], warning["running"]) == (
        "sklearn",
        _patch_release(running),
        running,
    )


def test_another_minor_release_of_skops_is_refused(trained: pathlib.Path, tmp_path: pathlib.Path) -> None:
    path = _copy(trained, tmp_path / "m")
    card = persist.read_card(path)
    major, minor = card["versions"]["skops"].split(".")[:2]
    card["versions"]["skops"] = f"{major}.{int(minor) + 1}.0"
    persist.write_card(path, card)
    with pytest.raises(persist.ModelMismatchError, match="another release line"):
        persist.load(path)


def test_damaged_model_file_is_refused(trained: pathlib.Path, tmp_path: pathlib.Path) -> None:
    path = _copy(trained, tmp_path / "m")
    (path / persist.MODEL_FILE).write_bytes(b"not a zip")
    with pytest.raises(persist.ModelMismatchError, match="cannot load"):
        persist.load(path)


def test_unusable_model_gives_a_null_scorer_and_an_event(tmp_path: pathlib.Path) -> None:
    with structlog.testing.capture_logs() as logs:
        scorer = scoring.load_or_null(tmp_path / "missing")
    assert isinstance(scorer, scoring.NullScorer)
    assert scorer.score(1.0) == {}
    assert [e["event"] for e in logs] == ["anomaly_model_unavailable"]
    assert logs[0]["anomaly_score"] == 0
