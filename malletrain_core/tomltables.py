"""A TOML table checked against a frozen dataclass: one typed value per field, unknown keys
rejected by name. What :mod:`.config` builds MalleTrain's settings with; nothing here knows
them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, get_type_hints

from .errors import ConfigError


def _convert(value: Any, typ: Any, where: str) -> Any:
    """Check (and gently coerce) one TOML value against the field's type."""
    origin = getattr(typ, "__origin__", None)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif typ is str:
        if isinstance(value, str):
            return value
    elif origin is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        return _bad(where, value, "a list of strings")
    elif origin in (Mapping, dict) or typ is Mapping:
        if isinstance(value, dict) and all(isinstance(v, int) and not isinstance(v, bool)
                                           for v in value.values()):
            return dict(value)
        return _bad(where, value, "a table of whole numbers")
    return _bad(where, value, getattr(typ, "__name__", str(typ)))


def _bad(where: str, value: Any, expected: str) -> Any:
    article = "" if expected.startswith("a ") else "an " if expected[0] in "aeiou" else "a "
    raise ConfigError(f"{where}: {value!r} is not {article}{expected}")


def dataclass_from_table(cls: type, table: Mapping[str, Any], where: str) -> Any:
    """An instance of dataclass ``cls`` from ``table``; ConfigError naming ``where`` and the
    valid keys for an unknown key, and the expected type for a value of another."""
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in table.items():
        if key not in hints:
            raise ConfigError(f"{where}: unknown key {key!r}; valid keys: {', '.join(names)}")
        values[key] = _convert(value, hints[key], f"{where}.{key}")
    return cls(**values)


def positive(*named: tuple[str, float], unit: str = "") -> None:
    """ConfigError naming the first of ``named`` (key, value) that is not a finite number > 0."""
    for name, value in named:
        if not value > 0 or not math.isfinite(value):
            what = f"a finite number of {unit} > 0" if unit else "a finite number > 0"
            raise ConfigError(f"{name}: {value!r} must be {what}")
