"""Reading raw JSON config dicts into typed values, with errors that name the field's path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omniwalk.errors import ConfigError

MISSING = object()


def read_config(source: str | Path | dict) -> dict:
    """A checkpoint directory's config.json, a config.json path, or an already parsed dict."""
    if isinstance(source, dict):
        return source
    path = Path(source) / "config.json" if Path(source).is_dir() else Path(source)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no config.json at {path}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None


class Section:
    """A dict with the JSON path it came from, so errors can name the exact field."""

    def __init__(self, data: dict, path: str):
        if not isinstance(data, dict):
            raise ConfigError(f"{path or 'config'}: expected an object, got {type(data).__name__}")
        self.data, self.path = data, path

    def name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, default: Any = MISSING, kind: type | tuple = (int, float, bool, str, list, dict)):
        if key not in self.data or self.data[key] is None:
            if default is MISSING:
                raise ConfigError(f"{self.name(key)} is required but missing")
            return default
        value = self.data[key]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{self.name(key)} must be an integer, got {value!r}")
        if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"{self.name(key)} must be a number, got {value!r}")
        if kind not in (int, float) and not isinstance(value, kind):
            raise ConfigError(f"{self.name(key)} has the wrong type: {value!r}")
        return float(value) if kind is float else value

    def int(self, key: str, default: Any = MISSING, minimum: int = 1) -> int:
        value = self.get(key, default, int)
        if value < minimum:
            raise ConfigError(f"{self.name(key)} must be >= {minimum}, got {value}")
        return value

    def float(self, key: str, default: Any = MISSING) -> float:
        return self.get(key, default, float)

    def bool(self, key: str, default: Any = MISSING) -> bool:
        return bool(self.get(key, default, (bool, int)))

    def ints(self, key: str, default: Any = MISSING) -> tuple[int, ...]:
        value = self.get(key, default, (list, tuple))
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{self.name(key)} must be a list of integers, got {value!r}")
        return tuple(value)

    def section(self, key: str) -> Section:
        return Section(self.get(key, kind=dict), self.name(key))
