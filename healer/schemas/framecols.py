"""Columnar frame decoding: a NodeFrame's GPU readings written as float64 into a caller's plane.

The controller reads every GPU number of every frame into numpy planes. Decoding each frame into Python
structs first (about 380 values), reading them back by attribute and converting them again cost more than
half of its ingest (docs/performance.md). Here one call validates a frame and writes its GPU readings into
rows of a preallocated plane: one row per GPU, one column per numeric field of GpuSample (``COLUMNS``:
floats as they are, integers and booleans as float64, null as NaN). The node, timestamps and the rest of
the frame's header come back as a ``Frame``; the GPUs as objects (``Frame.gpus``) are decoded only when
someone reads them.

Two implementations give exactly the same results, verdicts and errors, and the same tests run both
(tests/schemas/test_framecols.py):

- the compiled one (``_framec``, a small C extension built by ``pip install`` where a C compiler is
  present). It interprets a field table derived here from the pydantic models, as fastwire.py derives
  its structs, refusing (``TypeError``) what it cannot translate exactly. It decides only documents it
  can decide exactly (ASCII strings without escapes, integers of at most 18 digits, every key once, known
  keys only, numbers that float64 holds exactly where they go to the plane), and hands every other
  document to the pure-Python path. So it never judges a document: strictness, every rejection and its
  reason stay ``codec.decode_frame_view``'s;
- the pure-Python one: ``codec.decode_frame_view`` (the strict msgspec structs, pydantic's verdict for
  what they refuse), then the numbers written into the plane. It runs where the extension was not built.

numpy is imported here (the controller's dependency), so the node agent never imports this module.
"""

from __future__ import annotations

import functools
import math
import operator
import re
import types
import typing
from collections.abc import Sequence
from typing import Any, Final

import annotated_types
import numpy as np
import numpy.typing as npt
import pydantic

from healer import errors
from healer.schemas import codec, fabric, fastwire, telemetry

FRAMEC_VERSION: Final = 1
"""The version of _framec (``FRAMEC_VERSION`` in _framec.h) this module drives (a module built from an older
source is not used)."""
try:
    from healer.schemas import _framec  # type: ignore[attr-defined]
except ImportError:  # not built (no C compiler at install): the pure-Python path does everything
    _framec = None
if getattr(_framec, "VERSION", None) != FRAMEC_VERSION:  # built from another source: reinstall
    _framec = None

F64 = npt.NDArray[np.float64]

_NUMERIC: Final = (float, int, bool)


