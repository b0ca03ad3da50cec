"""The CI skip rule of ``tests/conftest.py``, run on a small suite of its own: with ``CI`` set, a skip that
is not a GPU test's fails the run with the test's name and the reason; without ``CI`` it stays a skip."""

from pathlib import Path

import pytest

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
