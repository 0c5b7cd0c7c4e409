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


LAYERS: dict[str, tuple[str, ...]] = {
    "bottom": (
        "healer.schemas", "healer.errors", "healer.config", "healer.logs", "healer.durations",
        "healer.buildinfo", "healer.metricdecl", "healer.sdnotify", "healer.health", "healer.tasks",
        "healer.steps", "healer.sizing", "healer.actions",
    ),
    "middle": (
        "healer.telemetry", "healer.bus", "healer.rules", "healer.anomaly", "healer.sim", "healer.actuators",
        "healer.feed", "healer.archive", "healer.security", "healer.testing",
    ),
    "top": (
        "healer.agent", "healer.controller", "healer.demo", "healer.evals", "healer.ui", "healer.cli",
        "healer.__main__",
    ),
}  # fmt: skip
"""docs/architecture.md's layer table (the longest matching prefix decides)."""
RANK = {"bottom": 0, "middle": 1, "top": 2}


def layer_of(module: str) -> str | None:
    matches = [
        (len(prefix), name)
        for name, prefixes in LAYERS.items()
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    return max(matches)[1] if matches else None


def healer_imports(path: pathlib.Path) -> set[str]:
    """The healer modules (or names in them) a file imports: ``from healer.bus import nats`` counts as
    ``healer.bus.nats``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("healer"))
        elif (
            isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("healer")
        ):
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def module_name(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def test_every_module_has_a_layer() -> None:
    unplaced = [module_name(p) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"]
    assert [m for m in unplaced if layer_of(m) is None] == []


def test_lower_layers_never_import_higher_ones() -> None:
    upward = []
    for path in PACKAGE.rglob("*.py"):
        me = module_name(path)
        mine = layer_of(me)
        if mine is None:
            continue
        for imported in healer_imports(path):
            theirs = layer_of(imported)
            if theirs is not None and RANK[theirs] > RANK[mine]:
                upward.append(f"{me} ({mine}) imports {imported} ({theirs})")
    assert sorted(upward) == []


def test_the_layer_check_sees_an_upward_import(tmp_path: pathlib.Path) -> None:
    (tmp_path / "m.py").write_text("def f():\n    from healer.controller.core import service\n")
    assert healer_imports(tmp_path / "m.py") == {"healer.controller.core.service"}
    assert layer_of("healer.controller.core.service") == "top"
    assert layer_of("healer.agent.sim_fleet") == "top"
    assert layer_of("healer.sim.physics") == "middle"
    assert layer_of("healer.schemas.codec") == "bottom"


SHARED_NAMES = {"__init__", "base"}
"""File names several packages may share: ``base`` (each package's Protocols) is never ambiguous."""


def test_no_module_imports_two_modules_of_one_name() -> None:
    """Two modules called ``incidents`` (or ``server``, ``commands``, ``recovery``) in one file forced
    ``x as x_mod`` aliases; each name is used once wherever a module meets another."""
    clashes = []
    for path in PACKAGE.rglob("*.py"):
        me = module_name(path)
        mods = {
            m
            for m in healer_imports(path) | {me}
            if (PACKAGE.parent / (m.replace(".", "/") + ".py")).exists()
        }
        by_name: dict[str, set[str]] = {}
        for m in mods:
            by_name.setdefault(m.rsplit(".", 1)[-1], set()).add(m)
        clashes += [f"{me}: {sorted(v)}" for k, v in by_name.items() if len(v) > 1 and k not in SHARED_NAMES]
    assert sorted(clashes) == []


def test_every_module_name_is_used_once() -> None:
    """A name says which module: ``runner``, ``metrics`` or ``engine`` in two packages made readers and
    imports guess (#25). Only ``SHARED_NAMES`` repeat."""
    by_name: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        by_name.setdefault(path.stem, []).append(module_name(path))
    repeated = {k: sorted(v) for k, v in by_name.items() if len(v) > 1 and k not in SHARED_NAMES}
    assert repeated == {}


def test_no_module_is_imported_under_a_mod_alias() -> None:
    """``from healer.x import y as y_mod`` hid a name clash; with every module name used once there is
    none to hide."""
    aliased = []
    for path in [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "tests").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                aliased += [
                    f"{path.name}: {a.name} as {a.asname}"
                    for a in node.names
                    if a.asname and a.asname.endswith("_mod")
                ]
    assert aliased == []


EVALS = "healer.evals"
"""Bench harnesses and evaluation runners: they drive the runtime, the runtime never imports them."""


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_no_runtime_package_imports_the_evaluation_code() -> None:
    """The controller, bus, rules, actuators, agent, schemas, anomaly and every other runtime package ship
    without ``healer.evals``; only the CLI reaches it, and only inside the bench command that runs it."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        me = module_name(path)
        if _within(me, EVALS):
            continue
        if me.startswith("healer.cli"):
            top_level = ast.parse(path.read_text(), filename=str(path)).body
            lazy_ok = not any(
                isinstance(n, ast.Import | ast.ImportFrom) and any(_within(m, EVALS) for m in _names_of(n))
                for n in top_level
            )
            if lazy_ok:
                continue
        found += [f"{me} imports {m}" for m in healer_imports(path) if _within(m, EVALS)]
    assert sorted(found) == []


def _names_of(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    return {f"{node.module}.{a.name}" for a in node.names} if node.level == 0 and node.module else set()


def test_the_controller_imports_neither_the_simulator_nor_the_agent() -> None:
    found = [
        f"{module_name(path)} imports {m}"
        for path in (PACKAGE / "controller").rglob("*.py")
        for m in healer_imports(path)
        if any(_within(m, p) for p in ("healer.sim", "healer.agent"))
    ]
    assert sorted(found) == []


CONTROLLER_STAGES = (
    "observability", "store", "inventory", "power", "incidents", "failslow", "remediation", "core",
)  # fmt: skip
"""healer/controller/'s sub-packages, bottom to top (its ``__init__`` says what each holds): a stage
imports only itself and the stages before it."""


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["healer", "controller"] else None


def test_every_controller_module_sits_in_a_stage() -> None:
    loose = [
        module_name(p)
        for p in (PACKAGE / "controller").rglob("*.py")
        if p.name != "__init__.py" and stage_of(module_name(p)) not in CONTROLLER_STAGES
    ]
    assert loose == []


def test_controller_stages_import_only_the_stages_below() -> None:
    upward = []
    for path in (PACKAGE / "controller").rglob("*.py"):
        mine = stage_of(module_name(path))
        if mine is None:
            continue
        for imported in healer_imports(path):
            theirs = stage_of(imported)
            if theirs in CONTROLLER_STAGES and CONTROLLER_STAGES.index(theirs) > CONTROLLER_STAGES.index(
                mine
            ):
                upward.append(f"{module_name(path)} ({mine}) imports {imported} ({theirs})")
    assert sorted(upward) == []


def test_the_evaluation_and_stage_checks_see_a_violation(tmp_path: pathlib.Path) -> None:
    (tmp_path / "m.py").write_text(
        "def f():\n    from healer.evals import power_bench\n    from healer.controller.core import service\n"
    )
    found = healer_imports(tmp_path / "m.py")
    assert "healer.evals.power_bench" in found
    assert stage_of("healer.controller.core.service") == "core"
    assert stage_of("healer.controller.store.kv") == "store"
    assert stage_of("healer.controller") is None
    assert layer_of("healer.evals.controller_bench") == "top"
