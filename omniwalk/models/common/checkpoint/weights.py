"""Checkpoint names -> our modules.

Our module trees mirror the published checkpoints' names (``thinker.audio_tower.*``,
``thinker.model.layers.N.*``, ``talker.*`` ...) with one exception:
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

import contextlib
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from omniwalk.errors import CheckpointError
from omniwalk.layers import fp8
from omniwalk.layers.fp8 import DEFAULT_BLOCK, Block

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_FUSED = re.compile(r"^(?P<stem>.*\.experts)\.(?P<kind>gate_up_proj|down_proj)(?P<scale>_scale_inv)?$")
SCALE = "_scale_inv"  # an FP8 weight's scales: "<name>.weight" -> "<name>.weight_scale_inv"


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
    stem, suffix = m["stem"], "weight" + (m["scale"] or "")
    if m["scale"] and m["kind"] == "gate_up_proj":  # FP8 scales [E, 2 (gate, up), rows, cols]
        num_experts, _, rows, cols = shape
        for e in range(num_experts):
            yield f"{stem}.{e}.gate_proj.{suffix}", (rows, cols), (e, 0)
            yield f"{stem}.{e}.up_proj.{suffix}", (rows, cols), (e, 1)
        return
    num_experts, rows, cols = shape
    for e in range(num_experts):
        if m["kind"] == "down_proj":
            yield f"{stem}.{e}.down_proj.{suffix}", (rows, cols), (e, slice(0, rows))
        else:
            half = rows // 2
            yield f"{stem}.{e}.gate_proj.{suffix}", (half, cols), (e, slice(0, half))
            yield f"{stem}.{e}.up_proj.{suffix}", (half, cols), (e, slice(half, rows))


def _expected(module: nn.Module, prefix: str) -> dict[str, tuple[str, tuple[int, ...], tuple]]:
    """checkpoint name -> (our parameter name, shape, slice) for every parameter of ``module``."""
    out = {}
    for name, param in module.named_parameters():
        for ckpt_name, shape, where in to_checkpoint_names(name, param.shape):
            out[prefix + ckpt_name] = (name, shape, where)
    return out


def _check_names(expected: dict, files: dict, prefix: str, ckpt_dir) -> None:
    """Every expected tensor in ``files`` (but FP8 scales made here) and none under ``prefix`` left over
    (but FP8 scales read with their weights), else a ``CheckpointError`` naming them."""
    made = {n for n in expected if n.endswith(SCALE) and n not in files}  # (quantised here, if the weight is not FP8)
    read = {n for n in files if n.endswith(SCALE) and n not in expected and n.removesuffix(SCALE) in expected}
    missing = sorted(set(expected) - set(files) - made)
    if missing:
        raise CheckpointError(f"{ckpt_dir}: missing {len(missing)} tensor(s): {_names(missing)}")
    unexpected = sorted(n for n in set(files) - set(expected) - read if n.startswith(prefix))
    if unexpected:
        raise CheckpointError(f"{ckpt_dir}: unexpected {len(unexpected)} tensor(s): {_names(unexpected)}")


def load_weights(module: nn.Module, ckpt_dir: str | Path, prefix: str = "", block: Block = DEFAULT_BLOCK) -> None:
    """Fill every parameter of ``module`` in place (its device and dtype) from the checkpoint
    tensors named ``prefix + name``. Missing or mis-shaped tensors are errors naming the key(s)
    and file; so are checkpoint tensors under ``prefix`` that no parameter takes.

    FP8 (``quantization.py``): a weight FP8 in ``module`` but not in the checkpoint is quantised
    as it is read (its scales made with ``block``); one FP8 in the checkpoint but not in
    ``module`` is dequantised (its scales read with its weight, in the checkpoint's ``block``)."""
    files = checkpoint_files(ckpt_dir)
    expected = _expected(module, prefix)
    _check_names(expected, files, prefix, ckpt_dir)
    params = dict(module.named_parameters())
    by_file: dict[Path, list[str]] = {}
    for ckpt_name in expected:
        if not ckpt_name.endswith(SCALE):  # (scales are read with their weights)
            by_file.setdefault(files[ckpt_name], []).append(ckpt_name)
    with contextlib.ExitStack() as stack:
        handles: dict[Path, object] = {}

        def get(name: str) -> torch.Tensor:
            path = files.get(name)
            if path is None:
                raise CheckpointError(f"{ckpt_dir}: {name.removesuffix(SCALE)} is FP8 but {name} is missing")
            if path not in handles:
                handles[path] = stack.enter_context(_open(path))
            try:
                return handles[path].get_tensor(name)
            except (SafetensorError, OSError, ValueError) as e:
                raise CheckpointError(f"{path}: cannot read {name} (truncated file?): {e}") from None

        def target(name: str) -> torch.Tensor:
            ours, _, (expert, rows) = expected[name]
            return params[ours] if expert is None else params[ours][expert, rows]

        for path, names in by_file.items():
            for ckpt_name in names:
                tensor, shape = get(ckpt_name), expected[ckpt_name][1]
                if tuple(tensor.shape) != shape:
                    raise CheckpointError(f"{path}: {ckpt_name} has shape {tuple(tensor.shape)}, expected {shape}")
                scale = ckpt_name + SCALE if ckpt_name.endswith(".weight") else None
                param_scale = target(scale) if scale in expected else None
                _fill(target(ckpt_name), tensor, param_scale, functools.partial(get, scale), block)


@torch.no_grad()
def _fill(
    param: torch.Tensor, tensor: torch.Tensor, param_scale: torch.Tensor | None, read_scale, block: Block
) -> None:
    """Copy a checkpoint tensor into a parameter (a view), converting between FP8 and not."""
    if tensor.dtype == fp8.FP8 and param.dtype == fp8.FP8:
        param.copy_(tensor)
        scale = read_scale()
        if tuple(scale.shape) != tuple(param_scale.shape):
            raise CheckpointError(f"FP8 scales of shape {tuple(scale.shape)}, expected {tuple(param_scale.shape)}")
        param_scale.copy_(scale)
    elif param.dtype == fp8.FP8:
        q, scale = fp8.quantize(tensor.to(param.device), block)
        param.copy_(q)
        param_scale.copy_(scale)
    elif tensor.dtype == fp8.FP8:
        scale = read_scale()
        if tuple(scale.shape) != fp8.grid(tensor.shape, block):
            raise CheckpointError(f"FP8 scales of shape {tuple(scale.shape)}, expected {fp8.grid(tensor.shape, block)}")
        param.copy_(fp8.dequantize(tensor, scale, block, param.dtype))
    else:
        param.copy_(tensor)


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")
