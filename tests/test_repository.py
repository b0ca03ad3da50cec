"""The repository's own hygiene: the package states contracts, not a lab notebook (no run labels, no
paths into run archives), and no test module imports another (shared test code lives in ``helpers``).

The CI skip rule of ``tests/conftest.py``, run on a small suite of its own: with ``CI`` set, a skip that
is not a GPU test's fails the run with the test's name and the reason; without ``CI`` it stays a skip.

The examples/ scripts run against a live server, as a user would run them.

The package layout keeps model families apart: a family's package is imported (or named as a
module string) only inside itself, the registry's lazy entries aside; no module outside the family
packages has a family's name as an identifier (class, function, variable, attribute)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile
from helpers.live_server import server

from omniwalk.models.registry import BUILTIN

ROOT = Path(__file__).resolve().parents[1]
LABELS = re.compile(r"session [0-9]|call [0-9]|results/20", re.IGNORECASE)


def test_the_package_cites_no_run_labels_or_results_paths():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "omniwalk").rglob("*"))
        if path.is_file() and path.suffix in (".py", ".json", ".md", ".txt", ".toml", ".html", ".js", ".css")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if LABELS.search(line)
    ]
    assert not found, "run labels or results paths in omniwalk/ (measurements belong in docs/performance.md):\n" + (
        "\n".join(found)
    )


def _imported_modules(tree: ast.Module) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:  # relative: from . import test_x, from .test_x import
            names += [node.module or ""] + [alias.name for alias in node.names]
    return names


def test_no_test_module_imports_another():
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for name in _imported_modules(ast.parse(path.read_text(encoding="utf-8"))):
            if any(part.startswith("test_") for part in name.split(".")):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, "test modules import test modules (move what they share to tests/helpers/):\n" + (
        "\n".join(offenders)
    )


pytest_plugins = ["pytester"]

SUITE = """
import pytest


def test_runs():
    pass


def test_skips_for_a_missing_browser():
    pytest.skip("needs the browser")


@pytest.mark.skipif(True, reason="no codec here")
def test_skipif():
    pass


@pytest.mark.gpu
def test_on_the_gpu_machine():
    pass


@pytest.mark.xfail(reason="known")
def test_expected_failure():
    assert False
"""
MODULE_SKIP = 'import pytest\n\npytest.importorskip("a_package_nobody_installs")\n\n\ndef test_never():\n    pass\n'


@pytest.fixture
def suite(pytester):
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_suite=SUITE, test_module_skip=MODULE_SKIP)
    return pytester


def test_in_ci_an_unintended_skip_fails_naming_the_test_and_reason(suite, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = suite.runpytest("-p", "no:cacheprovider", "test_suite.py")
    # a skip in the call phase fails the test; a skipif (decided at setup) is an error: both fail the run
    result.assert_outcomes(passed=1 + _cuda(), failed=1, errors=1, xfailed=1, skipped=1 - _cuda())
    out = result.stdout.str()
    assert "test_suite.py::test_skips_for_a_missing_browser was skipped in CI: needs the browser" in out
    assert "test_suite.py::test_skipif was skipped in CI: no codec here" in out
    assert result.ret != 0


def test_in_ci_a_module_skipped_at_import_fails(suite, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = suite.runpytest("-p", "no:cacheprovider", "test_module_skip.py")
    result.assert_outcomes(errors=1)
    assert "test_module_skip.py was skipped in CI: could not import 'a_package_nobody_installs'" in result.stdout.str()
    assert result.ret != 0


def test_outside_ci_skips_stay_skips(suite, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    result = suite.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1 + _cuda(), xfailed=1, skipped=3 + (not _cuda()))
    assert result.ret == 0


def _cuda() -> int:
    import torch

    return int(torch.cuda.is_available())


EXAMPLES = Path(__file__).parents[1] / "examples"


def run(cmd, cwd):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_examples_against_a_live_server(tmp_path):
    with server() as base:
        assert "completion_tokens" in run(
            [sys.executable, str(EXAMPLES / "chat.py"), "--base-url", f"{base}/v1"], tmp_path
        )
        out = run([sys.executable, str(EXAMPLES / "speech_to_speech.py"), "--base-url", f"{base}/v1"], tmp_path)
        assert "speech: answer.wav" in out and soundfile.info(tmp_path / "answer.wav").samplerate == 24000
        out = run([sys.executable, str(EXAMPLES / "stream_speech.py"), "--base-url", f"{base}/v1"], tmp_path)
        assert "chunks" in out and soundfile.info(tmp_path / "stream.wav").duration > 0
        out = run([sys.executable, str(EXAMPLES / "realtime_talk.py"), "--base-url", f"{base}/v1"], tmp_path)
        assert "speech: answer.wav" in out and soundfile.info(tmp_path / "answer.wav").duration > 0
        out = run(["bash", str(EXAMPLES / "curl_chat.sh"), base], tmp_path)
        assert '"chat.completion"' in out and soundfile.info(tmp_path / "speech.wav").samplerate == 24000


PACKAGE = Path(__file__).resolve().parents[1] / "omniwalk"
FAMILIES = sorted({module.rsplit(".", 1)[1] for module in BUILTIN.values()})  # ["qwen2_5_omni", "qwen3_omni"]
REGISTRY = "models/registry.py"


def family_of(module: str) -> str | None:
    """The family whose package ``module`` (a dotted name) is in, or None."""
    parts = module.split(".")
    if parts[:2] == ["omniwalk", "models"] and len(parts) > 2 and parts[2] in FAMILIES:
        return parts[2]
    return None


def named_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted module name) of every absolute import and every string constant that looks like one."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("omniwalk."):
            out.append((node.lineno, node.value))
    return out


def import_violations(rel: str, source: str) -> list[str]:
    """``rel``: the file's path under ``omniwalk/``; imports of a family package from outside it."""
    home = rel.split("/")[1] if rel.startswith("models/") and rel.count("/") >= 2 else None
    found = []
    for line, module in named_modules(ast.parse(source)):
        family = family_of(module)
        if family is not None and family != home and rel != REGISTRY:
            found.append(f"{rel}:{line} names {module}")
    return found


