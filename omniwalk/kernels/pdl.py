"""Programmatic dependent launch (PDL, Hopper and later) for the decode kernels.

A decode step is hundreds of small kernels; between two of them the GPU drains the first,
launches the second and ramps it up (a gap per boundary, even in CUDA graphs).
With PDL the next kernel's programs start while the previous kernel still runs: they issue
what does not depend on it (loads of weights), then wait for it. ``launch(device)`` gives the
keyword arguments of such a launch: ``launch_pdl`` (Triton's launch attribute; captured in a
CUDA graph as a programmatic edge) and the kernels' constexpr ``USE_PDL``.

Rules every kernel launched with ``launch`` keeps (``USE_PDL`` true):

- it calls ``gdc_wait()`` (wait until the previous kernel in the stream has completed and its
  writes are visible) before it reads anything an earlier kernel wrote (activations, KV, page
  tables, routing ids, counters) and before its first store or atomic (an earlier kernel may
  still be reading the buffer it writes). Loads of weights, which nothing writes during decode,
  may come before the wait: that is the win for the GEMV/GEMM kernels.
- it calls ``gdc_launch_dependents()`` right after its wait: the next PDL kernel may then start
  and prefetch its weights. That is safe because the next kernel waits in turn for this one's
  completion, which comes after this one's wait, so each wait covers every earlier kernel.
- a kernel launched without PDL (cuBLAS, PyTorch) after a PDL kernel starts as usual, after it.

On CPU tensors (Triton's interpreter, which cannot run the wait's inline PTX) and GPUs before
compute capability 9.0, ``USE_PDL`` is false and the kernels compile without the instructions.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def enabled(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch with PDL: CUDA, compute capability >= 9.0."""
    if device.type != "cuda":
        return False
    from triton import knobs  # (CUDA installs have Triton)

    index = torch.cuda.current_device() if device.index is None else device.index
    return not knobs.runtime.interpret and _capable(index)


def launch(device: torch.device) -> dict:
    """Keyword arguments for a decode kernel's launch on ``device`` (see the module docstring)."""
    return {"USE_PDL": True, "launch_pdl": True} if enabled(device) else {"USE_PDL": False}
