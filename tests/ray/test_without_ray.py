"""omniwalk without Ray installed (the ``[ray]`` extra is optional): the server and the CLI import and
build as usual, and ``omniwalk serve --ray`` says what to install."""

import subprocess
import sys

# (``sys.modules["ray"] = None`` makes every ``import ray`` fail, as on a machine without it)
SCRIPT = """
import sys
sys.modules["ray"] = None
import omniwalk.cli, omniwalk.serve.app, omniwalk.serve.replicas, omniwalk.serve.routing
omniwalk.cli.build_parser().parse_args(["serve", "--data-parallel", "2"])
sys.exit(omniwalk.cli.main(["serve", "--ray", "auto"]))
"""


def test_omniwalk_imports_and_serve_ray_names_the_extra_without_ray():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "--ray needs Ray Serve: pip install 'omniwalk[ray]'" in run.stderr
