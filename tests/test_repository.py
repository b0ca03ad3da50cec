"""The repository's own hygiene: the package states contracts, not a lab notebook (no run labels, no
paths into run archives), and no test module imports another (shared test code lives in ``helpers``)."""

import ast
import re
from pathlib import Path

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
