"""README.md is the front door (#40): the two commands are on it, every link on it leads somewhere, and
it stays short enough to read in a few minutes (the measurements live in docs/performance.md)."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_WORDS = 1200
"""About three minutes of reading."""


def test_the_two_commands_are_on_the_front_door() -> None:
    text = README.read_text()
    assert "make demo" in text
    assert "make test" in text
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M)
    assert re.search(r"^test:", makefile, re.M)


def test_every_relative_link_and_path_in_the_readme_exists() -> None:
    text = README.read_text()
    targets = set(re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text))
    targets |= set(re.findall(r"`((?:docs|deploy|healer|benchmarks|tests)/[^`\s]*)`", text))
    missing = sorted(t for t in targets if "://" not in t and not (ROOT / t).exists())
    assert missing == []


def test_the_readme_reads_in_a_few_minutes() -> None:
    assert len(README.read_text().split()) <= MAX_WORDS
