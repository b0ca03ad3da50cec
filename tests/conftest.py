"""Suite-wide markers and the CI skip rule.

``gpu`` marks a test that needs a CUDA device; without one it is skipped. Any other skip is one the
suite did not intend where CI runs (a missing browser, codec or package would otherwise turn a test
into a silent pass): with the environment variable ``CI`` set (CI sets ``CI=true``), such a skip
fails the run, naming the test and the reason it skipped.

``interpreter`` (a fixture a test asks for) runs Triton's interpreter, patched, around a CPU test.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton's interpreter runs the kernels on the CPU. Set before any test module imports a kernel module:
    # ``@triton.jit`` picks the interpreter when a module is imported (omniwalk/kernels/).
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def interpreter(monkeypatch):
    """Triton's interpreter around a CPU test (``helpers.triton_cpu.interpreted``: its patches are undone
    after the test; such tests are marked ``helpers.triton_cpu.CPU_ONLY``, the ``gpu`` tests run the
    compiled kernels)."""
    from helpers import triton_cpu

    yield from triton_cpu.interpreted(monkeypatch)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (runs on the GPU machine)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _skip_reason(report) -> str:
    if isinstance(report.longrepr, tuple):  # (path, line, "Skipped: why")
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return str(report.longrepr)


def _fail_unintended_skip(report, what: str) -> None:
    report.outcome = "failed"
    report.longrepr = (
        f"{what} was skipped in CI: {_skip_reason(report)}\n"
        "Outside GPU-marked tests a skip in CI is a failure: install what the test needs in CI, or mark the "
        "test gpu if it can only run on the GPU machine."
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _in_ci() and item.get_closest_marker("gpu") is None and not hasattr(report, "wasxfail"):
        _fail_unintended_skip(report, item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _in_ci():  # a whole module skipped at import (pytest.importorskip, a module-level skip)
        _fail_unintended_skip(report, collector.nodeid)
