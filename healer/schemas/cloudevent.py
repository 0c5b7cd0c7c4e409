"""The CloudEvents 1.0 envelope (JSON format) that every event on the incident feed wears.

healer's own event models extend ``CloudEvent`` with a typed ``data``. What the spec allows, healer
accepts and passes on: extension attributes (``traceparent``, ``partitionkey``, anything whose name is
lower-case letters and digits, with a string, integer or boolean value) stay in ``model_extra`` and are
serialised again as they came; ``dataschema`` is optional; ``datacontenttype`` is ``application/json``
with or without parameters (``; charset=utf-8``). ``specversion`` defaults to ``"1.0"`` in code but is
required on the wire (JSON input, or ``context={"wire": True}``), as the spec says.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Final, Literal

import pydantic

SPECVERSION: Final = "1.0"
JSON_CONTENT_TYPE: Final = "application/json"

EXTENSION_NAME: Final = r"^[a-z0-9]+$"
"""A context attribute name (spec: lower-case ASCII letters and digits)."""
EXTENSION_VALUE_TYPES: Final = (str, int, bool)
"""What an extension attribute may hold in the JSON format (Binary, URI and Timestamp travel as strings)."""

CONTENT_TYPE_PATTERN: Final = r"^[Aa][Pp][Pp][Ll][Ii][Cc][Aa][Tt][Ii][Oo][Nn]/[Jj][Ss][Oo][Nn]\s*(;.*)?$"
"""``application/json``, any case, with optional parameters."""

CORE_ATTRIBUTES: Final = frozenset(
    {"specversion", "id", "source", "type", "subject", "time", "datacontenttype", "dataschema", "data"}
)

_OPTIONAL: Final = ("subject", "time", "dataschema")
_NAME = re.compile(EXTENSION_NAME)
_CONFIG = pydantic.ConfigDict(
    extra="allow", frozen=True, validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
)


def _schema_extra(schema: dict[str, Any]) -> None:
    """JSON Schema: ``specversion`` required; other members only as extension attributes."""
    schema["required"] = sorted({*schema.get("required", []), "specversion"})
    schema["properties"]["dataschema"] = {
        "description": "URI of the schema ``data`` adheres to (optional)",
        "format": "uri",
        "maxLength": 1024,
        "minLength": 1,
        "type": "string",
    }
    schema["additionalProperties"] = False
    schema["patternProperties"] = {
        r"^(?!data$)[a-z0-9]+$": {
            "description": "a CloudEvents extension attribute (traceparent, ...), passed on as is",
            "type": ["string", "integer", "boolean"],
        }
    }


class CloudEvent(pydantic.BaseModel):
    """The context attributes of a CloudEvents 1.0 event; subclasses type ``data``."""

    model_config = pydantic.ConfigDict(**_CONFIG, json_schema_extra=_schema_extra)

    specversion: Literal["1.0"] = SPECVERSION
    id: str = pydantic.Field(min_length=1, max_length=128)
    source: str = pydantic.Field(min_length=1, max_length=1024)
    type: str = pydantic.Field(min_length=1, max_length=256)
    subject: str | None = None
    time: datetime | None = None
    datacontenttype: str = pydantic.Field(default=JSON_CONTENT_TYPE, pattern=CONTENT_TYPE_PATTERN)
    dataschema: str | None = pydantic.Field(default=None, min_length=1, max_length=1024)

    @pydantic.model_validator(mode="before")
    @classmethod
    def _specversion_required_on_wire(cls, data: Any, info: pydantic.ValidationInfo) -> Any:
        wire = info.mode == "json" or bool(info.context and info.context.get("wire"))
        if wire and isinstance(data, dict) and "specversion" not in data:
            raise ValueError("missing 'specversion': a CloudEvent names its spec version (\"1.0\")")
        return data

    @pydantic.model_validator(mode="after")
    def _extensions_are_attributes(self) -> CloudEvent:
        for name, value in (self.model_extra or {}).items():
            if not _NAME.match(name):
                raise ValueError(
                    f"{name!r} is not a CloudEvents attribute name (lower-case letters and digits only)"
                )
            if not isinstance(value, EXTENSION_VALUE_TYPES):
                raise ValueError(
                    f"extension attribute {name!r} must be a string, integer or boolean, "
                    f"not {type(value).__name__}"
                )
        return self

    @pydantic.model_serializer(mode="wrap")
    def _omit_absent(self, handler: pydantic.SerializerFunctionWrapHandler) -> Any:
        """An optional attribute without a value is left out (the JSON format has no ``null`` attributes)."""
        out = handler(self)
        if isinstance(out, dict):
            for name in _OPTIONAL:
                if name in out and out[name] is None:
                    del out[name]
        return out

    @property
    def extensions(self) -> dict[str, str | int | bool]:
        """Extension attributes as received (empty for an event healer built itself)."""
        return dict(self.model_extra or {})
