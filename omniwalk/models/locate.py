"""Where the checkpoint directory a ``--model`` name stands for is, read from disk only (no network).

a directory             itself
a family's preset name  a config + tokenizer skeleton written once under ``CACHE`` (no weights:
                        for ``random_weights`` runs such as benchmarks)
ORG/NAME                the snapshot in the local Hugging Face cache (``huggingface_hub``'s
                        layout: models--ORG--NAME/refs/REVISION -> snapshots/HASH/), where the
                        cache is ``hf_cache`` or the one ``huggingface_hub`` would use
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from omniwalk.errors import ConfigError

CACHE = Path.home() / ".cache" / "omniwalk"


def locate(model: str, random_weights: bool = False, hf_cache: str | None = None) -> Path:
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    from omniwalk.models.registry import family_with_preset

    family = family_with_preset(model)
    if family is not None:
        if not random_weights:
            raise ConfigError(f"--model {model} is a preset: a config without weights; add --random-weights")
        skeleton = lambda out: family.Family.make_tiny(out, model, with_weights=False)  # noqa: E731
        return written_once(CACHE / "presets" / model, skeleton, f"a config + tokenizer skeleton of {model}")
    if model.count("/") == 1 and not model.startswith((".", "/", "~")):
        return _hf_snapshot(model, Path(hf_cache).expanduser() if hf_cache else _hf_cache(), random_weights)
    raise ConfigError(f"--model {model}: no such checkpoint directory, preset, or Hugging Face model id (ORG/NAME)")


def written_once(out: Path, write: Callable[[Path], object], what: str) -> Path:
    """``out``, written by ``write`` into a temporary sibling and renamed the first time it is asked for."""
    if not (out / "config.json").exists():
        print(f"writing {what} to {out}", flush=True)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)  # a write that was interrupted
        try:
            write(tmp)
            tmp.rename(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _hf_cache() -> Path:
    """The cache ``huggingface_hub`` uses: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub"


def _hf_snapshot(repo: str, cache: Path, random_weights: bool, revision: str = "main") -> Path:
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    ref = repo_dir / "refs" / revision
    if not ref.is_file():
        raise ConfigError(
            f"--model {repo}: not in the local Hugging Face cache ({ref} is missing); download it first, "
            f"e.g. `huggingface-cli download {repo}`, or give its directory"
        )
    snapshot = repo_dir / "snapshots" / ref.read_text().strip()
    missing = [name for name in ("config.json", "tokenizer.json") if not (snapshot / name).exists()]
    if not random_weights and not any(snapshot.glob("*.safetensors")):
        missing.append("*.safetensors")
    if missing:
        raise ConfigError(f"--model {repo}: the cached snapshot {snapshot} lacks {', '.join(missing)}")
    return snapshot
