"""Process entry point of a tensor-parallel worker, rank r > 0 (``parallel/group.py`` starts it):

    python -m omniwalk.parallel.worker RANK WORLD INIT_METHOD OPTIONS_JSON

It joins the group, builds the rank's ``Omni`` (its share of the model) and follows rank 0's
steps (``lockstep.Follower``) until rank 0 stops. This module sits above ``omniwalk.omni`` (it
runs one), so nothing in the package imports it: ``omni`` reaches the group through ``group``.
"""

from __future__ import annotations

import json
import signal
import sys
import traceback

import torch.distributed as dist

from omniwalk.omni import Omni
from omniwalk.parallel.group import join_group
from omniwalk.parallel.lockstep import Follower
from omniwalk.parallel.placement import rank_options


def serve_rank(rank: int, world: int, init_method: str, options: dict) -> None:
    """Join the group, build this rank's engine, follow rank 0."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (rank 0 stops this process; a terminal's Ctrl-C is its)
    try:
        join_group(rank, world, init_method, options)
        omni = Omni(**rank_options(options, rank))
        Follower(omni).run()
    except Exception:  # noqa: BLE001 - rank 0 sees its collectives fail and reports the engine's failure
        traceback.print_exc()
        sys.exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    serve_rank(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]))
