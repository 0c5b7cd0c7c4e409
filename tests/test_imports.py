"""Boundaries held by imports: only ``healer/bus/`` imports nats-py, so everything else runs on the Bus
Protocol (and the in-memory bus) and nats-py's errors never leak past the adapter."""

from __future__ import annotations

import ast
import pathlib

import healer

PACKAGE = pathlib.Path(healer.__file__).parent


def imported_modules(path: pathlib.Path) -> set[str]:
    """Every absolute module a file imports, at any depth (inside functions and ``TYPE_CHECKING`` too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module",
            "__import__",
        ):
            found.update(
                a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
            )
    return found


def nats_importers() -> list[str]:
    return sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if any(m == "nats" or m.startswith("nats.") for m in imported_modules(path))
    )


def test_only_the_bus_package_imports_nats_py() -> None:
    outside = [p for p in nats_importers() if not p.startswith("healer/bus/")]
    assert outside == [], f"nats-py imported outside healer/bus/: {outside}"


def test_the_check_sees_every_form_of_import(tmp_path: pathlib.Path) -> None:
    """The check above would pass vacuously if it missed a form of import: it must see each."""
    forms = [
        "import nats",
        "import nats.errors",
        "from nats.js import api",
        "from nats import errors",
        "def f():\n    import nats.js.errors",
        "import importlib\nimportlib.import_module('nats')",
    ]
    for i, source in enumerate(forms):
        path = tmp_path / f"m{i}.py"
        path.write_text(source + "\n")
        assert any(m == "nats" or m.startswith("nats.") for m in imported_modules(path)), source
    (tmp_path / "ok.py").write_text("from healer.bus import nats as natsbus\nimport natsort\n")
    assert imported_modules(tmp_path / "ok.py") == {"healer.bus", "natsort"}
    assert "healer/bus/nats.py" in nats_importers(), "the adapter itself is found"
