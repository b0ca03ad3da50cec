"""Where each stage of a model runs: ``ModelConfig.placement`` parsed once, and shifted per replica.

    placement = "thinker=cuda:0,talker=cuda:1,vocoder=cuda:1"   stages not named run on ``device``

``parse_placement`` checks the syntax and the devices (torch devices of the same type as
``device``: a model runs either on CUDA or on the CPU, since its backends are chosen for one);
the model family checks the stage names (``check_stages``), since only it knows them, and that
each CUDA device exists (``check_devices_exist``, in the process that loads the model).

A replica of a data-parallel server (``replica_options``) and a tensor-parallel rank
(``rank_options``) run the same placement shifted to devices of their own: every CUDA index i
becomes ``i + offset``, so one replica's group of GPUs never overlaps another's.
"""

from __future__ import annotations

import torch

from omniwalk.errors import ConfigError


def parse_placement(text: str, device: str) -> dict[str, str]:
    """``"stage=device,..."`` -> {stage: device}; "" -> {} (every stage on ``device``)."""
    placed: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        stage, sep, where = (s.strip() for s in item.partition("="))
        if not sep or not stage or not where:
            raise ConfigError(f"placement: {item!r} is not STAGE=DEVICE (e.g. thinker=cuda:0,talker=cuda:1)")
        if stage in placed:
            raise ConfigError(f"placement: stage {stage!r} is placed twice")
        try:
            kind = torch.device(where).type
        except RuntimeError:
            raise ConfigError(f"placement: {where!r} (stage {stage!r}) is not a torch device") from None
        if kind != torch.device(device).type:
            raise ConfigError(
                f"placement: {stage}={where} is not a {torch.device(device).type} device like --device {device!r}; "
                "a model's stages all run on CUDA or all on the CPU"
            )
        placed[stage] = where
    return placed


def check_stages(placed: dict[str, str], stages: tuple[str, ...]) -> None:
    unknown = sorted(set(placed) - set(stages))
    if unknown:
        raise ConfigError(f"placement names unknown stage(s) {unknown}; this model's stages: {list(stages)}")


def check_devices_exist(devices) -> None:
    """Every CUDA device named exists on this machine (a ConfigError naming the first that does not)."""
    for d in map(torch.device, devices):
        if d.type != "cuda":
            continue
        count = torch.cuda.device_count()
        if (d.index or 0) >= count:
            raise ConfigError(f"device {d} does not exist: this machine has {count} CUDA device(s)")


def cuda_indices(device: str, placed: dict[str, str]) -> set[int]:
    """The CUDA device indices one engine uses (``cuda`` without an index is ``cuda:0``)."""
    return {torch.device(d).index or 0 for d in (device, *placed.values()) if torch.device(d).type == "cuda"}


def shifted(device: str, offset: int) -> str:
    d = torch.device(device)
    return device if d.type != "cuda" or offset == 0 else f"cuda:{(d.index or 0) + offset}"


def shift_options(options: dict, offset: int) -> dict:
    """Engine options (``Omni`` keywords) with every CUDA device index moved up by ``offset``."""
    device = options.get("device", "cpu")
    placed = parse_placement(options.get("placement", ""), device)
    placement = ",".join(f"{stage}={shifted(where, offset)}" for stage, where in placed.items())
    return {**options, "device": shifted(device, offset), "placement": placement}


def group_size(options: dict) -> int:
    """GPUs one engine (all its tensor-parallel ranks) spans: the placement's CUDA devices, from the
    lowest to the highest index, times the ranks (rank r runs on the placement shifted by r * span)."""
    device = options.get("device", "cpu")
    indices = cuda_indices(device, parse_placement(options.get("placement", ""), device))
    span = max(indices) - min(indices) + 1 if indices else 0
    return span * options.get("tensor_parallel", 1)


def rank_options(options: dict, rank: int) -> dict:
    """A tensor-parallel rank's engine options: the placement shifted past the ranks before it."""
    return shift_options(options, rank * group_size({**options, "tensor_parallel": 1}))


def replica_options(options: dict, replica: int) -> dict:
    """A data-parallel replica's engine options: its devices after those of the replicas before it."""
    return shift_options(options, replica * group_size(options))
