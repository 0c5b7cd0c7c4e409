"""docs/architecture.md's walk of one XID matches the code (#40): every module it names exists, and the
count it gives is the number of modules it names."""

from __future__ import annotations

import pathlib
import re

import pytest

import healer

PACKAGE = pathlib.Path(healer.__file__).parent
DOC = PACKAGE.parent / "docs" / "architecture.md"


def walk() -> str:
    text = DOC.read_text()
    start = text.index("### One XID 48, room by room")
    return text[start : text.index("One catalogue per fact:", start)]


def named_modules(section: str) -> set[pathlib.Path]:
    """The `path.py` names in the walk, resolved under healer/ (the controller's under healer/controller/)."""
    found = set()
    for name in re.findall(r"`([a-z_/]+\.py)`", section):
        under = [PACKAGE / name, PACKAGE / "controller" / name]
        hits = [p for p in under if p.is_file()]
        assert hits, f"architecture.md's XID walk names {name}, which is not in healer/ or healer/controller/"
        found.add(hits[0])
    return found


def test_every_module_of_the_xid_walk_exists_and_the_count_is_right() -> None:
    section = walk()
    modules = named_modules(section)
    counted = re.search(r"passes through the (\d+) modules named", section)
    assert counted, "the walk says how many modules the fault passes through"
    assert int(counted.group(1)) == len(modules), sorted(str(m.relative_to(PACKAGE)) for m in modules)


def test_the_check_would_see_a_module_that_is_gone() -> None:
    with pytest.raises(AssertionError, match=r"no_such_room\.py"):
        named_modules("`core/no_such_room.py`")
    assert named_modules("`core/tick.py` and `bus/nats.py`") == {
        PACKAGE / "controller" / "core" / "tick.py",
        PACKAGE / "bus" / "nats.py",
    }
