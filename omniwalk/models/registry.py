"""Model families by the architecture a checkpoint names (``config.json`` ``architectures``).

Entries are import paths, imported on first use. A family outside this repository plugs in as
an installed package with an entry point in the ``omniwalk.families`` group (name: the
architecture, value: ``module:Class``), so adding one edits nothing here.
"""

from __future__ import annotations

import importlib
import json
from importlib.metadata import entry_points
from pathlib import Path

from omniwalk.errors import ConfigError
from omniwalk.models.family import ModelFamily

BUILTIN = {"Qwen3OmniMoeForConditionalGeneration": "omniwalk.models.qwen3_omni.family:Qwen3OmniFamily"}
DEFAULT_ARCHITECTURE = "Qwen3OmniMoeForConditionalGeneration"  # the embedded tiny model's family
GROUP = "omniwalk.families"


def families() -> dict[str, str]:
    """Architecture -> ``module:Class``: the built-in families, then the installed ones."""
    return {**BUILTIN, **{ep.name: ep.value for ep in entry_points(group=GROUP)}}


def family_class(source: str | Path | dict) -> type[ModelFamily]:
    """The family of a checkpoint directory, a config.json path or its parsed dict."""
    if isinstance(source, dict):
        where, config = "config", source
    else:
        path = Path(source) / "config.json" if Path(source).is_dir() else Path(source)
        where = str(path)
        try:
            config = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"no config.json at {path}") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from None
    names, known = config.get("architectures") or [], families()
    for name in names:
        if name in known:
            return load(known[name])
    raise ConfigError(f"{where}: architectures {names} name no model family known here; known: {sorted(known)}")


def family_for_config(config: str | Path) -> type[ModelFamily]:
    """The family of a config.json (or checkpoint directory), or the one that ships a preset of this name."""
    if Path(config).exists():
        return family_class(config)
    for path in families().values():
        if str(config) in load(path).presets:
            return load(path)
    raise ConfigError(f"{config}: no such config.json, and no model family has a preset of that name")


def default_family() -> type[ModelFamily]:
    return load(families()[DEFAULT_ARCHITECTURE])


def load(path: str) -> type[ModelFamily]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
