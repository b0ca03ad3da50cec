"""Model families by the architecture a checkpoint names (``config.json`` ``architectures``).

Entries are import paths, imported on first use. A family outside this repository plugs in as
an installed package with an entry point in the ``omniwalk.families`` group (name: the
architecture, value: ``module:Class``), so adding one edits nothing here.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from pathlib import Path

from omniwalk.errors import ConfigError
from omniwalk.models.family import ModelFamily
from omniwalk.models.json_fields import read_config

BUILTIN = {"Qwen3OmniMoeForConditionalGeneration": "omniwalk.models.qwen3_omni.family:Qwen3OmniFamily"}
DEFAULT_ARCHITECTURE = "Qwen3OmniMoeForConditionalGeneration"  # the embedded tiny model's family
GROUP = "omniwalk.families"


def families() -> dict[str, str]:
    """Architecture -> ``module:Class``: the built-in families, then the installed ones."""
    return {**BUILTIN, **{ep.name: ep.value for ep in entry_points(group=GROUP)}}


def family_class(source: str | Path | dict) -> type[ModelFamily]:
    """The family of a checkpoint directory, a config.json path or its parsed dict."""
    names, known = read_config(source).get("architectures") or [], families()
    for name in names:
        if name in known:
            return load(known[name])
    where = "config" if isinstance(source, dict) else str(source)
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
