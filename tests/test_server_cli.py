"""`omniwalk serve`'s command line: flags from the config dataclasses, checked before anything loads."""

import socket
import subprocess
import sys

import pytest

from omniwalk.cli import build_parser, format_size, parse_size


def test_help_does_not_import_torch():
    code = "import sys, contextlib\nfrom omniwalk.cli import main\nwith contextlib.suppress(SystemExit):\n"
    code += "    main(['serve', '--help'])\nassert 'torch' not in sys.modules, 'torch was imported'\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--dtype {float32,bfloat16,float16}" in out.stdout and "--log-level {debug,info,warning,error}" in out.stdout
    help_text = " ".join(out.stdout.split())  # argparse wraps lines
    assert "ServerConfig.max_body_bytes: a size in bytes, units allowed (default: 64MiB)" in help_text


def test_booleans_are_flags_and_sizes_have_units():
    parse = lambda *flags: build_parser().parse_args(["serve", *flags])  # noqa: E731
    assert parse("--random-weights").random_weights is True
    assert parse("--random-weights", "false").random_weights is False
    assert parse().random_weights is False
    assert parse("--thinker-kv-bytes", "16GiB", "--max-body-bytes", "512KiB").thinker_kv_bytes == 16 * 2**30
    assert parse("--max-body-bytes", "512KiB").max_body_bytes == 512 * 2**10
    assert parse_size("1.5GB") == 1_500_000_000 and parse_size("4096") == 4096
    for size in (64 * 2**20, 16 * 2**30, 512 * 2**10, 3 * 2**20 + 1, 0):
        assert parse_size(format_size(size)) == size
    assert format_size(64 * 2**20) == "64MiB" and format_size(1000) == "1000"
    with pytest.raises(SystemExit):
        parse("--thinker-kv-bytes", "lots")


def test_a_missing_model_and_a_port_in_use_are_reported_before_anything_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "omniwalk.cli", "serve", "--model", "/nonexistent", "--port", str(port)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no such checkpoint directory" in out.stderr  # the model is checked first
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "omniwalk.cli", "serve", "--port", str(port)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in out.stderr, out.stderr
    assert "engine process started" not in out.stdout
