"""Tuned launch configurations as data: one JSON file per kernel and GPU model,
``configs/<kernel>,device_name=<GPU>.json`` (vLLM's convention: the GPU's name as
``torch.cuda.get_device_name`` gives it, spaces as underscores), written by the kernels' tuning
benchmarks (``benchmarks/kernels/skinny_gemm.py --tune`` ...) and read on first use:

    {"device_name": "NVIDIA H200", "compute_capability": [9, 0], "written_by": "<command>",
     "configs": {"<shape key>": <config>, ...}}

A kernel states its shape keys and what a config holds (``skinny_gemm.pick_blocks``: tiles, or
"cublas" where cuBLAS measured faster). Which file a device reads (``configs``):

1. its own;
2. else the file of a GPU of the same compute capability (the same SM, the same shared memory
   per SM: its tiles compile and launch, and every tile computes the same values; they may be
   slower there), with a one-time log line naming the file;
3. else none: the kernel's generic defaults (in its code), with a one-time log line.

Tiles change speed, never results (the kernels' tests run several tiles against the reference).
The CPU (Triton's interpreter) reads no file: it takes the generic defaults, silently.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
# The paged decode's programs to fill (its split target) and the semaphores a KV store keeps for it
# (``kernels/paged_decode.py``, ``engine/kv_pages.py``); here, where both import it without Triton.
DECODE_PROGRAMS = 128
log = logging.getLogger("omniwalk.kernels")


@dataclass(frozen=True)
class Device:
    """What selects a configuration file: the GPU model's name and its compute capability (None: the CPU)."""

    name: str
    capability: tuple[int, int] | None = None


CPU = Device("cpu")


@functools.cache
def _cuda_device(index: int) -> Device:
    import torch

    return Device(torch.cuda.get_device_name(index), tuple(torch.cuda.get_device_capability(index)))


def device_of(device=None) -> Device:
    """The ``Device`` of a torch device (None: the current CUDA device where there is one, else the CPU;
    a ``Device`` as it is, e.g. a GPU named to compile for on another machine)."""
    import torch

    if isinstance(device, Device):
        return device
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type != "cuda":
        return CPU
    return _cuda_device(torch.cuda.current_device() if device.index is None else device.index)


def file_name(kernel: str, device_name: str) -> str:
    return f"{kernel},device_name={device_name.replace(' ', '_')}.json"


@functools.cache
def configs(kernel: str, device: Device, directory: Path = CONFIG_DIR) -> dict[str, Any]:
    """``kernel``'s configurations for ``device`` (keys as the kernel writes them); {} where none
    applies (the kernel's generic defaults). See the module docstring for the fallback order."""
    if device.capability is None:
        return {}
    own = directory / file_name(kernel, device.name)
    if own.exists():
        return _read(own)["configs"]
    for path in sorted(directory.glob(f"{kernel},device_name=*.json")):
        data = _read(path)
        if tuple(data["compute_capability"]) == device.capability:
            log.warning(
                "%s: no configs tuned on %s; using %s's (same compute capability %s: correct, maybe slower; "
                "tune with benchmarks/kernels/)",
                kernel,
                device.name,
                data["device_name"],
                ".".join(map(str, device.capability)),
            )
            return data["configs"]
    log.warning("%s: no configs tuned for %s; generic defaults (tune with benchmarks/kernels/)", kernel, device.name)
    return {}


def _read(path: Path) -> dict[str, Any]:
    with path.open() as f:
        return json.load(f)


def save(kernel: str, device: Device, entries: dict[str, Any], written_by: str, directory: Path = CONFIG_DIR) -> Path:
    """Write ``kernel``'s configurations for ``device`` (what the tuning benchmarks call); -> the file.
    Entries already in the file for other keys are kept."""
    if device.capability is None:
        raise ValueError("tuned configurations are per GPU model; the CPU has none")
    path = directory / file_name(kernel, device.name)
    merged = _read(path)["configs"] if path.exists() else {}
    head = {"device_name": device.name, "compute_capability": list(device.capability), "written_by": written_by}
    # one line per entry (a tuning run's diff reads as the shapes it changed)
    fields = [f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in head.items()]
    rows = [f"    {json.dumps(key)}: {json.dumps(value)}" for key, value in (merged | entries).items()]
    path.write_text("{\n" + ",\n".join(fields) + ',\n  "configs": {\n' + ",\n".join(rows) + "\n  }\n}\n")
    configs.cache_clear()  # (the kernels' own caches of converted entries stay: a process tunes, another reads)
    return path
