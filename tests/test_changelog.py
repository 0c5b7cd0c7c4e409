"""CHANGELOG.md keeps the Keep a Changelog shape the house agreed on (#40): under Unreleased one section
of each kind, each entry one line, no entry twice (merges of long-lived branches used to re-add old text).
"""

from __future__ import annotations

import collections
import pathlib

CHANGELOG = pathlib.Path(__file__).resolve().parents[1] / "CHANGELOG.md"
KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")


def unreleased(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("## [Unreleased]")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## [")), len(lines))
    return lines[start + 1 : end]


def problems(text: str) -> list[str]:
    found = []
    body = unreleased(text)
    heads = collections.Counter(line[4:] for line in body if line.startswith("### "))
    found += [f"### {k} {n} times" for k, n in heads.items() if n > 1]
    found += [f"### {k}: not a Keep a Changelog section" for k in heads if k not in KINDS]
    found += [f"wrapped entry: {line[:60]!r}" for line in body if line.startswith("  ")]
    entries = collections.Counter(line for line in body if line.startswith("- "))
    found += [f"twice: {line[:60]!r}" for line, n in entries.items() if n > 1]
    return found


def test_unreleased_is_one_line_per_entry_one_section_per_kind() -> None:
    assert problems(CHANGELOG.read_text()) == []


def test_the_check_sees_each_fault() -> None:
    text = "\n".join(
        [
            "## [Unreleased]",
            "### Added",
            "- a (#1)",
            "- a (#1)",
            "- b that wraps",
            "  onto a second line",
            "### Added",
            "### Notes",
            "## [0.1.0]",
            "### Added",
        ]
    )
    assert problems(text) == [
        "### Added 2 times",
        "### Notes: not a Keep a Changelog section",
        "wrapped entry: '  onto a second line'",
        "twice: '- a (#1)'",
    ]