def _base_type(annotation: Any) -> tuple[Any, bool]:
    """(the type inside ``X | None``, whether None is allowed)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1 or len(args) != 2:
            raise TypeError(f"only 'X | None' unions are translated, not {annotation!r}")
        return rest[0], True
    return annotation, False


COLUMNS: Final[tuple[str, ...]] = tuple(
    name
    for name, info in telemetry.GpuSample.model_fields.items()
    if _base_type(info.annotation)[0] in _NUMERIC
)
"""The plane's columns: every numeric GpuSample field, in the model's order (``index`` first)."""
COLUMN: Final[dict[str, int]] = {name: i for i, name in enumerate(COLUMNS)}
WIDTH: Final = len(COLUMNS)
ROWS_MAX: Final = 256
"""The most GPU rows one frame writes (``NodeFrame.gpus``' max_length): a plane has this many free."""
ACCELERATED: Final = _framec is not None
"""The compiled decoder is in use (otherwise the pure-Python path decodes every frame)."""

if COLUMNS[0] != "index":
    raise TypeError("GpuSample's first field must be its index (the plane's key column)")
if telemetry.NodeFrame.model_fields["gpus"].metadata != [annotated_types.MaxLen(ROWS_MAX)]:
    raise TypeError("NodeFrame.gpus' max_length is not ROWS_MAX")

_STRICT = fastwire.decoder(telemetry.NodeFrame)
_ROW = operator.attrgetter(*COLUMNS)


class Frame:
    """A decoded frame whose GPU readings are in ``plane[row : row + gpu_count]`` (``COLUMNS``). It
    reads like a NodeFrame (``telemetry.FrameView``); ``gpus`` and ``ports`` are decoded on first use
    (the strict structs, or the NodeFrame's own for a frame only pydantic accepted)."""

    __slots__ = (
        "_gpus", "_ports", "agent_version", "boot_id", "data", "exact", "fabric_manager_up", "gpu_count",
        "gpus_expected", "has_ports", "lax", "max_index", "node", "plane", "row", "schema_", "seq",
        "source", "ts",
    )  # fmt: skip

    schema_: str
    node: str
    ts: float
    seq: int
    boot_id: str
    agent_version: str
    source: str
    gpus_expected: int | None
    fabric_manager_up: bool | None
    gpu_count: int
    """GPU entries in the frame (rows written)."""
    max_index: int
    """The largest GPU index in the frame, -1 with no GPU."""
    has_ports: bool
    """The frame carries a ``ports`` list (v2), possibly empty; ``ports`` is None otherwise."""
    lax: bool
    """Only pydantic's lax validation accepted it (a ``"3"`` for a float, say): counted apart."""
    exact: bool
    """Its plane rows hold exactly its readings (the compiled decoder decided it: every integer fits
    float64) and nothing was written over them since; whoever lends the plane to the next frame clears
    it (``FleetState.decode``). While it holds, ``readings`` reads the plane instead of ``gpus``."""
    data: bytes
    plane: F64
    row: int
    _gpus: Sequence[telemetry.GpuView]
    _ports: list[Any] | None

    @property
    def gpus(self) -> Sequence[telemetry.GpuView]:
        try:
            return self._gpus
        except AttributeError:
            self._decode_objects()
            return self._gpus

    @property
    def ports(self) -> list[Any] | None:
        try:
            return self._ports
        except AttributeError:
            self._decode_objects()
            return self._ports

    def readings(self, columns: npt.NDArray[np.intp]) -> list[list[float]] | None:
        """The GPUs' values of ``columns`` (indexes into ``COLUMNS``), one list per GPU in the frame's
        order, NaN for null, read from the plane while ``exact``; None otherwise (read ``gpus``)."""
        if not self.exact:
            return None
        rows: list[list[float]] = self.plane[self.row : self.row + self.gpu_count, columns].tolist()
        return rows

    def may_carry(self, field: str) -> bool:
        """Whether the frame's bytes name ``field`` at all (a string inside a value counts too): False
        says for certain that no GPU or port of it has the field, without decoding them."""
        return f'"{field}"'.encode() in self.data

    def _decode_objects(self) -> None:
        strict = _STRICT.decode(self.data)  # the compiled path accepts only what this accepts
        self._gpus, self._ports = strict.gpus, strict.ports


def decode_into(data: bytes, plane: F64, row: int) -> Frame:
    """Decode a frame, its GPU rows written into ``plane[row:]`` (float64, ``WIDTH`` columns, at least
    ``ROWS_MAX`` rows free); ``errors.DecodeError`` exactly as ``codec.decode_frame_view`` raises it."""
    if len(data) > codec.MAX_MESSAGE_BYTES:
        raise errors.DecodeError("frame", "too_large", f"{len(data)} bytes > {codec.MAX_MESSAGE_BYTES}")
    if _COMPILED is not None:
        out = _COMPILED.decode(data, plane, row)
        if out is not None:
            return _from_compiled(out, data, plane, row)
    return decode_into_python(data, plane, row)


def decode_into_python(data: bytes, plane: F64, row: int) -> Frame:
    """``decode_into`` without the compiled decoder (what runs where it was not built, and for every
    document it leaves to Python)."""
    if row < 0 or plane.shape[0] - row < ROWS_MAX or plane.shape[1:] != (WIDTH,):
        raise ValueError(f"a plane of {WIDTH} columns with {ROWS_MAX} rows free from row {row} is needed")
    view = codec.decode_frame_view(data)
    gpus = view.gpus
    n = len(gpus)
    if n:
        plane[row : row + n] = [_ROW(g) for g in gpus]
    f = Frame()
    f.schema_ = view.schema_  # type: ignore[attr-defined]
    f.node, f.ts, f.seq = view.node, view.ts, view.seq  # type: ignore[attr-defined]
    f.boot_id, f.agent_version, f.source = view.boot_id, view.agent_version, view.source  # type: ignore[attr-defined]
    f.gpus_expected = view.gpus_expected
    f.fabric_manager_up = view.fabric_manager_up  # type: ignore[attr-defined]
    f.gpu_count, f.max_index = n, max((g.index for g in gpus), default=-1)
    f._ports = view.ports  # type: ignore[attr-defined]
    f.has_ports = f._ports is not None
    f._gpus = gpus
    f.lax = isinstance(view, telemetry.NodeFrame)
    f.exact = False  # (its objects are at hand; past 2**53 an integer of the plane is rounded)
    f.data, f.plane, f.row = data, plane, row
    return f


_FIELDS: Final = tuple(telemetry.NodeFrame.model_fields)
"""The compiled decoder's outputs, one per NodeFrame field in this order, then gpu count and max index."""


def _from_compiled(out: tuple[Any, ...], data: bytes, plane: F64, row: int) -> Frame:
    f = Frame()
    (f.schema_, f.node, f.ts, f.seq, f.boot_id, f.agent_version, f.source, f.gpus_expected, _, ports,
     f.fabric_manager_up, f.gpu_count, f.max_index) = out  # fmt: skip
    f.has_ports = ports is not None
    if not f.has_ports:
        f._ports = None
    f.lax = False
    f.exact = True
    f.data, f.plane, f.row = data, plane, row
    return f


# -- the compiled decoder's field table --------------------------------------------------------------

_FLOAT, _INT, _BOOL, _STR, _LITERAL, _LIST_STR, _LIST_STRUCT = range(1, 8)
_NONE, _INCL, _EXCL = 0, 1, 2
_PATTERN = re.compile(r"\^(\[[^\]]+\])(\[[^\]]+\])\*\$")


def _tables(pattern: str, where: str) -> tuple[bytes, bytes]:
    """``^[first][rest]*$`` as two byte tables over ASCII, each class judged by Python's ``re`` itself
    (non-ASCII strings never reach the compiled decoder)."""
    m = _PATTERN.fullmatch(pattern)
    if m is None:
        raise TypeError(f"{where}: only ^[...][...]*$ patterns are translated, not {pattern!r}")
    first, rest = (re.compile(m.group(k)) for k in (1, 2))
    return (
        bytes(1 if c < 128 and first.fullmatch(chr(c)) else 0 for c in range(256)),
        bytes(1 if c < 128 and rest.fullmatch(chr(c)) else 0 for c in range(256)),
    )


def _field(model: type[pydantic.BaseModel], name: str, out: int, plane: bool) -> tuple[Any, ...]:
    info = model.model_fields[name]
    where = f"{model.__name__}.{name}"
    wire = info.alias or name
    typ, nullable = _base_type(info.annotation)
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    item: tuple[Any, ...] | None = None
    options: tuple[str, ...] | None = None
    if origin is typing.Literal:
        if not all(isinstance(a, str) for a in args):
            raise TypeError(f"{where}: only literals of strings are translated")
        kind, options = _LITERAL, tuple(args)
    elif origin is list and args == (str,):
        kind = _LIST_STR
    elif (
        origin is list
        and len(args) == 1
        and isinstance(args[0], type)
        and issubclass(args[0], pydantic.BaseModel)
    ):
        kind, item = _LIST_STRUCT, _struct(args[0], outputs=plane)
    elif typ in (bool, int, float, str):
        kind = {bool: _BOOL, int: _INT, float: _FLOAT, str: _STR}[typ]
    else:
        raise TypeError(f"{where}: the type {typ!r} is not translated")
    lo_mode, lo, hi_mode, hi = _NONE, 0.0, _NONE, 0.0
    lo_i, hi_i = fastwire.INT_RANGE
    min_len, max_len = 0, -1
    pattern: tuple[bytes, bytes] | None = None
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge | annotated_types.Gt) and lo_mode == _NONE:
            bound: Any = m.ge if isinstance(m, annotated_types.Ge) else m.gt
            lo_mode, lo = (_INCL if isinstance(m, annotated_types.Ge) else _EXCL), float(bound)
            lo_i = max(lo_i, math.ceil(bound) if lo_mode == _INCL else math.floor(bound) + 1)
        elif isinstance(m, annotated_types.Le | annotated_types.Lt) and hi_mode == _NONE:
            bound = m.le if isinstance(m, annotated_types.Le) else m.lt
            hi_mode, hi = (_INCL if isinstance(m, annotated_types.Le) else _EXCL), float(bound)
            hi_i = min(hi_i, math.floor(bound) if hi_mode == _INCL else math.ceil(bound) - 1)
        elif isinstance(m, annotated_types.MinLen):
            min_len = m.min_length
        elif isinstance(m, annotated_types.MaxLen):
            max_len = m.max_length
        elif type(m).__name__ == "_PydanticGeneralMetadata" and set(vars(m)) == {"pattern"}:
            pattern = _tables(str(vars(m)["pattern"]), where)
        else:
            raise TypeError(f"{where}: no translation for the constraint {m!r}")
        if (
            kind in (_LITERAL, _BOOL)
            or (kind == _STR and lo_mode + hi_mode)
            or (kind in (_FLOAT, _INT) and (min_len or max_len >= 0 or pattern))
        ):
            raise TypeError(f"{where}: the constraint {m!r} does not apply to its type")
    if kind == _FLOAT and (lo != lo or hi != hi):
        raise TypeError(f"{where}: a NaN bound")
    required = info.is_required() or wire == "schema"
    default = None if required else info.default
    if default is not None and not isinstance(default, str | int | float | bool):
        raise TypeError(f"{where}: the default {default!r} is not translated")
    return (
        wire.encode(), kind, nullable, required, out, lo_mode, lo, hi_mode, hi, lo_i, hi_i,
        min_len, max_len, pattern, options, item, plane, default,
    )  # fmt: skip


