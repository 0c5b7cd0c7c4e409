"""What every settings group shares: unknown fields refused, each field documented by its docstring."""

from __future__ import annotations

import os
import pathlib

import pydantic


def default_state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or str(pathlib.Path.home() / ".local" / "state")
    return str(pathlib.Path(base) / "healer")


class Group(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", use_attribute_docstrings=True)
