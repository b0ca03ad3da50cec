"""The package layout keeps model families apart: a family's package is imported (or named as a
module string) only inside itself, the registry's lazy entries aside; no module outside the family
packages has a family's name as an identifier (class, function, variable, attribute)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from omniwalk.models.registry import BUILTIN

PACKAGE = Path(__file__).resolve().parents[2] / "omniwalk"
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