def _struct(model: type[pydantic.BaseModel], *, outputs: bool) -> tuple[Any, ...]:
    """A model's field table: for the plane's rows (``outputs``: numeric fields to their column) or a
    nested list only validated (PortSample)."""
    config = model.model_config
    if config.get("extra") != "forbid" or config.get("allow_inf_nan", True) is not False:
        raise TypeError(f"{model.__name__}: only extra='forbid', allow_inf_nan=False models are translated")
    fields = tuple(
        _field(model, name, COLUMN.get(name, -1) if outputs else -1, False) for name in model.model_fields
    )
    fastwire.struct_for(model)  # the same translation limits as the strict structs (validators, ...)
    return fields


def _frame_table() -> tuple[Any, ...]:
    model = telemetry.NodeFrame
    if tuple(model.model_fields) != (
        "schema_", "node", "ts", "seq", "boot_id", "agent_version", "source", "gpus_expected", "gpus",
        "ports", "fabric_manager_up",
    ):  # fmt: skip
        raise TypeError("NodeFrame's fields changed: update Frame and _from_compiled")
    fastwire.struct_for(model)
    if model.model_fields["ports"].annotation != list[fabric.PortSample] | None:
        raise TypeError("NodeFrame.ports changed")
    return tuple(_field(model, name, i, name == "gpus") for i, name in enumerate(model.model_fields))


@functools.cache
def compiled() -> Any:
    """The compiled decoder for NodeFrame, or None where the extension was not built."""
    return None if _framec is None else _framec.Decoder(_frame_table(), WIDTH, ROWS_MAX)


_COMPILED = compiled()
