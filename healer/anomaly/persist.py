"""Saving and loading models: skops for the estimators (no bare pickle), a JSON model card beside them.

A model is a directory: ``model.skops`` (the fitted estimators; loading accepts only the scikit-learn
types listed in ``TRUSTED``) and ``card.json`` (format, features and their order, library versions,
training data summary and time span, calibration and threshold, evaluation results). ``load`` refuses a
model whose format or feature list differs from this build, or that was trained with another minor
release of scikit-learn or skops, with a ``ModelMismatchError``: estimators read by another release
line are not trustworthy. Patch releases of the same line (1.9.1 → 1.9.2) keep the estimators' layout,
so such a model loads with a ``model.library_patch_differs`` warning; pyproject.toml pins the
``controller`` extra to the line the shipped model was trained with.
"""

from __future__ import annotations

import dataclasses
import pathlib
import zipfile
from typing import Any, Final

import orjson
import sklearn
import skops
import skops.io
import structlog

from healer import errors
from healer.anomaly import model as anomaly_model

log = structlog.get_logger(__name__)

FORMAT: Final = "healer-anomaly-model/3"
"""/3: thermal checks against baselines learned on the deployment (``thermal``), a forest without
temperatures, no regressions; /1 and /2 models are refused."""
MODEL_FILE: Final = "model.skops"
CARD_FILE: Final = "card.json"
TRUSTED: Final = frozenset(
    {
        "sklearn.ensemble._iforest.IsolationForest",
        "sklearn.tree._classes.ExtraTreeRegressor",
        "sklearn.tree._tree.Tree",
        "numpy.dtype",
        "numpy.random.mtrand.RandomState",
        "builtins.slice",
    }
)


class ModelMismatchError(errors.PermanentError):
    """The model on disk does not fit this build (format, features, library versions) or is unsafe."""


def versions() -> dict[str, str]:
    return {"sklearn": sklearn.__version__, "skops": skops.__version__}


def release_line(version: str) -> tuple[str, ...]:
    """``"1.9.2"`` → ``("1", "9")``: the part of a version a model's compatibility depends on."""
    return tuple(version.split(".")[:2])


def save(path: str | pathlib.Path, m: anomaly_model.Model, card: dict[str, Any]) -> pathlib.Path:
    """Write ``path/model.skops`` and ``path/card.json``; returns the directory."""
    out = pathlib.Path(path)
    out.mkdir(parents=True, exist_ok=True)
    blob = {"forest": m.forest}
    skops.io.dump(blob, out / MODEL_FILE, compression=zipfile.ZIP_DEFLATED, compresslevel=9)
    full = {
        "format": FORMAT,
        "features": list(anomaly_model.FEATURES),
        "versions": versions(),
        "classes": m.classes,
        "prior_resistance": m.prior_r,
        "calibration": m.calib,
        "settings": dataclasses.asdict(m.settings),
        "score_threshold": anomaly_model.SCORE_THRESHOLD,
        **card,
    }
    write_card(out, full)
    return out


def write_card(path: str | pathlib.Path, card: dict[str, Any]) -> None:
    data = orjson.dumps(card, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n"
    (pathlib.Path(path) / CARD_FILE).write_bytes(data)


def read_card(path: str | pathlib.Path) -> dict[str, Any]:
    p = pathlib.Path(path) / CARD_FILE
    try:
        card: dict[str, Any] = orjson.loads(p.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise ModelMismatchError(f"{p}: cannot read the model card: {e}") from e
    return card


def check_card(card: dict[str, Any], where: str) -> None:
    """Raise ModelMismatchError naming every difference between the card and this build."""
    problems = []
    if card.get("format") != FORMAT:
        problems.append(f"format {card.get('format')!r}, expected {FORMAT!r}")
    if card.get("features") != list(anomaly_model.FEATURES):
        problems.append(
            f"feature schema {card.get('features')!r} differs from {list(anomaly_model.FEATURES)!r}"
        )
    have = card.get("versions") or {}
    for lib, version in versions().items():
        trained = str(have.get(lib))
        if trained == version:
            continue
        if release_line(trained) == release_line(version):
            log.warning(
                "model.library_patch_differs", model=where, library=lib, trained=trained, running=version
            )
            continue
        problems.append(f"trained with {lib} {trained}, this build has {version} (another release line)")
    if problems:
        raise ModelMismatchError(f"{where}: model does not fit this build: " + "; ".join(problems))


def load(path: str | pathlib.Path) -> tuple[anomaly_model.Model, dict[str, Any]]:
    """The model and its card; ModelMismatchError if it does not fit this build or cannot be read."""
    where = str(path)
    card = read_card(path)
    check_card(card, where)
    file = pathlib.Path(path) / MODEL_FILE
    try:
        untrusted = set(skops.io.get_untrusted_types(file=file))
        unsafe = untrusted - TRUSTED
        if unsafe:
            raise ModelMismatchError(f"{where}: model file holds types not allowed: {sorted(unsafe)}")
        blob = skops.io.load(file, trusted=sorted(untrusted))
    except ModelMismatchError:
        raise
    except Exception as e:  # skops raises many kinds for a damaged file
        raise ModelMismatchError(f"{where}: cannot load {MODEL_FILE}: {e}") from e
    try:
        settings = anomaly_model.TrainSettings(**card["settings"])
        m = anomaly_model.Model(
            forest=blob["forest"],
            classes=list(card["classes"]),
            prior_r=[float(v) for v in card["prior_resistance"]],
            calib={k: float(v) for k, v in card["calibration"].items()},
            settings=settings,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ModelMismatchError(f"{where}: model card is incomplete: {e}") from e
    return m, card
