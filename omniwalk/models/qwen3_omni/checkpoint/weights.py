"""Checkpoint names -> our modules.

Our module tree mirrors the published checkpoint's names (``thinker.audio_tower.*``,
``thinker.model.layers.N.*``, ``talker.code_predictor.*``, ``code2wav.*``) with one exception:
MoE experts are stored per expert in the checkpoint but fused in our modules, because grouped
GEMMs want one tensor per projection:

    checkpoint                                      ours
    ...mlp.experts.E.gate_proj.weight [I, H]  ┐
    ...mlp.experts.E.up_proj.weight   [I, H]  ┴─►   ...mlp.experts.gate_up_proj [E, 2I, H]  (gate rows first)
    ...mlp.experts.E.down_proj.weight [H, I]   ─►   ...mlp.experts.down_proj    [E, H, I]

``to_checkpoint_names`` is the inverse view, used by ``make-tiny`` to write checkpoints from a
module tree and by the parameter count. Loading reads tensors one at a time from the
safetensors files (memory-mapped), casts and places each directly on its target device, so the
model is never materialised on the CPU in fp32.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from omniwalk.errors import CheckpointError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_FUSED = re.compile(r"^(?P<stem>.*\.experts)\.(?P<kind>gate_up_proj|down_proj)$")


def checkpoint_files(ckpt_dir: str | Path) -> dict[str, Path]:
    """Map every tensor name to the safetensors file that holds it (single file or sharded)."""
    ckpt_dir = Path(ckpt_dir)
    index = ckpt_dir / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index}: malformed index ({e})") from None
        return {name: ckpt_dir / file for name, file in weight_map.items()}
    single = ckpt_dir / SINGLE_FILE
    if not single.exists():
        raise CheckpointError(f"{ckpt_dir}: no {SINGLE_FILE} or {INDEX_FILE}")
    with _open(single) as f:
        return {name: single for name in f.keys()}


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: shard named in the index does not exist") from None
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable safetensors file (truncated or corrupt?): {e}") from None


def to_checkpoint_names(name: str, shape: torch.Size) -> Iterator[tuple[str, tuple[int, ...], tuple]]:
    """Yield (checkpoint name, checkpoint shape, (expert, row slice)) for one of our parameters.

    Unfused parameters map to themselves with slice ``(None, None)``.
    """
    m = _FUSED.match(name)
    if not m:
        yield name, tuple(shape), (None, None)
        return
    num_experts, rows, cols = shape
    stem = m["stem"]
    for e in range(num_experts):
        if m["kind"] == "down_proj":
            yield f"{stem}.{e}.down_proj.weight", (rows, cols), (e, slice(0, rows))
        else:
            half = rows // 2
            yield f"{stem}.{e}.gate_proj.weight", (half, cols), (e, slice(0, half))
            yield f"{stem}.{e}.up_proj.weight", (half, cols), (e, slice(half, rows))


def _expected(module: nn.Module, prefix: str) -> dict[str, tuple[str, tuple[int, ...], tuple]]:
    """checkpoint name -> (our parameter name, shape, slice) for every parameter of ``module``."""
    out = {}
    for name, param in module.named_parameters():
        for ckpt_name, shape, where in to_checkpoint_names(name, param.shape):
            out[prefix + ckpt_name] = (name, shape, where)
    return out


def load_weights(
    module: nn.Module,
    ckpt_dir: str | Path,
    prefix: str = "",
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    strict_unused: bool = False,
) -> None:
    """Fill every parameter of ``module`` from the checkpoint tensors named ``prefix + name``.

    Missing or mis-shaped tensors are errors naming the key(s) and file. Checkpoint tensors
    under ``prefix`` that no parameter takes are errors too; with ``strict_unused`` the same holds
    for tensors outside ``prefix`` (used when loading a whole model). ``module`` may live on the
    meta device: parameters are then created on ``device``.
    """
    files = checkpoint_files(ckpt_dir)
    expected = _expected(module, prefix)
    missing = sorted(set(expected) - set(files))
    if missing:
        raise CheckpointError(f"{ckpt_dir}: missing {len(missing)} tensor(s): {_names(missing)}")
    unexpected = sorted(n for n in set(files) - set(expected) if strict_unused or n.startswith(prefix))
    if unexpected:
        raise CheckpointError(f"{ckpt_dir}: unexpected {len(unexpected)} tensor(s): {_names(unexpected)}")
    targets = {}  # parameters are filled in place unless they live on meta or change dtype
    for name, param in module.named_parameters():
        target_device = device if device is not None else param.device
        if str(target_device) == "meta":
            raise CheckpointError("load_weights needs a device when the module lives on the meta device")
        if param.device == torch.device(target_device) and dtype in (None, param.dtype):
            targets[name] = param.data
        else:
            targets[name] = torch.empty(param.shape, dtype=dtype or param.dtype, device=target_device)
    by_file: dict[Path, list[str]] = {}
    for ckpt_name in expected:
        by_file.setdefault(files[ckpt_name], []).append(ckpt_name)
    for path, names in by_file.items():
        with _open(path) as f:
            for ckpt_name in names:
                ours, shape, (expert, rows) = expected[ckpt_name]
                try:
                    tensor = f.get_tensor(ckpt_name)
                except (SafetensorError, OSError, ValueError) as e:
                    raise CheckpointError(f"{path}: cannot read {ckpt_name} (truncated file?): {e}") from None
                if tuple(tensor.shape) != shape:
                    raise CheckpointError(f"{path}: {ckpt_name} has shape {tuple(tensor.shape)}, expected {shape}")
                dest = targets[ours] if expert is None else targets[ours][expert, rows]
                dest.copy_(tensor)
    params = dict(module.named_parameters())
    for name, value in targets.items():
        if value is not params[name].data:
            _set_parameter(module, name, value)


def _set_parameter(module: nn.Module, name: str, value: torch.Tensor) -> None:
    *path, leaf = name.split(".")
    owner = module.get_submodule(".".join(path)) if path else module
    setattr(owner, leaf, nn.Parameter(value, requires_grad=False))


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")
