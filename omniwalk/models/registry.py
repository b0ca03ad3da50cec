"""Model families by the architecture a checkpoint names (``config.json`` ``architectures``).

A family is a module (a package's ``__init__``) that defines ``Family`` (its ``ModelFamily``,
which may be imported lazily) and optionally ``Options`` (a frozen dataclass: its config section,
whose fields become ``Omni`` keywords and ``omniwalk serve`` flags), ``PRESETS`` (name ->
config.json path) and ``ANCHORS`` (served model name -> published figures of other systems,
drawn in ``omniwalk bench`` charts). Entries are module names, imported on first use;
``Options``, ``PRESETS`` and ``ANCHORS`` must be importable without torch (``omniwalk --help``).
A family outside this repository plugs in as an installed package with an entry point in the
``omniwalk.families`` group (name: the architecture, value: its module), so adding one edits
nothing here.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from omniwalk.errors import ConfigError
from omniwalk.models.family import ModelFamily
from omniwalk.models.json_fields import read_config

BUILTIN = {
    "Qwen3OmniMoeForConditionalGeneration": "omniwalk.models.qwen3_omni",
    "Qwen2_5OmniForConditionalGeneration": "omniwalk.models.qwen2_5_omni",
    "Qwen2_5OmniModel": "omniwalk.models.qwen2_5_omni",  # the name early Qwen2.5-Omni configs carry
}
DEFAULT_ARCHITECTURE = "Qwen3OmniMoeForConditionalGeneration"  # the embedded tiny model's family
GROUP = "omniwalk.families"


def families() -> dict[str, str]:
    """Architecture -> module: the built-in families, then the installed ones."""
    return {**BUILTIN, **{ep.name: ep.value for ep in entry_points(group=GROUP)}}


def family_module(source: str | Path | dict) -> ModuleType:
    """The family of a checkpoint directory, a config.json path or its parsed dict."""
    names, known = read_config(source).get("architectures") or [], families()
    for name in names:
        if name in known:
            return importlib.import_module(known[name])
    where = "config" if isinstance(source, dict) else str(source)
    raise ConfigError(f"{where}: architectures {names} name no model family known here; known: {sorted(known)}")


def family_class(source: str | Path | dict) -> type[ModelFamily]:
    return family_module(source).Family


def options_class(source: str | Path | dict) -> type | None:
    return getattr(family_module(source), "Options", None)


def default_family() -> ModuleType:
    return importlib.import_module(families()[DEFAULT_ARCHITECTURE])


def family_for_config(config: str | Path) -> ModuleType:
    """The family of a config.json (or checkpoint directory), or the one that ships a preset of this name."""
    family = family_with_preset(str(config)) if not Path(config).exists() else family_module(config)
    if family is None:
        raise ConfigError(f"{config}: no such config.json, and no model family has a preset of that name")
    return family


def family_with_preset(name: str) -> ModuleType | None:
    modules = [importlib.import_module(m) for m in dict.fromkeys(families().values())]
    return next((m for m in modules if name in getattr(m, "PRESETS", {})), None)


def family_modules() -> list:
    """Every known family's package module, each once (imported: light, see each ``__init__``)."""
    return [importlib.import_module(name) for name in dict.fromkeys(families().values())]


def bench_anchors(model: str) -> dict:
    """The anchor figures a family ships for the served model name ``model`` (none: {})."""
    modules = family_modules()
    return next((m.ANCHORS[model] for m in modules if model in getattr(m, "ANCHORS", {})), {})


def codec_frames_per_second(model: str) -> float:
    """Codec frames per second of speech out for the served model name ``model``: the first family's
    ``CODEC_FRAMES_PER_SECOND`` entry whose key prefixes it (12.5, the bench presets' unit, if none)."""
    modules = family_modules()
    rates = (
        r
        for m in modules
        for prefix, r in getattr(m, "CODEC_FRAMES_PER_SECOND", {}).items()
        if model.startswith(prefix)
    )
    return next(rates, 12.5)


def all_options() -> list[type]:
    """Every known family's ``Options`` (the CLI makes flags of their fields)."""
    modules = family_modules()
    return [m.Options for m in modules if getattr(m, "Options", None) is not None]
