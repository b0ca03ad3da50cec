"""The processes of a tensor-parallel engine: rank 0 is the engine (``Omni``), ranks 1..W-1 are
workers it starts, each holding its share of the thinker and following rank 0's steps.

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
import signal
import subprocess
import sys
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from omniwalk.parallel import ranks
from omniwalk.parallel.lockstep import Follower, Leader
from omniwalk.parallel.placement import rank_options

# How long a collective may wait. The control broadcast waits for rank 0's next step, which an idle
# server may not take for hours: so, long (a dead peer is noticed at once through its closed socket).
COLLECTIVE_TIMEOUT = timedelta(days=365)
# NVLink multicast stays off (in NCCL, and in PyTorch's symmetric memory and NVSHMEM, which may use it too):
# the GPU hosts we run on forbid it, since a program using it can take a host's shared GPUs out of service
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def start_ranks(options: dict) -> Leader:
    """In rank 0: start ranks 1..W-1 on ``options`` (``Omni`` keywords) and join their group.

    The workers are plain subprocesses (``python -m omniwalk.parallel.worker``), not multiprocessing
    children: rank 0 is itself a daemonic child in a server (the engine process), which may have none.
    One that outlives rank 0 stops when its collectives find rank 0's sockets closed."""
    world = options.get("tensor_parallel", 1)
    os.environ.update(NCCL_ENV)  # (rank 0's own NCCL)
    store = Path(tempfile.mkdtemp(prefix="omniwalk-tp-")) / "store"
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "omniwalk.parallel.worker",
                str(r),
                str(world),
                f"file://{store}",
                json.dumps(options),
            ],
            env={**os.environ, **NCCL_ENV},
        )
        for r in range(1, world)
    ]
    join_group(0, world, f"file://{store}", options)
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


def serve_rank(rank: int, world: int, init_method: str, options: dict) -> None:
    """Process entry point of rank ``rank`` > 0: join the group, build this rank's engine, follow rank 0."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (rank 0 stops this process; a terminal's Ctrl-C is its)
    try:
        join_group(rank, world, init_method, options)
        from omniwalk.omni import Omni

        omni = Omni(**rank_options(options, rank))
        Follower(omni).run()
    except Exception:  # noqa: BLE001 - rank 0 sees its collectives fail and reports the engine's failure
        traceback.print_exc()
        sys.exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    serve_rank(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]))
