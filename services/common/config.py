"""Configuration base: pydantic models validated at the edge (CLI, REST body, YAML, env).

Every service config subclasses :class:`StrictConfig`, so an unknown key is an error that
names it, and a bad value is an error that names the field path and the value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from streamrec.errors import BadRequest

C = TypeVar("C", bound="StrictConfig")


class StrictConfig(BaseModel):
    """A pydantic model that refuses unknown fields and re-validates on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)

    @classmethod
    def parse(cls: type[C], data: Any, source: str = "config") -> C:
        """Validates ``data``; raises :class:`BadRequest` naming each bad field and value."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise BadRequest(f"invalid {source}: {describe_validation_error(exc)}") from exc

    @classmethod
    def from_yaml(cls: type[C], path: str | Path) -> C:
        return cls.parse(read_yaml_mapping(path), source=str(path))


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The mapping at the top of a YAML file; :class:`BadRequest` naming the file otherwise."""
    text = Path(path).read_text()
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise BadRequest(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def describe_validation_error(exc: ValidationError) -> str:
    """One line per error: ``field.path: message (got value)``."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        value = err.get("input")
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        parts.append(f"{loc}: {err['msg']} (got {shown})")
    return "; ".join(parts)
