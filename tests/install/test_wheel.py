"""The wheel as a user installs it: built with ``pip wheel``, installed into a fresh venv that cannot
see this checkout or its editable install, then, from a folder outside the repository, each model
family's tiny checkpoint is made, served and asked one chat. An editable install reads package data
from the source tree, so only this catches a file the wheel forgets to ship."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from omniwalk.models.registry import BUILTIN

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"  # the README's pin; pip finds it on local disk before the registry
# family package -> (the package holding its tiny config, or None for the default family's
# ``make-tiny`` without --config; the served model name)
FAMILIES = {
    "omniwalk.models.qwen3_omni": (None, "qwen3-omni"),
    "omniwalk.models.qwen2_5_omni": ("omniwalk.models.qwen2_5_omni.checkpoint", "qwen2.5-omni"),
}


def _run(cmd: list, env: dict, cwd: Path, timeout: float) -> str:
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out.stdout


def _source_copy(dest: Path) -> Path:
    """The files a wheel is built from, copied, so no stale ``build/`` of the checkout leaks into it."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(ROOT / "omniwalk", dest / "omniwalk", ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    return dest


class Venv:
    def __init__(self, root: Path, work: Path):
        self.root, self.work = root, work
        clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        self.env = {**clean, "PATH": f"{root / 'bin'}{os.pathsep}{clean.get('PATH', '')}", "VIRTUAL_ENV": str(root)}

    def bin(self, name: str) -> str:
        return str(self.root / "bin" / name)

    def run(self, *args, timeout: float = 300) -> str:
        return _run([str(a) for a in args], self.env, self.work, timeout)

    def python(self, code: str) -> str:
        return self.run(self.bin("python"), "-c", code).strip()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    src = _source_copy(base / "src")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", src, "-w", base / "dist"], env, base, 300)
    (built,) = (base / "dist").glob("omniwalk-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel) -> Venv:
    base = wheel.parents[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run([sys.executable, "-m", "venv", base / "venv"], env, base, 120)  # no --system-site-packages
    work = base / "work"  # outside the checkout: nothing importable from the current folder
    work.mkdir()
    v = Venv(base / "venv", work)
    v.run(v.bin("python"), "-m", "pip", "install", "-q", "--no-compile", TORCH, timeout=600)
    v.run(v.bin("python"), "-m", "pip", "install", "-q", "--no-compile", wheel, timeout=600)
    return v


def test_the_wheel_holds_every_data_file_of_the_package(wheel):
    """Every file under omniwalk/ that is not Python (configs, presets, tuned tiles, the talk page)."""
    source = wheel.parents[1] / "src"
    data = {p.relative_to(source).as_posix() for p in (source / "omniwalk").rglob("*") if p.is_file()}
    data = {name for name in data if not name.endswith((".py", ".pyc"))}
    assert data, "the package has no data files: the source copy is wrong"
    with zipfile.ZipFile(wheel) as z:
        missing = sorted(data - set(z.namelist()))
    assert not missing, f"the wheel lacks {missing}"


def test_the_venv_imports_the_wheel_not_the_checkout(venv):
    where = Path(venv.python("import omniwalk; print(omniwalk.__file__)"))
    assert where.is_relative_to(venv.root), where
    assert not where.is_relative_to(ROOT), where


def test_every_builtin_family_is_smoke_tested():
    assert set(FAMILIES) == set(BUILTIN.values())


def test_every_family_ships_its_presets(venv):
    code = (
        "import json; from omniwalk.models.registry import family_modules\n"
        "print(json.dumps({m.__name__: [str(p) for p in m.PRESETS.values()] for m in family_modules()}))"
    )
    presets = json.loads(venv.python(code))
    assert set(presets) == set(FAMILIES)
    for family, paths in presets.items():
        assert paths, f"{family} ships no preset"
        missing = [p for p in paths if not Path(p).is_file()]
        assert not missing, f"{family}: the wheel lacks {missing}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, dict]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, json.loads(r.read())


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return r.status, json.loads(r.read())


def _wait_ready(proc: subprocess.Popen, base: str, log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if urllib.request.urlopen(f"{base}/health", timeout=2).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the server was not ready in 180 s:\n{log.read_text()[-4000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """The server and its engine processes: it was started in its own session, so its group is theirs."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # (any engine process left behind)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_make_serve_and_chat_each_family(venv, family):
    data_package, served_name = FAMILIES[family]
    ckpt = venv.work / family.rsplit(".", 1)[1]
    config = []
    if data_package:  # (the path inside the installed package: the file must have shipped)
        where = f"import importlib.resources as r; print(r.files('{data_package}') / 'tiny_config.json')"
        config = ["--config", venv.python(where)]
    venv.run(venv.bin("omniwalk"), "make-tiny", ckpt, *config, timeout=300)
    port, log = _free_port(), venv.work / f"{ckpt.name}.log"
    with open(log, "w") as out:
        cmd = [venv.bin("omniwalk"), "serve", "--model", str(ckpt), "--port", str(port)]
        opts = {"env": venv.env, "cwd": venv.work, "stdout": out, "stderr": subprocess.STDOUT}
        proc = subprocess.Popen(cmd, start_new_session=True, **opts)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_ready(proc, base.removesuffix("/v1"), log)
        status, models = _get(f"{base}/models")
        assert status == 200 and [m["id"] for m in models["data"]] == [served_name]
        messages = [{"role": "user", "content": "hello"}]
        body = {"model": served_name, "messages": messages, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
        status, reply = _post(f"{base}/chat/completions", body)
        assert status == 200, reply
        assert reply["choices"][0]["message"]["content"].strip(), reply
        assert reply["usage"]["completion_tokens"] == 8
    finally:
        _stop(proc)
