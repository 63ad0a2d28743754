"""Typed records across the control plane's wall, checked field by field.

A record crosses between the API and the trainers as JSON (a report's ``data``) or as a
Redis hash or stream entry (every value a string). :func:`decode` turns a JSON object into a
frozen dataclass by the dataclass's own annotations; :func:`encode` is its inverse. The
``text_*`` readers parse the string values of a hash or stream entry. Every one of them
raises :class:`ContractError` (a ``ValueError``) naming the record, the field and the value,
never a bare ``KeyError`` or ``TypeError``.

Example::

    @dataclass(frozen=True)
    class Claimed:
        day: str
        pass_id: int
        ranks: int = 1

    decode(Claimed, {"day": "20190720", "pass_id": 3}, "report 'claimed'")
    # Claimed(day='20190720', pass_id=3, ranks=1)
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any, TypeVar

from streamrec.errors import quote

T = TypeVar("T")


class ContractError(ValueError):
    """A record of the control contract is malformed: the message names the record, the
    field and the value."""


def _bad(where: str, name: str, expected: str, value: object) -> ContractError:
    return ContractError(f"{where}: field {name!r} must be {expected}, got {quote(value)}")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a dataclass (cached: read on every decode)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _check(where: str, name: str, hint: Any, value: Any) -> Any:
    """``value`` as the annotation ``hint`` wants it (lists become tuples, enum values
    enums), or ContractError."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        (inner,) = [o for o in options if o is not type(None)]
        return _check(where, name, inner, value)
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return hint(value)
        except ValueError:
            names = ", ".join(repr(m.value) for m in hint)
            raise _bad(where, name, f"one of {names}", value) from None
    if hint is bool:
        if not isinstance(value, bool):
            raise _bad(where, name, "true or false", value)
        return value
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _bad(where, name, "an integer", value)
        return value
    if hint is str:
        if not isinstance(value, str):
            raise _bad(where, name, "a string", value)
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise _bad(where, name, "a list of strings", value)
        return tuple(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise _bad(where, name, "an object", value)
        return dict(value)
    raise TypeError(f"{where}: no codec for field {name!r} of type {hint!r}")  # a bug here


def decode(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """The dataclass ``cls`` from a JSON object: every field checked against its annotation;
    a field with a default may be missing; unknown fields are ignored (a newer sender's).

    Raises:
        ContractError: ``data`` is no object, a field without a default is missing, or a
            value has the wrong type (an enum field: a value the enum does not know).
    """
    if not isinstance(data, Mapping):
        raise ContractError(f"{where}: must be an object, got {quote(data)}")
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]  # T: any dataclass
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ContractError(f"{where}: field {f.name!r} is missing")
            continue
        values[f.name] = _check(where, f.name, hints[f.name], data[f.name])
    return cls(**values)


def encode(record: Any) -> dict[str, Any]:
    """The JSON object of a dataclass :func:`decode` reads back (tuples as lists, enums as
    their values)."""
    out = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if isinstance(value, Enum):
            value = value.value
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def json_safe(value: Any) -> Any:
    """JSON-safe copy: NaN/inf become None (JSON has no NaN), numpy/torch scalars plain."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return json_safe(value.item())
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


# ---- string values of a Redis hash or stream entry --------------------------------------
def text(fields: Mapping[str, str], name: str, where: str) -> str:
    """A required string value."""
    value = fields.get(name)
    if value is None:
        raise ContractError(f"{where}: field {name!r} is missing")
    return value


def text_or_none(fields: Mapping[str, str], name: str) -> str | None:
    """An optional string value ("" and absent: None)."""
    return fields.get(name) or None


def text_int(fields: Mapping[str, str], name: str, where: str, default: int | None = None) -> int:
    """An integer written as text; ``default`` when absent or "" (none: required)."""
    value = fields.get(name)
    if not value:
        if default is None:
            raise ContractError(f"{where}: field {name!r} is missing")
        return default
    try:
        return int(value)
    except ValueError:
        raise _bad(where, name, "an integer", value) from None


def text_list(
    fields: Mapping[str, str], name: str, where: str, required: bool = True
) -> tuple[str, ...]:
    """A JSON list of strings written as text (not ``required``: absent or "" is empty)."""
    value = fields.get(name)
    if not value:
        if required:
            raise ContractError(f"{where}: field {name!r} is missing")
        return ()
    try:
        items = json.loads(value)
    except ValueError:
        raise _bad(where, name, "a JSON list of strings", value) from None
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise _bad(where, name, "a JSON list of strings", value)
    return tuple(items)
