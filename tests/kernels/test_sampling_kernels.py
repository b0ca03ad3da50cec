"""Runs ``sampling_interpreted.py`` (the fused sampling kernels against the PyTorch reference)
in Triton's CPU interpreter, in a subprocess: TRITON_INTERPRET must be set before triton is
first imported. Skipped where triton is not installed (CI)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_fused_kernels_in_the_triton_interpreter():
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels/sampling_interpreted.py"]
    run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-2000:]
