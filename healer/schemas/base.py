"""The base of every top-level wire document: strict, frozen, versioned by its ``schema`` field."""

from __future__ import annotations

import enum
from typing import Any

import pydantic

CONFIG = pydantic.ConfigDict(
    extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
)


class WireModel(pydantic.BaseModel):
    """In code the ``schema`` field defaults to the current version; on the wire it is required."""

    model_config = CONFIG

    @pydantic.model_validator(mode="before")
    @classmethod
    def _schema_required_on_wire(cls, data: Any, info: pydantic.ValidationInfo) -> Any:
        if info.context and info.context.get("wire") and isinstance(data, dict) and "schema" not in data:
            raise ValueError("missing 'schema' field: every healer document names its schema version")
        return data


def inline(vocabulary: type[enum.StrEnum], title: str | None = None) -> pydantic.WithJsonSchema:
    """A field's JSON schema for a vocabulary enum, written inline as a ``Literal`` of its values would be
    (``{"enum": [...], "title": <the field's>, "type": "string"}``), so the published schemas stay what they
    were."""
    return pydantic.WithJsonSchema(
        {"enum": [m.value for m in vocabulary], "title": title or vocabulary.__name__, "type": "string"}
    )
