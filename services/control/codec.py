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
from collections.abc import Iterable, Mapping
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


def text_float(
    fields: Mapping[str, str], name: str, where: str, default: float | None = None
) -> float:
    """A finite number written as text; ``default`` when absent or "" (none: required)."""
    value = fields.get(name)
    if not value:
        if default is None:
            raise ContractError(f"{where}: field {name!r} is missing")
        return default
    return float(_from_text(where, name, float, value))


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


# ---- a dataclass as the string values of a Redis hash -------------------------------------
#: Field metadata of a float written as a time: unix seconds with 3 decimals
#: (``"1764270000.123"``); any other float is written as its ``repr``, an int as decimal.
TIME: Mapping[str, str] = types.MappingProxyType({"text": "time"})


def _optional(hint: Any) -> tuple[Any, bool]:
    """(the annotation without its ``| None``, whether it had one)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        (inner,) = [o for o in options if o is not type(None)]
        return inner, type(None) in options
    return hint, False


def _to_text(where: str, f: dataclasses.Field[Any], hint: Any, value: Any) -> str:
    base, optional = _optional(hint)
    if value is None:
        if not optional:
            raise _bad(where, f.name, "set", value)
        return ""
    if isinstance(base, type) and issubclass(base, Enum):
        return str(_check(where, f.name, base, value).value)
    if base is str:
        return str(_check(where, f.name, str, value))
    if base is bool:
        return "true" if _check(where, f.name, bool, value) else "false"
    if base is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # a count a JSON report carried as 12.0
        return str(_check(where, f.name, int, value))
    if base is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _bad(where, f.name, "a number", value)
        if not math.isfinite(value):
            raise _bad(where, f.name, "a finite number", value)
        if f.metadata.get("text") == "time":
            return f"{value:.3f}"
        return str(value) if isinstance(value, int) else repr(float(value))
    return json.dumps(list(_check(where, f.name, base, value)))


def to_text(record: Any, names: Iterable[str] | None = None) -> dict[str, str]:
    """The hash fields of a dataclass that :func:`from_text` reads back (``names``: only
    those): None as "", an enum as its value, a bool as ``true`` or ``false``, an int in
    decimal, a :data:`TIME` with 3 decimals, another float as its ``repr``, a tuple of
    strings as a JSON list.

    Raises:
        ContractError: a value of the wrong type, or not finite, naming field and value.
    """
    where = type(record).__name__
    hints = _hints(type(record))
    wanted = None if names is None else set(names)
    return {
        f.name: _to_text(where, f, hints[f.name], getattr(record, f.name))
        for f in dataclasses.fields(record)
        if wanted is None or f.name in wanted
    }


def _from_text(where: str, name: str, hint: Any, raw: str) -> Any:
    base, _ = _optional(hint)
    if isinstance(base, type) and issubclass(base, Enum):
        return _check(where, name, base, raw)
    if base is bool:
        if raw not in ("true", "false"):
            raise _bad(where, name, "true or false", raw)
        return raw == "true"
    if base is int:
        try:
            return int(raw)
        except ValueError:
            pass
        try:
            number = float(raw)
        except ValueError:
            raise _bad(where, name, "an integer", raw) from None
        if not number.is_integer():  # 12.0 (a count written as a float) reads as 12
            raise _bad(where, name, "an integer", raw)
        return int(number)
    if base is float:
        try:
            number = float(raw)
        except ValueError:
            raise _bad(where, name, "a number", raw) from None
        if not math.isfinite(number):
            raise _bad(where, name, "a finite number", raw)
        return number
    if typing.get_origin(base) is tuple:
        return text_list({name: raw}, name, where)
    return raw


def from_text(cls: type[T], fields: Mapping[str, str], where: str) -> T:
    """The dataclass ``cls`` (every field with a default) from a hash's string values, the
    inverse of :func:`to_text`: a field absent or "" takes its default (what an older
    record lacks reads as its empty value); fields ``cls`` does not know are ignored.

    Raises:
        ContractError: a value that does not parse as its field's type (an enum field: a
            value the enum does not know), naming ``where``, the field and the value.
    """
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]  # T: any dataclass
        raw = fields.get(f.name)
        if raw:
            values[f.name] = _from_text(where, f.name, hints[f.name], raw)
    return cls(**values)
