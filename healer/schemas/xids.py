"""The XID catalogue: which driver fault code means what, and what NVIDIA says to do about it.

One catalogue per fact: the codes, NVIDIA's mnemonics and NVIDIA's immediate action come from NVIDIA's
published Xid catalog (``xids.yaml`` beside this module says which version and where from); names,
categories and the ``hardware`` flag are healer's own short wording. The rules tooling reads it
(``healer rules check`` warns when a code that needs a reset, a reboot or support matches no rule),
and so does the agent (readable event messages, decoding kernel-log lines). ``load()`` validates the
file once and caches it; a broken file is a bug in the package and raises at import of the caller's
first use, never silently.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
from collections.abc import Mapping
from typing import Final, Literal

import pydantic
import yaml

Action = Literal[
    "IGNORE",
    "RESTART_APP",
    "CHECK_UVM",
    "RESET_GPU",
    "RESTART_BM",
    "RESTART_VM",
    "CHECK_MECHANICALS",
    "CONTACT_SUPPORT",
    "UPDATE_SWFW",
    "WORKFLOW_XID_45",
    "WORKFLOW_XID_48",
    "WORKFLOW_NVLINK_ERR",
    "WORKFLOW_NVLINK5_ERR",
    "FOLLOW_LINKED_XID",
]
Category = Literal[
    "application", "driver", "recovery", "timeout", "memory", "power", "firmware", "nvlink", "bus", "security"
]

NEEDS_RULE: Final[frozenset[str]] = frozenset(
    {
        "RESET_GPU",
        "RESTART_BM",
        "RESTART_VM",
        "CHECK_MECHANICALS",
        "CONTACT_SUPPORT",
        "WORKFLOW_XID_48",
        "WORKFLOW_NVLINK_ERR",
        "WORKFLOW_NVLINK5_ERR",
    }
)
"""Immediate actions that need a person or a reset/reboot: a rule set handling XIDs must match them."""


class _Entry(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    code: int = pydantic.Field(ge=0)
    mnemonic: str
    name: str = pydantic.Field(min_length=1, max_length=80)
    category: Category
    action: Action
    hardware: bool


class _File(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    catalog: str
    source: str
    cross_checked: str = ""
    retrieved: str
    xids: list[_Entry]


@dataclasses.dataclass(frozen=True, slots=True)
class Xid:
    code: int
    mnemonic: str
    name: str
    category: Category
    action: Action
    hardware: bool

    @property
    def needs_rule(self) -> bool:
        """NVIDIA's immediate action is a reset, a reboot, support or a hardware check."""
        return self.action in NEEDS_RULE


@dataclasses.dataclass(frozen=True, slots=True)
class Catalog:
    catalog: str
    source: str
    retrieved: str
    xids: Mapping[int, Xid]

    def get(self, code: int) -> Xid | None:
        return self.xids.get(code)

    def name(self, code: int) -> str:
        """A short readable name, or a pointer to the catalog for a code healer does not list."""
        xid = self.xids.get(code)
        return xid.name if xid is not None else "not in healer's XID catalogue"

    @property
    def needing_rules(self) -> list[Xid]:
        return [x for x in self.xids.values() if x.needs_rule]

    @property
    def version(self) -> str:
        return f"{self.catalog}, retrieved {self.retrieved} from {self.source}"


def parse(text: str) -> Catalog:
    """Validate a catalogue document (codes unique)."""
    doc = _File.model_validate(yaml.safe_load(text))
    xids: dict[int, Xid] = {}
    for e in doc.xids:
        if e.code in xids:
            raise ValueError(f"XID {e.code} is listed twice")
        xids[e.code] = Xid(e.code, e.mnemonic, e.name, e.category, e.action, e.hardware)
    return Catalog(doc.catalog, doc.source, doc.retrieved, dict(sorted(xids.items())))


@functools.cache
def load() -> Catalog:
    """The catalogue shipped with healer (cached)."""
    text = importlib.resources.files("healer.schemas").joinpath("xids.yaml").read_text(encoding="utf-8")
    return parse(text)
