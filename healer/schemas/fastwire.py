"""A strict msgspec decoder derived from the pydantic wire models: the controller's first try.

Validating an 8-GPU NodeFrame with pydantic costs about 50 us on top of parsing it; msgspec parses and
validates the same bytes into slotted structs in about 12 us, faster than ``orjson.loads`` builds plain
dicts. The pydantic models stay the one definition of the wire format: ``struct_for`` reads their fields,
types, defaults, aliases and constraints and builds msgspec structs from them at import, refusing
(``TypeError``) anything it cannot translate exactly, so a schema change can never leave this path
silently more lenient.

The translation is at least as strict as pydantic, never more lenient: msgspec takes JSON types as they
are (no ``"3"`` or ``3.0`` for an int, no ``1`` for a bool), rejects numbers out of float range, integers
are bounded (``INT_RANGE``), and the node-name pattern's ``$`` becomes ``\\Z`` (Python's ``$`` would
also accept a trailing newline; pydantic's Rust regex does not). Whatever it rejects goes to the
pydantic path (``codec.decode_frame``), which either accepts it (lax coercion) or raises the precise
``DecodeError``; tests/schemas/test_fastwire.py checks, with generated good and bad documents, that both paths
give the same verdict and the same values.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Annotated, Any

import annotated_types
import msgspec
import pydantic

_BASE = (int, float, str, bool)
_CONFIG_OK = {
    "extra", "frozen", "allow_inf_nan", "validate_by_name", "validate_by_alias", "serialize_by_alias"
}  # fmt: skip
_VALIDATORS_OK = {"_schema_required_on_wire"}
"""base.WireModel's rule that ``schema`` is required on the wire: here every aliased ``schema`` field is."""


INT_RANGE = (-(2**63), 2**63 - 1)
"""Integers this path takes: msgspec would take any size, pydantic parses at most u64 (those past i64,
which msgspec cannot bound, take the pydantic path)."""


def _meta(metadata: list[Any], where: str, typ: Any) -> msgspec.Meta | None:
    kwargs: dict[str, Any] = {}
    if typ is int:
        kwargs["ge"], kwargs["le"] = INT_RANGE
    for m in metadata:
        if isinstance(m, annotated_types.Ge):
            kwargs["ge"] = max(m.ge, kwargs.get("ge", m.ge))
        elif isinstance(m, annotated_types.Gt):
            kwargs["gt"] = m.gt
        elif isinstance(m, annotated_types.Le):
            kwargs["le"] = min(m.le, kwargs.get("le", m.le))
        elif isinstance(m, annotated_types.Lt):
            kwargs["lt"] = m.lt
        elif isinstance(m, annotated_types.MinLen):
            kwargs["min_length"] = m.min_length
        elif isinstance(m, annotated_types.MaxLen):
            kwargs["max_length"] = m.max_length
        elif type(m).__name__ == "_PydanticGeneralMetadata" and set(vars(m)) == {"pattern"}:
            pattern = str(vars(m)["pattern"])
            if not pattern.startswith("^") or not pattern.endswith("$") or pattern.endswith("\\$"):
                raise TypeError(f"{where}: only ^...$ anchored patterns are translated, not {pattern!r}")
            kwargs["pattern"] = pattern[:-1] + "\\Z"
        else:
            raise TypeError(f"{where}: no msgspec equivalent for the constraint {m!r}")
    return msgspec.Meta(**kwargs) if kwargs else None


def _translate(annotation: Any, metadata: list[Any], where: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (types.UnionType, typing.Union):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1 or len(args) != 2:
            raise TypeError(f"{where}: only 'X | None' unions are translated, not {annotation!r}")
        return _translate(rest[0], metadata, where) | None
    if origin is typing.Literal:
        if metadata:
            raise TypeError(f"{where}: constraints on a Literal are not translated")
        return annotation
    if origin is list and len(args) == 1:
        (item,) = args
        inner = struct_for(item) if _is_model(item) else _translate(item, [], where)
        typ: Any = list[inner]  # type: ignore[valid-type]
    elif annotation in _BASE:
        typ = annotation
    else:
        raise TypeError(f"{where}: the type {annotation!r} is not translated")
    meta = _meta(metadata, where, typ)
    return Annotated[typ, meta] if meta is not None else typ


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, pydantic.BaseModel)


@functools.cache
def struct_for(model: type[pydantic.BaseModel]) -> type[msgspec.Struct]:
    """The msgspec struct that decodes exactly the documents ``model`` accepts without coercion."""
    config = model.model_config
    if config.get("extra") != "forbid" or set(config) - _CONFIG_OK:
        raise TypeError(f"{model.__name__}: config {dict(config)!r} is not translated")
    decorators = model.__pydantic_decorators__
    validators = {
        **decorators.validators,
        **decorators.field_validators,
        **decorators.root_validators,
        **decorators.model_validators,
    }
    if set(validators) - _VALIDATORS_OK:
        raise TypeError(f"{model.__name__}: validators {sorted(validators)} have no msgspec equivalent")
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    rename: dict[str, str] = {}
    for name, info in model.model_fields.items():
        where = f"{model.__name__}.{name}"
        wire = info.alias or name
        if wire != name:
            rename[name] = wire
        typ = _translate(info.annotation, list(info.metadata), where)
        if info.is_required() or wire == "schema":
            fields.append((name, typ))
        elif info.default is None or isinstance(info.default, _BASE):
            fields.append((name, typ, info.default))
        else:
            raise TypeError(f"{where}: the default {info.default!r} is not translated")
    return msgspec.defstruct(
        f"{model.__name__}Wire",
        fields,
        kw_only=True,
        frozen=True,
        forbid_unknown_fields=True,
        gc=False,  # decoded documents are trees (no cycles): the collector need not track them
        rename=rename or None,
        module=__name__,
    )


@functools.cache
def decoder(model: type[pydantic.BaseModel]) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(struct_for(model))


Error = msgspec.MsgspecError
"""What a failed strict decode raises (malformed JSON or a document pydantic must judge)."""
