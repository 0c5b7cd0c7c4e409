"""Modules a command needs only when it runs, imported on first use.

``healer`` builds its whole argument parser at start, so every command module is imported for every
command. The node agent's install has no numpy, scikit-learn or Kubernetes client (pyproject's extras), so
the command modules must not import the controller, the simulator or the rule engine at import time:
``lazy.module(name)`` returns a stand-in that imports the module on its first attribute access, that is,
when the command that needs it runs. The stand-in is not put in ``sys.modules`` (libraries such as
pydantic walk ``sys.modules`` and would import it early). mypy sees the real module through ``if
TYPE_CHECKING`` imports beside each use.
"""

from __future__ import annotations

import importlib
import types
from typing import Any


class _Deferred:
    __slots__ = ("_module", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: types.ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<deferred module {self._name!r} ({state})>"


def module(name: str) -> Any:
    """A stand-in for the module ``name`` that imports it on first use."""
    return _Deferred(name)
