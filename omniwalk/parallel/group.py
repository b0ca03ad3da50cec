"""The process group of a tensor-parallel engine: rank 0 is the engine (``Omni``), ranks 1..W-1 are
workers it starts (``parallel/worker.py``), each holding its share of the thinker and following
rank 0's steps.

    leader = start_ranks(options)   # in rank 0, before its model loads: spawns the workers, joins the group
    ... Omni builds its share; the workers build theirs and run lockstep.Follower
    leader.close()                  # the workers stop; the group is destroyed

The ranks form torch.distributed's default group (gloo on the CPU, NCCL on CUDA) and a gloo
group for the per-step control messages (host objects); rank r's current CUDA device is its
``device``, and it runs on the placement shifted past the ranks before it
(``placement.rank_options``). NVLink multicast (NVLS) stays off: ``NCCL_NVLS_ENABLE=0`` is put in
the workers' environment (and rank 0's own) before NCCL starts; it is not a user setting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from omniwalk.parallel import ranks
from omniwalk.parallel.lockstep import Leader
from omniwalk.parallel.placement import rank_options

# How long a collective may wait. The control broadcast waits for rank 0's next step, which an idle
# server may not take for hours: so, long (a dead peer is noticed at once through its closed socket).
COLLECTIVE_TIMEOUT = timedelta(days=365)
# NVLink multicast stays off (in NCCL, and in PyTorch's symmetric memory and NVSHMEM, which may use it too):
# the GPU hosts we run on forbid it, since a program using it can take a host's shared GPUs out of service
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
WORKER = "omniwalk.parallel.worker"  # the workers' module (run with ``python -m``; this module never imports it)


def start_ranks(options: dict) -> Leader:
    """In rank 0: start ranks 1..W-1 on ``options`` (``Omni`` keywords) and join their group.

    The workers are plain subprocesses (``python -m omniwalk.parallel.worker``), not multiprocessing
    children: rank 0 is itself a daemonic child in a server (the engine process), which may have none.
    One that outlives rank 0 stops when its collectives find rank 0's sockets closed."""
    world = options.get("tensor_parallel", 1)
    os.environ.update(NCCL_ENV)  # (rank 0's own NCCL)
    store = Path(tempfile.mkdtemp(prefix="omniwalk-tp-")) / "store"
    init_method = f"file://{store}"
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", WORKER, str(r), str(world), init_method, json.dumps(options)],
            env={**os.environ, **NCCL_ENV},
        )
        for r in range(1, world)
    ]
    join_group(0, world, init_method, options)
    return Leader(workers, store.parent)


def join_group(rank: int, world: int, init_method: str, options: dict) -> None:
    device = torch.device(rank_options(options, rank).get("device", "cpu"))
    cuda = device.type == "cuda"
    if cuda:  # (NCCL binds a communicator to each device its collectives' tensors are on, lazily)
        torch.cuda.set_device(device.index or 0)  # ("cuda" without an index is cuda:0, as in placement.py)
    dist.init_process_group(
        "nccl" if cuda else "gloo", init_method=init_method, rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT
    )
    ranks.set_control_group(dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT))