def identifiers(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((node.lineno, node.name))
        elif isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.alias):
            out.append((getattr(node, "lineno", 0), node.asname or node.name))
    return out


def name_violations(rel: str, source: str) -> list[str]:
    if rel.startswith(tuple(f"models/{family}/" for family in FAMILIES)):
        return []
    return [f"{rel}:{line} {name}" for line, name in identifiers(ast.parse(source)) if "qwen" in name.lower()]


def sources() -> list[tuple[str, str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50  # the package, not an empty directory
    return [(path.relative_to(PACKAGE).as_posix(), path.read_text()) for path in files]


def test_families_are_known():
    assert FAMILIES == ["qwen2_5_omni", "qwen3_omni"]


def test_no_family_is_imported_from_outside_its_package():
    found = [v for rel, source in sources() for v in import_violations(rel, source)]
    assert not found, "\n".join(found)


def test_no_family_name_outside_the_family_packages():
    found = [v for rel, source in sources() for v in name_violations(rel, source)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("rel", "source", "bad"),
    [
        ("models/qwen2_5_omni/x.py", "from omniwalk.models.qwen3_omni.networks.talker import Talker", True),
        ("models/qwen2_5_omni/x.py", "from omniwalk.models import qwen3_omni", True),
        ("engine/x.py", "import omniwalk.models.qwen2_5_omni.family", True),
        ("serve/x.py", "importlib.import_module('omniwalk.models.qwen3_omni')", True),
        ("models/qwen3_omni/x.py", "from omniwalk.models.qwen3_omni.networks.talker import Talker", False),
        ("models/common/x.py", "from omniwalk.models.common.processing.chat import Prompt", False),
        (REGISTRY, "BUILTIN = {'A': 'omniwalk.models.qwen3_omni'}", False),
    ],
)
def test_the_import_check_sees_cross_family_imports(rel: str, source: str, bad: bool):
    assert bool(import_violations(rel, source)) == bad


def test_the_name_check_sees_family_names():
    assert name_violations("layers/x.py", "class Qwen3Attention: pass")
    assert name_violations("models/common/x.py", "from omniwalk.models.qwen3_omni import family as qwen_family")
    assert not name_violations("models/qwen3_omni/x.py", "class Qwen3OmniConfig: pass")
