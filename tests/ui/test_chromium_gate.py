"""Without chromium the browser tests skip on a laptop but fail in CI (where .ci/run installs it)."""

from __future__ import annotations

import shutil

import pytest

from tests.ui import conftest


def test_missing_chromium_fails_in_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="chromium"):
        conftest.chromium_paths()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="chromium"):
        conftest.chromium_paths()
